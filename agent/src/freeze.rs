//! The change freeze (`docs/design/freeze.md`): its rules, its state and
//! its persistence.
//!
//! [`FreezeControl`] owns the agent's config state (`configured` or
//! `changefreeze`) and what is waiting for the unfreeze. Entering:
//! 1. the caller gathers the [`Conditions`] outside any lock (connection,
//!    snapshot, the updater's answer: a bounded socket call);
//! 2. under the mutation gate's lock, upgrade-intent forwarding is held
//!    back first, then [`refusals`] adds the gate's view (draining, a
//!    mutation in flight or planned, a pull) and whether an intent is
//!    pending now, and refuses with every reason that applies (forwarding
//!    is allowed again); otherwise the freeze file is written (durable:
//!    temp file, fsync, rename, directory fsync) and the gate admits only
//!    local restores from then on. No mutation starts and no intent is
//!    forwarded between the check and the entry, and nothing is
//!    acknowledged before the file is on disk.
//!
//! Leaving is only ever asked for (the agent never leaves on its own):
//! the `configured` file is written, then the gate opens and forwarding is
//! allowed again (the current intent is then handled). Any caller the
//! socket admits may unfreeze, not only the one that froze: the freezer's
//! uid is recorded and reported, and the original design's "the external
//! entity ends it" is whoever controls the device locally (root or
//! `fleet-control`; `docs/design/freeze.md` "Who may call").
//!
//! The freeze file (`freeze.json`, mode 0644: the root updater reads it and
//! refuses `upgrade` while it says frozen) is read once at start. A file
//! that cannot be read or understood counts as frozen, as in the updater:
//! refusing changes is always safe, and an explicit unfreeze rewrites it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use fleet_common::contracts::{
    ConfigState, ConfigStateReport, Freeze, FreezeFile, Refusal, Response, UpdaterReply,
    UpdaterRequest, UpdaterView, UpgradePhase, UpgradeView,
};
use fleet_common::durable::{self, DurableError};
use fleet_common::limits::{HEARTBEAT_INTERVAL, SYSTEMD_STOP_TIMEOUT};
use fleet_common::socket;
use fleet_common::validate::BoundedText;
use fleet_common::{Layout, Timestamp};

use crate::gate::{Admission, Froze, GateView, MutationGate};
use crate::upgrade::UpgradeState;

/// Mode of the freeze file: the agent writes it, the root updater and any
/// local reader may read it.
const FREEZE_FILE_MODE: u32 = 0o644;
/// A freeze file larger than this was not written by the agent.
const MAX_FREEZE_FILE_BYTES: u64 = 64 * 1024;
/// Bound on asking the updater for its status during a freeze request: the
/// updater answers `status` from memory at once; this keeps a freeze
/// request well within the socket's 15 s answer bound.
pub const UPDATER_STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Retry hints, per reason: how long the condition usually lasts.
/// A mutation or a snapshot read takes seconds.
const RETRY_SHORT: Duration = Duration::from_secs(5);
/// Pulls, upgrades and intents take longer; a reconnect is tried within
/// a heartbeat.
const RETRY_LONG: Duration = HEARTBEAT_INTERVAL;

/// What upgrades are doing, as the freeze needs it, and the hold on
/// forwarding intents. Every call is bounded in time; all but
/// [`Upgrades::view`] answer from memory at once.
pub trait Upgrades: Send + Sync {
    /// The updater's transaction, and whether an intent is pending.
    fn view(&self) -> UpgradeView;
    /// Holds back (`true`) or allows forwarding intents to the updater.
    fn hold_forwarding(&self, _held: bool) {}
    /// An accepted intent has not completed.
    fn intent_pending(&self) -> bool {
        false
    }
    /// A new intent arrived while forwarding was held back, and waits.
    fn intent_waiting(&self) -> bool {
        false
    }
}

/// The agent's [`Upgrades`]: the updater's transaction asked over its
/// socket (bounded), the intent side and the hold from [`UpgradeState`].
#[derive(Debug, Clone)]
pub struct AgentUpgrades {
    pub updater_socket: PathBuf,
    pub timeout: Duration,
    pub state: UpgradeState,
}

