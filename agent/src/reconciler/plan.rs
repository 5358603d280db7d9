//! The reconciler's policy, pure: which mutations bring live state to the
//! desired state ([`plan`]), which restore the last applied specs during
//! a change freeze ([`plan_frozen`]), and what an unfreeze would apply.
//!
//! A `start-first` spec (no host ports) is created beside the running
//! container of another spec (under another name,
//! [`container_name_beside`]); the old one is removed only once the new
//! one is healthy. A revert of such a spec is then the removal of the new
//! container alone: the restored spec's container never stopped.

use std::collections::BTreeMap;

use fleet_common::contracts::{UpdateStrategy, WorkloadSpec};
use fleet_common::validate::WorkloadName;

use crate::desired::{DesiredEntry, DesiredMap};
use crate::podman::{container_name, container_name_beside, LiveContainer, LiveState};

/// What identifies a mutation for back-off.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ActionKey {
    Workload(WorkloadName),
    Container(String),
}

/// One runtime mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A managed container whose workload is not desired, or a duplicate.
    Remove { container: LiveContainer },
    /// No container of the workload's spec. `missing`: one with this spec
    /// was applied before, so this is a restore. `name`: the container's
    /// (another than the workload's usual one when a container of another
    /// spec keeps it: `start-first`).
    Create {
        workload: WorkloadName,
        spec: WorkloadSpec,
        missing: bool,
        name: String,
    },
    /// Containers of the workload with another spec hash.
    Replace {
        workload: WorkloadName,
        spec: WorkloadSpec,
        old: Vec<LiveContainer>,
    },
    /// The workload's container exists but is not running. `spec`: to
    /// recreate it when starting fails (none for an invalid spec).
    Restore {
        workload: WorkloadName,
        container: LiveContainer,
        spec: Option<WorkloadSpec>,
    },
}

impl Action {
    pub fn key(&self) -> ActionKey {
        match self {
            Self::Remove { container } => ActionKey::Container(container.id.clone()),
            Self::Create { workload, .. }
            | Self::Replace { workload, .. }
            | Self::Restore { workload, .. } => ActionKey::Workload(workload.clone()),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Remove { container } => format!("remove {}", container.name),
            Self::Create {
                workload,
                missing: false,
                ..
            } => format!("create {workload}"),
            Self::Create {
                workload,
                missing: true,
                ..
            } => format!("recreate missing {workload}"),
            Self::Replace { workload, .. } => format!("replace {workload}"),
            Self::Restore { workload, .. } => format!("restore {workload}"),
        }
    }

    pub(super) fn is_restore(&self) -> bool {
        matches!(
            self,
            Self::Restore { .. } | Self::Create { missing: true, .. }
        )
    }
}

/// The name a new container of `w` gets: the usual one, unless a live
/// container has it.
fn free_name(w: &WorkloadName, hash: &str, live: &[LiveContainer]) -> String {
    let usual = container_name(w);
    if live.iter().any(|c| c.name == usual) {
        container_name_beside(w, hash)
    } else {
        usual
    }
}

