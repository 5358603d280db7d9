//! Workload health: the optional `health` of a [`super::WorkloadSpec`] (how
//! the agent decides that a container serves), the optional
//! `update-strategy`, and what a device reports about the health of each
//! workload at `fleet-status` `<device>.health` ([`HealthReport`]).
//!
//! The spec side is read by the agent and refused whole when invalid
//! (`deny_unknown_fields`, bounds checked by [`HealthCheck::validate`]).
//! The report side is read by operators' tools, which must keep reading
//! the reports of newer agents: its types take unknown fields and unknown
//! enum values ([`HealthState::Other`], [`RevertReason::Other`]) without an
//! error, so a later agent can extend them in place.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::workload::SpecError;
use crate::time::Timestamp;
use crate::validate::{BoundedText, Sha256Hex, WorkloadName};

/// Longest `interval-secs`, `start-period-secs` and `healthy-after-secs`:
/// an hour. A workload that needs longer to show it serves is not gated by
/// a probe.
pub const MAX_HEALTH_PERIOD_SECS: u32 = 3600;
/// Most `retries` a probe may have.
pub const MAX_HEALTH_RETRIES: u32 = 10;
/// Longest HTTP probe path.
pub const MAX_HEALTH_PATH_CHARS: usize = 256;
/// Arguments an exec probe's command may have.
pub const MAX_PROBE_ARGS: usize = 16;
/// Characters of one exec probe argument.
pub const MAX_PROBE_ARG_CHARS: usize = 1024;

/// One way to ask a running container whether it serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum Probe {
    /// A command run in the container (`podman exec`); healthy on exit 0.
    Exec { command: Vec<String> },
    /// `GET http://127.0.0.1:<port><path>` from the device, on a host port
    /// the workload publishes (a rootless container's own address is not
    /// reachable from the host); healthy on 2xx or 3xx.
    Http {
        port: u16,
        #[serde(default = "default_http_path")]
        path: String,
    },
    /// A TCP connect to `127.0.0.1:<port>`, a host port the workload
    /// publishes; healthy once it connects.
    Tcp { port: u16 },
}

fn default_http_path() -> String {
    "/".to_owned()
}

impl Probe {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Exec { .. } => "exec",
            Self::Http { .. } => "http",
            Self::Tcp { .. } => "tcp",
        }
    }
}

/// `health` of a workload spec. Without a `probe`, a workload is healthy
/// once its container has run `healthy-after-secs` without a restart.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct HealthCheck {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    /// Probe failures in this time after the container starts do not count.
    #[serde(default)]
    pub start_period_secs: u32,
    /// Between two probes.
    #[serde(default = "default_interval")]
    pub interval_secs: u32,
    /// One probe's deadline; the probe is killed when it passes.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u32,
    /// Consecutive failures (after the start period) that make the
    /// workload unhealthy.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Without a probe: the time the container must run without a restart
    /// to be healthy.
    #[serde(default = "default_healthy_after")]
    pub healthy_after_secs: u32,
}

fn default_interval() -> u32 {
    10
}
fn default_timeout() -> u32 {
    2
}
fn default_retries() -> u32 {
    3
}
fn default_healthy_after() -> u32 {
    DEFAULT_HEALTHY_AFTER_SECS
}

/// Without any `health`: how long a container must run without a restart
/// to count as healthy.
pub const DEFAULT_HEALTHY_AFTER_SECS: u32 = 10;

impl Default for HealthCheck {
    fn default() -> Self {
        Self {
            probe: None,
            start_period_secs: 0,
            interval_secs: default_interval(),
            timeout_secs: default_timeout(),
            retries: default_retries(),
            healthy_after_secs: default_healthy_after(),
        }
    }
}

