//! The `agent-upgrade` thread: owns the intent, the attempt being followed,
//! the record of attempts seen and every write of `<device>.upgrade`.
//!
//! It waits on its channel (intents from `agent-intent`, answers from
//! `agent-upgrade-call`, forwarding changes, the stop) at most a second at
//! a time. Each turn: poll the updater when an attempt is followed and the
//! poll is due; retry a status write that failed; take the current intent
//! when nothing is followed. After shutdown it only answers the stop.
//!
//! An attempt followed ([`Tracked`]) ends when the updater's status for it
//! (same UUID and digest) is terminal, or when the updater refused it, or
//! when the updater stayed unreachable for [`UPDATER_GONE_GRACE`] after
//! the request ended.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AgentUpgradeAttempt, AttemptOutcome, BindError, Bounded, ErrorCode, IntentRef, RefusalReason,
    RefusedIntent, Response, UpdaterReply, UpgradePhase, UpgradeReason, UpgradeReport,
    UpgradeStatus,
};
use fleet_common::limits::{NATS_REQUEST_TIMEOUT, SOCKET_STATUS_RESPONSE_TIMEOUT};
use fleet_common::socket::ClientError;
use fleet_common::subjects::{status_key, StatusKey, BUCKET_CONTROL, BUCKET_STATUS, INTENT_KEY};
use fleet_common::validate::{Arch, AttemptUuid, BoundedText, DeviceId, Sha256Hex, Version};
use fleet_common::Timestamp;

use super::intent::{self, Verdict};
use super::seen::SeenStore;
use super::updater::{self, StatusError};
use super::{outcome_of, UpgradeState};
use crate::nats::{kv, read_key, Nats};
use crate::shutdown::Shutdown;
use crate::threads;

/// How often the updater is polled while an attempt is followed.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Longest wait on the channel, so shutdown is noticed.
const TICK: Duration = Duration::from_secs(1);
/// How long an updater that stopped answering (it crashed or restarts) is
/// waited for, once the `upgrade` request has ended, before the attempt is
/// reported failed: systemd restarts it well within this, and its
/// recovery then says what became of the attempt.
pub const UPDATER_GONE_GRACE: Duration = Duration::from_secs(120);
/// How long after a `busy` answer the request is sent again, and how
/// many times: the updater is busy for a moment when it has just started
/// (its recovery holds the one mutator until the agent it started is
/// ready). Busy with another attempt under way is a failure at once.
const BUSY_RETRY_DELAY: Duration = Duration::from_secs(5);
const BUSY_RETRIES: u32 = 12;
/// Bound on the status read that decides, at SIGTERM, whether the updater
/// is stopping this agent (it answers from memory at once).
const STOP_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Messages to the worker.
#[derive(Debug)]
pub enum Msg {
    /// The intent now (`None`: absent).
    Intent(Option<Vec<u8>>),
    /// Forwarding was allowed or held back ([`UpgradeState::set_forwarding`]).
    Forwarding,
    /// The `upgrade` request for `uuid` ended.
    Called {
        uuid: AttemptUuid,
        result: Box<Result<Response<UpdaterReply>, ClientError>>,
    },
    /// Publish the stopping status if the updater is stopping us, then exit.
    Stop {
        drain: Duration,
        until: Instant,
        done: SyncSender<StopOutcome>,
    },
}

/// The answer to [`Msg::Stop`].
#[derive(Debug)]
pub enum StopOutcome {
    Published(Box<UpgradeStatus>),
    /// No cutover is stopping this agent.
    NotStopping,
    Failed(String),
}

/// Where the current intent is in its handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handling {
    /// New or changed: to be handled when nothing is followed.
    Due,
    /// Valid and new, held back while forwarding is not allowed.
    Waiting,
    Done,
}

/// The `upgrade` request of the attempt followed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    /// Not sent by this run (followed after a restart).
    NotSent,
    InFlight,
    /// Answered `busy`: sent again at `retry_at` unless the updater is
    /// busy with another attempt.
    Busy {
        retry_at: Instant,
        why: String,
    },
    /// It ended; with the refusal it would mean if the updater never shows
    /// the attempt.
    Ended(Option<(UpgradeReason, String)>),
}

/// The attempt followed.
#[derive(Debug)]
struct Tracked {
    uuid: AttemptUuid,
    digest: Sha256Hex,
    target_version: Version,
    /// The content, when known (from the intent): needed to send it again.
    attempt: Option<AgentUpgradeAttempt>,
    call: Call,
    /// `busy` answers still to be retried.
    busy_left: u32,
    /// The updater's status has shown this attempt.
    shown: bool,
    unreachable_since: Option<Instant>,
}

