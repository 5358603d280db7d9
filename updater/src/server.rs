//! The updater socket's handler: `status` (read-only, answered from the
//! published copy, never waiting on a transaction) and `upgrade`.
//!
//! An `upgrade` is admitted in this order, each refusal changing nothing:
//! 1. `quarantined` while the journal is in `rollback-failed`;
//! 2. a UUID already seen: the same digest answers its status (idempotent),
//!    another digest is a `conflict`; a UUID whose journal record is gone but
//!    whose binding is kept (`seen`) is a `conflict` either way (it ran);
//! 3. `busy` while another upgrade or a recovery holds the mutator;
//! 4. `frozen` while the agent's persisted change freeze is on (or unreadable);
//! 5. `invalid` for another architecture;
//! 6. `refused` when the active link is not an installed versioned agent;
//! 7. `refused` when the attempt cannot be bound to its digest (the
//!    bindings are full or unreadable); once its transaction began, the
//!    binding is written (see `seen`).
//!
//! It then runs preparation and probe on the request's own thread and
//! answers when they end; after a successful probe it records `activating`,
//! hands the mutator to the `updater-cutover` thread and answers
//! (`stopping`) while the cutover proceeds.

use std::sync::{mpsc, Arc, Mutex, PoisonError};

use fleet_common::contracts::BindError;
use fleet_common::contracts::{
    AgentUpgradeAttempt, ErrorBody, ErrorCode, Journal, JournalPhase, Response, UpdaterReply,
    UpdaterRequest,
};
use fleet_common::limits::MAX_REMEMBERED_ATTEMPTS;
use fleet_common::socket::{Handler, Peer, Reply, RequestClass};
use fleet_common::validate::{Arch, AttemptUuid, Sha256Hex};

use crate::freeze;
use crate::seen::{BindingError, BindingStore};
use crate::state::{Mutator, Shared};
use crate::status::{self, StatusInfo};
use crate::transaction::{self, Context, Prepared};

/// Seconds after which a `busy` caller may retry.
const BUSY_RETRY_AFTER_SECS: u64 = 30;

#[derive(Debug)]
pub struct UpdaterHandler {
    shared: Arc<Shared>,
    ctx: Arc<Context>,
    info: StatusInfo,
    /// Every attempt's binding; an unreadable record refuses every upgrade.
    /// Changed only under the mutator.
    bindings: Mutex<Result<BindingStore, String>>,
}

impl UpdaterHandler {
    pub fn new(shared: Arc<Shared>, ctx: Arc<Context>, info: StatusInfo) -> Self {
        let bindings = BindingStore::load(&ctx.layout, &shared.snapshot().journal).map_err(|e| {
            log::error!("{e}");
            e.to_string()
        });
        Self {
            shared,
            ctx,
            info,
            bindings: Mutex::new(bindings),
        }
    }

    /// What the kept bindings say of an attempt the journal no longer
    /// holds: `None` when it was never started.
    fn by_binding(&self, attempt: &AgentUpgradeAttempt, digest: &Sha256Hex) -> Option<Reply> {
        let guard = self.bindings.lock().unwrap_or_else(PoisonError::into_inner);
        let store = match &*guard {
            Ok(s) => s,
            Err(why) => return Some(Self::error(ErrorCode::Refused, why)),
        };
        let earlier = store.digest_of(&attempt.uuid)?;
        Some(if earlier != digest {
            Self::error(
                ErrorCode::Conflict,
                format!(
                    "attempt {} was seen before with digest {earlier}, this one has digest {digest}: one UUID names one attempt; write a new attempt with a new UUID",
                    attempt.uuid
                ),
            )
        } else {
            Self::error(
                ErrorCode::Conflict,
                format!(
                    "attempt {} ran here before; its outcome is no longer kept (only the latest {MAX_REMEMBERED_ATTEMPTS} are) and it does not run twice: write a new attempt with a new UUID",
                    attempt.uuid
                ),
            )
        })
    }

