//! Agent upgrades, the agent's half (`docs/design/upgrade.md`): the intent is
//! followed, validated and forwarded to the updater, and the updater's
//! transaction is mirrored into `fleet-status` `<device>.upgrade`.
//!
//! | piece | owns |
//! |---|---|
//! | [`UpgradeState`] | the handle others hold: what is pending, whether forwarding is allowed |
//! | [`recovered_transaction`] | start-up: the updater's transaction read and checked before READY |
//! | [`UpgradeState::start`] | the recovered status published (acked) before READY, then the threads |
//! | `agent-intent` | a [`Watcher`] on `fleet-control` `<device>.agent-upgrade-intent`: the intent, read then followed |
//! | `agent-upgrade` (`worker`) | validates, forwards, polls, publishes, records the attempts seen |
//! | `agent-upgrade-call` | one `upgrade` request (up to 20 min), so reconciling and polling go on |
//!
//! Steps for an intent: validate it ([`intent::decode`]: this device, this
//! architecture, a valid attempt); check its UUID against the attempts seen
//! ([`intent::verdict`]: another digest is a conflict, an ended attempt is
//! never forwarded again); record it as forwarded; publish `preparing`;
//! send one `upgrade` request; poll `status` every second and publish each
//! change, `complete` included; record the outcome. A refused attempt is
//! published as `failed` with reason `rejected` or `conflict` and an error
//! naming the rule; an intent refused without a valid UUID or target
//! version is published as a refused intent (its sequence and digest, the
//! identity rule it broke, escaped excerpts of the offending fields).
//!
//! On SIGTERM, when the updater is stopping this agent for a cutover, the
//! worker publishes `stopping` with reason `updater` and the drain
//! duration, acknowledged ([`UpgradeHandle::begin_stop`]).

pub(crate) mod intent;
mod seen;
mod updater;
mod worker;

use std::fmt;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet_common::contracts::{AttemptOutcome, UpgradePhase, UpgradeReport, UpgradeStatus};
use fleet_common::limits::{NATS_REQUEST_TIMEOUT, SOCKET_STATUS_RESPONSE_TIMEOUT};
use fleet_common::subjects::{status_key, StatusKey, BUCKET_CONTROL, BUCKET_STATUS, INTENT_KEY};
use fleet_common::validate::{Arch, AttemptUuid, Version};
use fleet_common::Layout;

use crate::nats::watch::WatchStatus;
use crate::nats::{kv, Nats, PublishError, WatchEvent, WatchHandle, Watcher};
use crate::shutdown::Shutdown;
use crate::threads;
use seen::SeenStore;
use worker::{Msg, StopOutcome, Worker};

/// Delay between start-up retries of the recovered status write.
const STARTUP_RETRY_DELAY: Duration = Duration::from_secs(2);

/// What the agent knows of upgrades, shared with whoever needs to ask
/// (the change freeze's entry checks, the local API) or to hold forwarding
/// back. Cheap to clone.
#[derive(Debug, Clone)]
pub struct UpgradeState {
    shared: Arc<Shared>,
    tx: Sender<Msg>,
}

#[derive(Debug)]
struct Shared {
    view: Mutex<View>,
    /// The worker's end of the channel, until [`UpgradeState::start`] takes it.
    inbox: Mutex<Option<Receiver<Msg>>>,
}

#[derive(Debug, Clone)]
struct View {
    forwarding: bool,
    intent_waiting: bool,
    /// The accepted attempt whose transaction has not ended.
    pending: Option<AttemptUuid>,
    /// The updater's transaction as last read.
    last: Option<UpgradeStatus>,
}

impl Default for UpgradeState {
    fn default() -> Self {
        Self::new()
    }
}

