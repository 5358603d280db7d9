//! The production service manager: `systemctl stop|start <unit>`, each
//! bounded by the updater's own limit (65 s / 4 min 15 s, around the unit's
//! `TimeoutStopSec=60s` / `TimeoutStartSec=4min`). For a `Type=notify` unit
//! `systemctl start` returns once the agent sent `READY=1`, or fails.

use std::path::{Path, PathBuf};
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
    program: PathBuf,
    unit: String,
}

impl Systemctl {
    /// `systemctl` from `PATH`, for `unit`.
    pub fn new(unit: &str) -> Self {
        Self::with_program(Path::new("systemctl"), unit)
    }

    /// Another `systemctl` binary (tests use a stand-in script).
    pub fn with_program(program: &Path, unit: &str) -> Self {
        Self {
            program: program.to_owned(),
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
            Command::new(&self.program).args(["--no-ask-password", action, &self.unit]),
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
            Command::new(&self.program).args(["show", "-p", "InvocationID", "--value", &self.unit]),
            SHOW_TIMEOUT,
            1024,
        )
        .ok()?;
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (out.success() && !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in `systemctl` that logs its arguments and answers on cue.
    fn stand_in(dir: &Path, body: &str) -> PathBuf {
        let p = dir.join("systemctl");
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}/calls\n{body}\n",
                dir.display()
            ),
        )
        .expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    fn calls(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("calls")).unwrap_or_default()
    }

    #[test]
    fn stop_start_and_show_call_systemctl_with_the_unit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let program = stand_in(
            dir.path(),
            r#"[ "$1" = show ] && echo 1e5f0c3d2b4a49c8b7a6f5e4d3c2b1a0; exit 0"#,
        );
        let s = Systemctl::with_program(&program, "fleet-agent.service");
        s.stop(Duration::from_secs(10)).expect("stop");
        s.start(Duration::from_secs(10)).expect("start");
        assert_eq!(
            s.invocation_id().as_deref(),
            Some("1e5f0c3d2b4a49c8b7a6f5e4d3c2b1a0")
        );
        assert_eq!(
            calls(dir.path()),
            "--no-ask-password stop fleet-agent.service\n--no-ask-password start fleet-agent.service\nshow -p InvocationID --value fleet-agent.service\n"
        );
    }

    #[test]
    fn failures_carry_systemctls_words_and_the_journal_hint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let program = stand_in(
            dir.path(),
            "echo 'Job for fleet-agent.service failed because a timeout was exceeded.' >&2; exit 1",
        );
        let s = Systemctl::with_program(&program, "fleet-agent.service");
        assert_eq!(
            s.start(Duration::from_secs(10)).expect_err("fails").to_string(),
            "start fleet-agent.service: systemctl start failed: Job for fleet-agent.service failed because a timeout was exceeded.; see journalctl -u fleet-agent.service"
        );
        assert_eq!(s.invocation_id(), None);
    }

    #[test]
    fn a_hanging_systemctl_is_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let program = stand_in(dir.path(), "sleep 30");
        let s = Systemctl::with_program(&program, "fleet-agent.service");
        let e = s.stop(Duration::from_millis(300)).expect_err("bounded");
        assert!(
            e.to_string().starts_with(&format!(
                "stop fleet-agent.service: {} did not finish within 0 s and was killed",
                program.display()
            )),
            "{e}"
        );
    }
}
