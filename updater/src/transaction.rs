//! The upgrade transaction (`docs/design/upgrade.md`): preparation and probe,
//! the cutover (stop, switch, start, commit), rollback, and recovery after a
//! restart.
//!
//! Every function here takes the [`Mutator`]: holding it is what allows
//! changing the journal, the active link and the service. Durable phases
//! are written at the named points only:
//!
//! ```text
//! preparing ──probe ok──▶ activating ──ready──▶ committed
//!     │                       │
//!     └──fail──▶ failed ◀──ok── rolling-back ──restore/start fails──▶ rollback-failed
//! ```
//!
//! Recovery is [`recover`]: one `match` on the durable phase, reading like the
//! recovery table (`docs/design/upgrade.md` "Recovery"). Its first half (select
//! the previous link, persist the recovery phase) runs before the updater
//! reports ready; the stop/start that remains ([`Pending`]) runs afterwards on
//! a background thread.

use std::fmt;
use std::path::{Path, PathBuf};

use fleet_common::contracts::{
    AgentUpgradeAttempt, JournalPhase, Transaction, Transitions, UpgradeReason,
};
use fleet_common::durable::{switch_symlink, AtomicFile};
use fleet_common::{Layout, Timestamp};

use crate::config::Bounds;
use crate::fault::{self, FaultPoint};
use crate::fetch::Fetcher;
use crate::journal::JournalWriteError;
use crate::probe::probe;
use crate::published::Step;
use crate::reclaim;
use crate::runas::RunAs;
use crate::service::ServiceManager;
use crate::state::Mutator;
use crate::stream::hash_file;

/// Installed agents: root-owned, executable by everyone.
const AGENT_MODE: u32 = 0o755;

/// Everything a transaction uses besides its journal, fixed at start.
#[derive(Debug)]
pub struct Context {
    pub layout: Layout,
    pub fetcher: Fetcher,
    pub service: Box<dyn ServiceManager>,
    pub probe_user: String,
    pub bounds: Bounds,
}

/// A step that failed: what it means publicly, where, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    reason: UpgradeReason,
    step: &'static str,
    message: String,
}

impl Failure {
    fn new(reason: UpgradeReason, step: &'static str, message: impl fmt::Display) -> Self {
        Self {
            reason,
            step,
            message: message.to_string(),
        }
    }
}

/// The binary the active link points at: it must be an installed
/// `fleet-agent-v<version>`, or the device was never set up.
pub fn active_binary(layout: &Layout) -> Result<PathBuf, String> {
    let link = layout.active_agent_link();
    let target = std::fs::read_link(&link).map_err(|e| {
        format!(
            "device not set up: the active link {} cannot be read ({e}); run device setup",
            link.display()
        )
    })?;
    if layout.version_of(&target).is_none() {
        return Err(format!(
            "device not set up: the active link {} points at {}, not at a fleet-agent-v<version> in {}; run device setup",
            link.display(),
            target.display(),
            layout.versions_dir().display()
        ));
    }
    if !target.is_file() {
        return Err(format!(
            "device not set up: the active link {} points at {}, which does not exist; run device setup",
            link.display(),
            target.display()
        ));
    }
    Ok(target)
}

/// Starts a transaction for `attempt` in `preparing`, `previous` being the
/// binary active now. On error nothing started.
pub fn begin(
    m: &mut Mutator,
    layout: &Layout,
    attempt: AgentUpgradeAttempt,
    previous: PathBuf,
) -> Result<(), JournalWriteError> {
    let now = Timestamp::now();
    let mut tx = Transaction {
        phase: JournalPhase::Preparing,
        reason: Some(UpgradeReason::Accepted),
        attempt_digest: attempt.digest(),
        previous_binary: previous,
        target_binary: layout.versioned_agent(&attempt.target_version),
        attempt,
        started_at: now,
        drain_duration_ms: None,
        errors: Default::default(),
        transitions: Transitions::default(),
    };
    tx.enter(JournalPhase::Preparing, Some(UpgradeReason::Accepted), now);
    m.begin(tx)
}

