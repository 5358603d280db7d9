//! Observation: the bookkeeping of each desired workload (restarts,
//! back-off, last error, state and since when) updated from live state,
//! and the workload report built from it and sent when it changed; the
//! settled list that lets an idle resync skip `podman ps`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    ImageRef, PodmanUnreachable, WorkloadSpec, WorkloadState, WorkloadStatus, WorkloadsReport,
};
use fleet_common::process::{bounded_text, MAX_LOG_TEXT_BYTES};
use fleet_common::validate::{BoundedText, Sha256Hex, WorkloadName};
use fleet_common::Timestamp;

use super::backoff::{up_long_enough, Backoff};
use super::judge::short;
use super::plan::frozen_view;
use super::records::Held;
use super::{unix_now, waiting_changes, Reconciler, Report};
use crate::desired::{DesiredEntry, DesiredMap};
use crate::gate::Admission;
use crate::podman::{LiveContainer, LiveState, ProcessIdentity};

/// Bookkeeping of one desired workload.
#[derive(Debug, Clone)]
pub(super) struct Tracked {
    /// The spec hash (or, for an invalid value, the value hash) this
    /// bookkeeping is about; a new one starts it over.
    pub(super) hash: Sha256Hex,
    pub(super) restarts: u32,
    pub(super) last_error: Option<String>,
    pub(super) backoff: Backoff,
    pub(super) last_restore: Option<Instant>,
    pub(super) state: WorkloadState,
    pub(super) since: Timestamp,
}

impl Tracked {
    pub(super) fn new(hash: Sha256Hex) -> Self {
        Self {
            hash,
            restarts: 0,
            last_error: None,
            backoff: Backoff::default(),
            last_restore: None,
            state: WorkloadState::Pending,
            since: Timestamp::now(),
        }
    }
}

/// Live state as the last pass left it when it had nothing to do and
/// nothing backing off: the list, and the main process of every container,
/// all up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Settled {
    pub(super) at: Instant,
    pub(super) live: Vec<LiveContainer>,
    pub(super) processes: Vec<ProcessIdentity>,
}

impl Settled {
    /// `None` unless every container is running (or paused) with a
    /// process to watch.
    pub(super) fn of(live: &[LiveContainer], at: Instant) -> Option<Settled> {
        let processes = live
            .iter()
            .map(LiveContainer::main_process)
            .collect::<Option<Vec<_>>>()?;
        Some(Settled {
            at,
            live: live.to_vec(),
            processes,
        })
    }

    /// Nothing to re-read: younger than `full_every`, and every process is
    /// still the one seen.
    pub(super) fn holds(&self, now: Instant, full_every: Duration) -> bool {
        now.duration_since(self.at) < full_every
            && self.processes.iter().all(ProcessIdentity::is_alive)
    }
}

impl Reconciler {
    /// The report while Podman does not answer: workloads seen before are
    /// `unknown`, desired specs not applied wait (`pending`, with why),
    /// invalid ones stay `invalid`. During a freeze, what runs as
    /// [`frozen_view`] says and the waiting count is kept.
    pub(super) fn observe_unreachable(&mut self) {
        let Some(desired) = self.desired.take() else {
            return;
        };
        let view = if self.gate.admission() == Admission::Frozen {
            self.freeze
                .set_waiting_changes(waiting_changes(&desired, &self.applied));
            frozen_view(&desired, &self.applied)
        } else {
            desired.clone()
        };
        self.desired = Some(desired);
        let why = self
            .podman_down
            .as_ref()
            .map(|d| format!("Podman unreachable: {}", d.error))
            .unwrap_or_default();
        self.tracked.retain(|w, _| view.contains_key(w));
        let mut report = BTreeMap::new();
        for (w, entry) in &view {
            let hash = match entry {
                DesiredEntry::Valid(spec) => spec.spec_hash(),
                DesiredEntry::Invalid { value_hash, .. } => value_hash.clone(),
            };
            let t = self
                .tracked
                .entry(w.clone())
                .or_insert_with(|| Tracked::new(hash.clone()));
            if t.hash != hash {
                *t = Tracked::new(hash.clone());
            }
            let (state, image, last_error, waiting) = match entry {
                DesiredEntry::Valid(spec) => {
                    let applied =
                        self.applied.get(w).map(WorkloadSpec::spec_hash) == Some(hash.clone());
                    let state = if applied || t.state != WorkloadState::Pending {
                        WorkloadState::Unknown
                    } else {
                        WorkloadState::Pending
                    };
                    (
                        state,
                        Some(spec.image.clone()),
                        t.last_error.clone(),
                        (!applied).then(|| why.clone()),
                    )
                }
                DesiredEntry::Invalid { error, image, .. } => (
                    WorkloadState::Invalid,
                    image.clone(),
                    Some(error.clone()),
                    None,
                ),
            };
            if t.state != state {
                t.state = state;
                t.since = Timestamp::now();
            }
            let Some(image) = image else {
                continue;
            };
            report.insert(
                w.clone(),
                WorkloadStatus {
                    state,
                    image,
                    spec_hash: hash,
                    container_id: None,
                    restarts: t.restarts,
                    last_error: last_error.map(BoundedText::truncate),
                    since: t.since,
                    waiting: waiting.map(BoundedText::truncate),
                },
            );
        }
        self.send_report(report);
    }