impl UpgradeState {
    /// Forwarding allowed, nothing pending, nothing known of the updater.
    pub fn new() -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            shared: Arc::new(Shared {
                view: Mutex::new(View {
                    forwarding: true,
                    intent_waiting: false,
                    pending: None,
                    last: None,
                }),
                inbox: Mutex::new(Some(rx)),
            }),
            tx,
        }
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.shared.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An intent was accepted (validated, forwarded or about to be) and its
    /// transaction has not ended yet. (Change freeze: refuse entry.)
    // The change freeze's entry checks call these three.
    #[allow(dead_code)]
    pub fn intent_pending(&self) -> bool {
        self.view().pending.is_some()
    }

    /// The updater's transaction, as last read, is not terminal. It is read
    /// at start, every second while an attempt is followed, and after each
    /// `upgrade` answer; the updater runs no transaction the agent did not
    /// forward. (Change freeze: refuse entry.)
    #[allow(dead_code)]
    pub fn transaction_active(&self) -> bool {
        self.view()
            .last
            .as_ref()
            .is_some_and(|s| !s.phase.is_terminal())
    }

    /// A valid new intent arrived while forwarding was held back and waits
    /// for [`set_forwarding`](Self::set_forwarding)`(true)` (reported as
    /// `intent-waiting` in the config state).
    #[allow(dead_code)]
    pub fn intent_waiting(&self) -> bool {
        self.view().intent_waiting
    }

    /// Allows or holds back forwarding intents to the updater (a change
    /// freeze holds it back). Held back, a valid new intent is noted as
    /// waiting and not forwarded; refusals (another device, a reused UUID)
    /// are still published. Allowed again, the worker takes the current
    /// intent — the latest value read from NATS — and handles it as new.
    /// An attempt already forwarded is not affected: the updater owns it.
    #[allow(dead_code)]
    pub fn set_forwarding(&self, allowed: bool) {
        self.view().forwarding = allowed;
        let _ = self.tx.send(Msg::Forwarding);
    }

    fn forwarding(&self) -> bool {
        self.view().forwarding
    }

    /// Marks `uuid` pending if forwarding is allowed, in one step: a hold
    /// set before this returns is seen, and a hold set after it finds the
    /// attempt pending (whoever holds forwarding checks
    /// [`intent_pending`](Self::intent_pending) after setting the hold).
    fn accept(&self, uuid: AttemptUuid) -> bool {
        let mut v = self.view();
        if v.forwarding {
            v.pending = Some(uuid);
            v.intent_waiting = false;
        }
        v.forwarding
    }

    fn set_waiting(&self, waiting: bool) {
        self.view().intent_waiting = waiting;
    }

    fn set_pending(&self, uuid: Option<AttemptUuid>) {
        self.view().pending = uuid;
    }

    fn set_last(&self, status: Option<UpgradeStatus>) {
        self.view().last = status;
    }

    fn last(&self) -> Option<UpgradeStatus> {
        self.view().last.clone()
    }

    /// Publishes the recovered transaction's status (acknowledged, retried
    /// until `s.publish_until`) when it is not terminal or its end was never
    /// mirrored, then starts `agent-intent` and `agent-upgrade`. `Ok(None)`
    /// when shutdown was requested meanwhile.
    pub fn start(&self, s: Start) -> Result<Option<UpgradeHandle>, StartupError> {
        let mut seen = SeenStore::load(&s.layout);
        let mut published = None;
        if let Some(r) = &s.recovered {
            let ended = seen
                .attempts()
                .find(&r.attempt_uuid)
                .is_some_and(|a| a.outcome.has_ended());
            if !r.phase.is_terminal() || !ended {
                let key = status_key(s.nats.device(), StatusKey::Upgrade);
                loop {
                    match kv::put_json(&s.nats, BUCKET_STATUS, &key, r, NATS_REQUEST_TIMEOUT) {
                        Ok(_) => break,
                        Err(last) if Instant::now() + STARTUP_RETRY_DELAY >= s.publish_until => {
                            return Err(StartupError::NotPublished { last })
                        }
                        Err(e) => {
                            log::warn!("publishing the upgrade status: {e}; retrying");
                            if s.shutdown.sleep(STARTUP_RETRY_DELAY) {
                                return Ok(None);
                            }
                        }
                    }
                }
                log::info!(attempt = r.attempt_uuid.to_string().as_str(); "upgrade status {} published", r.phase);
                published = Some(r.clone());
            }
            if let Some(outcome) = outcome_of(r.phase) {
                if let Err(e) = seen.end(&r.attempt_uuid, outcome) {
                    log::error!("{e}");
                }
            }
        }
        let rx = self
            .shared
            .inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(StartupError::AlreadyStarted)?;
        let device = s.nats.device().clone();
        let worker = Worker::new(worker::Setup {
            nats: Arc::clone(&s.nats),
            socket: s.layout.updater_socket(),
            device,
            arch: s.arch,
            state: self.clone(),
            seen,
            tx: self.tx.clone(),
            shutdown: Arc::clone(&s.shutdown),
            recovered: s.recovered.filter(|r| !r.phase.is_terminal()),
            published: published.map(UpgradeReport::Attempt),
        });
        let thread =
            threads::spawn("agent-upgrade", move || worker.run(&rx)).map_err(|source| {
                StartupError::Thread {
                    name: "agent-upgrade",
                    source,
                }
            })?;
        let tx = self.tx.clone();
        let intents = Watcher {
            bucket: BUCKET_CONTROL,
            key: INTENT_KEY,
            expand: expand_intent,
            nats: s.nats,
            check: s.check,
            shutdown: s.shutdown,
        }
        .spawn("agent-intent", move |event| match intent_of(event) {
            Some(value) => tx.send(Msg::Intent(value)).is_ok(),
            None => true,
        })
        .map_err(|source| StartupError::Thread {
            name: "agent-intent",
            source,
        })?;
        Ok(Some(UpgradeHandle {
            worker: thread,
            intents,
            tx: self.tx.clone(),
        }))
    }
}

