//! Health of the container each workload runs, judged in memory from what
//! the reconciler observes (the container's start time, its state) and
//! what the prober answers; and the verdict on a new spec's trial.
//!
//! Per workload, one [`Health`] follows the spec hash whose container the
//! workload runs (after a revert, the restored one); a new hash starts it
//! over, except the restarts of the last hour, which are the workload's.
//!
//! - Without a probe: `healthy` once the container has been up
//!   `healthy-after-secs` since its last start (Podman's start time, so an
//!   agent restart does not reset it).
//! - With a probe: `healthy` on a passing probe; `unhealthy` after
//!   `retries` failures in a row, those in the `start-period-secs` after
//!   the start not counted.
//! - A container seen with another start time than before was restarted
//!   (by Podman's restart policy or by the reconciler): the state starts
//!   over (`starting`), and the restart is counted.
//! - A container down is `unhealthy`; none at all (being created) is
//!   `starting`.
//!
//! A spec on trial (desired, not the last healthy, not failed, not
//! frozen) gets a verdict from [`Health::trial_verdict`]: it fails once it
//! restarted [`MAX_RESTARTS_BEFORE_REVERT`] times before it was ever
//! healthy, once its probe has failed `retries` times in a row, or once
//! `deadline-secs` have passed since its first start (or since its first
//! attempt to start, when it never ran) without it being healthy.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use fleet_common::contracts::{HealthCheck, HealthState, ProbeResult, RevertReason};
use fleet_common::limits::MAX_RESTARTS_BEFORE_REVERT;
use fleet_common::validate::Sha256Hex;
use fleet_common::Timestamp;

use crate::podman::{LiveContainer, LiveState};

/// Restarts are counted over this window for the report.
pub(super) const RESTART_WINDOW: Duration = Duration::from_secs(3600);

/// A container as the health bookkeeping sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen<'a> {
    /// Running or paused, with its id and start time (unix seconds).
    Up {
        id: &'a str,
        started_at: i64,
    },
    Down {
        id: &'a str,
    },
    /// No container of the spec.
    None,
}

impl<'a> Seen<'a> {
    pub(super) fn of(c: Option<&'a LiveContainer>) -> Self {
        match c {
            Some(c) if matches!(c.state, LiveState::Running | LiveState::Paused) => Self::Up {
                id: &c.id,
                started_at: c.started_at,
            },
            Some(c) => Self::Down { id: &c.id },
            None => Self::None,
        }
    }
}

/// Why a trial failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Verdict {
    pub(super) reason: RevertReason,
    pub(super) detail: String,
}

/// The health of one workload's container; see the module doc.
#[derive(Debug, Clone)]
pub(super) struct Health {
    pub(super) spec_hash: Sha256Hex,
    check: HealthCheck,
    /// The container judged and its last start seen (`None` until `ps`
    /// says, for a container the reconciler just created).
    container: Option<(String, Option<i64>)>,
    /// When the current start was first seen (start periods count from it).
    up_since: Option<Instant>,
    pub(super) state: HealthState,
    pub(super) since: Timestamp,
    pub(super) last_probe: Option<ProbeResult>,
    failures: u32,
    ever_healthy: bool,
    /// The spec's first start seen, or its first attempt to start (unix s).
    trial_clock: Option<i64>,
    ever_up: bool,
    /// A container of the spec was seen before (so another one is a
    /// replacement, even after a look that found none).
    had_container: bool,
    restarts_of_spec: u32,
    /// The workload's restarts, any spec, within [`RESTART_WINDOW`].
    restarts: VecDeque<Instant>,
}

impl Health {
    pub(super) fn new(spec_hash: Sha256Hex, check: HealthCheck) -> Self {
        Self {
            spec_hash,
            check,
            container: None,
            up_since: None,
            state: HealthState::Starting,
            since: Timestamp::now(),
            last_probe: None,
            failures: 0,
            ever_healthy: false,
            trial_clock: None,
            ever_up: false,
            had_container: false,
            restarts_of_spec: 0,
            restarts: VecDeque::new(),
        }
    }

    /// Starts over for another spec, keeping the workload's restarts.
    pub(super) fn switch(&mut self, spec_hash: Sha256Hex, check: HealthCheck) {
        let restarts = std::mem::take(&mut self.restarts);
        *self = Self::new(spec_hash, check);
        self.restarts = restarts;
    }

    pub(super) fn check(&self) -> &HealthCheck {
        &self.check
    }

    /// The container whose probe results count.
    pub(super) fn container_id(&self) -> Option<&str> {
        self.container.as_ref().map(|(id, _)| id.as_str())
    }

