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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_common::contracts::{
    AppliedSpecs, ImageRef, PodmanUnreachable, PullPolicy, WorkloadSpec, WorkloadState,
    WorkloadStatus, WorkloadsReport,
};
use fleet_common::durable;
use fleet_common::limits::MAX_STATE_FILE_BYTES;
use fleet_common::process::{bounded_text, MAX_LOG_TEXT_BYTES};
use fleet_common::validate::{BoundedText, DeviceId, Sha256Hex, WorkloadName};
use fleet_common::{Layout, Timestamp};

use crate::desired::{DesiredChange, DesiredEntry, DesiredMap};
use crate::freeze::FreezeControl;
use crate::gate::{Admission, MutationGate, MutationKind, Permit};
use crate::lock::AgentLock;
use crate::podman::{LiveContainer, LiveState, Podman, PodmanError, ProcessIdentity};
use crate::shutdown::Shutdown;
use crate::threads;

/// First back-off after a failure; doubles per consecutive failure.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(5);
/// Longest back-off.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// A restored container that runs this long ends its back-off; one that
/// needs restoring again sooner counts as failing.
pub const CRASH_LOOP_WINDOW: Duration = Duration::from_secs(60);
/// Every this many resync intervals, live state is re-read in full even
/// when every container's process is unchanged.
pub const FULL_RESYNC_EVERY: u32 = 10;
/// How long stopping waits for the thread after the gate is idle.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// While waiting for `podman ps`, how often desired changes and a stop are
/// looked at.
const PS_POLL: Duration = Duration::from_millis(200);

/// How long a `podman ps` may run before the report says Podman does not
/// answer (the call goes on, bounded by the command timeout): the resync
/// interval, at least 5 s (a `ps` takes ~100 ms idle, seconds on a loaded
/// device) and at most 15 s (an operator sees a hang within a resync
/// interval of the default 30 s).
pub fn silent_after(resync: Duration) -> Duration {
    resync.clamp(Duration::from_secs(5), Duration::from_secs(15))
}

/// The back-off after `failures` consecutive failures (1 → 5 s).
pub fn backoff_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (BACKOFF_FIRST * 2u32.pow(doublings)).min(BACKOFF_MAX)
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Backoff {
    failures: u32,
    not_before: Option<Instant>,
}

impl Backoff {
    fn fail(&mut self, now: Instant) -> Duration {
        self.failures += 1;
        let d = backoff_delay(self.failures);
        self.not_before = Some(now + d);
        d
    }
    fn clear(&mut self) {
        *self = Self::default();
    }
    fn blocks(&self, now: Instant) -> bool {
        self.not_before.is_some_and(|t| t > now)
    }
}

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
    /// No container for the workload. `missing`: one with this spec was
    /// applied before, so this is a restore.
    Create {
        workload: WorkloadName,
        spec: WorkloadSpec,
        missing: bool,
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

    fn is_restore(&self) -> bool {
        matches!(
            self,
            Self::Restore { .. } | Self::Create { missing: true, .. }
        )
    }
}

