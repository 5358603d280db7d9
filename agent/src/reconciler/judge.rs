//! The reconciler's health step, run in every pass after the workload
//! observation and on every probe result: the [`Health`] of each
//! workload's container brought up to date, the probe targets sent to
//! `agent-probe`, the last healthy spec recorded, a new spec's trial
//! judged (a failed one becomes a `failed` record: the revert), and the
//! health report sent when it changed.
//!
//! During a change freeze trials are not judged (nothing is reverted);
//! health is still observed and reported, and a spec that becomes healthy
//! is still recorded as the last healthy one. At the first pass after the
//! unfreeze, a trial whose deadline passed meanwhile is judged at once.

use std::collections::BTreeMap;
use std::time::Instant;

use fleet_common::contracts::{
    FailedSpec, HealthCheck, HealthReport, HealthState, Revert, WorkloadHealth, WorkloadSpec,
};
use fleet_common::validate::{BoundedText, Sha256Hex, WorkloadName};
use fleet_common::Timestamp;

use super::health::{Health, Seen};
use super::records::Held;
use super::{unix_now, Reconciler, Report};
use crate::desired::{DesiredEntry, DesiredMap};
use crate::podman::{LiveContainer, LiveState};
use crate::prober::{ProbeOutcome, ProbeTarget};

/// A workload's health as compared for "changed".
type HealthKey = (WorkloadName, WorkloadHealth);

/// Whether trials may be judged now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judging {
    On,
    /// A change freeze: nothing is reverted.
    Frozen,
}

/// The first 12 digits of a spec hash, for messages.
pub(super) fn short(hash: &Sha256Hex) -> String {
    hash.as_str().chars().take(12).collect()
}

impl Reconciler {
    /// The spec with `hash` among those known for `w` (the view's, the
    /// applied one, the last healthy one).
    fn known_spec(&self, w: &WorkloadName, hash: &str, view: &DesiredMap) -> Option<WorkloadSpec> {
        let candidates = [
            match view.get(w) {
                Some(DesiredEntry::Valid(s)) => Some(s),
                _ => None,
            },
            self.applied.get(w),
            self.records.get(w).and_then(|r| r.last_healthy.as_ref()),
        ];
        candidates
            .into_iter()
            .flatten()
            .find(|s| s.spec_hash().as_str() == hash)
            .cloned()
    }

    /// Brings every workload's health up to date from `live`, for the
    /// workloads of `view` (what the reconciler aims to run); judges
    /// trials unless frozen. True when a trial failed (the caller plans
    /// again: the revert).
    pub(super) fn judge(
        &mut self,
        view: &DesiredMap,
        live: &[LiveContainer],
        judging: Judging,
    ) -> bool {
        let now = Instant::now();
        let unix = unix_now();
        self.health.retain(|w, _| view.contains_key(w));
        let mut reverted = false;
        let mut records_changed = false;
        for (w, entry) in view {
            let mine: Vec<&LiveContainer> = live
                .iter()
                .filter(|c| c.workload.as_ref() == Some(w))
                .collect();
            // The spec judged: the view's; for an invalid value, whatever runs.
            let (hash, spec) = match entry {
                DesiredEntry::Valid(spec) => (spec.spec_hash(), Some(spec.clone())),
                DesiredEntry::Invalid { .. } => {
                    let Some(h) = mine
                        .iter()
                        .min_by_key(|c| c.state != LiveState::Running)
                        .and_then(|c| c.spec_hash.as_deref())
                        .and_then(|h| Sha256Hex::parse(h).ok())
                    else {
                        continue;
                    };
                    let spec = self.known_spec(w, h.as_str(), view);
                    (h, spec)
                }
            };
            let check = spec
                .as_ref()
                .and_then(|s| s.health.clone())
                .unwrap_or_else(HealthCheck::default);
            let container = mine
                .iter()
                .filter(|c| c.spec_hash.as_deref() == Some(hash.as_str()))
                .min_by_key(|c| c.state != LiveState::Running)
                .copied();
            let h = self
                .health
                .entry(w.clone())
                .or_insert_with(|| Health::new(hash.clone(), check.clone()));
            if h.spec_hash != hash {
                h.switch(hash.clone(), check);
            }
            h.observe(Seen::of(container), unix, now);
            let Some(spec) = spec else {
                continue;
            };
            if h.state == HealthState::Healthy {
                records_changed |= self.note_healthy(w, &spec);
                continue;
            }
            let record = self.records.entry(w.clone()).or_default();
            let last_healthy = record.last_healthy.as_ref().map(WorkloadSpec::spec_hash);
            let on_trial = matches!(entry, DesiredEntry::Valid(_))
                && last_healthy.as_ref() != Some(&hash)
                && record.failed.is_none()
                && judging == Judging::On;
            if !on_trial {
                continue;
            }
            if let Some(v) = h.trial_verdict(unix) {
                let restored = last_healthy.filter(|l| *l != hash);
                match &restored {
                    Some(r) => {
                        log::error!(device = self.device.as_str(), workload = w.as_str(); "spec {} failed ({}: {}); reverting to the last healthy spec {}", short(&hash), v.reason.as_str(), v.detail, short(r))
                    }
                    None => {
                        log::error!(device = self.device.as_str(), workload = w.as_str(); "spec {} failed ({}: {}); no healthy spec to go back to: leaving it stopped until the desired spec changes", short(&hash), v.reason.as_str(), v.detail)
                    }
                }
                record.failed = Some(FailedSpec {
                    spec_hash: hash.clone(),
                    reason: v.reason,
                    detail: Some(BoundedText::truncate(v.detail)),
                    at: Timestamp::now(),
                    restored_spec_hash: restored,
                });
                records_changed = true;
                reverted = true;
            }
        }
        self.records.retain(|_, r| !r.is_empty());
        if records_changed {
            // INVARIANT: the failed record is on disk before anything of
            // the revert is done (see `records`).
            self.persist();
        }
        self.send_probe_targets();
        self.send_health_report();
        reverted
    }

