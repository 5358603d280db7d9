//! The reconciler's durable records, and the desired state they make
//! effective.
//!
//! Two files in the agent's state directory, both written by
//! [`fleet_common::durable::write_atomic`] (temp file, fsync, rename,
//! directory fsync), always in this order:
//!
//! 1. `workload-health.json` ([`WorkloadHealthState`]): every applied spec,
//!    the last healthy spec of each workload and the desired spec that
//!    failed, with `applied-json-written-at` = T;
//! 2. `applied.json` ([`AppliedSpecs`], the 0.2 shape): the applied specs
//!    that every agent version reads (no field of
//!    [`fleet_common::contracts::SPEC_FIELDS_SINCE`]), `written-at` = T.
//!
//! Read back: `applied.json` older than T (a crash between the two
//! writes) or equal: `workload-health.json` is the truth. Newer: another
//! agent (a downgrade to 0.2.0 ran and applied something) wrote it after
//! this one: its specs are the applied ones, the health records are kept.
//! A revert is nothing but a `failed` record: the desired spec of the
//! workload is then replaced, for planning, by its last healthy spec
//! ([`effective`]), so every crash point of a revert is a state the next
//! pass resolves the ordinary way (see `docs/design/workload-health.md`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use fleet_common::contracts::{
    AppliedSpecs, FailedSpec, WorkloadHealthRecord, WorkloadHealthState, WorkloadSpec,
};
use fleet_common::durable;
use fleet_common::limits::MAX_STATE_FILE_BYTES;
use fleet_common::validate::WorkloadName;
use fleet_common::{Layout, Timestamp};

use crate::desired::{DesiredEntry, DesiredMap};

/// Mode of both files (as `applied.json` always had).
const STATE_FILE_MODE: u32 = 0o640;

/// Where the records live.
#[derive(Debug, Clone)]
pub(super) struct StateFiles {
    applied: PathBuf,
    health: PathBuf,
}

/// What [`StateFiles::load`] found.
#[derive(Debug, Default)]
pub(super) struct Loaded {
    pub(super) applied: BTreeMap<WorkloadName, WorkloadSpec>,
    pub(super) records: BTreeMap<WorkloadName, WorkloadHealthRecord>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Option<T> {
    match durable::read_bounded(path, MAX_STATE_FILE_BYTES) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                log::warn!("ignoring {}: {e}", path.display());
                None
            }
        },
        Err(e) if e.is_not_found() => None,
        Err(e) => {
            log::warn!("ignoring {}: {e}", path.display());
            None
        }
    }
}

impl StateFiles {
    pub(super) fn new(layout: &Layout) -> Self {
        Self {
            applied: layout.applied_specs(),
            health: layout.workload_health_state(),
        }
    }

    /// Reads both files as the module doc says; absent or unreadable ones
    /// count as empty (logged).
    pub(super) fn load(&self) -> Loaded {
        let applied: Option<AppliedSpecs> = read_json(&self.applied);
        let state: Option<WorkloadHealthState> = read_json(&self.health);
        match (applied, state) {
            (a, None) => Loaded {
                applied: a.map(|a| a.workloads).unwrap_or_default(),
                records: BTreeMap::new(),
            },
            (None, Some(s)) => Loaded {
                applied: s.applied,
                records: s.workloads,
            },
            (Some(a), Some(s)) if a.written_at <= s.applied_json_written_at => Loaded {
                applied: s.applied,
                records: s.workloads,
            },
            (Some(a), Some(s)) => {
                log::warn!(
                    "{} was written at {} by another agent, after {} (written at {}): its applied specs count",
                    self.applied.display(),
                    a.written_at,
                    self.health.display(),
                    s.applied_json_written_at
                );
                Loaded {
                    applied: a.workloads,
                    records: s.workloads,
                }
            }
        }
    }

