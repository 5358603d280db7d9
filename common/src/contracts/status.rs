//! `UpgradeStatus`: the public view of one upgrade transaction, answered by
//! the updater's `status` request and mirrored by the agent into
//! `fleet-status` `<device>.upgrade`.

use serde::{Deserialize, Serialize};

use super::bounded::Transitions;
use crate::time::Timestamp;
use crate::validate::{AttemptUuid, BoundedText, Sha256Hex, Version};

/// The seven public phases (seed 002, "Status").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradePhase {
    Preparing,
    Stopping,
    Starting,
    Complete,
    RollingBack,
    Failed,
    RollbackFailed,
}

impl UpgradePhase {
    /// No further change happens without a new attempt (or root repair).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed | Self::RollbackFailed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Stopping => "stopping",
            Self::Starting => "starting",
            Self::Complete => "complete",
            Self::RollingBack => "rolling-back",
            Self::Failed => "failed",
            Self::RollbackFailed => "rollback-failed",
        }
    }
}

impl std::fmt::Display for UpgradePhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a transaction is in its phase: machine-readable, stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeReason {
    /// The agent accepted the attempt and asked the updater to prepare it.
    Accepted,
    /// The agent drained because the updater stopped it for a cutover.
    Updater,
    /// The candidate became ready and the transaction committed.
    Ready,
    /// The target version was already the active one.
    AlreadyActive,
    /// The artifact could not be fetched (network, TLS, HTTP status, redirect, timeout).
    Download,
    /// The artifact's SHA-256 differs from the attempt's.
    Checksum,
    /// The artifact is larger than the attempt's limit or the 100 MiB ceiling.
    TooLarge,
    /// The OCI manifest is not a Harmony agent artifact.
    Artifact,
    /// The binary could not be installed, or an installed one failed re-verification.
    Install,
    /// The candidate's `--self-test` failed or timed out.
    Probe,
    /// The candidate reports a compiled version other than the target.
    VersionMismatch,
    /// The running agent could not be stopped within the bound.
    StopFailed,
    /// The candidate did not become ready within the start bound.
    StartFailed,
    /// The updater restarted during the transaction and recovered it.
    Interrupted,
    /// Restoring or starting the previous agent failed.
    RollbackFailed,
    /// The agent refused the attempt (another device or arch, invalid content).
    Rejected,
    /// The attempt's UUID was seen before with different content.
    Conflict,
    /// The updater is in `rollback-failed` and refuses attempts until root repair.
    Quarantined,
    /// The device is in a change freeze.
    Frozen,
    /// The updater could not be reached or answered with an error.
    UpdaterUnavailable,
}

impl UpgradeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Updater => "updater",
            Self::Ready => "ready",
            Self::AlreadyActive => "already-active",
            Self::Download => "download",
            Self::Checksum => "checksum",
            Self::TooLarge => "too-large",
            Self::Artifact => "artifact",
            Self::Install => "install",
            Self::Probe => "probe",
            Self::VersionMismatch => "version-mismatch",
            Self::StopFailed => "stop-failed",
            Self::StartFailed => "start-failed",
            Self::Interrupted => "interrupted",
            Self::RollbackFailed => "rollback-failed",
            Self::Rejected => "rejected",
            Self::Conflict => "conflict",
            Self::Quarantined => "quarantined",
            Self::Frozen => "frozen",
            Self::UpdaterUnavailable => "updater-unavailable",
        }
    }
}

impl std::fmt::Display for UpgradeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One timed phase change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct StatusTransition {
    pub phase: UpgradePhase,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
}

/// The public status of one upgrade transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct UpgradeStatus {
    pub phase: UpgradePhase,
    pub attempt_uuid: AttemptUuid,
    pub attempt_digest: Sha256Hex,
    pub target_version: Version,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
    pub attempt_started_at: Timestamp,
    pub phase_changed_at: Timestamp,
    /// How long the old agent took to drain, once it has stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<BoundedText>,
    /// systemd invocation id of the agent unit run this status concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<BoundedText>,
    /// Where the logs are: a journalctl selector such as
    /// `_SYSTEMD_UNIT=fleet-agent.service _SYSTEMD_INVOCATION_ID=<id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_ref: Option<BoundedText>,
    pub transitions: Transitions<StatusTransition>,
}

impl UpgradeStatus {
    /// A status entering its first phase now.
    pub fn begin(
        uuid: AttemptUuid,
        digest: Sha256Hex,
        target_version: Version,
        phase: UpgradePhase,
        reason: Option<UpgradeReason>,
        now: Timestamp,
    ) -> Self {
        let mut transitions = Transitions::default();
        transitions.push(StatusTransition {
            phase,
            at: now,
            reason,
        });
        Self {
            phase,
            attempt_uuid: uuid,
            attempt_digest: digest,
            target_version,
            reason,
            detail: None,
            error: None,
            attempt_started_at: now,
            phase_changed_at: now,
            drain_duration_ms: None,
            boot_id: None,
            invocation_id: None,
            journal_ref: None,
            transitions,
        }
    }

    /// Moves to `phase` now, recording a transition when the phase changes.
    pub fn enter(&mut self, phase: UpgradePhase, reason: Option<UpgradeReason>, now: Timestamp) {
        if self.phase != phase || self.reason != reason {
            self.transitions.push(StatusTransition {
                phase,
                at: now,
                reason,
            });
            if self.phase != phase {
                self.phase_changed_at = now;
            }
        }
        self.phase = phase;
        self.reason = reason;
    }
}