impl Upgrades for AgentUpgrades {
    fn view(&self) -> UpgradeView {
        let updater = match updater_view(&self.updater_socket, self.timeout) {
            // Gone for a moment (restarting) while its last status said a
            // transaction runs: not known to be over.
            UpdaterView::Absent {} if self.state.transaction_active() => UpdaterView::Unknown {
                error: BoundedText::truncate(
                    "the updater socket is gone and its last status was not terminal",
                ),
            },
            v => v,
        };
        UpgradeView {
            updater,
            intent_pending: self.state.intent_pending(),
        }
    }

    fn hold_forwarding(&self, held: bool) {
        self.state.set_forwarding(!held);
    }

    fn intent_pending(&self) -> bool {
        self.state.intent_pending()
    }

    fn intent_waiting(&self) -> bool {
        self.state.intent_waiting()
    }
}

/// Asks the updater at `path` for its transaction.
pub fn updater_view(path: &Path, timeout: Duration) -> UpdaterView {
    match socket::call::<_, UpdaterReply>(path, &UpdaterRequest::Status {}, timeout) {
        Ok(Response::Ok(UpdaterReply { status: None })) => UpdaterView::Idle {},
        Ok(Response::Ok(UpdaterReply { status: Some(s) })) => UpdaterView::Transaction {
            phase: s.phase,
            attempt: s.attempt_uuid,
            target_version: s.target_version,
        },
        Ok(Response::Err(e)) => UpdaterView::Unknown {
            error: BoundedText::truncate(format!("the updater answered {e}")),
        },
        Err(e) if e.is_unreachable() => UpdaterView::Absent {},
        Err(e) => UpdaterView::Unknown {
            error: BoundedText::truncate(e.to_string()),
        },
    }
}

/// What a freeze decision needs besides the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditions {
    /// The desired-state watcher has read a complete snapshot since the last
    /// (re)connect.
    pub snapshot_complete: bool,
    /// How long NATS has been unreachable (since start when never
    /// connected); `None` while connected.
    pub disconnected_for: Option<Duration>,
    /// Disconnected longer than this refuses.
    pub disconnect_window: Duration,
    pub upgrade: UpgradeView,
}

/// One reason a freeze is refused, with what it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    pub reason: Refusal,
    pub detail: String,
}

/// Every reason that refuses a freeze now, in the order of [`Refusal`].
pub fn refusals(c: &Conditions, gate: &GateView) -> Vec<Blocker> {
    let mut out = Vec::new();
    let mut add = |reason, detail: String| out.push(Blocker { reason, detail });
    if !c.snapshot_complete {
        add(
            Refusal::NoSnapshot,
            "no complete desired-state snapshot has been read yet".into(),
        );
    }
    if let Some(d) = c.disconnected_for.filter(|d| *d > c.disconnect_window) {
        add(
            Refusal::Disconnected,
            format!(
                "NATS has been unreachable for {} s, longer than the heartbeat window of {} s",
                d.as_secs(),
                c.disconnect_window.as_secs()
            ),
        );
    }
    if matches!(gate.admission, Admission::Closed(_)) {
        add(Refusal::Draining, "the agent is shutting down".into());
    }
    match &c.upgrade.updater {
        UpdaterView::Transaction {
            phase,
            attempt,
            target_version,
        } if !phase.is_terminal() => add(
            Refusal::UpgradeInProgress,
            format!("upgrade attempt {attempt} to {target_version} is in phase {phase}"),
        ),
        UpdaterView::Unknown { error } => add(
            Refusal::UpgradeInProgress,
            format!("the updater did not answer ({error}), so an upgrade may be in progress"),
        ),
        _ => {}
    }
    if c.upgrade.intent_pending {
        add(
            Refusal::IntentPending,
            "an upgrade intent was accepted and has not completed".into(),
        );
    }
    match (&gate.in_flight, gate.pending) {
        (Some(what), 0) => add(Refusal::ReconcilerBusy, format!("{what} is in flight")),
        (Some(what), n) => add(
            Refusal::ReconcilerBusy,
            format!("{what} is in flight and {n} more planned"),
        ),
        (None, 0) => {}
        (None, n) => add(
            Refusal::ReconcilerBusy,
            format!("{n} workload mutations are planned"),
        ),
    }
    let mut downloads = Vec::new();
    if let Some(image) = &gate.pulling {
        downloads.push(format!("image {image} is being pulled"));
    }
    if let UpdaterView::Transaction {
        phase: UpgradePhase::Preparing,
        attempt,
        ..
    } = &c.upgrade.updater
    {
        downloads.push(format!(
            "the updater is downloading and checking the artifact of attempt {attempt}"
        ));
    }
    if !downloads.is_empty() {
        add(Refusal::DownloadInProgress, downloads.join(" and "));
    }
    out
}

