//! The production service manager: `systemctl stop|start <unit>`, each
//! bounded by the updater's own limit (65 s / 4 min 15 s, around the unit's
//! `TimeoutStopSec=60s` / `TimeoutStartSec=4min`). For a `Type=notify` unit
//! `systemctl start` returns once the agent sent `READY=1`, or fails.

use std::process::Command;
use std::time::{Duration, Instant};

use fleet_common::process::run_bounded;

use super::{ServiceError, ServiceManager};

/// Output kept from one systemctl call (its error is the last line).
const MAX_SYSTEMCTL_OUTPUT_BYTES: usize = 16 * 1024;
/// `systemctl show` answers from systemd's memory: it is quick or broken.
const SHOW_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Systemctl {
    unit: String,
}

impl Systemctl {
    pub fn new(unit: &str) -> Self {
        Self {
            unit: unit.to_owned(),
        }
    }

    fn call(&self, action: &'static str, bound: Duration) -> Result<Duration, ServiceError> {
        let fail = |message: String| ServiceError {
            action,
            unit: self.unit.clone(),
            message,
        };
        let started = Instant::now();
        let out = run_bounded(
            Command::new("systemctl").args(["--no-ask-password", action, &self.unit]),
            bound,
            MAX_SYSTEMCTL_OUTPUT_BYTES,
        )
        .map_err(|e| fail(e.to_string()))?;
        if !out.success() {
            return Err(fail(format!(
                "systemctl {action} failed: {}; see journalctl -u {}",
                out.diagnostic(),
                self.unit
            )));
        }
        Ok(started.elapsed())
    }
}

impl ServiceManager for Systemctl {
    fn unit(&self) -> &str {
        &self.unit
    }

    fn stop(&self, bound: Duration) -> Result<Duration, ServiceError> {
        self.call("stop", bound)
    }

    fn start(&self, bound: Duration) -> Result<(), ServiceError> {
        self.call("start", bound).map(|_| ())
    }

    fn invocation_id(&self) -> Option<String> {
        let out = run_bounded(
            Command::new("systemctl").args(["show", "-p", "InvocationID", "--value", &self.unit]),
            SHOW_TIMEOUT,
            1024,
        )
        .ok()?;
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (out.success() && !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
    }
}