/// How preparation ended; every outcome is already in the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// Installed (or re-verified) and probed: the cutover may begin.
    Probed,
    /// The target was already the active binary: committed, no cutover.
    AlreadyActive,
    /// Recorded as `failed`; the previous agent never stopped.
    Failed,
}

/// Installs or re-verifies the target, then probes it.
pub fn prepare(m: &mut Mutator, ctx: &Context) -> Prepared {
    match prepare_steps(m, ctx) {
        Ok(p) => p,
        Err(f) => {
            log_failure(m, &f);
            if let Err(e) = m.enter(
                JournalPhase::Failed,
                Some(f.reason),
                Some((f.step, &f.message)),
            ) {
                log::error!("{e}");
            }
            Prepared::Failed
        }
    }
}

fn uuid_of(m: &Mutator) -> String {
    m.transaction()
        .map(|t| t.attempt.uuid.to_string())
        .unwrap_or_default()
}

fn log_failure(m: &Mutator, f: &Failure) {
    let attempt = uuid_of(m);
    log::error!(attempt = attempt.as_str(), step = f.step; "{}", f.message);
}

fn prepare_steps(m: &mut Mutator, ctx: &Context) -> Result<Prepared, Failure> {
    let tx = m
        .transaction()
        .ok_or_else(|| Failure::new(UpgradeReason::Install, "prepare", "no transaction"))?;
    let (attempt, target, previous) = (
        tx.attempt.clone(),
        tx.target_binary.clone(),
        tx.previous_binary.clone(),
    );
    install_or_verify(m, ctx, &attempt, &target)?;
    if target == previous {
        let uuid = attempt.uuid.to_string();
        log::info!(attempt = uuid.as_str(); "{} is already active and re-verified", target.display());
        if let Err(e) = m.enter(
            JournalPhase::Committed,
            Some(UpgradeReason::AlreadyActive),
            None,
        ) {
            log::error!("{e}");
        }
        return Ok(Prepared::AlreadyActive);
    }
    let run_as = RunAs::resolve(&ctx.probe_user)
        .map_err(|e| Failure::new(UpgradeReason::Probe, "probe", e))?;
    m.detail(format!(
        "probing {} as {}",
        target.display(),
        run_as.describe()
    ));
    let report = probe(
        &target,
        &ctx.layout.agent_config(),
        &run_as,
        &attempt.target_version,
        ctx.bounds.probe,
    )
    .map_err(|e| Failure::new(e.reason(), "probe", e))?;
    let uuid = attempt.uuid.to_string();
    log::info!(attempt = uuid.as_str(); "candidate {} passed its self-test ({} checks)", report.version, report.checks.len());
    Ok(Prepared::Probed)
}