    /// Refuses an attempt that cannot be bound (before its transaction
    /// begins).
    fn check_binding(
        &self,
        attempt: &AgentUpgradeAttempt,
        digest: &Sha256Hex,
    ) -> Result<(), Reply> {
        let guard = self.bindings.lock().unwrap_or_else(PoisonError::into_inner);
        let store = match &*guard {
            Ok(s) => s,
            Err(why) => return Err(Self::error(ErrorCode::Refused, why.as_str())),
        };
        store.check(&attempt.uuid, digest).map_err(|e| {
            log::error!(attempt = attempt.uuid.to_string().as_str(); "refused: {e}");
            let code = match e {
                BindingError::Bind(BindError::Conflict { .. }) => ErrorCode::Conflict,
                BindingError::Bind(BindError::Full) => ErrorCode::Refused,
                BindingError::Unreadable { .. } | BindingError::Write { .. } => ErrorCode::Internal,
            };
            Self::error(code, format!("{e}; the attempt did not start"))
        })
    }

    /// Binds an attempt whose transaction began. A failed write is logged:
    /// the journal holds the attempt, and the binding is written from it at
    /// the next start (or with the next binding written).
    fn bind(&self, uuid: &AttemptUuid, digest: &Sha256Hex) {
        let mut guard = self.bindings.lock().unwrap_or_else(PoisonError::into_inner);
        if let Ok(store) = &mut *guard {
            if let Err(e) = store.bind(uuid, digest) {
                log::error!(attempt = uuid.to_string().as_str(); "{e}; the journal holds the attempt and binds it again at the next start");
            }
        }
    }

    fn status(&self) -> Reply {
        let snap = self.shared.snapshot();
        Response::Ok(UpdaterReply {
            status: status::current(&snap, &self.info),
        })
        .into()
    }

    fn error(code: ErrorCode, message: impl AsRef<str>) -> Reply {
        Reply::error(code, message)
    }

    /// Refusals and answers decided by the journal alone (steps 1 and 2).
    fn by_identity(
        &self,
        journal: &Journal,
        attempt: &AgentUpgradeAttempt,
        digest: &Sha256Hex,
    ) -> Option<Reply> {
        if let Some(tx) = &journal.transaction {
            if tx.phase == JournalPhase::RollbackFailed {
                return Some(Self::error(
                    ErrorCode::Quarantined,
                    format!(
                        "the updater is in rollback-failed after attempt {}: every attempt is refused until root repair (see the repair procedure)",
                        tx.attempt.uuid
                    ),
                ));
            }
        }
        let seen = journal
            .transaction
            .as_ref()
            .filter(|tx| tx.attempt.uuid == attempt.uuid)
            .map(|tx| (tx.attempt_digest.clone(), None))
            .or_else(|| {
                journal
                    .finished
                    .iter()
                    .find(|f| f.uuid == attempt.uuid)
                    .map(|f| (f.digest.clone(), Some(status::finished(f))))
            });
        let Some((seen_digest, finished)) = seen else {
            return self.by_binding(attempt, digest);
        };
        if &seen_digest != digest {
            return Some(Self::error(
                ErrorCode::Conflict,
                format!(
                    "attempt {} was seen before with digest {seen_digest}, this one has digest {digest}: one UUID names one attempt; write a new attempt with a new UUID",
                    attempt.uuid
                ),
            ));
        }
        Some(match finished {
            Some(s) => Response::Ok(UpdaterReply { status: Some(s) }).into(),
            None => self.status(),
        })
    }