/// The mutations that bring `live` to `desired`, removals first, without
/// those `blocked` (backing off). `healthy(w, hash)`: whether the
/// container of that spec has been found healthy (a `start-first` spec's
/// old container goes only then). Pure: the reconciler's whole policy.
pub fn plan(
    desired: &DesiredMap,
    live: &[LiveContainer],
    applied: &BTreeMap<WorkloadName, WorkloadSpec>,
    blocked: impl Fn(&ActionKey) -> bool,
    healthy: impl Fn(&WorkloadName, &str) -> bool,
) -> Vec<Action> {
    let mut removes = Vec::new();
    let mut replaces = Vec::new();
    let mut creates = Vec::new();
    let mut restores = Vec::new();
    let mut by_workload: BTreeMap<&WorkloadName, Vec<&LiveContainer>> = BTreeMap::new();
    for c in live {
        match &c.workload {
            Some(w) if desired.contains_key(w) => by_workload.entry(w).or_default().push(c),
            _ => removes.push(Action::Remove {
                container: c.clone(),
            }),
        }
    }
    for (w, entry) in desired {
        let mut cs = by_workload.remove(w).unwrap_or_default();
        // Running ones first, so the one kept is the healthy one.
        cs.sort_by_key(|c| c.state != LiveState::Running);
        match entry {
            DesiredEntry::Valid(spec) => {
                let hash = spec.spec_hash();
                let (matching, others): (Vec<&LiveContainer>, Vec<&LiveContainer>) = cs
                    .into_iter()
                    .partition(|c| c.spec_hash.as_deref() == Some(hash.as_str()));
                let start_first = spec.update_strategy == UpdateStrategy::StartFirst;
                if let Some((keep, extra)) = matching.split_first() {
                    // start-first: the old one serves until the new one is healthy.
                    let keep_old = start_first && !healthy(w, hash.as_str());
                    let old = others
                        .iter()
                        .filter(|c| !(keep_old && c.state == LiveState::Running));
                    for c in extra.iter().chain(old) {
                        removes.push(Action::Remove {
                            container: (*c).clone(),
                        });
                    }
                    if matches!(keep.state, LiveState::Down(_)) {
                        restores.push(Action::Restore {
                            workload: w.clone(),
                            container: (*keep).clone(),
                            spec: Some(spec.clone()),
                        });
                    }
                } else if start_first && others.iter().any(|c| c.state == LiveState::Running) {
                    creates.push(Action::Create {
                        workload: w.clone(),
                        spec: spec.clone(),
                        missing: false,
                        name: free_name(w, hash.as_str(), live),
                    });
                } else if !others.is_empty() {
                    replaces.push(Action::Replace {
                        workload: w.clone(),
                        spec: spec.clone(),
                        old: others.into_iter().cloned().collect(),
                    });
                } else {
                    creates.push(Action::Create {
                        workload: w.clone(),
                        spec: spec.clone(),
                        missing: applied.get(w).is_some_and(|a| a.spec_hash() == hash),
                        name: free_name(w, hash.as_str(), live),
                    });
                }
            }
            DesiredEntry::Invalid { .. } => {
                if let Some(keep) = cs.first() {
                    if matches!(keep.state, LiveState::Down(_)) {
                        restores.push(Action::Restore {
                            workload: w.clone(),
                            container: (*keep).clone(),
                            spec: None,
                        });
                    }
                }
            }
        }
    }
    let mut all = removes;
    all.extend(replaces);
    all.extend(creates);
    all.extend(restores);
    all.retain(|a| !blocked(&a.key()));
    all
}

/// The mutations that restore the last applied specs during a change
/// freeze: a missing container is recreated, an exited one started (or
/// recreated when it cannot start), with local images only. Containers of
/// another spec, and workloads not applied, are left as they are.
pub fn plan_frozen(
    applied: &BTreeMap<WorkloadName, WorkloadSpec>,
    live: &[LiveContainer],
    blocked: impl Fn(&ActionKey) -> bool,
) -> Vec<Action> {
    let mut creates = Vec::new();
    let mut restores = Vec::new();
    for (w, spec) in applied {
        let hash = spec.spec_hash();
        let mine: Vec<&LiveContainer> = live
            .iter()
            .filter(|c| c.workload.as_ref() == Some(w))
            .collect();
        let mut matching: Vec<&LiveContainer> = mine
            .iter()
            .copied()
            .filter(|c| c.spec_hash.as_deref() == Some(hash.as_str()))
            .collect();
        matching.sort_by_key(|c| c.state != LiveState::Running);
        match matching.first() {
            Some(c) if matches!(c.state, LiveState::Down(_)) => restores.push(Action::Restore {
                workload: w.clone(),
                container: (*c).clone(),
                spec: Some(spec.clone()),
            }),
            Some(_) => {}
            None if mine.is_empty() => creates.push(Action::Create {
                workload: w.clone(),
                spec: spec.clone(),
                missing: true,
                name: container_name(w),
            }),
            None => {}
        }
    }
    let mut all = creates;
    all.extend(restores);
    all.retain(|a| !blocked(&a.key()));
    all
}

/// Desired changes an unfreeze would apply: workloads whose valid desired
/// spec differs from the applied one (or was never applied), and applied
/// workloads no longer desired. An invalid value changes nothing.
pub fn waiting_changes(
    desired: &DesiredMap,
    applied: &BTreeMap<WorkloadName, WorkloadSpec>,
) -> u32 {
    let changed = desired
        .iter()
        .filter(|(w, e)| match e {
            DesiredEntry::Valid(spec) => {
                applied.get(*w).map(WorkloadSpec::spec_hash) != Some(spec.spec_hash())
            }
            DesiredEntry::Invalid { .. } => false,
        })
        .count();
    let removed = applied.keys().filter(|w| !desired.contains_key(*w)).count();
    u32::try_from(changed + removed).unwrap_or(u32::MAX)
}

/// What runs during a freeze, for the report: the applied specs, and the
/// desired entries of workloads never applied (waiting).
pub(super) fn frozen_view(
    desired: &DesiredMap,
    applied: &BTreeMap<WorkloadName, WorkloadSpec>,
) -> DesiredMap {
    let mut view: DesiredMap = applied
        .iter()
        .map(|(w, s)| (w.clone(), DesiredEntry::Valid(s.clone())))
        .collect();
    for (w, e) in desired {
        view.entry(w.clone()).or_insert_with(|| e.clone());
    }
    view
}