/// What [`Worker::new`] takes.
#[derive(Debug)]
pub struct Setup {
    pub nats: Arc<Nats>,
    pub socket: PathBuf,
    pub device: DeviceId,
    pub arch: Arch,
    pub state: UpgradeState,
    pub seen: SeenStore,
    pub tx: Sender<Msg>,
    pub shutdown: Arc<Shutdown>,
    /// A transaction found at start that has not ended: followed at once.
    pub recovered: Option<UpgradeStatus>,
    /// What start-up already published.
    pub published: Option<UpgradeReport>,
}

#[derive(Debug)]
pub struct Worker {
    s: Setup,
    intent: Option<Vec<u8>>,
    handling: Handling,
    tracked: Option<Tracked>,
    unpublished: Option<UpgradeReport>,
    next_poll: Instant,
}

impl Worker {
    pub fn new(s: Setup) -> Self {
        let tracked = s.recovered.as_ref().map(|r| Tracked {
            uuid: r.attempt_uuid,
            digest: r.attempt_digest.clone(),
            target_version: r.target_version.clone(),
            attempt: None,
            call: Call::NotSent,
            busy_left: BUSY_RETRIES,
            shown: true,
            unreachable_since: None,
        });
        s.state.set_pending(tracked.as_ref().map(|t| t.uuid));
        Self {
            s,
            intent: None,
            // Nothing to handle until the first snapshot arrives.
            handling: Handling::Done,
            tracked,
            unpublished: None,
            next_poll: Instant::now(),
        }
    }

    pub fn run(mut self, rx: &Receiver<Msg>) {
        loop {
            let msg = match rx.recv_timeout(TICK) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            match msg {
                Some(Msg::Stop { drain, until, done }) => {
                    let _ = done.send(self.stop(drain, until));
                    return;
                }
                Some(Msg::Intent(value)) => {
                    if value != self.intent || self.handling != Handling::Waiting {
                        self.handling = Handling::Due;
                    }
                    self.intent = value;
                }
                Some(Msg::Forwarding)
                    if self.handling == Handling::Waiting && self.s.state.forwarding() =>
                {
                    self.handling = Handling::Due;
                }
                Some(Msg::Called { uuid, result }) => self.on_called(uuid, *result),
                Some(Msg::Forwarding) | None => {}
            }
            if self.s.shutdown.is_requested() {
                continue;
            }
            if self.tracked.is_some() && Instant::now() >= self.next_poll {
                self.poll();
            }
            self.flush();
            if self.tracked.is_none() && self.handling == Handling::Due {
                self.handle_intent();
            }
        }
    }

    fn key(&self) -> String {
        status_key(&self.s.device, StatusKey::Upgrade)
    }

    fn attempt_label(uuid: &AttemptUuid) -> String {
        uuid.to_string()
    }

    /// Names a report in a log line: its attempt, or the refused intent.
    fn report_label(report: &UpgradeReport) -> String {
        match report {
            UpgradeReport::Attempt(s) => Self::attempt_label(&s.attempt_uuid),
            UpgradeReport::RefusedIntent(r) => match r.intent.sequence {
                Some(seq) => format!("intent at sequence {seq}"),
                None => format!("intent {}", r.intent.digest),
            },
        }
    }

    /// Queues `report` for `<device>.upgrade` and tries to write it now.
    fn publish(&mut self, report: impl Into<UpgradeReport>) {
        self.unpublished = Some(report.into());
        self.flush();
    }

    /// Writes the queued status (acknowledged); kept for the next turn on failure.
    fn flush(&mut self) {
        let Some(status) = self.unpublished.take() else {
            return;
        };
        if self.s.published.as_ref() == Some(&status) {
            return;
        }
        let key = self.key();
        match kv::put_json(
            &self.s.nats,
            BUCKET_STATUS,
            &key,
            &status,
            NATS_REQUEST_TIMEOUT,
        ) {
            Ok(_) => {
                log::info!(attempt = Self::report_label(&status).as_str(); "upgrade status {}{} published", status.phase(), status.reason().map(|r| format!(" ({r})")).unwrap_or_default());
                self.s.published = Some(status);
            }
            Err(e) => {
                log::warn!("upgrade status not published: {e}; retrying");
                self.unpublished = Some(status);
            }
        }
    }