    /// Writes both files, in the module doc's order.
    pub(super) fn write(
        &self,
        applied: &BTreeMap<WorkloadName, WorkloadSpec>,
        records: &BTreeMap<WorkloadName, WorkloadHealthRecord>,
    ) -> Result<(), String> {
        let at = Timestamp::now();
        let state = WorkloadHealthState {
            format: WorkloadHealthState::FORMAT,
            applied: applied.clone(),
            applied_json_written_at: at,
            workloads: records
                .iter()
                .filter(|(_, r)| !r.is_empty())
                .map(|(w, r)| (w.clone(), r.clone()))
                .collect(),
            written_at: at,
        };
        let old_readable = AppliedSpecs {
            format: AppliedSpecs::FORMAT,
            workloads: applied
                .iter()
                .filter(|(_, s)| s.versioned_fields().is_empty())
                .map(|(w, s)| (w.clone(), s.clone()))
                .collect(),
            written_at: at,
        };
        let write = |path: &PathBuf, bytes: Result<Vec<u8>, serde_json::Error>| {
            bytes
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    durable::write_atomic(path, &b, STATE_FILE_MODE).map_err(|e| e.to_string())
                })
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        write(&self.health, serde_json::to_vec_pretty(&state))?;
        write(&self.applied, serde_json::to_vec_pretty(&old_readable))
    }
}

/// A workload whose desired spec failed and is not tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Held {
    /// Its last healthy spec runs instead.
    Restored {
        failed: FailedSpec,
        spec: WorkloadSpec,
    },
    /// Never healthy: left stopped.
    Stopped { failed: FailedSpec },
}

impl Held {
    pub(super) fn failed(&self) -> &FailedSpec {
        match self {
            Self::Restored { failed, .. } | Self::Stopped { failed } => failed,
        }
    }
}

/// The desired state the reconciler plans with: each workload whose
/// desired spec has failed gets its last healthy spec instead, or (none)
/// is left out, so its containers are removed and none is created.
pub(super) fn effective(
    desired: &DesiredMap,
    records: &BTreeMap<WorkloadName, WorkloadHealthRecord>,
) -> (DesiredMap, BTreeMap<WorkloadName, Held>) {
    let mut plan = DesiredMap::new();
    let mut held = BTreeMap::new();
    for (w, entry) in desired {
        let failed = match (entry, records.get(w).and_then(|r| r.failed.as_ref())) {
            (DesiredEntry::Valid(spec), Some(f)) if f.spec_hash == spec.spec_hash() => f,
            _ => {
                plan.insert(w.clone(), entry.clone());
                continue;
            }
        };
        let restore = records
            .get(w)
            .and_then(|r| r.last_healthy.as_ref())
            .filter(|s| s.spec_hash() != failed.spec_hash);
        match restore {
            Some(spec) => {
                plan.insert(w.clone(), DesiredEntry::Valid(spec.clone()));
                held.insert(
                    w.clone(),
                    Held::Restored {
                        failed: failed.clone(),
                        spec: spec.clone(),
                    },
                );
            }
            None => {
                held.insert(
                    w.clone(),
                    Held::Stopped {
                        failed: failed.clone(),
                    },
                );
            }
        }
    }
    (plan, held)
}