/// An installed target is re-verified and never overwritten; otherwise the
/// artifact is streamed into a temp file beside it, verified, and renamed
/// into place.
fn install_or_verify(
    m: &mut Mutator,
    ctx: &Context,
    attempt: &AgentUpgradeAttempt,
    target: &Path,
) -> Result<(), Failure> {
    let install = |message: String| Failure::new(UpgradeReason::Install, "install", message);
    if std::fs::symlink_metadata(target).is_ok() {
        m.detail(format!("re-verifying the installed {}", target.display()));
        let got = hash_file(target)
            .map_err(|e| install(format!("re-verifying {}: {e}", target.display())))?;
        if got != attempt.sha256 {
            return Err(install(format!(
                "{} is already installed with sha256 {got}, not the attempt's {}; it was not overwritten: inspect it, and remove it by hand if it is damaged",
                target.display(),
                attempt.sha256
            )));
        }
        return Ok(());
    }
    m.detail(format!("downloading {}", attempt.artifact_url));
    let started = std::time::Instant::now();
    let mut reclaimed = false;
    let (out, fetched) = loop {
        let mut out = AtomicFile::create(target, AGENT_MODE).map_err(|e| install(e.to_string()))?;
        match ctx.fetcher.fetch(
            &attempt.artifact_url,
            &attempt.sha256,
            attempt.max_bytes.get(),
            &mut out,
        ) {
            Ok(f) => break (out, f),
            // A full disk: unused agents are removed (the partial file
            // first), then the download runs once more.
            Err(e) if e.is_no_space() && !reclaimed => {
                drop(out);
                reclaimed = true;
                log::warn!(
                    "{e}; {}",
                    reclaim::describe_free(&ctx.layout.versions_dir())
                );
                let previous = m.transaction().map(|t| t.previous_binary.clone());
                let mut keep = vec![target];
                keep.extend(previous.as_deref());
                if reclaim::reclaim(&ctx.layout, &keep).removed.is_empty() {
                    return Err(Failure::new(e.reason(), "download", e));
                }
            }
            Err(e) => return Err(Failure::new(e.reason(), "download", e)),
        }
    };
    if fetched.sha256 != attempt.sha256 {
        return Err(Failure::new(
            UpgradeReason::Checksum,
            "verify",
            format!(
                "{}: the {} bytes downloaded have sha256 {}, not the attempt's {}; nothing was installed",
                attempt.artifact_url, fetched.bytes, fetched.sha256, attempt.sha256
            ),
        ));
    }
    let fetch_ms = started.elapsed().as_millis();
    out.commit().map_err(|e| install(e.to_string()))?;
    let uuid = attempt.uuid.to_string();
    log::info!(
        attempt = uuid.as_str();
        "installed {} ({} bytes; downloaded and verified in {fetch_ms} ms, synced to disk in {} ms)",
        target.display(),
        fetched.bytes,
        started.elapsed().as_millis() - fetch_ms
    );
    Ok(())
}

/// Records `activating`: from here on, a restart rolls back. The cutover
/// may begin only when this returns `Ok`; otherwise the attempt is failed.
pub fn activate(m: &mut Mutator, ctx: &Context) -> Result<(), ()> {
    m.step(Step::Stopping);
    m.detail(format!("stopping {}", ctx.service.unit()));
    match m.enter(JournalPhase::Activating, None, None) {
        Ok(()) => Ok(()),
        Err(e) => {
            log::error!("{e}; the previous agent keeps running");
            // The durable phase is still `preparing`, which recovery fails too.
            let _ = m.enter(
                JournalPhase::Failed,
                Some(UpgradeReason::Install),
                Some(("activate", &e.to_string())),
            );
            Err(())
        }
    }
}

/// Stop, switch, start, commit — or roll back. `activating` is recorded.
pub fn cutover(m: &mut Mutator, ctx: &Context) {
    let Some(target) = m.transaction().map(|t| t.target_binary.clone()) else {
        return;
    };
    let link = ctx.layout.active_agent_link();
    let unit = ctx.service.unit().to_owned();

    fault::hit(FaultPoint::BeforeStopPrevious);
    let stopped = ctx.service.stop(ctx.bounds.stop);
    fault::hit(FaultPoint::AfterStopPrevious);
    match stopped {
        Ok(drain) => {
            let ms = u64::try_from(drain.as_millis()).unwrap_or(u64::MAX);
            m.live(|l| l.drain_ms = Some(ms));
        }
        Err(e) => {
            return roll_back(
                m,
                ctx,
                Failure::new(UpgradeReason::StopFailed, "stop-previous", e),
            )
        }
    }

    fault::hit(FaultPoint::BeforeSwitchToTarget);
    let switched = switch_symlink(&link, &target);
    fault::hit(FaultPoint::AfterSwitchToTarget);
    if let Err(e) = switched {
        return roll_back(
            m,
            ctx,
            Failure::new(UpgradeReason::Install, "switch-to-target", e),
        );
    }

    m.step(Step::Starting);
    m.detail(format!("starting {unit} on {}", target.display()));
    fault::hit(FaultPoint::BeforeStartTarget);
    let started = ctx.service.start(ctx.bounds.start);
    fault::hit(FaultPoint::AfterStartTarget);
    let invocation = ctx.service.invocation_id();
    m.live(|l| l.invocation_id = invocation);
    if let Err(e) = started {
        return roll_back(
            m,
            ctx,
            Failure::new(UpgradeReason::StartFailed, "start-target", e),
        );
    }

    match m.enter(JournalPhase::Committed, Some(UpgradeReason::Ready), None) {
        Ok(()) => {
            let attempt = uuid_of(m);
            log::info!(attempt = attempt.as_str(); "committed: {} is active and ready", target.display());
        }
        // The durable phase is still `activating`, which a restart would
        // roll back: roll back now rather than keep a commit only memory knows.
        Err(e) => roll_back(
            m,
            ctx,
            Failure::new(UpgradeReason::StartFailed, "commit", e),
        ),
    }
}