    /// Makes `spec`, found healthy, the one `w` goes back to (in memory:
    /// the caller persists when this says it changed anything).
    fn note_healthy(&mut self, w: &WorkloadName, spec: &WorkloadSpec) -> bool {
        let hash = spec.spec_hash();
        let record = self.records.entry(w.clone()).or_default();
        if record.last_healthy.as_ref().map(WorkloadSpec::spec_hash) == Some(hash.clone()) {
            return false;
        }
        log::info!(device = self.device.as_str(), workload = w.as_str(); "spec {} is healthy: the one to go back to from now on", short(&hash));
        record.last_healthy = Some(spec.clone());
        true
    }

    /// A probe answered: true when the workload's health changed (a pass
    /// then judges it and plans what follows). A spec found healthy is
    /// recorded as the one to go back to at once, not at the next pass: a
    /// new desired spec may arrive before it, and the next pass judges
    /// that one.
    pub(super) fn probed(&mut self, outcome: ProbeOutcome) -> bool {
        let Some(h) = self.health.get_mut(&outcome.workload) else {
            return false;
        };
        if h.spec_hash != outcome.spec_hash {
            return false;
        }
        let before = h.state;
        let said = format!(
            "{} in {} ms: {}",
            if outcome.result.ok {
                "passed"
            } else {
                "failed"
            },
            outcome.result.took_ms,
            outcome
                .result
                .detail
                .as_ref()
                .map(BoundedText::as_str)
                .unwrap_or("")
        );
        if !h.probed(&outcome.container_id, outcome.result, Instant::now()) {
            log::debug!(device = self.device.as_str(), workload = outcome.workload.as_str(); "a probe of a container no longer judged {said}");
            return false;
        }
        let changed = h.state != before;
        let healthy = h.state == HealthState::Healthy;
        if changed {
            log::info!(device = self.device.as_str(), workload = outcome.workload.as_str(); "spec {} is {} (its probe {said})", short(&outcome.spec_hash), h.state);
        } else {
            log::debug!(device = self.device.as_str(), workload = outcome.workload.as_str(); "probe {said}");
        }
        if changed && healthy {
            let desired = self.desired.clone().unwrap_or_default();
            if let Some(spec) =
                self.known_spec(&outcome.workload, outcome.spec_hash.as_str(), &desired)
            {
                if self.note_healthy(&outcome.workload, &spec) {
                    self.persist();
                }
            }
        }
        self.send_health_report();
        changed
    }