pub(super) fn workload_of(a: &Action) -> Option<&WorkloadName> {
    match a {
        Action::Remove { container } => container.workload.as_ref(),
        Action::Create { workload, .. }
        | Action::Replace { workload, .. }
        | Action::Restore { workload, .. } => Some(workload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::test_support::{container, kinds, spec, w};
    use fleet_common::validate::Sha256Hex;

    #[test]
    fn plan_covers_every_case_removals_first() {
        let web = spec("localhost/web:1");
        let db = spec("localhost/db:1");
        let cam = spec("localhost/cam:1");
        let api = spec("localhost/api:1");
        let desired: DesiredMap = BTreeMap::from([
            (w("web"), DesiredEntry::Valid(web.clone())),
            (w("db"), DesiredEntry::Valid(db.clone())),
            (w("cam"), DesiredEntry::Valid(cam.clone())),
            (w("api"), DesiredEntry::Valid(api.clone())),
            (
                w("bad"),
                DesiredEntry::Invalid {
                    error: "x".into(),
                    value_hash: Sha256Hex::of(b"x"),
                    image: None,
                },
            ),
        ]);
        let live = vec![
            // web: running with the desired hash: nothing to do.
            container("1", "web", web.spec_hash().as_str(), LiveState::Running),
            // db: another hash: replace.
            container("2", "db", "old", LiveState::Running),
            // cam: exited with the desired hash: restore.
            container(
                "3",
                "cam",
                cam.spec_hash().as_str(),
                LiveState::Down("exited".into()),
            ),
            // gone: no longer desired: remove.
            container("4", "gone", "h", LiveState::Running),
            // bad: invalid spec keeps its container, restored when down.
            container("5", "bad", "h", LiveState::Down("exited".into())),
            // a duplicate of web: removed.
            container(
                "6",
                "web",
                web.spec_hash().as_str(),
                LiveState::Down("created".into()),
            ),
        ];
        let applied = BTreeMap::from([(w("api"), api.clone())]);
        let actions = plan(&desired, &live, &applied, |_| false, |_, _| false);
        assert_eq!(
            kinds(&actions),
            vec![
                "remove fleet-gone",
                "remove fleet-web",
                "replace db",
                "recreate missing api",
                "restore bad",
                "restore cam",
            ]
        );
        match &actions[1] {
            Action::Remove { container } => {
                assert_eq!(container.id, "6", "the running one is kept")
            }
            other => panic!("{other:?}"),
        }
        match &actions[2] {
            Action::Replace { old, .. } => assert_eq!(old.len(), 1),
            other => panic!("{other:?}"),
        }
        // Backing-off workloads and containers are left out.
        let blocked = plan(
            &desired,
            &live,
            &BTreeMap::new(),
            |k| {
                matches!(k, ActionKey::Workload(x) if x.as_str() == "db")
                    || matches!(k, ActionKey::Container(id) if id == "4")
            },
            |_, _| false,
        );
        assert_eq!(
            kinds(&blocked),
            vec![
                "remove fleet-web",
                "create api",
                "restore bad",
                "restore cam"
            ]
        );
        // Converged: nothing.
        let converged = vec![
            container("1", "web", web.spec_hash().as_str(), LiveState::Running),
            container("2", "db", db.spec_hash().as_str(), LiveState::Running),
            container("3", "cam", cam.spec_hash().as_str(), LiveState::Paused),
            container("7", "api", api.spec_hash().as_str(), LiveState::Running),
        ];
        assert!(plan(&desired, &converged, &applied, |_| false, |_, _| false).is_empty());
        // An empty desired state removes every managed container.
        assert_eq!(
            kinds(&plan(
                &BTreeMap::new(),
                &converged,
                &applied,
                |_| false,
                |_, _| false
            )),
            vec![
                "remove fleet-web",
                "remove fleet-db",
                "remove fleet-cam",
                "remove fleet-api"
            ]
        );
    }

    #[test]
    fn frozen_plan_restores_applied_specs_only() {
        let web = spec("localhost/web:1");
        let db = spec("localhost/db:1");
        let cam = spec("localhost/cam:1");
        let api = spec("localhost/api:1");
        let applied = BTreeMap::from([
            (w("web"), web.clone()),
            (w("db"), db.clone()),
            (w("cam"), cam.clone()),
            (w("api"), api.clone()),
        ]);
        let live = vec![
            // web: running its applied spec: nothing.
            container("1", "web", web.spec_hash().as_str(), LiveState::Running),
            // db: exited with its applied spec: restored (started).
            container(
                "2",
                "db",
                db.spec_hash().as_str(),
                LiveState::Down("exited".into()),
            ),
            // cam: missing: recreated from the applied spec.
            // api: a container of another spec: left alone, not replaced.
            container("4", "api", "other", LiveState::Down("exited".into())),
            // gone: not applied (not desired either): not removed.
            container("5", "gone", "h", LiveState::Running),
        ];
        let actions = plan_frozen(&applied, &live, |_| false);
        assert_eq!(kinds(&actions), vec!["recreate missing cam", "restore db"]);
        match &actions[0] {
            Action::Create { spec, missing, .. } => {
                assert!(missing);
                assert_eq!(spec.spec_hash(), cam.spec_hash());
            }
            other => panic!("{other:?}"),
        }
        let blocked = plan_frozen(
            &applied,
            &live,
            |k| matches!(k, ActionKey::Workload(x) if x.as_str() == "cam"),
        );
        assert_eq!(kinds(&blocked), vec!["restore db"]);
        assert!(plan_frozen(&BTreeMap::new(), &live, |_| false).is_empty());
    }

    #[test]
    fn waiting_changes_count_what_an_unfreeze_would_apply() {
        let web1 = spec("localhost/web:1");
        let web2 = spec("localhost/web:2");
        let db = spec("localhost/db:1");
        let applied = BTreeMap::from([(w("web"), web1.clone()), (w("db"), db.clone())]);
        let same: DesiredMap = BTreeMap::from([
            (w("web"), DesiredEntry::Valid(web1.clone())),
            (w("db"), DesiredEntry::Valid(db.clone())),
        ]);
        assert_eq!(waiting_changes(&same, &applied), 0);
        let changed: DesiredMap = BTreeMap::from([
            // changed
            (w("web"), DesiredEntry::Valid(web2.clone())),
            // db deleted; api added
            (w("api"), DesiredEntry::Valid(spec("localhost/api:1"))),
            // an invalid value applies nothing
            (
                w("bad"),
                DesiredEntry::Invalid {
                    error: "x".into(),
                    value_hash: Sha256Hex::of(b"x"),
                    image: None,
                },
            ),
        ]);
        assert_eq!(waiting_changes(&changed, &applied), 3);
        // What the report shows while frozen: what runs, plus what waits.
        let view = frozen_view(&changed, &applied);
        assert_eq!(
            view.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            vec!["api", "bad", "db", "web"]
        );
        assert_eq!(view.get(&w("web")), Some(&DesiredEntry::Valid(web1)));
    }

    #[test]
    fn a_start_first_spec_runs_beside_the_old_one_until_healthy() {
        let old = spec("localhost/web:1");
        let mut new = spec("localhost/web:2");
        new.update_strategy = UpdateStrategy::StartFirst;
        let h_new = new.spec_hash();
        let desired: DesiredMap = BTreeMap::from([(w("web"), DesiredEntry::Valid(new.clone()))]);
        let live = vec![container(
            "1",
            "web",
            old.spec_hash().as_str(),
            LiveState::Running,
        )];
        let actions = plan(&desired, &live, &BTreeMap::new(), |_| false, |_, _| false);
        assert_eq!(kinds(&actions), vec!["create web"], "beside, not a replace");
        match &actions[0] {
            Action::Create { name, .. } => {
                assert_eq!(*name, format!("fleet-web-{}", &h_new.as_str()[..12]))
            }
            other => panic!("{other:?}"),
        }
        let mut beside = container("2", "web", h_new.as_str(), LiveState::Running);
        beside.name = format!("fleet-web-{}", &h_new.as_str()[..12]);
        let both = vec![live[0].clone(), beside];
        assert!(
            plan(&desired, &both, &BTreeMap::new(), |_| false, |_, _| false).is_empty(),
            "the old one serves until the new one is healthy"
        );
        let healthy = |x: &WorkloadName, h: &str| x.as_str() == "web" && h == h_new.as_str();
        assert_eq!(
            kinds(&plan(&desired, &both, &BTreeMap::new(), |_| false, healthy)),
            vec!["remove fleet-web"]
        );
        // Without a running old one, a start-first spec replaces as usual.
        let exited = vec![container(
            "1",
            "web",
            old.spec_hash().as_str(),
            LiveState::Down("exited".into()),
        )];
        assert_eq!(
            kinds(&plan(
                &desired,
                &exited,
                &BTreeMap::new(),
                |_| false,
                |_, _| false
            )),
            vec!["replace web"]
        );
    }
}