/// The intent key as the watcher hands it over: present or absent (the
/// attempt's content is validated by the worker, which reports refusals).
fn expand_intent(
    value: Option<Vec<u8>>,
) -> Result<std::collections::BTreeMap<String, Vec<u8>>, String> {
    Ok(value
        .map(|v| std::collections::BTreeMap::from([(INTENT_KEY.to_owned(), v)]))
        .unwrap_or_default())
}

/// The intent in a watch event: `Some(None)` when it is absent (never
/// written or deleted), `None` when the event is about another key.
fn intent_of(event: WatchEvent) -> Option<Option<Vec<u8>>> {
    match event {
        WatchEvent::Snapshot(mut keys) => Some(keys.remove(INTENT_KEY)),
        WatchEvent::Put(k, v) if k == INTENT_KEY => Some(Some(v)),
        WatchEvent::Delete(k) if k == INTENT_KEY => Some(None),
        WatchEvent::Put(k, _) | WatchEvent::Delete(k) => {
            log::debug!(bucket = BUCKET_CONTROL; "ignoring key {k:?}: only {INTENT_KEY} is read");
            None
        }
    }
}

/// The seen-record outcome of a terminal public phase.
fn outcome_of(phase: UpgradePhase) -> Option<AttemptOutcome> {
    match phase {
        UpgradePhase::Complete => Some(AttemptOutcome::Complete),
        UpgradePhase::Failed => Some(AttemptOutcome::Failed),
        UpgradePhase::RollbackFailed => Some(AttemptOutcome::RollbackFailed),
        UpgradePhase::Preparing
        | UpgradePhase::Stopping
        | UpgradePhase::Starting
        | UpgradePhase::RollingBack => None,
    }
}

/// What [`UpgradeState::start`] needs.
#[derive(Debug)]
pub struct Start {
    pub nats: Arc<Nats>,
    pub layout: Layout,
    pub arch: Arch,
    /// The periodic backstop read of the intent.
    pub check: Duration,
    pub shutdown: Arc<Shutdown>,
    /// From [`recovered_transaction`].
    pub recovered: Option<UpgradeStatus>,
    /// Until when the acknowledged write of the recovered status is retried.
    pub publish_until: Instant,
}

/// Start-up cannot go on to readiness.
#[derive(Debug)]
pub enum StartupError {
    /// The updater is starting the upgrade target, and this binary is not it.
    NotTheTarget {
        running: Version,
        target: Version,
        attempt: AttemptUuid,
    },
    /// The recovered transaction's status was not acknowledged in time.
    NotPublished { last: PublishError },
    Thread {
        name: &'static str,
        source: std::io::Error,
    },
    /// `start` was called twice.
    AlreadyStarted,
}

impl fmt::Display for StartupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotTheTarget {
                running,
                target,
                attempt,
            } => write!(
                f,
                "this binary is fleet-agent {running}, but the updater is starting {target} for attempt {attempt}: exiting without readiness so the updater rolls back; check the release's artifact is a build of {target}"
            ),
            Self::NotPublished { last } => write!(
                f,
                "the recovered upgrade status was not acknowledged: {last}; check this device may write its fleet-status keys"
            ),
            Self::Thread { name, source } => write!(f, "starting thread {name}: {source}"),
            Self::AlreadyStarted => write!(f, "the upgrade threads were started twice"),
        }
    }
}

impl std::error::Error for StartupError {}

/// Start-up after a possible cutover (`docs/design/upgrade.md` "Readiness and
/// commit"): reads the updater's transaction (bounded by the status response
/// limit) and, when the updater is starting its target, checks this binary is
/// that version. An unreachable updater is logged and start-up goes on: a
/// device never goes without an agent because its updater is down.
pub fn recovered_transaction(
    state: &UpgradeState,
    layout: &Layout,
    version: &Version,
) -> Result<Option<UpgradeStatus>, StartupError> {
    let socket: PathBuf = layout.updater_socket();
    let status = match updater::status(&socket, SOCKET_STATUS_RESPONSE_TIMEOUT) {
        Ok(s) => s,
        Err(e) => {
            log::warn!(
                "{e}; starting without the updater's transaction (upgrades wait until it answers)"
            );
            return Ok(None);
        }
    };
    let Some(s) = status else {
        log::info!("the updater has run no upgrade on this device");
        return Ok(None);
    };
    let uuid = s.attempt_uuid.to_string();
    log::info!(attempt = uuid.as_str(); "the updater's transaction: {} to {}", s.phase, s.target_version);
    state.set_last(Some(s.clone()));
    if s.phase == UpgradePhase::Starting && &s.target_version != version {
        return Err(StartupError::NotTheTarget {
            running: version.clone(),
            target: s.target_version.clone(),
            attempt: s.attempt_uuid,
        });
    }
    Ok(Some(s))
}