impl HealthCheck {
    /// How long a new spec has to become healthy, from the first start of
    /// its container, before the agent reverts it: `start-period + retries
    /// × interval` with a probe (plus one timeout: the last probe may run
    /// to its deadline); without a probe, twice `healthy-after` plus 2 s
    /// (the container must run `healthy-after` without a restart, and one
    /// exit early on, restored, may still make it; Podman's start times
    /// are whole seconds, so proving a run of `healthy-after` takes up to
    /// one second more, and a start may land in the next second).
    pub fn deadline_secs(&self) -> u32 {
        match self.probe {
            Some(_) => self
                .start_period_secs
                .saturating_add(self.retries.saturating_mul(self.interval_secs))
                .saturating_add(self.timeout_secs),
            None => self.healthy_after_secs.saturating_mul(2).saturating_add(2),
        }
    }

    /// Checks the bounds serde cannot. `host_ports` are the TCP host ports
    /// the workload publishes (an HTTP or TCP probe must use one of them).
    pub fn validate(&self, host_tcp_ports: &[u16]) -> Result<(), SpecError> {
        let bad = |why: &'static str| SpecError::Health { why };
        if self.interval_secs == 0 || self.interval_secs > MAX_HEALTH_PERIOD_SECS {
            return Err(bad("interval-secs is 1 to 3600"));
        }
        if self.timeout_secs == 0 {
            return Err(bad("timeout-secs is at least 1"));
        }
        if self.timeout_secs > self.interval_secs {
            return Err(bad("timeout-secs may not be longer than interval-secs"));
        }
        if self.start_period_secs > MAX_HEALTH_PERIOD_SECS {
            return Err(bad("start-period-secs is 0 to 3600"));
        }
        if self.retries == 0 || self.retries > MAX_HEALTH_RETRIES {
            return Err(bad("retries is 1 to 10"));
        }
        if self.healthy_after_secs == 0 || self.healthy_after_secs > MAX_HEALTH_PERIOD_SECS {
            return Err(bad("healthy-after-secs is 1 to 3600"));
        }
        match &self.probe {
            None => {}
            Some(Probe::Exec { command }) => {
                if command.is_empty() {
                    return Err(bad("an exec probe needs a command"));
                }
                if command.len() > MAX_PROBE_ARGS {
                    return Err(bad("an exec probe's command has at most 16 arguments"));
                }
                for a in command {
                    if a.chars().count() > MAX_PROBE_ARG_CHARS {
                        return Err(bad("an exec probe's argument is at most 1024 characters"));
                    }
                    if a.contains('\0') {
                        return Err(bad("an exec probe's argument contains a NUL character"));
                    }
                }
            }
            Some(Probe::Http { port, path }) => {
                check_probe_port(*port, host_tcp_ports)?;
                let ok = path.starts_with('/')
                    && path.len() <= MAX_HEALTH_PATH_CHARS
                    && path.bytes().all(|b| b.is_ascii_graphic());
                if !ok {
                    return Err(bad(
                        "an http probe's path starts with '/', is at most 256 characters, printable ASCII without spaces",
                    ));
                }
            }
            Some(Probe::Tcp { port }) => check_probe_port(*port, host_tcp_ports)?,
        }
        Ok(())
    }
}

fn check_probe_port(port: u16, host_tcp_ports: &[u16]) -> Result<(), SpecError> {
    if port == 0 {
        return Err(SpecError::Health {
            why: "a probe port is 1 to 65535",
        });
    }
    if !host_tcp_ports.contains(&port) {
        return Err(SpecError::Health {
            why: "a probe port must be a TCP host port the workload publishes (ports[].host): a rootless container's own address is not reachable from the host",
        });
    }
    Ok(())
}

/// How a changed spec replaces the running container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpdateStrategy {
    /// Stop and remove the old container, then start the new one (the new
    /// image is pulled first).
    #[default]
    StopFirst,
    /// Start the new container beside the old one; remove the old one once
    /// the new one is healthy (a revert then only removes the new one). Only
    /// for workloads without host ports: two containers cannot publish the
    /// same port.
    StartFirst,
}

impl UpdateStrategy {
    pub fn is_default(&self) -> bool {
        *self == Self::StopFirst
    }
}

// ---- The report: `fleet-status` `<device>.health` ----