/// Drops what no longer applies: a `failed` record whose spec is no longer
/// the desired one (the desired spec changed: the new one is tried), and
/// the records of workloads no longer desired. True when anything changed.
pub(super) fn forget_stale(
    desired: &DesiredMap,
    records: &mut BTreeMap<WorkloadName, WorkloadHealthRecord>,
) -> bool {
    let before = records.clone();
    records.retain(|w, _| desired.contains_key(w));
    for (w, r) in records.iter_mut() {
        let still = match (desired.get(w), &r.failed) {
            (Some(DesiredEntry::Valid(spec)), Some(f)) => f.spec_hash == spec.spec_hash(),
            _ => false,
        };
        if !still {
            r.failed = None;
        }
    }
    records.retain(|_, r| !r.is_empty());
    *records != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::test_support::{spec, w};
    use fleet_common::contracts::RevertReason;

    fn failed(s: &WorkloadSpec) -> FailedSpec {
        FailedSpec {
            spec_hash: s.spec_hash(),
            reason: RevertReason::CrashLoop,
            detail: None,
            at: Timestamp::from_unix_millis(1),
            restored_spec_hash: None,
        }
    }

    #[test]
    fn a_failed_desired_spec_plans_as_its_last_healthy_one_or_not_at_all() {
        let good = spec("localhost/web:1");
        let bad = spec("localhost/web:2");
        let new_bad = spec("localhost/cam:2");
        let desired: DesiredMap = BTreeMap::from([
            (w("web"), DesiredEntry::Valid(bad.clone())),
            (w("cam"), DesiredEntry::Valid(new_bad.clone())),
            (w("db"), DesiredEntry::Valid(good.clone())),
        ]);
        let records = BTreeMap::from([
            (
                w("web"),
                WorkloadHealthRecord {
                    last_healthy: Some(good.clone()),
                    failed: Some(failed(&bad)),
                },
            ),
            (
                w("cam"),
                WorkloadHealthRecord {
                    last_healthy: None,
                    failed: Some(failed(&new_bad)),
                },
            ),
        ]);
        let (plan, held) = effective(&desired, &records);
        assert_eq!(
            plan.get(&w("web")),
            Some(&DesiredEntry::Valid(good.clone()))
        );
        assert_eq!(plan.get(&w("cam")), None, "left stopped");
        assert_eq!(plan.get(&w("db")), Some(&DesiredEntry::Valid(good.clone())));
        assert!(matches!(held.get(&w("web")), Some(Held::Restored { .. })));
        assert!(matches!(held.get(&w("cam")), Some(Held::Stopped { .. })));
        assert_eq!(held.len(), 2);
        // The desired spec changes: the failure is forgotten, the new one tried.
        let mut records = records;
        let changed: DesiredMap = BTreeMap::from([
            (w("web"), DesiredEntry::Valid(spec("localhost/web:3"))),
            (w("cam"), DesiredEntry::Valid(new_bad.clone())),
        ]);
        assert!(forget_stale(&changed, &mut records));
        assert_eq!(
            records.get(&w("web")).map(|r| r.failed.is_none()),
            Some(true)
        );
        assert_eq!(
            records.get(&w("web")).and_then(|r| r.last_healthy.clone()),
            Some(good),
            "the last healthy spec stays"
        );
        assert!(records.get(&w("cam")).is_some_and(|r| r.failed.is_some()));
        assert!(!forget_stale(&changed, &mut records), "nothing more");
    }

    #[test]
    fn applied_json_keeps_only_specs_every_agent_reads_and_a_later_one_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.agent_state_dir()).expect("state dir");
        let files = StateFiles::new(&layout);
        let plain = spec("localhost/db:1");
        let health = WorkloadSpec::from_json(
            br#"{"image":"localhost/web:1","health":{"healthy-after-secs":1}}"#,
        )
        .expect("spec");
        let applied = BTreeMap::from([(w("db"), plain.clone()), (w("web"), health.clone())]);
        let records = BTreeMap::from([(
            w("web"),
            WorkloadHealthRecord {
                last_healthy: Some(health.clone()),
                failed: None,
            },
        )]);
        files.write(&applied, &records).expect("written");
        let old: AppliedSpecs =
            serde_json::from_slice(&std::fs::read(layout.applied_specs()).expect("read"))
                .expect("the 0.2 shape");
        assert_eq!(old.workloads, BTreeMap::from([(w("db"), plain.clone())]));
        let back = files.load();
        assert_eq!(back.applied, applied, "the whole record");
        assert_eq!(back.records, records);
        // Another agent writes applied.json later: its specs count.
        let later = AppliedSpecs {
            format: 1,
            workloads: BTreeMap::from([(w("cam"), plain.clone())]),
            written_at: Timestamp::from_unix_millis(old.written_at.unix_millis() + 1),
        };
        std::fs::write(
            layout.applied_specs(),
            serde_json::to_vec(&later).expect("json"),
        )
        .expect("write");
        let back = files.load();
        assert_eq!(back.applied, later.workloads);
        assert_eq!(back.records, records, "the health records stay");
    }
}