    fn upgrade(&self, attempt: AgentUpgradeAttempt, peer: &Peer) -> Reply {
        let digest = attempt.digest();
        let uuid = attempt.uuid.to_string();
        log::info!(attempt = uuid.as_str(); "upgrade to {} requested by uid {} (pid {})", attempt.target_version, peer.uid, peer.pid);
        if let Some(r) = self.by_identity(&self.shared.snapshot().journal, &attempt, &digest) {
            return r;
        }
        let Some(mut m) = self.shared.try_mutator() else {
            let snap = self.shared.snapshot();
            let what = snap
                .journal
                .transaction
                .as_ref()
                .map(|t| format!(" (attempt {}, phase {})", t.attempt.uuid, t.phase))
                .unwrap_or_default();
            let mut body = ErrorBody::new(
                ErrorCode::Busy,
                format!("another upgrade or a recovery is in progress{what}: retry when it has finished"),
            );
            body.retry_after_secs = Some(BUSY_RETRY_AFTER_SECS);
            return Response::<()>::Err(body).into();
        };
        // A write a full disk refused comes first: a new transaction must
        // not replace one whose end is not on disk.
        if m.unsynced().is_some() {
            if let Err(e) = m.retry() {
                return Self::error(
                    ErrorCode::Internal,
                    format!("the journal cannot be written, so no attempt can start: {e}"),
                );
            }
        }
        // The journal may have moved between the first check and the mutator.
        if let Some(r) = self.by_identity(m.journal(), &attempt, &digest) {
            return r;
        }
        if let Err(why) = freeze::check(&self.ctx.layout) {
            log::warn!(attempt = uuid.as_str(); "refused: {why}");
            return Self::error(ErrorCode::Frozen, why);
        }
        if Arch::current() != Some(attempt.arch) {
            let here = Arch::current().map_or("an unsupported architecture", Arch::as_str);
            return Self::error(
                ErrorCode::Invalid,
                format!(
                    "attempt {} is for {}, this device is {here}: the operator must target the device's architecture",
                    attempt.uuid, attempt.arch
                ),
            );
        }
        let previous = match transaction::active_binary(&self.ctx.layout) {
            Ok(p) => p,
            Err(why) => {
                log::error!(attempt = uuid.as_str(); "refused: {why}");
                return Self::error(ErrorCode::Refused, why);
            }
        };
        if let Err(r) = self.check_binding(&attempt, &digest) {
            return r;
        }
        let attempt_uuid = attempt.uuid;
        if let Err(e) = transaction::begin(&mut m, &self.ctx.layout, attempt, previous) {
            log::error!(attempt = uuid.as_str(); "{e}");
            return Self::error(
                ErrorCode::Internal,
                format!("cannot record the attempt, so it did not start: {e}"),
            );
        }
        self.bind(&attempt_uuid, &digest);
        match transaction::prepare(&mut m, &self.ctx) {
            Prepared::Failed | Prepared::AlreadyActive => settle_in_background(m, &self.ctx),
            Prepared::Probed => {
                // The cutover thread exists before the point of no return,
                // so a failure to create it changes nothing.
                let (tx, rx) = mpsc::channel();
                let ctx = Arc::clone(&self.ctx);
                let spawned = std::thread::Builder::new()
                    .name("updater-cutover".to_owned())
                    .spawn(move || {
                        if let Ok(mut m) = rx.recv() {
                            transaction::cutover(&mut m, &ctx);
                            transaction::settle(&mut m, &ctx);
                        }
                    });
                match spawned {
                    Ok(_) => {
                        if transaction::activate(&mut m, &self.ctx).is_ok() {
                            let _ = tx.send(m);
                        } else {
                            settle_in_background(m, &self.ctx);
                        }
                    }
                    Err(e) => {
                        let _ = m.enter(
                            JournalPhase::Failed,
                            Some(fleet_common::contracts::UpgradeReason::Install),
                            Some(("activate", &format!("cannot start the cutover thread: {e}"))),
                        );
                        settle_in_background(m, &self.ctx);
                    }
                }
            }
        }
        self.status()
    }
}

/// When the end of an attempt is not on disk (a full disk), writes it
/// again on the `updater-settle` thread, which holds the mutator meanwhile
/// (`status` answers the phase on disk and why; an `upgrade` is `busy`).
/// Otherwise only gives the mutator back.
fn settle_in_background(mut m: Mutator, ctx: &Arc<Context>) {
    if m.unsynced().is_none() {
        return;
    }
    let ctx = Arc::clone(ctx);
    let spawned = std::thread::Builder::new()
        .name("updater-settle".to_owned())
        .spawn(move || transaction::settle(&mut m, &ctx));
    if let Err(e) = spawned {
        log::error!(
            "cannot start the thread that writes the journal again ({e}); the next upgrade request retries"
        );
    }
}

impl Handler for UpdaterHandler {
    type Request = UpdaterRequest;

    fn class(request: &UpdaterRequest) -> RequestClass {
        match request {
            UpdaterRequest::Status {} => RequestClass::ReadOnly,
            UpdaterRequest::Upgrade { .. } => RequestClass::Mutating,
        }
    }

    fn handle(&self, request: UpdaterRequest, peer: &Peer) -> Reply {
        match request {
            UpdaterRequest::Status {} => self.status(),
            UpdaterRequest::Upgrade { attempt } => self.upgrade(attempt, peer),
        }
    }
}
