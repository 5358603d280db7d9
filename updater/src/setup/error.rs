//! [`SetupError`]: why setup stopped, saying what to do, for every step.

use std::fmt;
use std::path::PathBuf;

use fleet_common::contracts::JournalPhase;
use fleet_common::durable::DurableError;
use fleet_common::layout::{AGENT_UNIT, UPDATER_UNIT};

use crate::journal::JournalLoadError;
use crate::service::ServiceError;

/// The file name of our sysusers.d and tmpfiles.d files.
pub(super) const CONF_NAME: &str = "harmony-fleet.conf";

/// Why setup stopped. Everything before the failed step is done (and is
/// idempotent); nothing after it is.
#[derive(Debug)]
pub enum SetupError {
    Journal(JournalLoadError),
    TransactionActive {
        phase: JournalPhase,
        path: PathBuf,
    },
    UpdaterRunning {
        socket: PathBuf,
    },
    Tool {
        what: String,
        message: String,
    },
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    Durable(DurableError),
    AgentVersion {
        binary: PathBuf,
        why: String,
    },
    NotInstalled {
        path: PathBuf,
    },
    NotALink {
        path: PathBuf,
    },
    Config {
        path: PathBuf,
        why: String,
    },
    /// The `--enrollment-token` file cannot be installed.
    EnrollmentToken {
        path: PathBuf,
        why: String,
    },
    UnknownUser {
        name: String,
        passwd: PathBuf,
    },
    SubIds {
        path: PathBuf,
        why: String,
    },
    NeedsSystemd,
    NothingToRepair {
        path: PathBuf,
    },
    Repair {
        agent: PathBuf,
        source: ServiceError,
    },
    UpdaterStart(String),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Journal(e) => write!(
                f,
                "{e}; setup changes nothing on a device whose journal cannot be read: follow REPAIR.md (/usr/share/doc/harmony-fleet/REPAIR.md)"
            ),
            Self::TransactionActive { phase, path } => write!(
                f,
                "an agent upgrade is in progress (phase {phase} in {}): device setup during a transaction is unsupported; wait until `fleet-updater status` shows it finished, then run setup again",
                path.display()
            ),
            Self::UpdaterRunning { socket } => write!(
                f,
                "an updater answers on {}: stop it before a repair under --root",
                socket.display()
            ),
            Self::Tool { what, message } => write!(f, "{what} failed: {message}"),
            Self::Copy { from, to, source } => write!(
                f,
                "copying {} to {}: {source}",
                from.display(),
                to.display()
            ),
            Self::Durable(e) => write!(f, "{e}"),
            Self::AgentVersion { binary, why } => write!(
                f,
                "{} is not a usable agent binary: {why}; give the fleet-agent binary of a release",
                binary.display()
            ),
            Self::NotInstalled { path } => write!(
                f,
                "{} is not installed: pick a version listed in its directory, or give --agent-binary",
                path.display()
            ),
            Self::NotALink { path } => write!(
                f,
                "{} exists and is not a symlink: the updater can only switch a symlink; move it away and run setup again",
                path.display()
            ),
            Self::Config { path, why } => write!(
                f,
                "agent config {}: {why}; give a JSON object (see fleet-agent --help)",
                path.display()
            ),
            Self::EnrollmentToken { path, why } => write!(
                f,
                "enrollment token {}: {why}; give the file the fleet's operator handed out",
                path.display()
            ),
            Self::UnknownUser { name, passwd } => write!(
                f,
                "user {name} is not in {}: systemd-sysusers did not create it; check /usr/lib/sysusers.d/{CONF_NAME}",
                passwd.display()
            ),
            Self::SubIds { path, why } => write!(f, "{}: {why}", path.display()),
            Self::NeedsSystemd => write!(
                f,
                "the updater is in rollback-failed and a repair stops and starts the agent: run setup on the device with systemd running (tests: --service-manager supervisor)"
            ),
            Self::NothingToRepair { path } => write!(
                f,
                "--repair: the updater is not in rollback-failed ({}): nothing to repair; run setup without --repair",
                path.display()
            ),
            Self::Repair { agent, source } => write!(
                f,
                "repair: {} did not start ({source}); the updater stays in rollback-failed: see journalctl -u {AGENT_UNIT}, then select another agent with --select VERSION or --agent-binary",
                agent.display()
            ),
            Self::UpdaterStart(message) => write!(
                f,
                "{UPDATER_UNIT} did not start: {message}; see journalctl -u {UPDATER_UNIT}"
            ),
        }
    }
}

impl std::error::Error for SetupError {}

impl From<DurableError> for SetupError {
    fn from(e: DurableError) -> Self {
        Self::Durable(e)
    }
}
