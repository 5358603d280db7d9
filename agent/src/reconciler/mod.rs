//! The reconciler: one thread (`agent-reconcile`), one mutation at a time.
//!
//! It owns the desired state (from [`crate::desired`]), the per-workload
//! bookkeeping (restarts, back-off, last error) and the record of applied
//! specs. A pass: list this device's managed containers, compute the
//! workload report, [`plan`] the mutations, do the first one that the
//! [`MutationGate`] admits, and start over — so live state is re-read
//! after every change — until nothing is left to do. Passes run after
//! every desired-state change, on the resync timer, and when a back-off
//! ends. Nothing happens before the first complete snapshot.
//!
//! The list a pass ends with, when it found nothing to do and every
//! container running, is kept ([`Settled`]) while the main process of
//! every container is still the one it saw (a procfs read each, where
//! `podman ps` costs ~50 ms of CPU and ~100 ms of wall time). Idle, the
//! resync timer then checks those processes instead of running a pass (two
//! `podman ps` a minute were 0.15% of a core with 20 workloads); and the
//! pass a desired-state change starts plans its first mutation from that
//! list, so a new workload's `podman run` starts at once. A process gone
//! or replaced means a full re-read, and one happens anyway every
//! [`FULL_RESYNC_EVERY`]th interval (for what no process shows: a
//! container added by hand).
//!
//! Rules: a container whose spec hash differs from the desired spec is
//! replaced (the new image is pulled first); a container whose workload is
//! no longer desired is removed; a missing or exited container is
//! restored; an invalid spec keeps the running container. Containers
//! without our managed-by and device labels never reach this module.
//! Failed mutations, and restores that come back within a minute, back off
//! per workload (5 s doubling to 5 min). A container running the desired
//! spec is recorded as applied even when an earlier run created it.
//!
//! During a change freeze (the gate says [`Admission::Frozen`]) a pass
//! plans with [`plan_frozen`] instead: only missing or exited containers of
//! the last applied specs are restored, with local images only; nothing is
//! pulled, replaced or removed. Desired changes are still received and
//! counted ([`waiting_changes`]) for the report, and applied after the
//! unfreeze. The workload report then describes what runs: the applied
//! specs, plus desired workloads that wait.
//!
//! Podman not answering (`podman ps` fails, or has not answered after
//! [`silent_after`] the resync interval) does not stop the report: it says
//! Podman is unreachable, since when and why; workloads seen before are
//! `unknown` (not `running` from memory), and a desired spec not applied
//! waits, saying for what. The `ps` runs on a helper thread
//! (`agent-podman-ps`) so that a hang is reported while it lasts, and
//! desired changes received meanwhile are reported at once. The first
//! `ps` that answers ends it.
//!
//! Health and revert: every workload's container is judged healthy or not
//! (`health`, with probes run on `agent-probe`: [`crate::prober`]); a new
//! spec that does not become healthy in time gets a durable `failed`
//! record (`judge`), and the reconciler then plans with the workload's
//! last healthy spec instead (`records`), or none; the health report goes
//! to `<device>.health`. `docs/design/workload-health.md` has the state
//! machine and the crash points.
//!
//! Modules: `plan` (the pure policy: what to do), `backoff` (when to try
//! again), `observe` (the bookkeeping of each workload and the workload
//! report), `mutate` (doing one action and recording what it did),
//! `health` (one workload's health), `judge` (the health step of a pass),
//! `records` (the durable records and the effective desired state).

mod backoff;
mod health;
mod judge;
mod mutate;
mod observe;
mod plan;
mod records;
#[cfg(test)]
mod test_support;

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_common::contracts::{
    HealthReport, HealthState, PodmanUnreachable, WorkloadHealth, WorkloadHealthRecord,
    WorkloadSpec, WorkloadStatus, WorkloadsReport,
};
use fleet_common::validate::{DeviceId, WorkloadName};
use fleet_common::{Layout, Timestamp};

use crate::desired::{DesiredChange, DesiredMap};
use crate::freeze::FreezeControl;
use crate::gate::{Admission, MutationGate, MutationKind};
use crate::lock::AgentLock;
use crate::podman::{LiveContainer, Podman, PodmanError};
use crate::prober::{ProbeOutcome, ProbeTarget, Prober, ProberHandle};
use crate::shutdown::Shutdown;
use crate::threads;

