//! The agent's record of upgrade attempts it has seen
//! (`/var/lib/harmony-fleet/agent/attempts.json`): uuid → digest and outcome,
//! so that a UUID reused with other content is refused and an attempt that
//! already ended is never forwarded again (`docs/design/upgrade.md` "Intent").
//! The full records are bounded at [`MAX_REMEMBERED_ATTEMPTS`] (the oldest goes
//! first); the binding of every attempt (uuid → digest, see
//! [`AttemptBindings`]) is kept for the device's lifetime, up to
//! [`MAX_BOUND_ATTEMPTS`], where new attempts are refused rather than an old
//! binding forgotten. The updater keeps its own [`AttemptBindings`].

use std::fmt;

use serde::{Deserialize, Serialize};

use super::bounded::Bounded;
use crate::limits::{MAX_BOUND_ATTEMPTS, MAX_REMEMBERED_ATTEMPTS};
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

/// One attempt's binding, written compactly as `"<uuid>:<sha256>"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AttemptBinding {
    pub uuid: AttemptUuid,
    pub digest: Sha256Hex,
}

impl TryFrom<String> for AttemptBinding {
    type Error = String;

    fn try_from(v: String) -> Result<Self, String> {
        let (uuid, digest) = v
            .split_once(':')
            .ok_or_else(|| format!("binding {v:?} is not <uuid>:<sha256>"))?;
        Ok(Self {
            uuid: AttemptUuid::parse(uuid).map_err(|e| e.to_string())?,
            digest: Sha256Hex::parse(digest).map_err(|e| e.to_string())?,
        })
    }
}

impl From<AttemptBinding> for String {
    fn from(b: AttemptBinding) -> String {
        format!("{}:{}", b.uuid, b.digest)
    }
}

/// Why an attempt cannot be bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindError {
    /// The UUID is bound to `earlier`, another digest.
    Conflict { earlier: Sha256Hex },
    /// [`MAX_BOUND_ATTEMPTS`] attempts are bound already.
    Full,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Conflict { earlier } => write!(
                f,
                "the attempt's UUID was seen before with digest {earlier}: one UUID names one attempt; write a new attempt with a new UUID"
            ),
            Self::Full => write!(
                f,
                "this device has seen {MAX_BOUND_ATTEMPTS} upgrade attempts, the most it keeps the identity of (so that no UUID is ever reused with other content), and refuses new ones: root repair is needed (archive the attempts file and clear the agent's and updater's records together)"
            ),
        }
    }
}

impl std::error::Error for BindError {}

/// The uuid → digest binding of every attempt a device has seen, oldest
/// first. Never forgets: at [`MAX_BOUND_ATTEMPTS`] a new binding is refused.
/// A longer list is refused at parse.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptBindings(Bounded<AttemptBinding, MAX_BOUND_ATTEMPTS>);

impl AttemptBindings {
    /// The digest `uuid` is bound to.
    pub fn digest_of(&self, uuid: &AttemptUuid) -> Option<&Sha256Hex> {
        self.0.iter().find(|b| &b.uuid == uuid).map(|b| &b.digest)
    }

    /// Binds `uuid` to `digest`: `Ok(true)` when newly bound, `Ok(false)`
    /// when it was bound to this digest already. Does not persist.
    pub fn bind(&mut self, uuid: &AttemptUuid, digest: &Sha256Hex) -> Result<bool, BindError> {
        let new = self.check(uuid, digest)?;
        if new {
            self.0.push(AttemptBinding {
                uuid: *uuid,
                digest: digest.clone(),
            });
        }
        Ok(new)
    }

