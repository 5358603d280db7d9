//! The persisted record of attempts seen ([`SeenAttempts`] at
//! `Layout::seen_attempts()`): the latest attempts in full and the uuid →
//! digest binding of every attempt ever seen (`docs/design/security.md`
//! "Attempt identity": a UUID reused with
//! other content is refused, with no window; up to `MAX_BOUND_ATTEMPTS`,
//! where new attempts are refused). Loaded at start, rewritten durably (temp
//! file, fsync, rename, directory fsync) at every change. A missing file is
//! an empty record. A file that cannot be read or understood is logged and
//! replaced by an empty record: the updater refuses a reused UUID on its
//! own (from its journal) and answers a known one with its status, so a
//! lost record can re-send an attempt but never run one twice.

use std::fmt;
use std::path::{Path, PathBuf};

use fleet_common::contracts::{AttemptOutcome, BindError, SeenAttempt, SeenAttempts};
use fleet_common::durable::{self, DurableError};
use fleet_common::limits::MAX_STATE_FILE_BYTES;
use fleet_common::validate::{AttemptUuid, Sha256Hex, Version};
use fleet_common::{Layout, Timestamp};

/// Owner read-write, group read (an operator in the agent's group may look).
const FILE_MODE: u32 = 0o640;

/// The record could not be changed or written.
#[derive(Debug)]
pub enum SeenWriteError {
    /// The UUID is bound to another digest, or the bindings are full;
    /// nothing changed.
    Bind(BindError),
    Write(DurableError),
}

impl fmt::Display for SeenWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bind(e) => write!(f, "recording the attempts seen: {e}"),
            Self::Write(e) => write!(f, "recording the attempts seen: {e}"),
        }
    }
}

impl std::error::Error for SeenWriteError {}

/// The record and where it lives.
#[derive(Debug)]
pub struct SeenStore {
    path: PathBuf,
    seen: SeenAttempts,
}

impl SeenStore {
    /// Loads the record of `layout` (see the module documentation for
    /// missing and unreadable files).
    pub fn load(layout: &Layout) -> Self {
        let path = layout.seen_attempts();
        let seen = match read(&path) {
            Ok(mut s) => {
                s.bind_remembered();
                s
            }
            Err(why) => {
                log::error!("{why}; starting with an empty record (the updater still refuses a reused UUID)");
                SeenAttempts::default()
            }
        };
        Self { path, seen }
    }

    pub fn attempts(&self) -> &SeenAttempts {
        &self.seen
    }

    /// Records `outcome` for `uuid` and writes the file.
    pub fn record(
        &mut self,
        uuid: AttemptUuid,
        digest: Sha256Hex,
        target_version: Option<Version>,
        outcome: AttemptOutcome,
    ) -> Result<(), SeenWriteError> {
        self.seen
            .record(SeenAttempt {
                uuid,
                digest,
                target_version,
                outcome,
                at: Timestamp::now(),
            })
            .map_err(SeenWriteError::Bind)?;
        // Compact: up to MAX_BOUND_ATTEMPTS bindings, about 1 MiB when full.
        let mut bytes = serde_json::to_vec(&self.seen).unwrap_or_default();
        bytes.push(b'\n');
        durable::write_atomic(&self.path, &bytes, FILE_MODE).map_err(SeenWriteError::Write)
    }

    /// Records that `uuid`'s transaction ended in `outcome`, keeping its digest
    /// and version. Nothing happens for a UUID never recorded.
    pub fn end(
        &mut self,
        uuid: &AttemptUuid,
        outcome: AttemptOutcome,
    ) -> Result<(), SeenWriteError> {
        match self.seen.find(uuid).cloned() {
            Some(s) if s.outcome != outcome => {
                self.record(s.uuid, s.digest, s.target_version, outcome)
            }
            _ => Ok(()),
        }
    }
}