use backoff::{next_backoff_end, Backoff};
use health::Health;
use judge::Judging;
use mutate::ImageSource;
use observe::{Settled, Tracked};
use plan::frozen_view;
use plan::{plan, plan_frozen, waiting_changes, ActionKey};
use records::{effective, forget_stale, Held, StateFiles};

/// Every this many resync intervals, live state is re-read in full even
/// when every container's process is unchanged.
pub const FULL_RESYNC_EVERY: u32 = 10;
/// How long stopping waits for the thread after the gate is idle.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// While waiting for `podman ps`, how often desired changes and a stop are
/// looked at.
const PS_POLL: Duration = Duration::from_millis(200);
/// Least time between two passes woken for health alone (a deadline, a
/// healthy-after moment): their clocks count whole seconds.
const HEALTH_LOOK_MIN: Duration = Duration::from_secs(1);

/// How long a `podman ps` may run before the report says Podman does not
/// answer (the call goes on, bounded by the command timeout): the resync
/// interval, at least 5 s (a `ps` takes ~100 ms idle, seconds on a loaded
/// device) and at most 15 s (an operator sees a hang within a resync
/// interval of the default 30 s).
pub fn silent_after(resync: Duration) -> Duration {
    resync.clamp(Duration::from_secs(5), Duration::from_secs(15))
}

/// Messages to the reconciler thread.
#[derive(Debug)]
pub enum ReconcilerMsg {
    Desired(Box<DesiredChange>),
    /// From `agent-probe`.
    Probe(Box<ProbeOutcome>),
    Stop,
}

/// What the reconciler reports, each sent when it changed.
#[derive(Debug)]
pub enum Report {
    /// `<device>.workloads`
    Workloads(WorkloadsReport),
    /// `<device>.health`
    Health(HealthReport),
}

/// Where reports go (the status publisher).
pub type ReportSink = Box<dyn FnMut(Report) + Send>;

/// The reconciler's state; moved onto its thread by [`Reconciler::spawn`].
pub struct Reconciler {
    device: DeviceId,
    podman: Podman,
    gate: Arc<MutationGate>,
    freeze: Arc<FreezeControl>,
    _lock: Arc<AgentLock>,
    files: StateFiles,
    applied: BTreeMap<WorkloadName, WorkloadSpec>,
    /// Durable with `applied` (see `records`).
    records: BTreeMap<WorkloadName, WorkloadHealthRecord>,
    /// Workloads whose desired spec failed, as the last pass saw them.
    held: BTreeMap<WorkloadName, Held>,
    health: BTreeMap<WorkloadName, Health>,
    /// `agent-probe`, from [`Reconciler::spawn`] on.
    prober: Option<ProberHandle>,
    probe_targets: Option<Vec<ProbeTarget>>,
    last_health: Option<BTreeMap<WorkloadName, WorkloadHealth>>,
    /// A health change calls for a pass (to judge it, or to plan what
    /// follows: a `start-first` spec's old container goes).
    health_due: bool,
    desired: Option<DesiredMap>,
    tracked: BTreeMap<WorkloadName, Tracked>,
    removal_backoff: BTreeMap<String, Backoff>,
    resync: Duration,
    /// Set by a pass that found nothing to do; taken by the next pass.
    settled: Option<Settled>,
    /// A desired-state change arrived since the last pass planned.
    changed: bool,
    /// Desired-state changes applied, ever (to tell a new one arrived).
    changes: u64,
    report: ReportSink,
    last_reported: Option<(
        BTreeMap<WorkloadName, WorkloadStatus>,
        Option<PodmanUnreachable>,
    )>,
    /// Set from the first `podman ps` that failed or was silent too long
    /// until one answers.
    podman_down: Option<PodmanDown>,
}

/// Podman not answering: since when, and the last error.
#[derive(Debug, Clone)]
struct PodmanDown {
    since: Timestamp,
    error: String,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("device", &self.device)
            .field("workloads", &self.tracked.len())
            .finish_non_exhaustive()
    }
}

/// The running reconciler thread.
#[derive(Debug)]
pub struct ReconcilerHandle {
    tx: Sender<ReconcilerMsg>,
    thread: JoinHandle<()>,
}

impl ReconcilerHandle {
    pub fn sender(&self) -> Sender<ReconcilerMsg> {
        self.tx.clone()
    }