/// The mutations that bring `live` to `desired`, removals first, without
/// those `blocked` (backing off). Pure: the reconciler's whole policy.
pub fn plan(
    desired: &DesiredMap,
    live: &[LiveContainer],
    applied: &BTreeMap<WorkloadName, WorkloadSpec>,
    blocked: impl Fn(&ActionKey) -> bool,
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
                if let Some((keep, extra)) = matching.split_first() {
                    for c in extra.iter().chain(others.iter()) {
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
fn frozen_view(desired: &DesiredMap, applied: &BTreeMap<WorkloadName, WorkloadSpec>) -> DesiredMap {
    let mut view: DesiredMap = applied
        .iter()
        .map(|(w, s)| (w.clone(), DesiredEntry::Valid(s.clone())))
        .collect();
    for (w, e) in desired {
        view.entry(w.clone()).or_insert_with(|| e.clone());
    }
    view
}

/// Where images may come from for a mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageSource {
    /// As the spec's pull policy says.
    AsSpecified,
    /// Local storage only (a change freeze).
    LocalOnly,
}

/// Bookkeeping of one desired workload.
#[derive(Debug, Clone)]
struct Tracked {
    /// The spec hash (or, for an invalid value, the value hash) this
    /// bookkeeping is about; a new one starts it over.
    hash: Sha256Hex,
    restarts: u32,
    last_error: Option<String>,
    backoff: Backoff,
    last_restore: Option<Instant>,
    state: WorkloadState,
    since: Timestamp,
}

impl Tracked {
    fn new(hash: Sha256Hex) -> Self {
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
struct Settled {
    at: Instant,
    live: Vec<LiveContainer>,
    processes: Vec<ProcessIdentity>,
}

impl Settled {
    /// `None` unless every container is running (or paused) with a
    /// process to watch.
    fn of(live: &[LiveContainer], at: Instant) -> Option<Settled> {
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
    fn holds(&self, now: Instant, full_every: Duration) -> bool {
        now.duration_since(self.at) < full_every
            && self.processes.iter().all(ProcessIdentity::is_alive)
    }
}

/// Messages to the reconciler thread.
#[derive(Debug)]
pub enum ReconcilerMsg {
    Desired(Box<DesiredChange>),
    Stop,
}

/// Where workload reports go (the status publisher).
pub type ReportSink = Box<dyn FnMut(WorkloadsReport) + Send>;

/// The reconciler's state; moved onto its thread by [`Reconciler::spawn`].
pub struct Reconciler {
    device: DeviceId,
    podman: Podman,
    gate: Arc<MutationGate>,
    freeze: Arc<FreezeControl>,
    _lock: Arc<AgentLock>,
    applied_path: PathBuf,
    applied: BTreeMap<WorkloadName, WorkloadSpec>,
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
        let applied_path = layout.applied_specs();
        let applied = match durable::read_bounded(&applied_path, MAX_STATE_FILE_BYTES) {
            Ok(bytes) => match serde_json::from_slice::<AppliedSpecs>(&bytes) {
                Ok(a) => a.workloads,
                Err(e) => {
                    log::warn!("ignoring {}: {e}", applied_path.display());
                    BTreeMap::new()
                }
            },
            Err(e) if e.is_not_found() => BTreeMap::new(),
            Err(e) => {
                log::warn!("ignoring the applied specs: {e}");
                BTreeMap::new()
            }
        };
        Self {
            device,
            podman,
            gate,
            freeze,
            _lock: lock,
            applied_path,
            applied,
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

    /// Starts `agent-reconcile`.
    pub fn spawn(self, shutdown: Arc<Shutdown>) -> std::io::Result<ReconcilerHandle> {
        let (tx, rx) = mpsc::channel();
        let thread = threads::spawn("agent-reconcile", move || self.run(&rx, &shutdown))?;
        Ok(ReconcilerHandle { tx, thread })
    }

    fn run(mut self, rx: &Receiver<ReconcilerMsg>, shutdown: &Shutdown) {
        let mut next_resync = Instant::now();
        loop {
            let now = Instant::now();
            let wake = self
                .next_backoff_end(now)
                .map_or(next_resync, |b| b.min(next_resync));
            let mut due = now >= wake;
            if !due {
                match rx.recv_timeout(wake - now) {
                    Ok(ReconcilerMsg::Desired(change)) => {
                        self.apply(*change);
                        due = true;
                    }
                    Ok(ReconcilerMsg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                    Err(RecvTimeoutError::Timeout) => due = true,
                }
            }
            if !self.drain(rx) || shutdown.is_requested() {
                return;
            }
            if due && self.desired.is_some() {
                let full_every = self.resync * FULL_RESYNC_EVERY;
                let idle = !self.changed
                    && self
                        .settled
                        .as_ref()
                        .is_some_and(|s| s.holds(Instant::now(), full_every));
                if !idle {
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
            if frozen {
                self.freeze
                    .set_waiting_changes(waiting_changes(&desired, &self.applied));
                self.observe(&frozen_view(&desired, &self.applied), &live, now);
            } else {
                self.adopt(&desired, &live);
                self.observe(&desired, &live, now);
            }
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
                    plan(&desired, &live, &self.applied, blocked),
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

    /// The report while Podman does not answer: workloads seen before are
    /// `unknown`, desired specs not applied wait (`pending`, with why),
    /// invalid ones stay `invalid`. During a freeze, what runs as
    /// [`frozen_view`] says and the waiting count is kept.
    fn observe_unreachable(&mut self) {
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
    fn send_report(&mut self, workloads: BTreeMap<WorkloadName, WorkloadStatus>) {
        let podman_unreachable = self.podman_down.as_ref().map(|d| PodmanUnreachable {
            since: d.since,
            error: BoundedText::truncate(&d.error),
        });
        let now = (workloads, podman_unreachable);
        if self.last_reported.as_ref() != Some(&now) {
            self.last_reported = Some(now.clone());
            (self.report)(WorkloadsReport {
                workloads: now.0,
                observed_at: Timestamp::now(),
                podman_unreachable: now.1,
            });
        }
    }

    /// Records as applied the desired specs a running container already
    /// has (created by an earlier run whose record was lost).
    fn adopt(&mut self, desired: &DesiredMap, live: &[LiveContainer]) {
        let mut changed = false;
        for (w, entry) in desired {
            let DesiredEntry::Valid(spec) = entry else {
                continue;
            };
            let hash = spec.spec_hash();
            if self.applied.get(w).map(WorkloadSpec::spec_hash) == Some(hash.clone()) {
                continue;
            }
            let running = live.iter().any(|c| {
                c.workload.as_ref() == Some(w)
                    && c.spec_hash.as_deref() == Some(hash.as_str())
                    && c.state == LiveState::Running
            });
            if running {
                self.applied.insert(w.clone(), spec.clone());
                changed = true;
            }
        }
        if changed {
            self.persist_applied();
        }
    }

    /// Makes the spec's image local: as its pull policy says, or, during a
    /// freeze, only when it is local already.
    fn ensure_image(
        &self,
        permit: &Permit<'_>,
        spec: &WorkloadSpec,
        images: ImageSource,
    ) -> Result<(), PodmanError> {
        let p = &self.podman;
        match images {
            ImageSource::AsSpecified => {
                if p.needs_pull(&spec.image, spec.pull)? {
                    let _pulling = permit.pulling(spec.image.as_str());
                    p.pull(&spec.image)?;
                }
                Ok(())
            }
            ImageSource::LocalOnly => {
                if p.needs_pull(&spec.image, PullPolicy::Missing)? {
                    return Err(PodmanError::Failed {
                        what: format!("image {}", spec.image),
                        status: "not local".into(),
                        stderr: "a change freeze restores from local images only; it is pulled after the unfreeze".into(),
                    });
                }
                Ok(())
            }
        }
    }

    /// [`Self::ensure_image`], then creates and starts the container.
    ///
    /// When no pull can be called for (the policy is `missing` or `never`,
    /// or a freeze allows local images only), `podman run --pull=never` is
    /// tried first and the image is looked at only if that fails: one
    /// podman call instead of two in the common case (each costs ~50 ms of
    /// podman start-up, which desired-state put → running pays in full). A
    /// run that failed with the image local keeps its own error.
    fn ensure_image_and_run(
        &self,
        permit: &Permit<'_>,
        workload: &WorkloadName,
        spec: &WorkloadSpec,
        images: ImageSource,
    ) -> Result<(), PodmanError> {
        let p = &self.podman;
        let may_pull_now = images == ImageSource::AsSpecified && spec.pull == PullPolicy::Always;
        if !may_pull_now {
            match p.run(&self.device, workload, spec) {
                Ok(_) => return Ok(()),
                Err(e) => match p.image_exists(&spec.image) {
                    Ok(true) => return Err(e),
                    // Not local: pulled, or refused, as the policy says.
                    Ok(false) => {}
                    // The run's error is the cause; the probe's only says
                    // Podman is unwell.
                    Err(probe) => {
                        log::warn!(device = self.device.as_str(), workload = workload.as_str(); "after a failed run, looking for the image: {probe}");
                        return Err(e);
                    }
                },
            }
        }
        self.ensure_image(permit, spec, images)?;
        p.run(&self.device, workload, spec).map(drop)
    }

    fn execute(
        &self,
        action: &Action,
        permit: &Permit<'_>,
        images: ImageSource,
    ) -> Result<(), PodmanError> {
        let p = &self.podman;
        match action {
            Action::Remove { container } => p.remove(container),
            Action::Create { workload, spec, .. } => {
                self.ensure_image_and_run(permit, workload, spec, images)
            }
            Action::Replace {
                workload,
                spec,
                old,
            } => {
                // Pull before removing, so a failing pull keeps the old one.
                self.ensure_image(permit, spec, images)?;
                for c in old {
                    p.remove(c)?;
                }
                p.run(&self.device, workload, spec).map(drop)
            }
            Action::Restore {
                workload,
                container,
                spec,
            } => match p.start(container) {
                Ok(()) => Ok(()),
                Err(e) => match spec {
                    Some(spec) => {
                        log::warn!(device = self.device.as_str(), workload = workload.as_str(); "{e}; recreating the container");
                        p.remove(container)?;
                        self.ensure_image_and_run(permit, workload, spec, images)
                    }
                    None => Err(e),
                },
            },
        }
    }

    fn record(&mut self, action: &Action, result: Result<(), PodmanError>, took: Duration) {
        let now = Instant::now();
        let device = self.device.clone();
        let what = action.describe();
        match (action, result) {
            (Action::Remove { container }, Ok(())) => {
                self.removal_backoff.remove(&container.id);
                if let Some(w) = &container.workload {
                    let still_desired = self.desired.as_ref().is_some_and(|d| d.contains_key(w));
                    if !still_desired && self.applied.remove(w).is_some() {
                        self.persist_applied();
                    }
                }
                log::info!(device = device.as_str(); "{what}: done in {} ms", took.as_millis());
            }
            (Action::Remove { container }, Err(e)) => {
                let b = self
                    .removal_backoff
                    .entry(container.id.clone())
                    .or_default();
                let d = b.fail(now);
                log::error!(device = device.as_str(), attempt = b.failures; "{what}: {e}; retrying in {} s", d.as_secs());
            }
            (action, Ok(())) => {
                let Some(w) = workload_of(action) else {
                    return;
                };
                let restore = action.is_restore();
                if let Some(t) = self.tracked.get_mut(w) {
                    t.last_error = None;
                    if restore {
                        t.restarts = t.restarts.saturating_add(1);
                        let looping = t
                            .last_restore
                            .is_some_and(|p| now.duration_since(p) < CRASH_LOOP_WINDOW);
                        t.last_restore = Some(now);
                        if looping {
                            let d = t.backoff.fail(now);
                            log::warn!(device = device.as_str(), workload = w.as_str(), attempt = t.backoff.failures; "restored again within {} s; the next restore waits {} s", CRASH_LOOP_WINDOW.as_secs(), d.as_secs());
                        }
                    } else {
                        t.backoff.clear();
                    }
                }
                if let Action::Create { spec, .. } | Action::Replace { spec, .. } = action {
                    self.applied.insert(w.clone(), spec.clone());
                    self.persist_applied();
                }
                log::info!(device = device.as_str(), workload = w.as_str(); "{what}: done in {} ms", took.as_millis());
            }
            (action, Err(e)) => {
                let Some(w) = workload_of(action) else {
                    return;
                };
                if let Some(t) = self.tracked.get_mut(w) {
                    let d = t.backoff.fail(now);
                    t.last_error = Some(e.to_string());
                    log::error!(device = device.as_str(), workload = w.as_str(), attempt = t.backoff.failures; "{what}: {e}; retrying in {} s", d.as_secs());
                }
            }
        }
    }

    fn persist_applied(&self) {
        let record = AppliedSpecs {
            format: AppliedSpecs::FORMAT,
            workloads: self.applied.clone(),
            written_at: Timestamp::now(),
        };
        let written = serde_json::to_vec_pretty(&record)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                durable::write_atomic(&self.applied_path, &b, 0o640).map_err(|e| e.to_string())
            });
        if let Err(e) = written {
            log::error!(device = self.device.as_str(); "recording the applied specs in {}: {e}", self.applied_path.display());
        }
    }

    /// Updates the bookkeeping from live state and sends the workload
    /// report when it changed.
    fn observe(&mut self, desired: &DesiredMap, live: &[LiveContainer], now: Instant) {
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
        self.send_report(report);
    }
}

/// Whether a container up for `up_secs` has outlived the crash-loop window.
/// The earliest back-off still to end after `now`. One that already ended
/// is not a reason to wake: its pass ran when it ended, and a back-off kept
/// after a restore (a crash loop, cleared only once the container has run
/// a minute) would otherwise wake the loop at once, again and again, each
/// wake a `podman ps`.
fn next_backoff_end<'a>(
    backoffs: impl Iterator<Item = &'a Backoff>,
    now: Instant,
) -> Option<Instant> {
    backoffs
        .filter_map(|b| b.not_before)
        .filter(|t| *t > now)
        .min()
}

fn up_long_enough(up_secs: i64) -> bool {
    u64::try_from(up_secs).is_ok_and(|s| s >= CRASH_LOOP_WINDOW.as_secs())
}

fn workload_of(a: &Action) -> Option<&WorkloadName> {
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

    fn w(n: &str) -> WorkloadName {
        WorkloadName::parse(n).expect("name")
    }

    fn spec(image: &str) -> WorkloadSpec {
        WorkloadSpec::from_json(format!(r#"{{"image":"{image}"}}"#).as_bytes()).expect("spec")
    }

    fn container(id: &str, workload: &str, hash: &str, state: LiveState) -> LiveContainer {
        LiveContainer {
            id: id.into(),
            name: format!("fleet-{workload}"),
            state,
            image: "img".into(),
            workload: WorkloadName::parse(workload).ok(),
            spec_hash: Some(hash.into()),
            started_at: 0,
            pid: 0,
        }
    }

    fn kinds(actions: &[Action]) -> Vec<String> {
        actions.iter().map(Action::describe).collect()
    }

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
        let actions = plan(&desired, &live, &applied, |_| false);
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
        let blocked = plan(&desired, &live, &BTreeMap::new(), |k| {
            matches!(k, ActionKey::Workload(x) if x.as_str() == "db")
                || matches!(k, ActionKey::Container(id) if id == "4")
        });
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
        assert!(plan(&desired, &converged, &applied, |_| false).is_empty());
        // An empty desired state removes every managed container.
        assert_eq!(
            kinds(&plan(&BTreeMap::new(), &converged, &applied, |_| false)),
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
    fn podman_is_silent_after_the_resync_interval_within_5_to_15_s() {
        assert_eq!(silent_after(Duration::from_secs(2)), Duration::from_secs(5));
        assert_eq!(silent_after(Duration::from_secs(8)), Duration::from_secs(8));
        assert_eq!(
            silent_after(Duration::from_secs(30)),
            Duration::from_secs(15)
        );
    }

    #[test]
    fn backoff_doubles_to_five_minutes() {
        assert_eq!(backoff_delay(1), Duration::from_secs(5));
        assert_eq!(backoff_delay(2), Duration::from_secs(10));
        assert_eq!(backoff_delay(3), Duration::from_secs(20));
        assert_eq!(backoff_delay(7), Duration::from_secs(300));
        assert_eq!(backoff_delay(1000), Duration::from_secs(300));
        let now = Instant::now();
        let mut b = Backoff::default();
        assert!(!b.blocks(now));
        b.fail(now);
        assert!(b.blocks(now));
        assert!(!b.blocks(now + Duration::from_secs(6)));
        b.clear();
        assert_eq!(b, Backoff::default());
    }

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

    #[test]
    fn an_ended_backoff_never_wakes_the_loop_again() {
        let now = Instant::now();
        let mut crash_loop = Backoff::default();
        crash_loop.fail(now);
        let mut removal = Backoff::default();
        removal.fail(now);
        removal.fail(now);
        let ends = crash_loop.not_before.expect("set");
        let all = [crash_loop.clone(), removal.clone(), Backoff::default()];
        assert_eq!(next_backoff_end(all.iter(), now), Some(ends));
        // After the first has ended (and is kept: the container runs but
        // not yet a minute), only the later one is a reason to wake.
        let later = removal.not_before.expect("set");
        let after = ends + Duration::from_millis(1);
        assert_eq!(next_backoff_end(all.iter(), after), Some(later));
        assert_eq!(next_backoff_end(all.iter(), later), None);
    }
}