/// Records `rolling-back`, restores the previous link, stops, starts the
/// previous agent, and ends in `failed` or `rollback-failed`.
fn roll_back(m: &mut Mutator, ctx: &Context, cause: Failure) {
    log_failure(m, &cause);
    // Should `rolling-back` not be written, the phase on disk stays
    // `activating`: its public form must then not stay `starting` the
    // target, which the previous agent would take for a start of the wrong
    // binary and refuse.
    m.step(Step::Stopping);
    if let Err(e) = m.enter(
        JournalPhase::RollingBack,
        Some(cause.reason),
        Some((cause.step, &cause.message)),
    ) {
        // The durable phase (`activating`) makes a restart roll back too.
        log::error!("{e}; rolling back anyway");
    }
    let result = restore_previous(m, ctx).and_then(|()| stop_and_start_previous(m, ctx));
    finish_rollback(m, cause.reason, result);
}

/// Points the active link back at the transaction's previous binary.
fn restore_previous(m: &mut Mutator, ctx: &Context) -> Result<(), Failure> {
    let Some(previous) = m.transaction().map(|t| t.previous_binary.clone()) else {
        return Ok(());
    };
    m.detail(format!("restoring {}", previous.display()));
    fault::hit(FaultPoint::BeforeRestorePrevious);
    let link = ctx.layout.active_agent_link();
    let mut restored = switch_symlink(&link, &previous);
    if let Err(e) = &restored {
        // A full disk must not end in a quarantine: free space, try once more.
        if e.is_no_space() {
            log::warn!(
                "{e}; {}",
                reclaim::describe_free(link.parent().unwrap_or(&link))
            );
            let target = m.transaction().map(|t| t.target_binary.clone());
            let mut keep = vec![previous.as_path()];
            keep.extend(target.as_deref());
            if !reclaim::reclaim(&ctx.layout, &keep).removed.is_empty() {
                restored = switch_symlink(&link, &previous);
            }
        }
    }
    fault::hit(FaultPoint::AfterRestorePrevious);
    restored.map_err(|e| Failure::new(UpgradeReason::RollbackFailed, "restore-previous", e))
}

fn stop_and_start_previous(m: &mut Mutator, ctx: &Context) -> Result<(), Failure> {
    m.detail(format!("stopping {} to roll back", ctx.service.unit()));
    fault::hit(FaultPoint::BeforeStopForRollback);
    let stopped = ctx.service.stop(ctx.bounds.stop);
    fault::hit(FaultPoint::AfterStopForRollback);
    stopped.map_err(|e| Failure::new(UpgradeReason::RollbackFailed, "stop-for-rollback", e))?;
    start_previous(m, ctx)
}

fn start_previous(m: &mut Mutator, ctx: &Context) -> Result<(), Failure> {
    m.detail(format!(
        "starting {} on the previous agent",
        ctx.service.unit()
    ));
    fault::hit(FaultPoint::BeforeStartPrevious);
    let started = ctx.service.start(ctx.bounds.start);
    fault::hit(FaultPoint::AfterStartPrevious);
    let invocation = ctx.service.invocation_id();
    m.live(|l| l.invocation_id = invocation);
    started.map_err(|e| Failure::new(UpgradeReason::RollbackFailed, "start-previous", e))
}