    /// Asks the thread to stop and joins it. Close the gate first: the
    /// thread finishes only the mutation in flight.
    pub fn stop(self) {
        let _ = self.tx.send(ReconcilerMsg::Stop);
        threads::join_within(self.thread, JOIN_TIMEOUT, "agent-reconcile");
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Reconciler {
    /// Reads the applied specs of an earlier run (absent or unreadable:
    /// none). Taking `lock` proves this process is the one mutator.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: DeviceId,
        podman: Podman,
        gate: Arc<MutationGate>,
        freeze: Arc<FreezeControl>,
        lock: Arc<AgentLock>,
        layout: &Layout,
        resync: Duration,
        report: ReportSink,
    ) -> Self {
        let files = StateFiles::new(layout);
        let loaded = files.load();
        Self {
            device,
            podman,
            gate,
            freeze,
            _lock: lock,
            files,
            applied: loaded.applied,
            records: loaded.records,
            held: BTreeMap::new(),
            health: BTreeMap::new(),
            prober: None,
            probe_targets: None,
            last_health: None,
            health_due: false,
            desired: None,
            tracked: BTreeMap::new(),
            removal_backoff: BTreeMap::new(),
            resync,
            settled: None,
            changed: false,
            changes: 0,
            report,
            last_reported: None,
            podman_down: None,
        }
    }

    /// Starts `agent-probe`, then `agent-reconcile` (which stops the
    /// prober when it ends).
    pub fn spawn(mut self, shutdown: Arc<Shutdown>) -> std::io::Result<ReconcilerHandle> {
        let (tx, rx) = mpsc::channel();
        let to_reconciler = tx.clone();
        let prober = Prober::new(
            self.podman.clone(),
            Box::new(move |outcome| {
                to_reconciler
                    .send(ReconcilerMsg::Probe(Box::new(outcome)))
                    .is_ok()
            }),
        )
        .spawn()?;
        self.prober = Some(prober);
        let thread = threads::spawn("agent-reconcile", move || {
            self.run(&rx, &shutdown);
            if let Some(p) = self.prober.take() {
                p.stop();
            }
        })?;
        Ok(ReconcilerHandle { tx, thread })
    }

    /// When a pass is due for health alone, at most every
    /// [`HEALTH_LOOK_MIN`] after `floor`; none during a freeze (trials
    /// wait for the unfreeze).
    fn next_health_wake(&self, now: Instant, floor: Instant) -> Option<Instant> {
        if self.gate.admission() == Admission::Frozen {
            return None;
        }
        let look = self.next_health_look()?;
        let secs = u64::try_from(look.saturating_sub(unix_now())).unwrap_or(0);
        Some((now + Duration::from_secs(secs)).max(floor))
    }

    fn run(&mut self, rx: &Receiver<ReconcilerMsg>, shutdown: &Shutdown) {
        let mut next_resync = Instant::now();
        let mut look_floor = Instant::now();
        loop {
            let now = Instant::now();
            let health_at = self.next_health_wake(now, look_floor);
            let wake = [Some(next_resync), self.next_backoff_end(now), health_at]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(next_resync);
            let mut due = now >= wake;
            if !due {
                match rx.recv_timeout(wake - now) {
                    Ok(ReconcilerMsg::Desired(change)) => {
                        self.apply(*change);
                        due = true;
                    }
                    Ok(ReconcilerMsg::Probe(outcome)) => {
                        if self.probed(*outcome) {
                            self.health_due = true;
                            due = true;
                        }
                    }
                    Ok(ReconcilerMsg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                    Err(RecvTimeoutError::Timeout) => due = true,
                }
            }
            if health_at.is_some_and(|t| Instant::now() >= t) {
                self.health_due = true;
            }
            if !self.drain(rx) || shutdown.is_requested() {
                return;
            }
            if due && self.desired.is_some() {
                let full_every = self.resync * FULL_RESYNC_EVERY;
                let idle = !self.changed
                    && !self.health_due
                    && self
                        .settled
                        .as_ref()
                        .is_some_and(|s| s.holds(Instant::now(), full_every));
                if !idle {
                    self.health_due = false;
                    look_floor = Instant::now() + HEALTH_LOOK_MIN;
                    self.pass(rx, shutdown);
                }
                next_resync = Instant::now() + self.resync;
            } else if due {
                next_resync = Instant::now() + self.resync;
            }
        }
    }

    /// Applies every queued message; false on Stop.
    fn drain(&mut self, rx: &Receiver<ReconcilerMsg>) -> bool {
        loop {
            match rx.try_recv() {
                Ok(ReconcilerMsg::Desired(change)) => self.apply(*change),
                Ok(ReconcilerMsg::Probe(outcome)) => {
                    if self.probed(*outcome) {
                        self.health_due = true;
                    }
                }
                Ok(ReconcilerMsg::Stop) => return false,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn apply(&mut self, change: DesiredChange) {
        self.changed = true;
        self.changes += 1;
        match change {
            DesiredChange::Snapshot(map) => {
                log::info!(device = self.device.as_str(); "desired state: {} workloads", map.len());
                self.desired = Some(map);
            }
            // INVARIANT: the watcher sends a snapshot before any delta; a
            // delta alone must never stand for the whole desired state
            // (everything else would be removed).
            DesiredChange::Put(w, entry) => match self.desired.as_mut() {
                Some(d) => {
                    log::info!(device = self.device.as_str(), workload = w.as_str(); "desired workload changed");
                    d.insert(w, entry);
                }
                None => {
                    log::error!(device = self.device.as_str(), workload = w.as_str(); "ignoring a change before the first snapshot")
                }
            },
            DesiredChange::Delete(w) => match self.desired.as_mut() {
                Some(d) => {
                    log::info!(device = self.device.as_str(), workload = w.as_str(); "desired workload deleted");
                    d.remove(&w);
                }
                None => {
                    log::error!(device = self.device.as_str(), workload = w.as_str(); "ignoring a deletion before the first snapshot")
                }
            },
        }
    }

    fn next_backoff_end(&self, now: Instant) -> Option<Instant> {
        next_backoff_end(
            self.tracked
                .values()
                .map(|t| &t.backoff)
                .chain(self.removal_backoff.values()),
            now,
        )
    }

    /// Re-reads live state and does one mutation at a time until the plan
    /// is empty, the gate refuses, or a new desired change arrives (which
    /// is applied before the next mutation is planned). Plans for a change
    /// freeze while the gate is frozen.
    fn pass(&mut self, rx: &Receiver<ReconcilerMsg>, shutdown: &Shutdown) {
        let full_every = self.resync * FULL_RESYNC_EVERY;
        let mut kept = self
            .settled
            .take()
            .filter(|s| s.holds(Instant::now(), full_every))
            .map(|s| s.live);
        loop {
            if !self.drain(rx) || shutdown.is_requested() {
                return;
            }
            self.changed = false;
            // The kept list serves the first plan only: live state is
            // re-read after every mutation.
            let live = match kept.take() {
                Some(l) => l,
                None => match self.list_live(rx, shutdown) {
                    Some(Ok(l)) => {
                        if let Some(down) = self.podman_down.take() {
                            log::info!(device = self.device.as_str(); "Podman answers again (unreachable for {} s)", Timestamp::now().since(down.since).as_secs());
                        }
                        l
                    }
                    Some(Err((since, e))) => {
                        log::error!(device = self.device.as_str(); "reading live containers: {e}");
                        self.podman_unreachable(since, &e);
                        self.observe_unreachable();
                        return;
                    }
                    None => return,
                },
            };
            let now = Instant::now();
            let frozen = self.gate.admission() == Admission::Frozen;
            let Some(desired) = self.desired.take() else {
                return;
            };
            if !frozen && forget_stale(&desired, &mut self.records) {
                self.persist();
            }
            let (plan_view, held) = effective(&desired, &self.records);
            // What is reported: the plan's view, and the workloads left
            // stopped as the desired state has them.
            let mut report_view = plan_view.clone();
            for (w, h) in &held {
                if let (Held::Stopped { .. }, Some(e)) = (h, desired.get(w)) {
                    report_view.insert(w.clone(), e.clone());
                }
            }
            self.held = held;
            if frozen {
                self.freeze
                    .set_waiting_changes(waiting_changes(&plan_view, &self.applied));
                let view = frozen_view(&desired, &self.applied);
                self.observe(&view, &live, now);
                self.judge(&view, &live, Judging::Frozen);
            } else {
                self.adopt(&plan_view, &live);
                self.observe(&report_view, &live, now);
                if self.judge(&report_view, &live, Judging::On) {
                    // A spec failed: plan its revert from the same list.
                    self.desired = Some(desired);
                    kept = Some(live);
                    continue;
                }
            }
            let health = &self.health;
            let healthy = |w: &WorkloadName, hash: &str| {
                health.get(w).is_some_and(|h| {
                    h.spec_hash.as_str() == hash && h.state == HealthState::Healthy
                })
            };
            let tracked = &self.tracked;
            let removal = &self.removal_backoff;
            let backing_off = std::cell::Cell::new(false);
            let blocked = |k: &ActionKey| {
                let blocked = match k {
                    ActionKey::Workload(w) => tracked.get(w).is_some_and(|t| t.backoff.blocks(now)),
                    ActionKey::Container(id) => removal.get(id).is_some_and(|b| b.blocks(now)),
                };
                backing_off.set(backing_off.get() || blocked);
                blocked
            };
            let (actions, kind, images) = if frozen {
                (
                    plan_frozen(&self.applied, &live, blocked),
                    MutationKind::LocalRestore,
                    ImageSource::LocalOnly,
                )
            } else {
                (
                    plan(&plan_view, &live, &self.applied, blocked, healthy),
                    MutationKind::Change,
                    ImageSource::AsSpecified,
                )
            };
            self.desired = Some(desired);
            self.gate.set_pending(actions.len());
            let Some(action) = actions.into_iter().next() else {
                if !backing_off.get() {
                    self.settled = Settled::of(&live, now);
                }
                return;
            };
            let what = action.describe();
            let Some(permit) = self.gate.begin(&what, kind) else {
                if !frozen && self.gate.admission() == Admission::Frozen {
                    // A freeze began since the plan: plan again for it.
                    continue;
                }
                log::info!(device = self.device.as_str(); "not starting {what}: mutations are not admitted now");
                return;
            };
            match images {
                ImageSource::AsSpecified => log::info!(device = self.device.as_str(); "{what}"),
                ImageSource::LocalOnly => {
                    log::info!(device = self.device.as_str(); "{what} (change freeze: last applied spec, local image)")
                }
            }
            let result = self.execute(&action, &permit, images);
            let took = permit.elapsed();
            drop(permit);
            self.record(&action, result, took);
        }
    }

    /// `podman ps` on `agent-podman-ps`, waited for while applying desired
    /// changes; once it has run [`silent_after`] the resync interval, the
    /// report says Podman does not answer (and again for each change
    /// received). `None` when stopping; the error comes with when the call
    /// began.
    #[allow(clippy::type_complexity)]
    fn list_live(
        &mut self,
        rx: &Receiver<ReconcilerMsg>,
        shutdown: &Shutdown,
    ) -> Option<Result<Vec<LiveContainer>, (Timestamp, PodmanError)>> {
        let began = Timestamp::now();
        let started = Instant::now();
        let (tx, answer) = mpsc::sync_channel(1);
        let podman = self.podman.clone();
        let device = self.device.clone();
        if let Err(e) = threads::spawn("agent-podman-ps", move || {
            let _ = tx.send(podman.list_managed(&device));
        }) {
            log::warn!(device = self.device.as_str(); "starting a thread for podman ps: {e}; running it here");
            return Some(
                self.podman
                    .list_managed(&self.device)
                    .map_err(|e| (began, e)),
            );
        }
        let silent = silent_after(self.resync);
        let mut said_silent = false;
        let mut changes = self.changes;
        loop {
            match answer.recv_timeout(PS_POLL) {
                Ok(r) => return Some(r.map_err(|e| (began, e))),
                Err(RecvTimeoutError::Disconnected) => {
                    return Some(Err((
                        began,
                        PodmanError::Silent {
                            what: "ps".into(),
                            after: started.elapsed(),
                        },
                    )))
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            if !self.drain(rx) || shutdown.is_requested() {
                return None;
            }
            let news = self.changes != changes;
            changes = self.changes;
            if started.elapsed() >= silent && (!said_silent || news) {
                if !said_silent {
                    let e = PodmanError::Silent {
                        what: "ps".into(),
                        after: silent,
                    };
                    log::error!(device = self.device.as_str(); "{e}; reporting workloads as unknown until it does");
                    self.podman_unreachable(began, &e);
                }
                said_silent = true;
                self.observe_unreachable();
            }
        }
    }

    /// Notes that Podman does not answer (since `since`, unless it did
    /// not before either).
    fn podman_unreachable(&mut self, since: Timestamp, e: &PodmanError) {
        let error = e.to_string();
        match &mut self.podman_down {
            Some(down) => down.error = error,
            None => self.podman_down = Some(PodmanDown { since, error }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_is_silent_after_the_resync_interval_within_5_to_15_s() {
        assert_eq!(silent_after(Duration::from_secs(2)), Duration::from_secs(5));
        assert_eq!(silent_after(Duration::from_secs(8)), Duration::from_secs(8));
        assert_eq!(
            silent_after(Duration::from_secs(30)),
            Duration::from_secs(15)
        );
    }
}