/// How long to wait before asking again, given the reasons.
pub fn retry_after(reasons: &[Refusal]) -> Duration {
    reasons
        .iter()
        .map(|r| match r {
            Refusal::NoSnapshot | Refusal::ReconcilerBusy => RETRY_SHORT,
            Refusal::Disconnected
            | Refusal::UpgradeInProgress
            | Refusal::IntentPending
            | Refusal::DownloadInProgress
            | Refusal::NotPersisted => RETRY_LONG,
            // A new agent is started by the service manager.
            Refusal::Draining => SYSTEMD_STOP_TIMEOUT,
        })
        .max()
        .unwrap_or(RETRY_SHORT)
}

/// A config-state change that did not happen.
#[derive(Debug)]
pub enum FreezeError {
    Refused(Vec<Blocker>),
    Persist { path: PathBuf, source: String },
}

impl FreezeError {
    pub fn reasons(&self) -> Vec<Refusal> {
        match self {
            Self::Refused(b) => b.iter().map(|b| b.reason).collect(),
            Self::Persist { .. } => Vec::new(),
        }
    }
}

impl fmt::Display for FreezeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(blockers) => {
                let d: Vec<&str> = blockers.iter().map(|b| b.detail.as_str()).collect();
                write!(f, "cannot enter changefreeze now: {}", d.join("; "))
            }
            Self::Persist { path, source } => write!(
                f,
                "recording the config state in {} failed ({source}), so it did not change: check the agent's state directory",
                path.display()
            ),
        }
    }
}

impl std::error::Error for FreezeError {}

/// Whether a call changed the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Done,
    Already,
}

#[derive(Debug)]
struct Reported {
    state: ConfigState,
    waiting_changes: u32,
}

type Listener = Box<dyn Fn() + Send + Sync>;

/// The agent's config state; see the module documentation.
pub struct FreezeControl {
    gate: Arc<MutationGate>,
    upgrades: Arc<dyn Upgrades>,
    path: PathBuf,
    state: Mutex<Reported>,
    /// Held through a whole change, so two callers do not interleave.
    changing: Mutex<()>,
    listener: OnceLock<Listener>,
}

impl fmt::Debug for FreezeControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FreezeControl")
            .field("path", &self.path)
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

/// Reads a freeze file; absent means configured.
pub fn read_state(path: &Path) -> Result<ConfigState, String> {
    let bytes = match durable::read_bounded(path, MAX_FREEZE_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(ConfigState::Configured),
        Err(e) => return Err(e.to_string()),
    };
    let file: FreezeFile = serde_json::from_slice(&bytes).map_err(|e| format!("corrupt: {e}"))?;
    if file.format != FreezeFile::FORMAT {
        return Err(format!("unknown format {}", file.format));
    }
    Ok(file.config_state)
}

fn write_state(path: &Path, state: &ConfigState) -> Result<(), FreezeError> {
    let persist = |source: String| FreezeError::Persist {
        path: path.to_owned(),
        source,
    };
    let file = FreezeFile {
        format: FreezeFile::FORMAT,
        config_state: state.clone(),
        written_at: Timestamp::now(),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).map_err(|e| persist(e.to_string()))?;
    bytes.push(b'\n');
    durable::write_atomic(path, &bytes, FREEZE_FILE_MODE)
        .map_err(|e: DurableError| persist(e.to_string()))
}

/// Replaces the persisted `previous` state with `next`. On failure the
/// file may already hold `next` (a failed directory sync comes after the
/// rename), so `previous` is written back, best effort: the state on disk
/// and in memory stay the same either way.
fn replace_state(
    path: &Path,
    next: &ConfigState,
    previous: &ConfigState,
) -> Result<(), FreezeError> {
    write_state(path, next).inspect_err(|e| {
        if let Err(back) = write_state(path, previous) {
            log::error!("{e}; writing back the previous config state failed too: {back}");
        }
    })
}