/// `failed` (for `cause`) when the previous agent runs again, otherwise
/// `rollback-failed`.
fn finish_rollback(m: &mut Mutator, cause: UpgradeReason, result: Result<(), Failure>) {
    let written = match result {
        Ok(()) => {
            let attempt = uuid_of(m);
            log::info!(attempt = attempt.as_str(); "rolled back: the previous agent is active and ready");
            m.enter(JournalPhase::Failed, Some(cause), None)
        }
        Err(f) => quarantine(m, &f),
    };
    if let Err(e) = written {
        log::error!("{e}");
    }
}

fn quarantine(m: &mut Mutator, f: &Failure) -> Result<(), JournalWriteError> {
    log_failure(m, f);
    log::error!("rollback failed: every new attempt is refused until root repair");
    m.enter(
        JournalPhase::RollbackFailed,
        Some(UpgradeReason::RollbackFailed),
        Some((f.step, &f.message)),
    )
}

/// What recovery still has to do once the updater is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// No transaction step: only what the service manager does at boot.
    Nothing,
    /// Start the previous service (it was never stopped); the phase is `failed`.
    StartPrevious,
    /// Stop, then start the previous service; `failed` for `cause` after.
    StopStartPrevious { cause: UpgradeReason },
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nothing => f.write_str("nothing to recover"),
            Self::StartPrevious => f.write_str("starting the previous agent"),
            Self::StopStartPrevious { cause } => {
                write!(f, "restarting the previous agent ({cause})")
            }
        }
    }
}

/// First wait before writing again a journal that a full disk refused.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest wait between retries: an operator freeing space sees the
/// journal recorded within a minute, and a full disk is not hammered.
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// The recovery table (`docs/design/upgrade.md` "Recovery"), up to the point
/// where the updater may report ready: the previous link is selected and the
/// recovery phase persisted.
///
/// On a full disk the recovery phase may not be written. The previous link
/// is selected all the same (a restart in the phase on disk would select it
/// too), the updater goes on to readiness so that the previous agent can
/// start, and [`complete_recovery`] writes the journal once it can, with
/// backoff. Status meanwhile reports the phase on disk and why the next is
/// not recorded.
pub fn recover(m: &mut Mutator, ctx: &Context) -> Pending {
    let Some(tx) = m.transaction() else {
        return Pending::Nothing;
    };
    let (phase, cause) = (tx.phase, tx.reason);
    let attempt = tx.attempt.uuid.to_string();
    m.live(|l| l.attempt = Some(tx.attempt.uuid));
    let state_dir = ctx.layout.updater_state_dir();
    log::info!(attempt = attempt.as_str(); "journal phase at start: {phase}; {}", reclaim::describe_free(&state_dir));
    let record = |m: &mut Mutator, phase, reason, error: (&str, &str)| {
        if let Err(e) = m.enter(phase, Some(reason), Some(error)) {
            log::error!("{e}; {}; the previous agent is selected all the same, and the journal is written again once space is freed", reclaim::describe_free(&state_dir));
        }
    };
    match phase {
        // | preparing | restore the previous link, record failed, start the
        //   previous service; restore or start failure → rollback-failed |
        JournalPhase::Preparing => match restore_previous(m, ctx) {
            Ok(()) => {
                record(
                    m,
                    JournalPhase::Failed,
                    UpgradeReason::Interrupted,
                    (
                        "recovery",
                        "the updater restarted while preparing; the candidate was never activated",
                    ),
                );
                Pending::StartPrevious
            }
            Err(f) => {
                quarantine_logged(m, &f);
                Pending::Nothing
            }
        },
        // | activating | record rolling-back, restore the previous link,
        //   stop, then start the previous service |
        JournalPhase::Activating => {
            record(
                m,
                JournalPhase::RollingBack,
                UpgradeReason::Interrupted,
                (
                    "recovery",
                    "the updater restarted during the cutover; rolling back to the previous agent",
                ),
            );
            restore_or_quarantine(m, ctx, UpgradeReason::Interrupted)
        }
        // | committed | keep the target |
        JournalPhase::Committed => Pending::Nothing,
        // | rolling-back | restore the previous link and repeat stop/start |
        JournalPhase::RollingBack => {
            // Not a phase change, but the person repairing should see it.
            if let Err(e) = m.note(
                "recovery",
                "the updater restarted while rolling back; repeating the rollback",
            ) {
                log::error!("{e}");
            }
            let cause = cause.unwrap_or(UpgradeReason::Interrupted);
            restore_or_quarantine(m, ctx, cause)
        }
        // | failed | keep the previous target; no automatic retry |
        JournalPhase::Failed => Pending::Nothing,
        // | rollback-failed | refuse every new attempt until direct root repair |
        JournalPhase::RollbackFailed => {
            log::error!(attempt = attempt.as_str(); "rollback-failed: every attempt is refused until root repair (see the repair procedure)");
            Pending::Nothing
        }
    }
}

