//! What an agent with Podman disabled (`podman.enabled: false`) reports for
//! its desired workloads: each one as `pending`, with the reason it is not
//! run, and an invalid value as `invalid`. Nothing is ever run; the report
//! tells the operator that the device read the change, and why nothing
//! follows, instead of leaving `<device>.workloads` silent.

use std::collections::BTreeMap;

use fleet_common::contracts::{WorkloadState, WorkloadStatus, WorkloadsReport};
use fleet_common::time::Timestamp;
use fleet_common::validate::{BoundedText, WorkloadName};

use crate::desired::{DesiredChange, DesiredEntry, DesiredMap};

/// The reason every desired workload of such a device gives.
pub const NOT_RUN: &str = "not run: Podman is disabled in this agent's config (podman.enabled)";

/// Follows the desired state and reports it, one report per change.
pub struct DisabledReporter {
    desired: Option<DesiredMap>,
    last: Option<BTreeMap<WorkloadName, WorkloadStatus>>,
    report: Box<dyn FnMut(WorkloadsReport) + Send>,
}

impl std::fmt::Debug for DisabledReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisabledReporter")
            .field("desired", &self.desired)
            .finish_non_exhaustive()
    }
}

impl DisabledReporter {
    pub fn new(report: Box<dyn FnMut(WorkloadsReport) + Send>) -> Self {
        Self {
            desired: None,
            last: None,
            report,
        }
    }

    /// Applies one change of the desired state and reports the result when
    /// it differs from the last report.
    pub fn apply(&mut self, change: DesiredChange) {
        match change {
            DesiredChange::Snapshot(map) => self.desired = Some(map),
            // INVARIANT (as in the reconciler): a snapshot comes first; a
            // delta before it is ignored.
            DesiredChange::Put(w, entry) => {
                if let Some(d) = self.desired.as_mut() {
                    d.insert(w, entry);
                }
            }
            DesiredChange::Delete(w) => {
                if let Some(d) = self.desired.as_mut() {
                    d.remove(&w);
                }
            }
        }
        let Some(desired) = &self.desired else {
            return;
        };
        let mut workloads = BTreeMap::new();
        for (w, entry) in desired {
            let (state, image, hash, error) = match entry {
                DesiredEntry::Valid(spec) => (
                    WorkloadState::Pending,
                    Some(spec.image.clone()),
                    spec.spec_hash(),
                    NOT_RUN.to_owned(),
                ),
                DesiredEntry::Invalid {
                    error,
                    value_hash,
                    image,
                } => (
                    WorkloadState::Invalid,
                    image.clone(),
                    value_hash.clone(),
                    error.clone(),
                ),
            };
            // A value naming no valid image cannot be reported (the report
            // requires one); the reconciler skips it the same way.
            let Some(image) = image else { continue };
            // An unchanged entry keeps its `since`.
            let since = self
                .last
                .as_ref()
                .and_then(|l| l.get(w))
                .filter(|s| s.spec_hash == hash && s.state == state)
                .map_or_else(Timestamp::now, |s| s.since);
            workloads.insert(
                w.clone(),
                WorkloadStatus {
                    state,
                    image,
                    spec_hash: hash,
                    container_id: None,
                    restarts: 0,
                    last_error: Some(BoundedText::truncate(error)),
                    since,
                    waiting: None,
                },
            );
        }
        if self.last.as_ref() != Some(&workloads) {
            self.last = Some(workloads.clone());
            (self.report)(WorkloadsReport {
                workloads,
                observed_at: Timestamp::now(),
                podman_unreachable: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::decode_value;
    use std::sync::mpsc;

    fn name(s: &str) -> WorkloadName {
        WorkloadName::parse(s).expect("name")
    }

    #[test]
    fn desired_workloads_are_reported_pending_with_the_reason_and_invalid_ones_as_such() {
        let (tx, rx) = mpsc::channel();
        let mut r = DisabledReporter::new(Box::new(move |report| {
            let _ = tx.send(report);
        }));
        let web = decode_value(br#"{"image":"docker.io/library/busybox:1.36"}"#);
        let DesiredEntry::Valid(spec) = &web else {
            panic!("a valid spec: {web:?}")
        };
        let hash = spec.spec_hash();

        r.apply(DesiredChange::Put(name("early"), web.clone()));
        assert!(rx.try_recv().is_err(), "nothing before the snapshot");

        r.apply(DesiredChange::Snapshot(DesiredMap::new()));
        assert!(rx.try_recv().expect("empty report").workloads.is_empty());

        r.apply(DesiredChange::Put(name("web"), web.clone()));
        let report = rx.try_recv().expect("report");
        let s = &report.workloads[&name("web")];
        assert_eq!(s.state, WorkloadState::Pending);
        assert_eq!(s.spec_hash, hash);
        assert_eq!(s.last_error.as_ref().map(|e| e.as_str()), Some(NOT_RUN));
        assert_eq!(report.ready(), (0, 1));

        r.apply(DesiredChange::Put(name("web"), web));
        assert!(
            rx.try_recv().is_err(),
            "an unchanged state is not reported again"
        );

        r.apply(DesiredChange::Put(
            name("bad"),
            decode_value(br#"{"image":"docker.io/library/busybox:1.36","bogus":1}"#),
        ));
        let report = rx.try_recv().expect("report");
        assert_eq!(report.workloads[&name("bad")].state, WorkloadState::Invalid);

        r.apply(DesiredChange::Delete(name("web")));
        r.apply(DesiredChange::Delete(name("bad")));
        let last = rx.try_iter().last().expect("reports");
        assert!(last.workloads.is_empty());
    }
}