/// The health of the container a workload runs now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealthState {
    /// Running, not yet shown to serve (start period, or waiting for the
    /// first passing probe or for `healthy-after-secs`).
    Starting,
    Healthy,
    /// Failing its probe `retries` times, exiting, or not running; for a
    /// workload with no healthy spec to go back to, left stopped in back-off.
    Unhealthy,
    /// A value a newer agent sends that this reader does not know.
    #[serde(other)]
    Other,
}

impl HealthState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last probe (or, without a probe, the last uptime check).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ProbeResult {
    pub at: Timestamp,
    pub ok: bool,
    /// How long it took, bounded by its timeout.
    pub took_ms: u64,
    /// What it said: an HTTP status, an exit code and the start of its
    /// output (bounded and escaped), "timed out after 2 s", ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
}

/// Why a new spec was reverted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RevertReason {
    /// Its probe did not pass within its deadline.
    ProbeFailed,
    /// Its container exited and was restored too many times.
    CrashLoop,
    /// It could not be started at all (create or start failed).
    StartFailed,
    /// A value a newer agent sends that this reader does not know.
    #[serde(other)]
    Other,
}

impl RevertReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProbeFailed => "probe-failed",
            Self::CrashLoop => "crash-loop",
            Self::StartFailed => "start-failed",
            Self::Other => "other",
        }
    }
}

/// A desired spec that did not become healthy and was replaced by the last
/// healthy spec of the workload. The agent does not try `failed-spec-hash`
/// again until the desired spec changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Revert {
    pub failed_spec_hash: Sha256Hex,
    /// The last healthy spec, now running again.
    pub restored_spec_hash: Sha256Hex,
    pub reason: RevertReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
    pub at: Timestamp,
}

/// The health of one workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WorkloadHealth {
    pub health: HealthState,
    /// The spec the health refers to: the one the agent aims to run (the
    /// desired one; after a revert, the restored one; for a workload left
    /// stopped, the failed one).
    pub spec_hash: Sha256Hex,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<ProbeResult>,
    /// Restarts of the container in the last hour.
    #[serde(default)]
    pub restarts_last_hour: u32,
    /// Set while the desired spec is one that failed and was reverted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted: Option<Revert>,
    pub since: Timestamp,
}

/// `fleet-status` `<device>.health`: written on change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct HealthReport {
    pub workloads: BTreeMap<WorkloadName, WorkloadHealth>,
    pub observed_at: Timestamp,
}

// ---- The agent's own record: `workload-health.json` in its state directory ----

/// A spec that did not become healthy: the agent does not try it again
/// while it is the desired spec of its workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FailedSpec {
    pub spec_hash: Sha256Hex,
    pub reason: RevertReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
    pub at: Timestamp,
    /// The last healthy spec put back, or none (a workload never healthy
    /// is left stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_spec_hash: Option<Sha256Hex>,
}

/// What the agent keeps of one workload's health across restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WorkloadHealthRecord {
    /// The last spec whose container was healthy: what a failing new spec
    /// is reverted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_healthy: Option<super::WorkloadSpec>,
    /// The desired spec that failed, while it is the desired one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<FailedSpec>,
}

impl WorkloadHealthRecord {
    pub fn is_empty(&self) -> bool {
        self.last_healthy.is_none() && self.failed.is_none()
    }
}

/// The agent's `workload-health.json` (format 1), written durably before
/// `applied.json` at every change. `applied` is the whole record of
/// applied specs; `applied.json` holds the part of it every agent version
/// reads (specs without [`super::SPEC_FIELDS_SINCE`] fields), written with
/// `written-at` equal to `applied-json-written-at` here. An `applied.json`
/// written later than that was written by another agent (a downgrade ran):
/// it then wins over `applied`. Unknown fields are kept out of errors (not
/// `deny_unknown_fields`), so that this agent reads what a later one wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WorkloadHealthState {
    pub format: u32,
    pub applied: BTreeMap<WorkloadName, super::WorkloadSpec>,
    pub applied_json_written_at: Timestamp,
    #[serde(default)]
    pub workloads: BTreeMap<WorkloadName, WorkloadHealthRecord>,
    pub written_at: Timestamp,
}

impl WorkloadHealthState {
    pub const FORMAT: u32 = 1;
}