fn quarantine_logged(m: &mut Mutator, f: &Failure) {
    if let Err(e) = quarantine(m, f) {
        log::error!("{e}");
    }
}

fn restore_or_quarantine(m: &mut Mutator, ctx: &Context, cause: UpgradeReason) -> Pending {
    match restore_previous(m, ctx) {
        Ok(()) => Pending::StopStartPrevious { cause },
        Err(f) => {
            quarantine_logged(m, &f);
            Pending::Nothing
        }
    }
}

/// Writes again, until it succeeds, a journal write that failed (a full
/// disk): each try reclaims unused agents first when space is short, and
/// logs the free space seen. The caller holds the mutator meanwhile, so a
/// new attempt is told `busy` while `status` reports the phase on disk and
/// why the next is not recorded. Returns at once when nothing is pending.
pub fn settle(m: &mut Mutator, ctx: &Context) {
    let state_dir = ctx.layout.updater_state_dir();
    let mut wait = RETRY_FIRST;
    let mut tries = 0u32;
    let mut first: Option<(Timestamp, String)> = None;
    while let Some((phase, why)) = m.unsynced() {
        first.get_or_insert_with(|| (Timestamp::now(), why.clone()));
        log::warn!(
            "phase {phase} is not recorded ({why}); {}; writing it again in {} s",
            reclaim::describe_free(&state_dir),
            wait.as_secs()
        );
        std::thread::sleep(wait);
        tries += 1;
        match m.retry() {
            Ok(()) => {
                log::info!(
                    "phase {phase} recorded after {tries} retries; {}",
                    reclaim::describe_free(&state_dir)
                );
                // The journal itself keeps that it was not written: the
                // person reading it later sees why the phases came late.
                if let Some((since, why)) = &first {
                    let note = format!(
                        "the journal could not be written from {since} ({why}); phase {phase} recorded after {tries} retries"
                    );
                    if let Err(e) = m.note("journal", &note) {
                        log::warn!("{e}");
                    }
                }
            }
            Err(_) => wait = (wait * 2).min(RETRY_MAX),
        }
    }
}

/// The rest of recovery, after the updater reported ready.
pub fn complete_recovery(m: &mut Mutator, ctx: &Context, pending: Pending) {
    match pending {
        Pending::Nothing => {
            if let Err(e) = ctx.service.boot(ctx.bounds.start) {
                log::error!("starting the agent at boot: {e}");
            }
            let invocation = ctx.service.invocation_id();
            m.live(|l| l.invocation_id = invocation);
        }
        Pending::StartPrevious => {
            if let Err(f) = start_previous(m, ctx) {
                if let Err(e) = quarantine(m, &f) {
                    log::error!("{e}");
                }
            }
        }
        Pending::StopStartPrevious { cause } => {
            let result = stop_and_start_previous(m, ctx);
            finish_rollback(m, cause, result);
        }
    }
}