    fn set(&mut self, state: HealthState) {
        if self.state != state {
            self.state = state;
            self.since = Timestamp::now();
        }
    }

    /// The same container started again: it exited (a crash, or a stop
    /// by hand: the agent cannot tell), and counts against a trial.
    fn restarted(&mut self, now: Instant) {
        self.restarts_of_spec = self.restarts_of_spec.saturating_add(1);
        self.replaced(now);
    }

    /// Another container of the spec (the last one went missing: removed
    /// by hand, or recreated when it would not start): counted for the
    /// report, not against a trial.
    fn replaced(&mut self, now: Instant) {
        self.restarts.push_back(now);
        self.failures = 0;
        self.up_since = Some(now);
        self.set(HealthState::Starting);
    }

    /// Restarts within [`RESTART_WINDOW`] of `now`.
    pub(super) fn restarts_last_hour(&mut self, now: Instant) -> u32 {
        while self
            .restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) >= RESTART_WINDOW)
        {
            self.restarts.pop_front();
        }
        u32::try_from(self.restarts.len()).unwrap_or(u32::MAX)
    }

    /// The reconciler created (or started) the spec's container `id`, or
    /// tried to with the image local: the trial clock runs from now.
    pub(super) fn attempted(&mut self, id: Option<&str>, unix: i64, now: Instant) {
        self.trial_clock.get_or_insert(unix);
        if let Some(id) = id {
            if self.container_id() != Some(id) {
                if self.had_container {
                    self.replaced(now);
                }
                self.container = Some((id.to_owned(), None));
                self.had_container = true;
                self.up_since = Some(now);
            }
        }
    }

    /// Updates from what `ps` shows of the spec's container.
    pub(super) fn observe(&mut self, seen: Seen<'_>, unix: i64, now: Instant) {
        match seen {
            Seen::Up { id, started_at } => {
                let same_id = self.container_id() == Some(id);
                let known_start = self.container.as_ref().and_then(|(_, s)| *s);
                match (same_id, known_start) {
                    (true, Some(s)) if s == started_at => {}
                    // Created by us; ps tells its start now.
                    (true, None) => {}
                    (true, Some(_)) => self.restarted(now),
                    (false, _) if self.had_container => self.replaced(now),
                    (false, _) => self.up_since = Some(now),
                }
                self.container = Some((id.to_owned(), Some(started_at)));
                self.had_container = true;
                self.ever_up = true;
                self.trial_clock.get_or_insert(started_at);
                if self.check.probe.is_none() {
                    // Both clocks are whole seconds: a difference of
                    // `healthy-after + 1` is the first that proves the
                    // container ran `healthy-after` seconds (a start at
                    // 55.9 s seen at 56.0 s differs by 1).
                    let up = unix.saturating_sub(started_at);
                    if up > i64::from(self.check.healthy_after_secs) {
                        self.ever_healthy = true;
                        self.set(HealthState::Healthy);
                    } else {
                        self.set(HealthState::Starting);
                    }
                } else if self.state == HealthState::Unhealthy && self.failures == 0 {
                    // Was down; up again, waiting for a probe.
                    self.set(HealthState::Starting);
                }
            }
            Seen::Down { id } => {
                if self.container_id() != Some(id) {
                    if self.had_container {
                        self.replaced(now);
                    }
                    self.container = Some((id.to_owned(), None));
                }
                self.had_container = true;
                self.trial_clock.get_or_insert(unix);
                self.failures = 0;
                self.set(HealthState::Unhealthy);
            }
            Seen::None => {
                // Not created yet, or gone (removed by hand): it is
                // being (re)created.
                self.container = None;
                self.set(HealthState::Starting);
            }
        }
        self.restarts_last_hour(now);
    }

    /// A probe answered for this spec's container; false when it was for
    /// another container (a result from before a restart or replacement).
    pub(super) fn probed(&mut self, container_id: &str, result: ProbeResult, now: Instant) -> bool {
        if self.container_id() != Some(container_id) {
            return false;
        }
        let ok = result.ok;
        self.last_probe = Some(result);
        if ok {
            self.failures = 0;
            self.ever_healthy = true;
            self.set(HealthState::Healthy);
            return true;
        }
        let in_start_period = self.up_since.is_some_and(|t| {
            now.duration_since(t) < Duration::from_secs(u64::from(self.check.start_period_secs))
        });
        if !in_start_period {
            self.failures = self.failures.saturating_add(1);
            if self.failures >= self.check.retries {
                self.set(HealthState::Unhealthy);
            }
        }
        true
    }

    /// When the container needs looking at again without news (unix s):
    /// without a probe, the moment it will have run `healthy-after-secs`;
    /// for a spec `on_trial`, its deadline.
    pub(super) fn next_look(&self, on_trial: bool) -> Option<i64> {
        let deadline = self
            .trial_clock
            .filter(|_| on_trial && !self.ever_healthy)
            .map(|t| t.saturating_add(i64::from(self.check.deadline_secs())));
        let healthy_at = match (&self.check.probe, &self.container, self.state) {
            (None, Some((_, Some(started))), HealthState::Starting) => {
                Some(started.saturating_add(i64::from(self.check.healthy_after_secs) + 1))
            }
            _ => None,
        };
        [deadline, healthy_at].into_iter().flatten().min()
    }

    /// Whether the spec, on trial, has failed it (see the module doc).
    pub(super) fn trial_verdict(&self, unix: i64) -> Option<Verdict> {
        if self.ever_healthy {
            return None;
        }
        let probe_said = || {
            self.last_probe
                .as_ref()
                .and_then(|p| p.detail.as_ref())
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        };
        if self.restarts_of_spec >= MAX_RESTARTS_BEFORE_REVERT {
            return Some(Verdict {
                reason: RevertReason::CrashLoop,
                detail: format!(
                    "its container restarted {} times before it was ever healthy",
                    self.restarts_of_spec
                ),
            });
        }
        if self.check.probe.is_some() && self.failures >= self.check.retries {
            return Some(Verdict {
                reason: RevertReason::ProbeFailed,
                detail: format!(
                    "its probe failed {} times in a row{}",
                    self.failures,
                    probe_said()
                ),
            });
        }
        let deadline = self.check.deadline_secs();
        let past = self
            .trial_clock
            .is_some_and(|t| unix >= t.saturating_add(i64::from(deadline)));
        if !past {
            return None;
        }
        let (reason, why) = if !self.ever_up {
            (
                RevertReason::StartFailed,
                "its container never ran".to_owned(),
            )
        } else if self.restarts_of_spec > 0 || self.state == HealthState::Unhealthy {
            (
                RevertReason::CrashLoop,
                format!("its container exited ({} restarts)", self.restarts_of_spec),
            )
        } else if self.check.probe.is_some() {
            (
                RevertReason::ProbeFailed,
                format!("its probe never passed{}", probe_said()),
            )
        } else {
            (
                RevertReason::CrashLoop,
                "it did not run healthy-after-secs without a restart".to_owned(),
            )
        };
        Some(Verdict {
            reason,
            detail: format!("not healthy within {deadline} s: {why}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::contracts::Probe;

    fn hash() -> Sha256Hex {
        Sha256Hex::of(b"spec")
    }

    fn probe_check() -> HealthCheck {
        HealthCheck {
            probe: Some(Probe::Tcp { port: 8080 }),
            start_period_secs: 0,
            interval_secs: 1,
            timeout_secs: 1,
            retries: 2,
            healthy_after_secs: 10,
        }
    }

    fn result(ok: bool) -> ProbeResult {
        ProbeResult {
            at: Timestamp::now(),
            ok,
            took_ms: 1,
            detail: Some(fleet_common::validate::BoundedText::truncate("said so")),
        }
    }

    #[test]
    fn without_a_probe_a_container_is_healthy_after_running_healthy_after_without_a_restart() {
        let now = Instant::now();
        let mut h = Health::new(hash(), HealthCheck::default());
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1005,
            now,
        );
        assert_eq!(h.state, HealthState::Starting);
        assert_eq!(
            h.next_look(false),
            Some(1011),
            "when whole-second clocks prove it ran 10 s"
        );
        // 1000 → 1010 may be a start at 1000.9 seen at 1010.0: 9.1 s.
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1010,
            now,
        );
        assert_eq!(h.state, HealthState::Starting);
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1011,
            now,
        );
        assert_eq!(h.state, HealthState::Healthy);
        assert_eq!(
            h.trial_verdict(5000),
            None,
            "healthy once is never reverted"
        );
        // A restart starts it over and is counted.
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1020,
            },
            1021,
            now,
        );
        assert_eq!(h.state, HealthState::Starting);
        assert_eq!(h.restarts_last_hour(now), 1);
        assert_eq!(h.restarts_last_hour(now + RESTART_WINDOW), 0);
    }

    #[test]
    fn a_trial_fails_on_restarts_before_its_deadline() {
        let now = Instant::now();
        let mut h = Health::new(hash(), HealthCheck::default());
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1000,
            now,
        );
        for (i, start) in [1001, 1002].into_iter().enumerate() {
            h.observe(
                Seen::Up {
                    id: "a",
                    started_at: start,
                },
                start,
                now,
            );
            assert_eq!(h.trial_verdict(start), None, "restart {}", i + 1);
        }
        h.observe(Seen::Down { id: "a" }, 1003, now);
        assert_eq!(h.state, HealthState::Unhealthy);
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1003,
            },
            1003,
            now,
        );
        assert_eq!(
            h.trial_verdict(1003),
            Some(Verdict {
                reason: RevertReason::CrashLoop,
                detail: "its container restarted 3 times before it was ever healthy".into()
            })
        );
    }

    #[test]
    fn a_trial_without_a_probe_fails_at_twice_healthy_after_plus_two() {
        let now = Instant::now();
        let mut h = Health::new(hash(), HealthCheck::default());
        h.observe(Seen::Down { id: "a" }, 1000, now);
        assert_eq!(h.trial_verdict(1021), None);
        assert_eq!(
            h.trial_verdict(1022),
            Some(Verdict {
                reason: RevertReason::StartFailed,
                detail: "not healthy within 22 s: its container never ran".into()
            })
        );
    }

    #[test]
    fn probe_failures_count_after_the_start_period_and_a_pass_is_healthy() {
        let now = Instant::now();
        let mut check = probe_check();
        check.start_period_secs = 5;
        let mut h = Health::new(hash(), check);
        h.attempted(Some("a"), 1000, now);
        assert!(
            !h.probed("other", result(false), now),
            "another container's"
        );
        assert!(h.probed("a", result(false), now));
        assert!(h.probed("a", result(false), now + Duration::from_secs(1)));
        assert_eq!(h.state, HealthState::Starting, "in the start period");
        assert_eq!(h.trial_verdict(1001), None);
        let later = now + Duration::from_secs(6);
        h.probed("a", result(false), later);
        assert_eq!(h.state, HealthState::Starting, "one failure of two");
        h.probed("a", result(false), later);
        assert_eq!(h.state, HealthState::Unhealthy);
        let v = h.trial_verdict(1007).expect("failed");
        assert_eq!(v.reason, RevertReason::ProbeFailed);
        assert_eq!(v.detail, "its probe failed 2 times in a row: said so");
        // ps shows the container we created: not a restart.
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1007,
            later,
        );
        assert_eq!(h.restarts_last_hour(later), 0);
        h.probed("a", result(true), later);
        assert_eq!(h.state, HealthState::Healthy);
        assert_eq!(h.trial_verdict(9999), None);
    }

    #[test]
    fn a_probed_trial_that_never_passes_fails_at_its_deadline() {
        let now = Instant::now();
        let mut h = Health::new(hash(), probe_check());
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1000,
            now,
        );
        // deadline: 0 + 2 × 1 + 1 = 3 s.
        assert_eq!(h.next_look(true), Some(1003));
        assert_eq!(h.next_look(false), None, "not on trial: no deadline");
        assert_eq!(h.trial_verdict(1002), None);
        let v = h.trial_verdict(1003).expect("failed");
        assert_eq!(v.reason, RevertReason::ProbeFailed);
        assert_eq!(v.detail, "not healthy within 3 s: its probe never passed");
    }

    #[test]
    fn another_spec_starts_over_but_keeps_the_restarts() {
        let now = Instant::now();
        let mut h = Health::new(hash(), HealthCheck::default());
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1000,
            now,
        );
        h.observe(
            Seen::Up {
                id: "b",
                started_at: 1001,
            },
            1001,
            now,
        );
        assert_eq!(h.restarts_last_hour(now), 1);
        h.switch(Sha256Hex::of(b"other"), probe_check());
        assert_eq!(h.state, HealthState::Starting);
        assert_eq!(h.restarts_last_hour(now), 1);
        assert_eq!(h.container_id(), None);
    }

    #[test]
    fn a_container_removed_by_hand_and_recreated_is_counted_but_not_against_a_trial() {
        let now = Instant::now();
        let mut h = Health::new(hash(), HealthCheck::default());
        h.observe(
            Seen::Up {
                id: "a",
                started_at: 1000,
            },
            1000,
            now,
        );
        for (i, id) in ["b", "c", "d"].into_iter().enumerate() {
            h.observe(Seen::None, 1001, now);
            assert_eq!(h.state, HealthState::Starting);
            h.observe(
                Seen::Up {
                    id,
                    started_at: 1002,
                },
                1002,
                now,
            );
            assert_eq!(
                h.restarts_last_hour(now),
                u32::try_from(i + 1).expect("small")
            );
        }
        assert_eq!(h.trial_verdict(1003), None, "no crash restarts");
    }
}