fn read(path: &Path) -> Result<SeenAttempts, String> {
    let bytes = match durable::read_bounded(path, MAX_STATE_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(SeenAttempts::default()),
        Err(e) => return Err(format!("reading the attempts seen: {e}")),
    };
    let seen: SeenAttempts = serde_json::from_slice(&bytes)
        .map_err(|e| format!("the attempts seen in {} are corrupt: {e}", path.display()))?;
    if seen.format != SeenAttempts::FORMAT {
        return Err(format!(
            "the attempts seen in {} have format {}, which this agent does not know",
            path.display(),
            seen.format
        ));
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> (tempfile::TempDir, Layout) {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.agent_state_dir()).expect("state dir");
        (dir, layout)
    }

    #[test]
    fn records_survive_a_restart_and_ending_keeps_the_digest() {
        let (_dir, layout) = layout();
        let mut s = SeenStore::load(&layout);
        assert!(
            s.attempts().attempts.is_empty(),
            "missing file: empty record"
        );
        let uuid = AttemptUuid::new_random();
        let digest = Sha256Hex::of(b"attempt");
        s.record(
            uuid,
            digest.clone(),
            Some(Version::parse("2.0").expect("v")),
            AttemptOutcome::Forwarded,
        )
        .expect("record");
        s.end(&uuid, AttemptOutcome::Complete).expect("end");
        s.end(&AttemptUuid::new_random(), AttemptOutcome::Failed)
            .expect("unknown uuids are ignored");
        let again = SeenStore::load(&layout);
        let got = again.attempts().find(&uuid).expect("persisted");
        assert_eq!(
            (
                &got.digest,
                got.outcome,
                got.target_version.as_ref().map(|v| v.as_str())
            ),
            (&digest, AttemptOutcome::Complete, Some("2.0"))
        );
        assert_eq!(again.attempts().attempts.len(), 1);
        let text = std::fs::read_to_string(layout.seen_attempts()).expect("file");
        assert!(text.contains("\"outcome\":\"complete\""), "{text}");
    }

    #[test]
    fn a_corrupt_or_foreign_file_starts_an_empty_record() {
        let (_dir, layout) = layout();
        std::fs::write(layout.seen_attempts(), b"{not json").expect("write");
        assert!(SeenStore::load(&layout).attempts().attempts.is_empty());
        std::fs::write(layout.seen_attempts(), br#"{"format":9,"attempts":[]}"#).expect("write");
        assert_eq!(
            read(&layout.seen_attempts()).expect_err("format"),
            format!(
                "the attempts seen in {} have format 9, which this agent does not know",
                layout.seen_attempts().display()
            )
        );
        let mut s = SeenStore::load(&layout);
        s.record(
            AttemptUuid::new_random(),
            Sha256Hex::of(b"x"),
            None,
            AttemptOutcome::Rejected,
        )
        .expect("rewritten");
        assert_eq!(
            read(&layout.seen_attempts())
                .expect("valid again")
                .attempts
                .len(),
            1
        );
    }

    /// An attempt, then 70 others; after a restart the
    /// first UUID is still bound to its digest, so other content under it is
    /// refused (and nothing is recorded).
    #[test]
    fn the_first_binding_survives_70_attempts_and_a_restart() {
        let (_dir, layout) = layout();
        let mut s = SeenStore::load(&layout);
        let first = AttemptUuid::new_random();
        let digest = Sha256Hex::of(b"first");
        s.record(first, digest.clone(), None, AttemptOutcome::Forwarded)
            .expect("record");
        s.end(&first, AttemptOutcome::Failed).expect("end");
        for n in 0..70u32 {
            s.record(
                AttemptUuid::new_random(),
                Sha256Hex::of(&n.to_be_bytes()),
                None,
                AttemptOutcome::Complete,
            )
            .expect("record");
        }
        let mut again = SeenStore::load(&layout);
        assert_eq!(again.attempts().find(&first), None, "full record gone");
        assert_eq!(again.attempts().bound_digest(&first), Some(&digest));
        let other = Sha256Hex::of(b"v4.0");
        assert_eq!(
            crate::upgrade::intent::verdict(again.attempts(), &first, &other),
            crate::upgrade::intent::Verdict::Conflict {
                earlier: digest.clone()
            }
        );
        let e = again
            .record(first, other, None, AttemptOutcome::Forwarded)
            .expect_err("refused");
        assert!(
            matches!(e, SeenWriteError::Bind(BindError::Conflict { ref earlier }) if *earlier == digest),
            "{e}"
        );
        assert_eq!(again.attempts().bound.len(), 71);
    }
}
