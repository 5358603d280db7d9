//! The updater journal (`/var/lib/harmony-fleet/updater/journal.json`): the
//! one durable record of the current upgrade transaction, and the attempts
//! already finished. The recovery table (`docs/design/upgrade.md`
//! "Recovery") is driven entirely by
//! [`JournalPhase`]; nothing is inferred from the filesystem.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::attempt::AgentUpgradeAttempt;
use super::bounded::{Bounded, Transitions};
use super::status::UpgradeReason;
use crate::limits::{MAX_JOURNAL_ERRORS, MAX_REMEMBERED_ATTEMPTS};
use crate::time::Timestamp;
use crate::validate::{AttemptUuid, BoundedText, Sha256Hex, Version};

/// The journal file's format number; a file of another format is refused.
pub const JOURNAL_FORMAT: u32 = 1;

/// The six durable phases (`docs/design/upgrade.md` "The journal").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JournalPhase {
    Preparing,
    Activating,
    Committed,
    RollingBack,
    Failed,
    RollbackFailed,
}

impl JournalPhase {
    /// No recovery action remains for this phase.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Committed | Self::Failed | Self::RollbackFailed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Activating => "activating",
            Self::Committed => "committed",
            Self::RollingBack => "rolling-back",
            Self::Failed => "failed",
            Self::RollbackFailed => "rollback-failed",
        }
    }
}

impl std::fmt::Display for JournalPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One timed durable phase change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct JournalTransition {
    pub phase: JournalPhase,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
}

/// An error met during the transaction, kept for the person repairing it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct JournalError {
    pub at: Timestamp,
    /// The step that failed, e.g. `download`, `probe`, `start-candidate`.
    pub step: BoundedText,
    pub message: BoundedText,
}

/// The current (or last) transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Transaction {
    pub phase: JournalPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
    pub attempt: AgentUpgradeAttempt,
    pub attempt_digest: Sha256Hex,
    /// The binary the active link pointed at when the transaction began;
    /// rollback restores exactly this path.
    pub previous_binary: PathBuf,
    /// `fleet-agent-v<target>` in the versioned-binaries directory.
    pub target_binary: PathBuf,
    pub started_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_duration_ms: Option<u64>,
    pub errors: Bounded<JournalError, MAX_JOURNAL_ERRORS>,
    pub transitions: Transitions<JournalTransition>,
}

impl Transaction {
    /// Moves to `phase` now and records the transition. Does not persist:
    /// the caller writes the journal.
    pub fn enter(&mut self, phase: JournalPhase, reason: Option<UpgradeReason>, now: Timestamp) {
        self.phase = phase;
        self.reason = reason;
        self.transitions.push(JournalTransition {
            phase,
            at: now,
            reason,
        });
    }

    /// Records an error. Does not persist.
    pub fn record_error(&mut self, step: &str, message: impl AsRef<str>, now: Timestamp) {
        self.errors.push(JournalError {
            at: now,
            step: BoundedText::truncate(step),
            message: BoundedText::truncate(message),
        });
    }
}

/// An attempt that reached a terminal phase, remembered so that its UUID is
/// never accepted again with other content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FinishedAttempt {
    pub uuid: AttemptUuid,
    pub digest: Sha256Hex,
    pub target_version: Version,
    pub phase: JournalPhase,
    pub finished_at: Timestamp,
}

/// The whole journal file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Journal {
    pub format: u32,
    #[serde(default)]
    pub transaction: Option<Transaction>,
    #[serde(default)]
    pub finished: Bounded<FinishedAttempt, MAX_REMEMBERED_ATTEMPTS>,
}

impl Default for Journal {
    fn default() -> Self {
        Self {
            format: JOURNAL_FORMAT,
            transaction: None,
            finished: Bounded::default(),
        }
    }
}
