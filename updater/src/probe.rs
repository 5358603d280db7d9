//! The candidate probe: `<candidate> --self-test --config <agent config>`,
//! run as the probe user, bounded in time (the whole process group is
//! killed on timeout), required to exit 0 and to report, as a
//! [`SelfTestReport`] on stdout, a compiled version equal to the target.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use fleet_common::contracts::{SelfTestReport, UpgradeReason};
use fleet_common::limits::MAX_SELF_TEST_OUTPUT_BYTES;
use fleet_common::process::{describe_status, run_bounded, ProcessError};
use fleet_common::validate::Version;

use crate::runas::RunAs;

/// Why a candidate failed its probe.
#[derive(Debug)]
pub enum ProbeError {
    Run(ProcessError),
    Failed {
        status: String,
        diagnostic: String,
        failed_checks: Vec<String>,
    },
    Report {
        message: String,
    },
    VersionMismatch {
        reported: Version,
        target: Version,
    },
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Run(e) => write!(f, "candidate self-test: {e}"),
            Self::Failed {
                status,
                diagnostic,
                failed_checks,
            } => {
                write!(f, "candidate self-test failed with {status}")?;
                if !failed_checks.is_empty() {
                    write!(f, "; failed checks: {}", failed_checks.join("; "))?;
                }
                write!(f, "; last output: {diagnostic}")
            }
            Self::Report { message } => write!(
                f,
                "candidate self-test exited 0 but its report is unusable: {message}"
            ),
            Self::VersionMismatch { reported, target } => write!(
                f,
                "candidate reports compiled version {reported}, not the target {target}: the artifact is not the release the attempt names"
            ),
        }
    }
}

impl std::error::Error for ProbeError {}

impl ProbeError {
    pub fn reason(&self) -> UpgradeReason {
        match self {
            Self::VersionMismatch { .. } => UpgradeReason::VersionMismatch,
            _ => UpgradeReason::Probe,
        }
    }
}

/// Runs the probe of `candidate` and checks its report against `target`.
pub fn probe(
    candidate: &Path,
    agent_config: &Path,
    run_as: &RunAs,
    target: &Version,
    bound: Duration,
) -> Result<SelfTestReport, ProbeError> {
    let mut cmd = run_as.command(candidate);
    cmd.arg("--self-test").arg("--config").arg(agent_config);
    let out = run_bounded(&mut cmd, bound, MAX_SELF_TEST_OUTPUT_BYTES).map_err(ProbeError::Run)?;
    let report = serde_json::from_slice::<SelfTestReport>(trim(&out.stdout));
    if !out.success() {
        return Err(ProbeError::Failed {
            status: describe_status(out.status),
            diagnostic: out.diagnostic(),
            failed_checks: report.map(|r| r.failures()).unwrap_or_default(),
        });
    }
    let report = report.map_err(|e| ProbeError::Report {
        message: format!(
            "stdout is not one JSON object with a version ({e}); it starts with {:?}",
            String::from_utf8_lossy(&out.stdout)
                .chars()
                .take(120)
                .collect::<String>()
        ),
    })?;
    if &report.version != target {
        return Err(ProbeError::VersionMismatch {
            reported: report.version,
            target: target.clone(),
        });
    }
    Ok(report)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &b[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, body: &str) -> std::path::PathBuf {
        let p = dir.join("candidate");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    fn run(body: &str, bound: Duration) -> Result<SelfTestReport, ProbeError> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let p = script(dir.path(), body);
        let run_as = RunAs::resolve("nobody").expect("resolve");
        probe(
            &p,
            Path::new("/etc/harmony-fleet/agent.json"),
            &run_as,
            &Version::parse("2.0").expect("v"),
            bound,
        )
    }

    #[test]
    fn a_good_candidate_passes_and_gets_its_arguments() {
        let r = run(
            r#"[ "$1 $2 $3" = "--self-test --config /etc/harmony-fleet/agent.json" ] || exit 9
echo '{"version":"2.0","checks":[{"name":"config","ok":true}]}'"#,
            Duration::from_secs(10),
        )
        .expect("passes");
        assert_eq!(r.version.as_str(), "2.0");
    }

    #[test]
    fn failures_say_why() {
        let e = run(
            r#"echo '{"version":"2.0","checks":[{"name":"nats","ok":false,"detail":"refused"}]}'; echo 'cannot reach nats' >&2; exit 3"#,
            Duration::from_secs(10),
        )
        .expect_err("fails");
        assert_eq!(e.reason(), UpgradeReason::Probe);
        assert_eq!(e.to_string(), "candidate self-test failed with exit code 3; failed checks: nats: refused; last output: cannot reach nats");

        let e = run(r#"echo '{"version":"2.1"}'"#, Duration::from_secs(10)).expect_err("lies");
        assert_eq!(e.reason(), UpgradeReason::VersionMismatch);
        assert_eq!(e.to_string(), "candidate reports compiled version 2.1, not the target 2.0: the artifact is not the release the attempt names");

        let e = run("echo hello", Duration::from_secs(10)).expect_err("no report");
        assert!(e.to_string().starts_with("candidate self-test exited 0 but its report is unusable: stdout is not one JSON object with a version"), "{e}");
    }

    #[test]
    fn a_hanging_candidate_times_out() {
        let started = std::time::Instant::now();
        let e = run("sleep 30 & sleep 30", Duration::from_millis(300)).expect_err("hangs");
        assert!(
            matches!(e, ProbeError::Run(ProcessError::Timeout { .. })),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(e.reason(), UpgradeReason::Probe);
    }
}
