//! Control of the agent's service, behind one small trait with two
//! implementations: [`Systemctl`] (production: `systemctl stop|start` with
//! the updater's bounds) and [`Supervisor`] (an in-process service manager
//! speaking the real sd_notify protocol, for fast tests with real binaries).

mod supervisor;
mod systemctl;

use std::fmt;
use std::time::Duration;

pub use supervisor::{Supervisor, SupervisorError};
pub use systemctl::Systemctl;

/// Which implementation `fleet-updater run` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagerKind {
    Systemctl,
    Supervisor,
}

impl ManagerKind {
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "systemctl" => Some(Self::Systemctl),
            "supervisor" => Some(Self::Supervisor),
            _ => None,
        }
    }
}

/// Stops and starts the agent's one service.
pub trait ServiceManager: Send + Sync + fmt::Debug {
    /// The unit, for messages and the journald reference.
    fn unit(&self) -> &str;
    /// Stops the service and waits until it is inactive; returns how long
    /// that took (the old agent's drain).
    fn stop(&self, bound: Duration) -> Result<Duration, ServiceError>;
    /// Starts the service and waits until it is ready (`READY=1`).
    fn start(&self, bound: Duration) -> Result<(), ServiceError>;
    /// The systemd invocation id of the current run, when known.
    fn invocation_id(&self) -> Option<String>;
    /// Called once after recovery when no transaction step is pending: what
    /// the service manager does at boot for an enabled unit. systemd does it
    /// on its own; the supervisor starts the agent here.
    fn boot(&self, _bound: Duration) -> Result<(), ServiceError> {
        Ok(())
    }
}

/// A stop or start that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceError {
    pub action: &'static str,
    pub unit: String,
    pub message: String,
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.action, self.unit, self.message)
    }
}

impl std::error::Error for ServiceError {}