    /// When a pass is due for health without other news: the earliest
    /// deadline or healthy-after moment of a workload not yet healthy
    /// (unix seconds).
    pub(super) fn next_health_look(&self) -> Option<i64> {
        self.health
            .iter()
            .filter_map(|(w, h)| {
                let record = self.records.get(w);
                let on_trial = !record.is_some_and(|r| {
                    r.failed.is_some()
                        || r.last_healthy
                            .as_ref()
                            .map(WorkloadSpec::spec_hash)
                            .as_ref()
                            == Some(&h.spec_hash)
                });
                h.next_look(on_trial)
            })
            .min()
    }

    /// Sends `agent-probe` the containers to probe, when they changed.
    pub(super) fn send_probe_targets(&mut self) {
        let targets: Vec<ProbeTarget> = self
            .health
            .iter()
            .filter_map(|(w, h)| {
                let probe = h.check().probe.clone()?;
                let container_id = h.container_id()?.to_owned();
                if h.state == HealthState::Unhealthy && h.last_probe.is_none() {
                    // Down, never probed: nothing to ask.
                    return None;
                }
                Some(ProbeTarget {
                    workload: w.clone(),
                    spec_hash: h.spec_hash.clone(),
                    container_id,
                    probe,
                    interval: std::time::Duration::from_secs(u64::from(h.check().interval_secs)),
                    timeout: std::time::Duration::from_secs(u64::from(h.check().timeout_secs)),
                })
            })
            .collect();
        if self.probe_targets.as_ref() == Some(&targets) {
            return;
        }
        if let Some(p) = &self.prober {
            p.set_targets(targets.clone());
        }
        self.probe_targets = Some(targets);
    }

    /// Sends the health report when it differs from the last one sent.
    pub(super) fn send_health_report(&mut self) {
        let now = Instant::now();
        let mut workloads = BTreeMap::new();
        let held = &self.held;
        for (w, h) in self.health.iter_mut() {
            let restarts_last_hour = h.restarts_last_hour(now);
            let (health, spec_hash, reverted) = match held.get(w) {
                Some(Held::Restored { failed, spec }) => (
                    h.state,
                    h.spec_hash.clone(),
                    Some(Revert {
                        failed_spec_hash: failed.spec_hash.clone(),
                        restored_spec_hash: spec.spec_hash(),
                        reason: failed.reason,
                        detail: failed.detail.clone(),
                        at: failed.at,
                    }),
                ),
                Some(Held::Stopped { failed }) => {
                    (HealthState::Unhealthy, failed.spec_hash.clone(), None)
                }
                None => (h.state, h.spec_hash.clone(), None),
            };
            workloads.insert(
                w.clone(),
                WorkloadHealth {
                    health,
                    spec_hash,
                    last_probe: h.last_probe.clone(),
                    restarts_last_hour,
                    reverted,
                    since: h.since,
                },
            );
        }
        // Held workloads left stopped have no container to follow.
        for (w, held) in held {
            if let (Held::Stopped { failed }, false) = (held, workloads.contains_key(w)) {
                workloads.insert(
                    w.clone(),
                    WorkloadHealth {
                        health: HealthState::Unhealthy,
                        spec_hash: failed.spec_hash.clone(),
                        last_probe: None,
                        restarts_last_hour: 0,
                        reverted: None,
                        since: failed.at,
                    },
                );
            }
        }
        // Written on change, and a probe that says what the last one said
        // is no change: its time and duration alone do not make a write
        // (a probe every 10 s would otherwise be a write every 10 s).
        let key = |m: &BTreeMap<WorkloadName, WorkloadHealth>| -> Vec<HealthKey> {
            m.iter()
                .map(|(w, h)| {
                    let mut h = h.clone();
                    if let Some(p) = &mut h.last_probe {
                        p.at = Timestamp::from_unix_millis(0);
                        p.took_ms = 0;
                        p.detail = None;
                    }
                    (w.clone(), h)
                })
                .collect()
        };
        if self.last_health.as_ref().map(key) == Some(key(&workloads)) {
            return;
        }
        self.last_health = Some(workloads.clone());
        (self.report)(Report::Health(HealthReport {
            workloads,
            observed_at: Timestamp::now(),
        }));
    }
}