    /// Sends the workload report when it differs from the last one sent.
    pub(super) fn send_report(&mut self, workloads: BTreeMap<WorkloadName, WorkloadStatus>) {
        let podman_unreachable = self.podman_down.as_ref().map(|d| PodmanUnreachable {
            since: d.since,
            error: BoundedText::truncate(&d.error),
        });
        let now = (workloads, podman_unreachable);
        if self.last_reported.as_ref() != Some(&now) {
            self.last_reported = Some(now.clone());
            (self.report)(Report::Workloads(WorkloadsReport {
                workloads: now.0,
                observed_at: Timestamp::now(),
                podman_unreachable: now.1,
            }));
        }
    }

    /// Updates the bookkeeping from live state and sends the workload
    /// report when it changed.
    pub(super) fn observe(&mut self, desired: &DesiredMap, live: &[LiveContainer], now: Instant) {
        self.tracked.retain(|w, _| desired.contains_key(w));
        self.removal_backoff
            .retain(|id, _| live.iter().any(|c| &c.id == id));
        let unix = unix_now();
        let mut report = BTreeMap::new();
        for (w, entry) in desired {
            let hash = match entry {
                DesiredEntry::Valid(spec) => spec.spec_hash(),
                DesiredEntry::Invalid { value_hash, .. } => value_hash.clone(),
            };
            let t = self
                .tracked
                .entry(w.clone())
                .or_insert_with(|| Tracked::new(hash.clone()));
            if t.hash != hash {
                *t = Tracked::new(hash.clone());
            }
            let mine: Vec<&LiveContainer> = live
                .iter()
                .filter(|c| c.workload.as_ref() == Some(w))
                .collect();
            let (state, image, container, last_error) = match entry {
                DesiredEntry::Valid(spec) => {
                    let matching = mine
                        .iter()
                        .filter(|c| c.spec_hash.as_deref() == Some(hash.as_str()))
                        .min_by_key(|c| c.state != LiveState::Running)
                        .copied();
                    let state = match matching.map(|c| &c.state) {
                        Some(LiveState::Running) | Some(LiveState::Paused) => {
                            let up = matching.map_or(0, |c| unix.saturating_sub(c.started_at));
                            if up_long_enough(up) {
                                t.backoff.clear();
                            }
                            WorkloadState::Running
                        }
                        _ if t.backoff.blocks(now) && t.last_error.is_some() => {
                            WorkloadState::BackOff
                        }
                        Some(LiveState::Down(_)) => WorkloadState::Exited,
                        None if t.backoff.blocks(now) => WorkloadState::BackOff,
                        None => WorkloadState::Pending,
                    };
                    (
                        state,
                        Some(spec.image.clone()),
                        matching,
                        t.last_error.clone(),
                    )
                }
                DesiredEntry::Invalid { error, image, .. } => {
                    let c = mine.first().copied();
                    let live_image = c.and_then(|c| ImageRef::parse(&c.image).ok());
                    (
                        WorkloadState::Invalid,
                        live_image.or_else(|| image.clone()),
                        c,
                        Some(error.clone()),
                    )
                }
            };
            if t.state != state {
                t.state = state;
                t.since = Timestamp::now();
            }
            let Some(image) = image else {
                let why = bounded_text(
                    last_error.unwrap_or_default().as_bytes(),
                    MAX_LOG_TEXT_BYTES,
                );
                log::error!(device = self.device.as_str(), workload = w.as_str(); "not reporting the workload: its value names no valid image ({why})");
                continue;
            };
            report.insert(
                w.clone(),
                WorkloadStatus {
                    state,
                    image,
                    spec_hash: hash,
                    container_id: container.map(LiveContainer::short_id),
                    restarts: t.restarts,
                    last_error: last_error.map(BoundedText::truncate),
                    since: t.since,
                    waiting: None,
                },
            );
        }
        self.describe_held(&mut report);
        self.send_report(report);
    }