    /// What [`AttemptBindings::bind`] would answer, changing nothing.
    pub fn check(&self, uuid: &AttemptUuid, digest: &Sha256Hex) -> Result<bool, BindError> {
        match self.digest_of(uuid) {
            Some(d) if d == digest => Ok(false),
            Some(d) => Err(BindError::Conflict { earlier: d.clone() }),
            None if self.0.len() >= MAX_BOUND_ATTEMPTS => Err(BindError::Full),
            None => Ok(true),
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SeenAttempts {
    pub format: u32,
    /// The latest attempts in full.
    pub attempts: Bounded<SeenAttempt, MAX_REMEMBERED_ATTEMPTS>,
    /// Every attempt's binding (absent in files written before it existed:
    /// filled from `attempts` on load, see [`SeenAttempts::bind_remembered`]).
    #[serde(default)]
    pub bound: AttemptBindings,
}

impl Default for SeenAttempts {
    fn default() -> Self {
        Self {
            format: Self::FORMAT,
            attempts: Bounded::default(),
            bound: AttemptBindings::default(),
        }
    }
}

impl SeenAttempts {
    /// The file's format number; a file of another format is refused.
    pub const FORMAT: u32 = 1;

    /// The full record of `uuid`, when it is among the latest.
    pub fn find(&self, uuid: &AttemptUuid) -> Option<&SeenAttempt> {
        self.attempts.iter().find(|a| &a.uuid == uuid)
    }

    /// The digest `uuid` was first seen with, however long ago.
    pub fn bound_digest(&self, uuid: &AttemptUuid) -> Option<&Sha256Hex> {
        self.bound.digest_of(uuid)
    }

    /// Binds every attempt of the full records (a file of an older agent
    /// has no `bound`). Does not persist.
    pub fn bind_remembered(&mut self) {
        for a in self.attempts.iter() {
            // Full or conflicting: the full record still holds it.
            let _ = self.bound.bind(&a.uuid, &a.digest);
        }
    }

    /// Records `entry`, replacing an earlier record of its UUID (which
    /// moves to the newest place), and binds its UUID to its digest. Refused,
    /// changing nothing, when the UUID is bound to another digest or the
    /// bindings are full. Does not persist.
    pub fn record(&mut self, entry: SeenAttempt) -> Result<(), BindError> {
        self.bound.bind(&entry.uuid, &entry.digest)?;
        self.attempts.retain(|a| a.uuid != entry.uuid);
        self.attempts.push(entry);
        Ok(())
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
    fn record_replaces_by_uuid_and_drops_the_oldest_full_record_but_not_its_binding() {
        let mut s = SeenAttempts::default();
        let first = entry(0, AttemptOutcome::Forwarded);
        s.record(first.clone()).expect("new");
        let mut ended = first.clone();
        ended.outcome = AttemptOutcome::Complete;
        s.record(ended.clone()).expect("same digest");
        assert_eq!(s.attempts.len(), 1);
        assert_eq!(s.find(&first.uuid), Some(&ended));
        assert!(ended.outcome.has_ended() && !AttemptOutcome::Forwarded.has_ended());
        for n in 1..=MAX_REMEMBERED_ATTEMPTS as u64 {
            s.record(entry(n, AttemptOutcome::Rejected)).expect("new");
        }
        assert_eq!(s.attempts.len(), MAX_REMEMBERED_ATTEMPTS);
        assert_eq!(
            s.find(&first.uuid),
            None,
            "the oldest full record goes first"
        );
        assert_eq!(
            s.bound_digest(&first.uuid),
            Some(&first.digest),
            "its binding stays"
        );
        let mut other = entry(99, AttemptOutcome::Forwarded);
        other.uuid = first.uuid;
        assert_eq!(
            s.record(other),
            Err(BindError::Conflict {
                earlier: first.digest.clone()
            })
        );
        assert_eq!(
            s.find(&first.uuid),
            None,
            "a refused record changes nothing"
        );
    }

    #[test]
    fn bindings_refuse_new_attempts_when_full_and_never_forget() {
        let mut b = AttemptBindings::default();
        let first = AttemptUuid::new_random();
        let d = Sha256Hex::of(b"0");
        assert_eq!(b.bind(&first, &d), Ok(true));
        assert_eq!(b.bind(&first, &d), Ok(false));
        for n in 1..MAX_BOUND_ATTEMPTS as u64 {
            b.bind(&AttemptUuid::new_random(), &Sha256Hex::of(&n.to_be_bytes()))
                .expect("room");
        }
        assert_eq!(b.len(), MAX_BOUND_ATTEMPTS);
        let e = b.bind(&AttemptUuid::new_random(), &d).expect_err("full");
        assert_eq!(e, BindError::Full);
        assert!(e
            .to_string()
            .starts_with("this device has seen 10000 upgrade attempts"));
        assert_eq!(b.bind(&first, &d), Ok(false), "a bound attempt still is");
        assert_eq!(
            b.bind(&first, &Sha256Hex::of(b"other")),
            Err(BindError::Conflict { earlier: d.clone() })
        );
        // Round trip, compact, and a longer list is refused.
        let json = serde_json::to_string(&b).expect("json");
        assert!(
            json.len() < 110 * MAX_BOUND_ATTEMPTS,
            "{} bytes",
            json.len()
        );
        let back: AttemptBindings = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, b);
        let longer = json.replacen('[', &format!("[\"{}:{d}\",", AttemptUuid::new_random()), 1);
        assert!(serde_json::from_str::<AttemptBindings>(&longer).is_err());
        for bad in [r#"["x"]"#, r#"["0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10:zz"]"#] {
            assert!(
                serde_json::from_str::<AttemptBindings>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_file_without_bindings_binds_its_full_records() {
        let mut s = SeenAttempts::default();
        let e = entry(1, AttemptOutcome::Complete);
        s.record(e.clone()).expect("new");
        let mut json: serde_json::Value = serde_json::to_value(&s).expect("json");
        json.as_object_mut().expect("obj").remove("bound");
        let mut old: SeenAttempts = serde_json::from_value(json).expect("older file");
        assert!(old.bound.is_empty());
        old.bind_remembered();
        assert_eq!(old.bound_digest(&e.uuid), Some(&e.digest));
    }
}
