//! What a device says about itself (`fleet-status` `<device>.info` and
//! `<device>.heartbeat`) and its change-freeze state.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;
use crate::validate::{Arch, BoundedText, DeviceId, Version};

/// A change freeze in force: who asked, when and why. Persisted by the agent
/// (`freeze.json` in its state directory) and reported in status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Freeze {
    pub since: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<BoundedText>,
    /// The uid of the local caller that asked for the freeze.
    pub caller_uid: u32,
}

/// The agent's configuration state (`configstate` in the design it comes
/// from: `docs/design/freeze.md`). The agent
/// never leaves `changefreeze` on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state", deny_unknown_fields)]
pub enum ConfigState {
    Configured,
    Changefreeze(Freeze),
}

impl ConfigState {
    pub fn is_frozen(&self) -> bool {
        matches!(self, Self::Changefreeze(_))
    }
    pub fn name(&self) -> &'static str {
        match self {
            Self::Configured => "configured",
            Self::Changefreeze(_) => "changefreeze",
        }
    }
}

/// The persisted freeze file: the state, and when it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FreezeFile {
    pub format: u32,
    pub config_state: ConfigState,
    pub written_at: Timestamp,
}

impl FreezeFile {
    pub const FORMAT: u32 = 1;
}

/// The config state as reported: while frozen, what is waiting for the unfreeze.
/// (serde cannot refuse unknown fields next to a flattened field.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConfigStateReport {
    #[serde(flatten)]
    pub state: ConfigState,
    /// Desired-state changes received and not applied because of the freeze.
    #[serde(default)]
    pub waiting_changes: u32,
    /// An upgrade intent arrived and was not forwarded because of the freeze.
    #[serde(default)]
    pub intent_waiting: bool,
}

/// `fleet-status` `<device>.info`: published at start and on change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DeviceInfo {
    pub device_id: DeviceId,
    pub agent_version: Version,
    pub arch: Arch,
    /// `PRETTY_NAME` of os-release.
    pub os: BoundedText,
    pub kernel: BoundedText,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub podman_version: Option<BoundedText>,
    pub boot_id: BoundedText,
    pub config_state: ConfigStateReport,
    pub agent_started_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `fleet-status` `<device>.heartbeat`: every 30 s with jitter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Heartbeat {
    pub at: Timestamp,
    pub uptime_secs: u64,
    pub agent_version: Version,
    pub config_state: ConfigStateReport,
    /// Set on the last heartbeat of a run: the agent received SIGTERM,
    /// drained and is exiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<Stopping>,
    /// Set while Podman does not answer the agent (as in `<device>.workloads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub podman_unreachable: Option<PodmanUnreachable>,
}

/// Podman not answering the agent: its last call failed or timed out (or
/// is still running past the point where it should have answered). Set
/// from the first such call until one succeeds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PodmanUnreachable {
    pub since: Timestamp,
    /// The last call's error.
    pub error: BoundedText,
}

/// How an agent run ended: when it stopped and how long draining the
/// in-flight mutation took (`docs/design/upgrade.md` "Stop, switch, start").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Stopping {
    pub at: Timestamp,
    pub drain_duration_ms: u64,
}