    /// The intent, validated and checked against the attempts seen; a new
    /// valid attempt is forwarded (or noted as waiting).
    fn handle_intent(&mut self) {
        self.handling = Handling::Done;
        let Some(raw) = self.intent.clone() else {
            self.s.state.set_waiting(false);
            return;
        };
        let (attempt, digest) = match intent::decode(&raw, &self.s.device, self.s.arch) {
            Ok(ok) => ok,
            Err(r) => return self.reject(*r),
        };
        let uuid = Self::attempt_label(&attempt.uuid);
        match intent::verdict(self.s.seen.attempts(), &attempt.uuid, &digest) {
            Verdict::Conflict { earlier } => {
                let why = intent::conflict_message(&attempt.uuid, &earlier, &digest);
                log::error!(attempt = uuid.as_str(); "refused: {why}");
                self.publish_refusal(
                    attempt.uuid,
                    digest,
                    attempt.target_version,
                    UpgradeReason::Conflict,
                    why,
                );
            }
            Verdict::Ended(outcome) => {
                log::debug!(attempt = uuid.as_str(); "already {outcome}; not forwarded again");
            }
            Verdict::EndedLongAgo => {
                log::debug!(attempt = uuid.as_str(); "seen long ago; not forwarded again");
            }
            Verdict::Full => {
                let why = BindError::Full.to_string();
                log::error!(attempt = uuid.as_str(); "refused: {why}");
                self.publish_refusal(
                    attempt.uuid,
                    digest,
                    attempt.target_version,
                    UpgradeReason::Rejected,
                    why,
                );
            }
            Verdict::Forwarded => {
                log::info!(attempt = uuid.as_str(); "forwarded before this start; following it again");
                self.track(attempt, digest, Call::NotSent);
            }
            Verdict::New if self.s.state.accept(attempt.uuid) => self.forward(attempt, digest),
            Verdict::New => {
                log::info!(attempt = uuid.as_str(); "upgrade to {} waits: forwarding is held back", attempt.target_version);
                self.handling = Handling::Waiting;
                self.s.state.set_waiting(true);
            }
        }
    }

    /// Publishes `failed` (`rejected`) for an intent the agent refuses,
    /// once per content: under its attempt when its UUID and target
    /// version are valid, as a refused intent otherwise. A valid UUID is
    /// recorded (a corrected intent needs a new UUID); a value without one
    /// is published once while it stays the intent (again after a restart,
    /// or when the same bytes come back under another sequence).
    fn reject(&mut self, r: intent::Rejection) {
        let Some(uuid) = r.uuid else {
            log::error!(
                "refused the upgrade intent, which has no valid attempt uuid: {}",
                r.rule
            );
            return self.publish_refused_intent(r, RefusalReason::Rejected, None);
        };
        let label = Self::attempt_label(&uuid);
        match intent::verdict(self.s.seen.attempts(), &uuid, &r.digest) {
            Verdict::Ended(_) | Verdict::EndedLongAgo => {
                log::debug!(attempt = label.as_str(); "refused before: {}", r.rule);
                return;
            }
            Verdict::Conflict { earlier } => {
                let why = intent::conflict_message(&uuid, &earlier, &r.digest);
                log::error!(attempt = label.as_str(); "refused: {why}");
                return match r.target_version.clone() {
                    Some(version) => {
                        self.publish_refusal(uuid, r.digest, version, UpgradeReason::Conflict, why)
                    }
                    None => self.publish_refused_intent(r, RefusalReason::Conflict, Some(why)),
                };
            }
            Verdict::New | Verdict::Forwarded | Verdict::Full => {}
        }
        log::error!(attempt = label.as_str(); "refused: {}", r.rule);
        if let Err(e) = self.s.seen.record(
            uuid,
            r.digest.clone(),
            r.target_version.clone(),
            AttemptOutcome::Rejected,
        ) {
            log::error!("{e}");
        }
        match r.target_version.clone() {
            Some(version) => self.publish_refusal(
                uuid,
                r.digest,
                version,
                UpgradeReason::Rejected,
                r.rule.to_string(),
            ),
            None => self.publish_refused_intent(r, RefusalReason::Rejected, None),
        }
    }