/// The running upgrade threads.
#[derive(Debug)]
pub struct UpgradeHandle {
    worker: JoinHandle<()>,
    intents: WatchHandle,
    tx: Sender<Msg>,
}

/// An upgrade stop under way (see [`UpgradeHandle::begin_stop`]).
#[derive(Debug)]
pub struct StoppingUpgrade {
    worker: JoinHandle<()>,
    intents: WatchHandle,
    done: Receiver<StopOutcome>,
    until: Instant,
}

impl UpgradeHandle {
    /// The intent watcher's status: a change freeze asks it for a new
    /// snapshot (the current intent) at unfreeze.
    pub fn intents_status(&self) -> Arc<WatchStatus> {
        Arc::clone(&self.intents.status)
    }

    /// Shutdown has been requested: asks the worker to publish, when the
    /// updater is stopping this agent for a cutover, the acknowledged
    /// `stopping` status with reason `updater` and `drain`, all before
    /// `until`. Returns at once, so the heartbeat goes out meanwhile.
    pub fn begin_stop(self, drain: Duration, until: Instant) -> StoppingUpgrade {
        let (done, rx) = mpsc::sync_channel(1);
        let _ = self.tx.send(Msg::Stop { drain, until, done });
        StoppingUpgrade {
            worker: self.worker,
            intents: self.intents,
            done: rx,
            until,
        }
    }
}

impl StoppingUpgrade {
    /// Waits for the worker's answer and both threads, until the deadline.
    pub fn wait(self) {
        let left = || self.until.saturating_duration_since(Instant::now());
        match self.done.recv_timeout(left()) {
            Ok(StopOutcome::Published(s)) => {
                log::info!(attempt = s.attempt_uuid.to_string().as_str(); "upgrade status stopping (updater) acknowledged")
            }
            Ok(StopOutcome::NotStopping) => {}
            Ok(StopOutcome::Failed(e)) => {
                log::warn!("upgrade status stopping not acknowledged: {e}")
            }
            Err(_) => log::warn!("the upgrade worker did not answer the stop in time"),
        }
        threads::join_within(self.worker, left(), "agent-upgrade");
        self.intents.join_within(left());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::validate::Sha256Hex;
    use fleet_common::Timestamp;

    #[test]
    fn a_hold_on_forwarding_and_acceptance_exclude_each_other() {
        let state = UpgradeState::new();
        let rx = state
            .shared
            .inbox
            .lock()
            .expect("inbox")
            .take()
            .expect("the worker's end");
        assert!(!state.intent_pending() && !state.transaction_active());
        let first = AttemptUuid::new_random();
        assert!(state.accept(first), "forwarding is allowed at first");
        assert!(state.intent_pending());
        state.set_pending(None);

        // Held: nothing is accepted, and the worker is told.
        state.set_forwarding(false);
        assert!(matches!(rx.try_recv(), Ok(Msg::Forwarding)));
        assert!(!state.accept(AttemptUuid::new_random()));
        assert!(!state.intent_pending(), "a held attempt is not pending");
        state.set_waiting(true);
        assert!(state.intent_waiting());

        // Allowed again: the next acceptance clears the waiting mark.
        state.set_forwarding(true);
        assert!(matches!(rx.try_recv(), Ok(Msg::Forwarding)));
        assert!(state.accept(first));
        assert!(!state.intent_waiting());
    }

    #[test]
    fn a_transaction_is_active_until_its_phase_is_terminal() {
        let state = UpgradeState::new();
        let mut s = UpgradeStatus::begin(
            AttemptUuid::new_random(),
            Sha256Hex::of(b"a"),
            Version::parse("2.0").expect("v"),
            UpgradePhase::Starting,
            None,
            Timestamp::from_unix_millis(0),
        );
        state.set_last(Some(s.clone()));
        assert!(state.transaction_active());
        s.enter(UpgradePhase::Complete, None, Timestamp::from_unix_millis(1));
        state.set_last(Some(s));
        assert!(!state.transaction_active());
        assert_eq!(outcome_of(UpgradePhase::RollingBack), None);
        assert_eq!(
            outcome_of(UpgradePhase::RollbackFailed),
            Some(AttemptOutcome::RollbackFailed)
        );
    }
}