    /// Says, in the 0.2 vocabulary of the workload report, what a failed
    /// spec left: the restored spec `running`, its `last-error` saying it
    /// was reverted and why; a workload never healthy `back-off`, left
    /// stopped, saying why. (During a freeze the failed spec may still
    /// run: the report says what runs, and the note what follows.)
    fn describe_held(&self, report: &mut BTreeMap<WorkloadName, WorkloadStatus>) {
        for (w, held) in &self.held {
            let Some(r) = report.get_mut(w) else {
                continue;
            };
            let f = held.failed();
            let why = format!(
                "{}: {}",
                f.reason.as_str(),
                f.detail.as_ref().map(BoundedText::as_str).unwrap_or("")
            );
            let note = match held {
                Held::Restored { spec, .. } if r.spec_hash == spec.spec_hash() => format!(
                    "reverted: desired spec {} did not become healthy ({why}); running the last healthy spec {}; the failed spec is not tried again until the desired spec changes",
                    short(&f.spec_hash),
                    short(&r.spec_hash)
                ),
                Held::Restored { spec, .. } => format!(
                    "desired spec {} did not become healthy ({why}); the last healthy spec {} is put back after the change freeze",
                    short(&f.spec_hash),
                    short(&spec.spec_hash())
                ),
                Held::Stopped { .. } if r.state == WorkloadState::Running => format!(
                    "desired spec {} did not become healthy ({why}); it has no healthy spec to go back to and is stopped after the change freeze",
                    short(&f.spec_hash)
                ),
                Held::Stopped { .. } => {
                    if r.state != WorkloadState::BackOff {
                        r.state = WorkloadState::BackOff;
                    }
                    r.container_id = None;
                    format!(
                        "left stopped: desired spec {} did not become healthy ({why}) and the workload has no healthy spec to go back to; it is not tried again until the desired spec changes",
                        short(&f.spec_hash)
                    )
                }
            };
            r.last_error = Some(BoundedText::truncate(note));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::test_support::container;

    #[test]
    fn a_settled_state_holds_while_every_process_lives_and_not_past_the_full_resync() {
        let now = Instant::now();
        let me = std::process::id();
        let mut up = container("1", "web", "h", LiveState::Running);
        up.pid = me;
        let settled = Settled::of(&[up.clone()], now).expect("one live process");
        assert_eq!(settled.live, vec![up.clone()], "the list is kept");
        let every = Duration::from_secs(300);
        assert!(settled.holds(now + Duration::from_secs(30), every));
        assert!(!settled.holds(now + every, every), "a full re-read is due");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let mut other = container("2", "db", "h", LiveState::Paused);
        other.pid = child.id();
        let settled = Settled::of(&[up.clone(), other], now).expect("two live processes");
        assert!(settled.holds(now, every));
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert!(!settled.holds(now, every), "a container's process is gone");
        // Nothing to watch for an exited container, or one without a pid:
        // no settled state, so every resync re-reads.
        let down = container("3", "cam", "h", LiveState::Down("exited".into()));
        assert_eq!(Settled::of(&[up.clone(), down], now), None);
        assert_eq!(
            Settled::of(&[container("4", "x", "h", LiveState::Running)], now),
            None
        );
        assert_eq!(
            Settled::of(&[], now),
            Some(Settled {
                at: now,
                live: vec![],
                processes: vec![]
            })
        );
    }
}