    /// Publishes a refused intent for `r`, which has no valid UUID or no
    /// valid target version; not again while the same value (the same
    /// bytes at the same sequence) is the last report published. `why`
    /// replaces the rule's message.
    fn publish_refused_intent(
        &mut self,
        r: intent::Rejection,
        reason: RefusalReason,
        why: Option<String>,
    ) {
        let Some(u) = r.unidentified else {
            // INVARIANT: decode describes every value it leaves without a
            // UUID or a target version.
            log::error!(
                "refused the upgrade intent and cannot describe it: {}",
                r.rule
            );
            return;
        };
        // The same value (same bytes, same sequence when it could be read)
        // already reported: a snapshot after a reconnect reads it again.
        let sequence = self.sequence_of(&r.digest);
        let same = |p: &UpgradeReport| {
            matches!(p, UpgradeReport::RefusedIntent(p)
                if p.intent.digest == r.digest
                    && p.reason == reason
                    && (sequence.is_none() || p.intent.sequence == sequence))
        };
        if self.s.published.as_ref().is_some_and(same)
            || self.unpublished.as_ref().is_some_and(same)
        {
            log::debug!("intent {} refused before: {}", r.digest, r.rule);
            return;
        }
        let mut fields = Bounded::default();
        for f in u.fields {
            fields.push(f);
        }
        let report = RefusedIntent {
            reason,
            intent: IntentRef {
                sequence,
                digest: r.digest,
                bytes: u.bytes,
                uuid: r.uuid,
            },
            rule: u.rule,
            fields,
            error: BoundedText::truncate(why.unwrap_or_else(|| r.rule.to_string())),
            refused_at: Timestamp::now(),
        };
        self.publish(UpgradeReport::RefusedIntent(report));
    }

    /// The `fleet-control` sequence of the intent whose bytes hash to
    /// `digest`, read again (one Direct Get): `None` when the key has
    /// changed since (its new value comes as its own event) or the read
    /// failed.
    fn sequence_of(&self, digest: &Sha256Hex) -> Option<u64> {
        match read_key(&self.s.nats, BUCKET_CONTROL, INTENT_KEY) {
            Ok(k) if k.value.as_deref().map(Sha256Hex::of).as_ref() == Some(digest) => Some(k.seq),
            Ok(_) => None,
            Err(e) => {
                log::warn!("reading the intent's sequence: {e}; reporting the refusal without it");
                None
            }
        }
    }

    fn publish_refusal(
        &mut self,
        uuid: AttemptUuid,
        digest: Sha256Hex,
        version: Version,
        reason: UpgradeReason,
        why: String,
    ) {
        let mut s = UpgradeStatus::begin(
            uuid,
            digest,
            version,
            UpgradePhase::Failed,
            Some(reason),
            Timestamp::now(),
        );
        s.detail = Some(BoundedText::truncate(
            "refused by the agent; not sent to the updater",
        ));
        s.error = Some(BoundedText::truncate(why));
        self.publish(s);
    }

    /// Records the attempt as forwarded, publishes `preparing` and sends
    /// the one `upgrade` request on its own thread. The attempt is already
    /// pending ([`UpgradeState::accept`]).
    fn forward(&mut self, attempt: AgentUpgradeAttempt, digest: Sha256Hex) {
        let uuid = Self::attempt_label(&attempt.uuid);
        log::info!(attempt = uuid.as_str(); "accepted the upgrade to {} ({}); sending it to the updater", attempt.target_version, attempt.artifact_url);
        if let Err(e) = self.s.seen.record(
            attempt.uuid,
            digest.clone(),
            Some(attempt.target_version.clone()),
            AttemptOutcome::Forwarded,
        ) {
            // The updater refuses a reused UUID on its own.
            log::error!("{e}; forwarding anyway");
        }
        let mut s = UpgradeStatus::begin(
            attempt.uuid,
            digest.clone(),
            attempt.target_version.clone(),
            UpgradePhase::Preparing,
            Some(UpgradeReason::Accepted),
            Timestamp::now(),
        );
        s.detail = Some(BoundedText::truncate(
            "accepted by the agent; sent to the updater",
        ));
        self.publish(s);
        self.track(attempt, digest, Call::InFlight);
    }

    fn track(&mut self, attempt: AgentUpgradeAttempt, digest: Sha256Hex, call: Call) {
        let send = call == Call::InFlight;
        self.tracked = Some(Tracked {
            uuid: attempt.uuid,
            digest,
            target_version: attempt.target_version.clone(),
            attempt: Some(attempt.clone()),
            call,
            busy_left: BUSY_RETRIES,
            shown: false,
            unreachable_since: None,
        });
        self.s.state.set_pending(Some(attempt.uuid));
        self.next_poll = Instant::now() + if send { POLL_INTERVAL } else { Duration::ZERO };
        if send {
            self.send(attempt);
        }
    }

