//! The agent's record of upgrade attempts it has seen
//! (`/var/lib/harmony-fleet/agent/attempts.json`): uuid → digest and
//! outcome, so that a UUID reused with other content is refused and an
//! attempt that already ended is never forwarded again (seed 002, "Intent").
//! Bounded at [`MAX_REMEMBERED_ATTEMPTS`]; the oldest record goes first.

use serde::{Deserialize, Serialize};

use super::bounded::Bounded;
use crate::limits::MAX_REMEMBERED_ATTEMPTS;
use crate::time::Timestamp;
use crate::validate::{AttemptUuid, Sha256Hex, Version};

/// What became of an attempt the agent saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptOutcome {
    /// Accepted and sent to the updater; its transaction has not ended yet.
    Forwarded,
    /// Refused by the agent (another device or architecture, invalid content).
    Rejected,
    /// The transaction committed.
    Complete,
    /// The transaction failed (the previous agent kept or restored), or the
    /// updater refused it.
    Failed,
    /// The rollback failed; the updater is quarantined.
    RollbackFailed,
}

impl AttemptOutcome {
    /// Nothing more happens for this attempt.
    pub fn has_ended(self) -> bool {
        !matches!(self, Self::Forwarded)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::Rejected => "rejected",
            Self::Complete => "complete",
            Self::Failed => "failed",
            Self::RollbackFailed => "rollback-failed",
        }
    }
}

impl std::fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One attempt the agent saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SeenAttempt {
    pub uuid: AttemptUuid,
    /// The digest of the content first seen under this UUID (for content
    /// that did not parse, the SHA-256 of the raw value).
    pub digest: Sha256Hex,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<Version>,
    pub outcome: AttemptOutcome,
    /// When the outcome was recorded.
    pub at: Timestamp,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SeenAttempts {
    pub format: u32,
    pub attempts: Bounded<SeenAttempt, MAX_REMEMBERED_ATTEMPTS>,
}

impl Default for SeenAttempts {
    fn default() -> Self {
        Self {
            format: Self::FORMAT,
            attempts: Bounded::default(),
        }
    }
}

impl SeenAttempts {
    /// The file's format number; a file of another format is refused.
    pub const FORMAT: u32 = 1;

    pub fn find(&self, uuid: &AttemptUuid) -> Option<&SeenAttempt> {
        self.attempts.iter().find(|a| &a.uuid == uuid)
    }

    /// Records `entry`, replacing an earlier record of its UUID (which
    /// moves to the newest place). Does not persist.
    pub fn record(&mut self, entry: SeenAttempt) {
        self.attempts.retain(|a| a.uuid != entry.uuid);
        self.attempts.push(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64, outcome: AttemptOutcome) -> SeenAttempt {
        SeenAttempt {
            uuid: AttemptUuid::new_random(),
            digest: Sha256Hex::of(&n.to_be_bytes()),
            target_version: None,
            outcome,
            at: Timestamp::from_unix_millis(n),
        }
    }

    #[test]
    fn record_replaces_by_uuid_and_drops_the_oldest_when_full() {
        let mut s = SeenAttempts::default();
        let first = entry(0, AttemptOutcome::Forwarded);
        s.record(first.clone());
        let mut ended = first.clone();
        ended.outcome = AttemptOutcome::Complete;
        s.record(ended.clone());
        assert_eq!(s.attempts.len(), 1);
        assert_eq!(s.find(&first.uuid), Some(&ended));
        assert!(ended.outcome.has_ended() && !AttemptOutcome::Forwarded.has_ended());
        for n in 1..=MAX_REMEMBERED_ATTEMPTS as u64 {
            s.record(entry(n, AttemptOutcome::Rejected));
        }
        assert_eq!(s.attempts.len(), MAX_REMEMBERED_ATTEMPTS);
        assert_eq!(s.find(&first.uuid), None, "the oldest record goes first");
    }
}