impl FreezeControl {
    /// Reads the persisted state (see the module documentation for an
    /// unreadable file) and, when frozen, freezes `gate` and holds back
    /// `upgrades`' forwarding before any mutation or intent can start.
    pub fn load(layout: &Layout, gate: Arc<MutationGate>, upgrades: Arc<dyn Upgrades>) -> Self {
        let path = layout.freeze_state();
        let state = match read_state(&path) {
            Ok(s) => s,
            Err(e) => {
                log::error!("the freeze state {} cannot be used ({e}); staying frozen until an explicit unfreeze rewrites it", path.display());
                ConfigState::Changefreeze(Freeze {
                    since: Timestamp::now(),
                    reason: Some(BoundedText::truncate(format!(
                        "the freeze state could not be read at start ({e}); frozen until unfreeze"
                    ))),
                    caller_uid: 0,
                })
            }
        };
        if let ConfigState::Changefreeze(f) = &state {
            gate.start_frozen();
            upgrades.hold_forwarding(true);
            log::warn!(
                "starting in a change freeze (since {}, by uid {}{}): desired state is not applied until unfreeze",
                f.since,
                f.caller_uid,
                f.reason
                    .as_ref()
                    .map(|r| format!(", reason: {r}"))
                    .unwrap_or_default()
            );
        }
        Self {
            gate,
            upgrades,
            path,
            state: Mutex::new(Reported {
                state,
                waiting_changes: 0,
            }),
            changing: Mutex::new(()),
            listener: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Reported> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `f` runs after every change of the report (state, waiting changes,
    /// intent waiting). Set once.
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.listener.set(Box::new(f));
    }

    fn changed(&self) {
        if let Some(f) = self.listener.get() {
            f();
        }
    }

    /// The state and what waits for the unfreeze (read live from the
    /// upgrade side for the intent).
    pub fn report(&self) -> ConfigStateReport {
        let s = self.lock();
        let frozen = s.state.is_frozen();
        ConfigStateReport {
            state: s.state.clone(),
            waiting_changes: s.waiting_changes,
            intent_waiting: frozen && self.upgrades.intent_waiting(),
        }
    }

    pub fn is_frozen(&self) -> bool {
        self.lock().state.is_frozen()
    }

    /// Desired-state changes waiting for the unfreeze (ignored when not
    /// frozen: a count computed just before an unfreeze is stale).
    pub fn set_waiting_changes(&self, n: u32) {
        let changed = {
            let mut s = self.lock();
            let changed = s.state.is_frozen() && s.waiting_changes != n;
            if changed {
                s.waiting_changes = n;
            }
            changed
        };
        if changed {
            self.changed();
        }
    }

    /// Enters the freeze for `caller`, or refuses with every reason; see
    /// the module documentation. Frozen already: nothing changes.
    pub fn freeze(
        &self,
        caller: u32,
        reason: Option<BoundedText>,
        conditions: &Conditions,
    ) -> Result<Change, FreezeError> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_frozen() {
            return Ok(Change::Already);
        }
        let froze = self.gate.freeze(|view| {
            // Held first, then asked: an intent accepted before the hold is
            // pending now, none can be accepted after it.
            self.upgrades.hold_forwarding(true);
            let mut now = conditions.clone();
            now.upgrade.intent_pending |= self.upgrades.intent_pending();
            let blockers = refusals(&now, view);
            let entered = if blockers.is_empty() {
                let state = ConfigState::Changefreeze(Freeze {
                    since: Timestamp::now(),
                    reason,
                    caller_uid: caller,
                });
                // Answered only once written (`docs/design/freeze.md`
                // "Entering"): a freeze that
                // cannot be recorded is refused with its own reason.
                replace_state(&self.path, &state, &ConfigState::Configured)
                    .map(|()| state)
                    .map_err(|e| {
                        FreezeError::Refused(vec![Blocker {
                            reason: Refusal::NotPersisted,
                            detail: format!("{e}"),
                        }])
                    })
            } else {
                Err(FreezeError::Refused(blockers))
            };
            match entered {
                Ok(state) => {
                    // INVARIANT: lock order is gate, then state.
                    let mut s = self.lock();
                    s.state = state;
                    s.waiting_changes = 0;
                    Ok(())
                }
                Err(e) => {
                    self.upgrades.hold_forwarding(false);
                    Err(e)
                }
            }
        })?;
        match froze {
            Froze::Now => {
                log::warn!("change freeze entered for uid {caller}: desired state is recorded, not applied, until unfreeze");
                self.changed();
                Ok(Change::Done)
            }
            Froze::Already => Ok(Change::Already),
        }
    }

    /// Leaves the freeze (durable first, then the gate opens). Not frozen:
    /// nothing changes.
    pub fn unfreeze(&self, caller: u32) -> Result<Change, FreezeError> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let frozen = self.lock().state.clone();
        let ConfigState::Changefreeze(since) = &frozen else {
            return Ok(Change::Already);
        };
        self.gate.thaw(|| {
            replace_state(&self.path, &ConfigState::Configured, &frozen)?;
            let mut s = self.lock();
            s.state = ConfigState::Configured;
            s.waiting_changes = 0;
            Ok(())
        })?;
        self.upgrades.hold_forwarding(false);
        log::warn!(
            "change freeze ended by uid {caller} (frozen since {} by uid {})",
            since.since,
            since.caller_uid
        );
        self.changed();
        Ok(Change::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::validate::{AttemptUuid, Version};

    fn idle_gate() -> GateView {
        GateView {
            admission: Admission::Open,
            in_flight: None,
            pending: 0,
            pulling: None,
        }
    }

    fn good() -> Conditions {
        Conditions {
            snapshot_complete: true,
            disconnected_for: None,
            disconnect_window: Duration::from_secs(30),
            upgrade: UpgradeView {
                updater: UpdaterView::Absent {},
                intent_pending: false,
            },
        }
    }

    fn transaction(phase: UpgradePhase) -> UpdaterView {
        UpdaterView::Transaction {
            phase,
            attempt: AttemptUuid::parse("6f1c2d3e-4a5b-4c6d-8e7f-a0b1c2d3e4f5").expect("uuid"),
            target_version: Version::parse("1.5.0").expect("version"),
        }
    }

    fn reasons(c: &Conditions, g: &GateView) -> Vec<Refusal> {
        refusals(c, g).into_iter().map(|b| b.reason).collect()
    }

    #[test]
    fn every_reason_that_applies_is_listed_in_order() {
        assert!(refusals(&good(), &idle_gate()).is_empty());
        for phase in [
            UpgradePhase::Complete,
            UpgradePhase::Failed,
            UpgradePhase::RollbackFailed,
        ] {
            let mut c = good();
            c.upgrade.updater = transaction(phase);
            assert!(refusals(&c, &idle_gate()).is_empty(), "{phase}");
        }
        let c = Conditions {
            snapshot_complete: false,
            disconnected_for: Some(Duration::from_secs(31)),
            disconnect_window: Duration::from_secs(30),
            upgrade: UpgradeView {
                updater: transaction(UpgradePhase::Preparing),
                intent_pending: true,
            },
        };
        let g = GateView {
            admission: Admission::Closed(crate::gate::ClosedBy::Shutdown),
            in_flight: Some("replace web".into()),
            pending: 2,
            pulling: Some("localhost/web:2".into()),
        };
        let all = refusals(&c, &g);
        assert_eq!(
            all.iter().map(|b| b.reason).collect::<Vec<_>>(),
            vec![
                Refusal::NoSnapshot,
                Refusal::Disconnected,
                Refusal::Draining,
                Refusal::UpgradeInProgress,
                Refusal::IntentPending,
                Refusal::ReconcilerBusy,
                Refusal::DownloadInProgress,
            ]
        );
        let text = FreezeError::Refused(all).to_string();
        assert_eq!(
            text,
            "cannot enter changefreeze now: no complete desired-state snapshot has been read yet; \
             NATS has been unreachable for 31 s, longer than the heartbeat window of 30 s; \
             the agent is shutting down; \
             upgrade attempt 6f1c2d3e-4a5b-4c6d-8e7f-a0b1c2d3e4f5 to 1.5.0 is in phase preparing; \
             an upgrade intent was accepted and has not completed; \
             replace web is in flight and 2 more planned; \
             image localhost/web:2 is being pulled and the updater is downloading and checking the artifact of attempt 6f1c2d3e-4a5b-4c6d-8e7f-a0b1c2d3e4f5"
        );
    }

    #[test]
    fn each_condition_alone() {
        let mut c = good();
        c.disconnected_for = Some(Duration::from_secs(30));
        assert!(
            reasons(&c, &idle_gate()).is_empty(),
            "within the window is not disconnected"
        );
        c.disconnected_for = Some(Duration::from_secs(45));
        assert_eq!(reasons(&c, &idle_gate()), vec![Refusal::Disconnected]);
        let mut c = good();
        c.upgrade.updater = transaction(UpgradePhase::Starting);
        assert_eq!(reasons(&c, &idle_gate()), vec![Refusal::UpgradeInProgress]);
        c.upgrade.updater = UpdaterView::Unknown {
            error: BoundedText::truncate("no answer within 5 s"),
        };
        assert_eq!(reasons(&c, &idle_gate()), vec![Refusal::UpgradeInProgress]);
        let mut g = idle_gate();
        g.pending = 1;
        assert_eq!(reasons(&good(), &g), vec![Refusal::ReconcilerBusy]);
        let mut g = idle_gate();
        g.in_flight = Some("create cam".into());
        g.pulling = Some("registry/cam:1".into());
        assert_eq!(
            reasons(&good(), &g),
            vec![Refusal::ReconcilerBusy, Refusal::DownloadInProgress]
        );
        let mut g = idle_gate();
        g.admission = Admission::Frozen;
        assert!(reasons(&good(), &g).is_empty());
    }

    #[test]
    fn retry_hint_is_the_longest_of_the_reasons() {
        assert_eq!(retry_after(&[]), RETRY_SHORT);
        assert_eq!(retry_after(&[Refusal::ReconcilerBusy]), RETRY_SHORT);
        assert_eq!(
            retry_after(&[Refusal::ReconcilerBusy, Refusal::DownloadInProgress]),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_after(&[Refusal::Draining, Refusal::NoSnapshot]),
            Duration::from_secs(60)
        );
    }

    /// Upgrades in memory: what a forwarder would say.
    #[derive(Debug, Default)]
    struct FakeUpgrades {
        held: std::sync::atomic::AtomicBool,
        pending: std::sync::atomic::AtomicBool,
        waiting: std::sync::atomic::AtomicBool,
    }

    impl Upgrades for FakeUpgrades {
        fn view(&self) -> UpgradeView {
            UpgradeView {
                updater: UpdaterView::Absent {},
                intent_pending: false,
            }
        }
        fn hold_forwarding(&self, held: bool) {
            self.held.store(held, std::sync::atomic::Ordering::SeqCst);
        }
        fn intent_pending(&self) -> bool {
            self.pending.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn intent_waiting(&self) -> bool {
            self.waiting.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl FakeUpgrades {
        fn held(&self) -> bool {
            self.held.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    fn control_with(dir: &Path) -> (FreezeControl, Arc<MutationGate>, Arc<FakeUpgrades>) {
        let layout = Layout::with_root(dir);
        std::fs::create_dir_all(layout.agent_state_dir()).expect("state dir");
        let gate = Arc::new(MutationGate::new());
        let up = Arc::new(FakeUpgrades::default());
        let fc = FreezeControl::load(
            &layout,
            Arc::clone(&gate),
            Arc::clone(&up) as Arc<dyn Upgrades>,
        );
        (fc, gate, up)
    }

    fn control(dir: &Path) -> (FreezeControl, Arc<MutationGate>) {
        let (fc, gate, _) = control_with(dir);
        (fc, gate)
    }

    #[test]
    fn forwarding_is_held_while_frozen_and_a_pending_intent_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fc, gate, up) = control_with(dir.path());
        up.pending.store(true, std::sync::atomic::Ordering::SeqCst);
        let e = fc
            .freeze(0, None, &good())
            .expect_err("an intent is pending");
        assert_eq!(e.reasons(), vec![Refusal::IntentPending]);
        assert!(!up.held(), "a refusal lets forwarding go on");
        assert_eq!(gate.admission(), Admission::Open);
        up.pending.store(false, std::sync::atomic::Ordering::SeqCst);
        fc.freeze(0, None, &good()).expect("frozen");
        assert!(up.held());
        up.waiting.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(fc.report().intent_waiting);
        // A restart while frozen holds forwarding from the start.
        let (again, _, up2) = control_with(dir.path());
        assert!(again.is_frozen() && up2.held());
        again.unfreeze(0).expect("thawed");
        assert!(!up2.held(), "the unfreeze lets the current intent through");
        up2.waiting.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(!again.report().intent_waiting, "not frozen: nothing waits");
    }

    #[test]
    fn freeze_is_durable_before_it_is_acknowledged_and_survives_a_restart() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let (fc, gate) = control(dir.path());
        assert!(!fc.is_frozen());
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c2 = Arc::clone(&calls);
        fc.on_change(move || {
            c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let r = fc.freeze(1000, Some(BoundedText::truncate("in motion")), &good());
        assert_eq!(r.expect("frozen"), Change::Done);
        assert_eq!(gate.admission(), Admission::Frozen);
        let path = Layout::with_root(dir.path()).freeze_state();
        let mode = std::fs::metadata(&path).expect("file").permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        match read_state(&path).expect("readable") {
            ConfigState::Changefreeze(f) => {
                assert_eq!(f.caller_uid, 1000);
                assert_eq!(f.reason.map(String::from).as_deref(), Some("in motion"));
            }
            other => panic!("{other:?}"),
        }
        // Again: nothing changes, and the rules are not asked.
        let mut busy = good();
        busy.snapshot_complete = false;
        assert_eq!(fc.freeze(0, None, &busy).expect("ok"), Change::Already);
        fc.set_waiting_changes(2);
        assert_eq!(fc.report().waiting_changes, 2);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);

        // A restart reads it back and starts frozen.
        let (again, gate2) = control(dir.path());
        assert!(again.is_frozen());
        assert_eq!(gate2.admission(), Admission::Frozen);

        assert_eq!(again.unfreeze(0).expect("thawed"), Change::Done);
        assert_eq!(gate2.admission(), Admission::Open);
        assert_eq!(
            read_state(&path).expect("readable"),
            ConfigState::Configured
        );
        assert_eq!(again.unfreeze(0).expect("ok"), Change::Already);
        again.set_waiting_changes(4);
        assert_eq!(again.report().waiting_changes, 0, "not frozen: ignored");
    }

    #[test]
    fn a_refused_or_unrecorded_freeze_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fc, gate) = control(dir.path());
        gate.set_pending(1);
        let e = fc.freeze(0, None, &good()).expect_err("refused");
        assert_eq!(e.reasons(), vec![Refusal::ReconcilerBusy]);
        assert_eq!(
            e.to_string(),
            "cannot enter changefreeze now: 1 workload mutations are planned"
        );
        assert!(!fc.is_frozen());
        assert_eq!(gate.admission(), Admission::Open);
        assert!(!Layout::with_root(dir.path()).freeze_state().exists());
        gate.set_pending(0);
        // The state directory is gone: the write fails, nothing changes.
        std::fs::remove_dir_all(Layout::with_root(dir.path()).agent_state_dir()).expect("rm");
        let e = fc.freeze(0, None, &good()).expect_err("not recorded");
        assert_eq!(e.reasons(), vec![Refusal::NotPersisted], "{e}");
        assert!(
            e.to_string()
                .starts_with("cannot enter changefreeze now: recording the config state in "),
            "{e}"
        );
        assert_eq!(retry_after(&e.reasons()), RETRY_LONG);
        assert!(!fc.is_frozen());
        assert_eq!(gate.admission(), Admission::Open);

        // An unfreeze that cannot be recorded leaves the agent frozen.
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.agent_state_dir()).expect("state dir");
        assert_eq!(fc.freeze(0, None, &good()).expect("frozen"), Change::Done);
        std::fs::remove_dir_all(layout.agent_state_dir()).expect("rm");
        let e = fc.unfreeze(0).expect_err("not recorded");
        assert!(matches!(e, FreezeError::Persist { .. }), "{e}");
        assert!(fc.is_frozen());
        assert_eq!(gate.admission(), Admission::Frozen);
    }

    #[test]
    fn an_unreadable_freeze_file_counts_as_frozen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.agent_state_dir()).expect("state dir");
        std::fs::write(layout.freeze_state(), "{\"format\":1").expect("write");
        let (fc, gate) = control(dir.path());
        assert!(fc.is_frozen());
        assert_eq!(gate.admission(), Admission::Frozen);
        match fc.report().state {
            ConfigState::Changefreeze(f) => assert!(
                f.reason
                    .as_ref()
                    .is_some_and(|r| r.as_str().contains("could not be read at start")),
                "{f:?}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(fc.unfreeze(0).expect("thawed"), Change::Done);
        assert_eq!(
            read_state(&layout.freeze_state()).expect("rewritten"),
            ConfigState::Configured
        );
    }
}