    /// Starts `agent-upgrade-call` for `attempt`.
    fn send(&mut self, attempt: AgentUpgradeAttempt) {
        let socket = self.s.socket.clone();
        let tx = self.s.tx.clone();
        let uuid = attempt.uuid;
        if let Some(t) = self.tracked.as_mut() {
            t.call = Call::InFlight;
        }
        let spawned = threads::spawn("agent-upgrade-call", move || {
            let result = updater::upgrade(&socket, &attempt);
            let _ = tx.send(Msg::Called {
                uuid,
                result: Box::new(result),
            });
        });
        if let Err(e) = spawned {
            self.fail(
                UpgradeReason::UpdaterUnavailable,
                format!("starting the thread that calls the updater: {e}"),
            );
        }
    }

    fn is_ours(&self, s: &UpgradeStatus) -> bool {
        self.tracked
            .as_ref()
            .is_some_and(|t| t.uuid == s.attempt_uuid && t.digest == s.attempt_digest)
    }

    /// Publishes a status of the attempt followed; ends it when terminal.
    fn mirror(&mut self, s: UpgradeStatus) {
        if let Some(t) = self.tracked.as_mut() {
            t.shown = true;
            t.unreachable_since = None;
        }
        let phase = s.phase;
        self.publish(s);
        if let Some(outcome) = outcome_of(phase) {
            self.end(outcome);
        }
    }

    /// The attempt followed ended in `outcome`.
    fn end(&mut self, outcome: AttemptOutcome) {
        if let Some(t) = self.tracked.take() {
            log::info!(attempt = Self::attempt_label(&t.uuid).as_str(); "the upgrade to {} ended: {outcome}", t.target_version);
            if let Err(e) = self.s.seen.end(&t.uuid, outcome) {
                log::error!("{e}");
            }
        }
        self.s.state.set_pending(None);
        // The intent may have changed meanwhile.
        if self.handling == Handling::Done && self.intent.is_some() {
            self.handling = Handling::Due;
        }
    }

    /// Publishes `failed` for the attempt followed, for a reason found
    /// outside the updater's transaction (a refusal, an absent updater).
    fn fail(&mut self, reason: UpgradeReason, why: String) {
        let Some(t) = self.tracked.as_ref() else {
            return;
        };
        log::error!(attempt = Self::attempt_label(&t.uuid).as_str(); "the upgrade to {} failed ({reason}): {why}", t.target_version);
        let now = Timestamp::now();
        let mut s = match &self.s.published {
            Some(UpgradeReport::Attempt(p))
                if p.attempt_uuid == t.uuid && p.attempt_digest == t.digest =>
            {
                p.clone()
            }
            _ => UpgradeStatus::begin(
                t.uuid,
                t.digest.clone(),
                t.target_version.clone(),
                UpgradePhase::Preparing,
                Some(UpgradeReason::Accepted),
                now,
            ),
        };
        s.enter(UpgradePhase::Failed, Some(reason), now);
        s.detail = Some(BoundedText::truncate(
            "the previous agent keeps running; no automatic retry of this attempt",
        ));
        s.error = Some(BoundedText::truncate(why));
        self.publish(s);
        self.end(AttemptOutcome::Failed);
    }

    fn on_called(
        &mut self,
        uuid: AttemptUuid,
        result: Result<Response<UpdaterReply>, ClientError>,
    ) {
        if self.tracked.as_ref().map(|t| t.uuid) != Some(uuid) {
            return;
        }
        let call = match result {
            Ok(Response::Ok(reply)) => {
                if let Some(s) = reply.status {
                    if self.is_ours(&s) {
                        self.s.state.set_last(Some(s.clone()));
                        self.mirror(s);
                    }
                }
                Call::Ended(None)
            }
            // Busy with this very attempt (after a restart) means follow
            // it; the next poll tells.
            Ok(Response::Err(body)) if body.code == ErrorCode::Busy => {
                match self.tracked.as_mut() {
                    Some(t) if t.busy_left > 0 => {
                        t.busy_left -= 1;
                        Call::Busy {
                            retry_at: Instant::now() + BUSY_RETRY_DELAY,
                            why: body.to_string(),
                        }
                    }
                    _ => Call::Ended(Some((UpgradeReason::UpdaterUnavailable, body.to_string()))),
                }
            }
            Ok(Response::Err(body)) => {
                return self.fail(updater::refusal_reason(body.code), body.to_string());
            }
            Err(e) => Call::Ended(Some((UpgradeReason::UpdaterUnavailable, e.to_string()))),
        };
        if let Some(t) = self.tracked.as_mut() {
            t.call = call;
        }
        self.next_poll = Instant::now();
    }

    /// One status read; mirrors the attempt followed, or decides what its
    /// absence means.
    fn poll(&mut self) {
        self.next_poll = Instant::now() + POLL_INTERVAL;
        let read = updater::status(&self.s.socket, SOCKET_STATUS_RESPONSE_TIMEOUT);
        let Some(t) = self.tracked.as_mut() else {
            return;
        };
        match read {
            Ok(Some(s)) if t.uuid == s.attempt_uuid && t.digest == s.attempt_digest => {
                self.s.state.set_last(Some(s.clone()));
                self.mirror(s);
            }
            Ok(other) => {
                let another = other.as_ref().filter(|s| !s.phase.is_terminal()).map(|s| {
                    format!(
                        "attempt {} to {} is {}",
                        s.attempt_uuid, s.target_version, s.phase
                    )
                });
                self.s.state.set_last(other);
                t.unreachable_since = None;
                match (&t.call, t.shown) {
                    // The updater is still admitting it.
                    (Call::InFlight, _) => {}
                    (Call::Busy { why, .. }, false) if another.is_some() => {
                        let why = format!("{why} ({})", another.unwrap_or_default());
                        self.fail(UpgradeReason::UpdaterUnavailable, why);
                    }
                    (Call::Busy { retry_at, .. }, _) => {
                        if Instant::now() >= *retry_at {
                            if let Some(a) = t.attempt.clone() {
                                self.send(a);
                            }
                        }
                    }
                    (Call::Ended(Some((reason, why))), false) => {
                        let (reason, why) = (*reason, why.clone());
                        self.fail(reason, why);
                    }
                    // Not sent by this run, or shown and then replaced: the
                    // updater answers a known attempt with its status, and
                    // starts one it never got.
                    (Call::NotSent, _) | (Call::Ended(_), _) => match t.attempt.clone() {
                        Some(a) => self.send(a),
                        None => {
                            log::warn!(attempt = Self::attempt_label(&t.uuid).as_str(); "the updater no longer shows this attempt and its content is unknown here; not following it");
                            self.tracked = None;
                            self.s.state.set_pending(None);
                        }
                    },
                }
            }
            Err(e) => {
                let since = *t.unreachable_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= UPDATER_GONE_GRACE && t.call != Call::InFlight {
                    let why = match e {
                        StatusError::Unreachable(e) => e.to_string(),
                        StatusError::Refused(e) => e.to_string(),
                    };
                    self.fail(
                        UpgradeReason::UpdaterUnavailable,
                        format!(
                            "the updater has not answered for {} s: {why}",
                            UPDATER_GONE_GRACE.as_secs()
                        ),
                    );
                } else {
                    log::debug!("{e}; polling again");
                }
            }
        }
    }

    /// At SIGTERM: when the updater is stopping this agent for a cutover,
    /// publish `stopping` with reason `updater` and the drain duration.
    fn stop(&mut self, drain: Duration, until: Instant) -> StopOutcome {
        let left = || until.saturating_duration_since(Instant::now());
        let last = self.s.state.last();
        let unsure =
            self.tracked.is_some() || last.as_ref().is_some_and(|s| !s.phase.is_terminal());
        let current = match last {
            Some(s) if s.phase == UpgradePhase::Stopping => Some(s),
            _ if unsure => match updater::status(&self.s.socket, STOP_STATUS_TIMEOUT.min(left())) {
                Ok(Some(s)) if s.phase == UpgradePhase::Stopping => Some(s),
                Ok(_) => None,
                Err(e) => {
                    log::warn!("{e}; not reporting a cutover stop");
                    None
                }
            },
            _ => None,
        };
        let Some(mut s) = current else {
            return StopOutcome::NotStopping;
        };
        s.enter(
            UpgradePhase::Stopping,
            Some(UpgradeReason::Updater),
            Timestamp::now(),
        );
        s.drain_duration_ms = Some(u64::try_from(drain.as_millis()).unwrap_or(u64::MAX));
        let key = self.key();
        match kv::put_json(&self.s.nats, BUCKET_STATUS, &key, &s, left()) {
            Ok(_) => StopOutcome::Published(Box::new(s)),
            Err(e) => StopOutcome::Failed(e.to_string()),
        }
    }
}
