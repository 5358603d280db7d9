//! The durable journal (`/var/lib/harmony-fleet/updater/journal.json`, root
//! 0600): loading it at start, and writing it at the named points of a
//! transaction — and nowhere else.
//!
//! Every write is a phase entry ([`JournalStore::update`]): the change is made
//! on a copy and the copy is written with `write_atomic` (temp file, fsync,
//! rename, directory fsync). A failed write leaves the file as it was, and
//! the memory too: the store's journal is always the one on disk, so nothing
//! is published or answered that a restart would not find. The copy that
//! could not be written is kept, with the reason, until a later write
//! succeeds or [`JournalStore::retry`] writes it.
//!
//! A write refused for lack of space first reclaims unused agents
//! ([`crate::reclaim`]) and is retried once.
//!
//! A missing file means "no transaction ever". A file that does not parse,
//! has an unknown format, or contradicts itself is corrupt: the updater
//! refuses to start rather than guess from the filesystem.

use std::fmt;
use std::path::{Path, PathBuf};

use fleet_common::contracts::{
    FinishedAttempt, Journal, JournalPhase, Transaction, JOURNAL_FORMAT,
};
use fleet_common::durable::{read_bounded, write_atomic, DurableError, DurableStep};
use fleet_common::limits::MAX_STATE_FILE_BYTES;
use fleet_common::Layout;

use crate::fault::{self, FaultPoint};
use crate::reclaim;

/// The journal's file mode: root only.
pub const JOURNAL_MODE: u32 = 0o600;

/// Why the journal cannot be used.
#[derive(Debug)]
pub enum JournalLoadError {
    Read { path: PathBuf, source: DurableError },
    Corrupt { path: PathBuf, why: String },
}

impl fmt::Display for JournalLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => write!(
                f,
                "cannot read the updater journal {}: {source}",
                path.display()
            ),
            Self::Corrupt { path, why } => write!(
                f,
                "the updater journal {} is corrupt ({why}); the updater will not guess the state of the device from its files. \
                 Inspect the journal, the active link and the installed agents (updater/REPAIR.md), \
                 then move the journal aside and restart the updater once the active link points at a good agent",
                path.display()
            ),
        }
    }
}

impl std::error::Error for JournalLoadError {}

/// The journal's transitions: from each phase, the phases a transaction
/// may enter next (docs/design/upgrade.md "The journal"). A transaction
/// begins in `preparing`; `committed` and `rollback-failed` are never left,
/// `failed` only for `rollback-failed` (the next attempt is a new
/// transaction). Every phase entry goes through
/// [`JournalStore::update`], which refuses any other.
pub const TRANSITIONS: &[(JournalPhase, &[JournalPhase])] = &[
    (
        JournalPhase::Preparing,
        // probed; the target already active; failed (download, verify,
        // install, probe, a restart while preparing); quarantined when the
        // previous link cannot be restored.
        &[
            JournalPhase::Activating,
            JournalPhase::Committed,
            JournalPhase::Failed,
            JournalPhase::RollbackFailed,
        ],
    ),
    (
        JournalPhase::Activating,
        // ready; not ready or a restart during the cutover; failed or
        // quarantined straight away when `rolling-back` could not be
        // written (a full disk) and the rollback went on all the same.
        &[
            JournalPhase::Committed,
            JournalPhase::RollingBack,
            JournalPhase::Failed,
            JournalPhase::RollbackFailed,
        ],
    ),
    (
        JournalPhase::RollingBack,
        &[JournalPhase::Failed, JournalPhase::RollbackFailed],
    ),
    (JournalPhase::Committed, &[]),
    // After a restart in `preparing`: recorded failed, then the previous
    // agent would not start.
    (JournalPhase::Failed, &[JournalPhase::RollbackFailed]),
    (JournalPhase::RollbackFailed, &[]),
];

/// Whether [`TRANSITIONS`] lets a transaction in `from` enter `to`.
pub fn may_enter(from: JournalPhase, to: JournalPhase) -> bool {
    TRANSITIONS
        .iter()
        .any(|(f, next)| *f == from && next.contains(&to))
}

/// A journal write that did not happen.
#[derive(Debug)]
pub struct JournalWriteError {
    pub phase: JournalPhase,
    pub source: JournalWriteFailure,
}

/// Why a journal write did not happen.
#[derive(Debug)]
pub enum JournalWriteFailure {
    /// The file could not be written (nothing changed on disk).
    Write(DurableError),
    /// The transition is not in [`TRANSITIONS`]: a bug in the updater,
    /// refused before anything is written.
    Refused { from: JournalPhase },
}

impl fmt::Display for JournalWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            JournalWriteFailure::Write(e) => {
                write!(f, "recording phase {} in the journal: {e}", self.phase)
            }
            JournalWriteFailure::Refused { from } => write!(
                f,
                "recording phase {} in the journal: refused, a transaction in {from} may not enter {} \
                 (the journal's transitions: docs/design/upgrade.md \"The journal\"); the journal is unchanged, \
                 report this as a bug with the updater's log",
                self.phase, self.phase
            ),
        }
    }
}

impl std::error::Error for JournalWriteError {}

/// What was on disk at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// No journal file: no transaction has ever run here.
    Missing,
    Existing,
}

/// The journal file and its in-memory copy, always equal. A write that
/// failed is kept aside ([`Unsynced`]) and never published.
#[derive(Debug)]
pub struct JournalStore {
    layout: Layout,
    path: PathBuf,
    journal: Journal,
    unsynced: Option<Unsynced>,
}

/// The journal that could not be written, and why.
#[derive(Debug)]
struct Unsynced {
    next: Journal,
    phase: JournalPhase,
    why: String,
}

impl JournalStore {
    /// Loads and checks the journal of `layout`.
    pub fn load(layout: &Layout) -> Result<(Self, Found), JournalLoadError> {
        let path = layout.journal();
        let bytes = match read_bounded(&path, MAX_STATE_FILE_BYTES) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => {
                return Ok((
                    Self {
                        layout: layout.clone(),
                        path,
                        journal: Journal::default(),
                        unsynced: None,
                    },
                    Found::Missing,
                ))
            }
            Err(e) if matches!(e.step, DurableStep::TooLarge { .. }) => {
                return Err(JournalLoadError::Corrupt {
                    why: format!("larger than {MAX_STATE_FILE_BYTES} bytes"),
                    path,
                })
            }
            Err(source) => return Err(JournalLoadError::Read { path, source }),
        };
        let journal = parse(layout, &bytes).map_err(|why| JournalLoadError::Corrupt {
            path: path.clone(),
            why,
        })?;
        Ok((
            Self {
                layout: layout.clone(),
                path,
                journal,
                unsynced: None,
            },
            Found::Existing,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn transaction(&self) -> Option<&Transaction> {
        self.journal.transaction.as_ref()
    }

    /// Why the last write failed, while no later write has succeeded.
    pub fn unsynced(&self) -> Option<&str> {
        self.unsynced.as_ref().map(|u| u.why.as_str())
    }

    /// The phase the failed write would have recorded.
    pub fn unsynced_phase(&self) -> Option<JournalPhase> {
        self.unsynced.as_ref().map(|u| u.phase)
    }

    /// Writes again the journal whose write failed (nothing when none did).
    pub fn retry(&mut self) -> Result<(), JournalWriteError> {
        match self.unsynced.take() {
            Some(u) => self.write(u.next, u.phase, true),
            None => Ok(()),
        }
    }

    /// Starts `tx` (already in its first phase) and writes it; all or
    /// nothing: when the write fails, the transaction is not started. The
    /// previous transaction, terminal by then, stays remembered in `finished`.
    pub fn begin(&mut self, tx: Transaction) -> Result<(), JournalWriteError> {
        let phase = tx.phase;
        let mut next = self.journal.clone();
        next.transaction = Some(tx);
        remember_if_terminal(&mut next);
        self.write(next, phase, false)
    }

    /// Applies `change` to the current transaction — which must enter
    /// `phase`, and may record errors or the drain duration in the same
    /// write — and writes it. When the write fails, the journal stays as it
    /// is on disk (and the change is kept for [`Self::retry`]): the caller
    /// decides whether to take the next step. With no transaction, does
    /// nothing.
    pub fn update(
        &mut self,
        phase: JournalPhase,
        change: impl FnOnce(&mut Transaction),
    ) -> Result<(), JournalWriteError> {
        let mut next = self.journal.clone();
        let Some(tx) = next.transaction.as_mut() else {
            return Ok(());
        };
        // `phase` is the one entered, or the current one for a write that
        // only records an error.
        if phase != tx.phase && !may_enter(tx.phase, phase) {
            return Err(JournalWriteError {
                phase,
                source: JournalWriteFailure::Refused { from: tx.phase },
            });
        }
        // The errors of a write that failed stay on record (the phase it
        // would have entered does not: it never was on disk).
        if let Some(unwritten) = self
            .unsynced
            .as_ref()
            .and_then(|u| u.next.transaction.as_ref())
        {
            if unwritten.attempt.uuid == tx.attempt.uuid {
                tx.errors = unwritten.errors.clone();
            }
        }
        change(tx);
        remember_if_terminal(&mut next);
        self.write(next, phase, true)
    }

    fn write(
        &mut self,
        next: Journal,
        phase: JournalPhase,
        keep_on_failure: bool,
    ) -> Result<(), JournalWriteError> {
        let mut bytes = serde_json::to_vec_pretty(&next).unwrap_or_default();
        bytes.push(b'\n');
        let mut written = write_atomic(&self.path, &bytes, JOURNAL_MODE);
        if let Err(e) = &written {
            if e.is_no_space() {
                log::warn!(
                    "recording phase {phase}: {e}; {}",
                    reclaim::describe_free(self.path.parent().unwrap_or(&self.path))
                );
                let keep = binaries_of(&self.journal, &next);
                let keep: Vec<&Path> = keep.iter().map(PathBuf::as_path).collect();
                if !reclaim::reclaim(&self.layout, &keep).removed.is_empty() {
                    written = write_atomic(&self.path, &bytes, JOURNAL_MODE);
                }
            }
        }
        match written {
            Ok(()) => {
                self.journal = next;
                self.unsynced = None;
                fault::hit(FaultPoint::after_write(phase));
                Ok(())
            }
            Err(source) => {
                let e = JournalWriteError {
                    phase,
                    source: JournalWriteFailure::Write(source),
                };
                if keep_on_failure {
                    self.unsynced = Some(Unsynced {
                        next,
                        phase,
                        why: e.to_string(),
                    });
                }
                Err(e)
            }
        }
    }
}

fn binaries_of(a: &Journal, b: &Journal) -> Vec<PathBuf> {
    [a, b]
        .iter()
        .filter_map(|j| j.transaction.as_ref())
        .flat_map(|t| [t.previous_binary.clone(), t.target_binary.clone()])
        .collect()
}

/// Adds the transaction to `finished` once it is terminal (once per uuid).
fn remember_if_terminal(j: &mut Journal) {
    let Some(tx) = j.transaction.as_ref() else {
        return;
    };
    if !tx.phase.is_terminal() || j.finished.iter().any(|f| f.uuid == tx.attempt.uuid) {
        return;
    }
    let at = tx.transitions.last().map(|t| t.at).unwrap_or(tx.started_at);
    let done = FinishedAttempt {
        uuid: tx.attempt.uuid,
        digest: tx.attempt_digest.clone(),
        target_version: tx.attempt.target_version.clone(),
        phase: tx.phase,
        finished_at: at,
    };
    j.finished.push(done);
}

/// Parses and cross-checks a journal; the error says what is wrong.
fn parse(layout: &Layout, bytes: &[u8]) -> Result<Journal, String> {
    #[derive(serde::Deserialize)]
    struct FormatOnly {
        format: serde_json::Value,
    }
    let format = serde_json::from_slice::<FormatOnly>(bytes)
        .map_err(|e| format!("not a journal: {e}"))?
        .format;
    if format.as_u64() != Some(u64::from(JOURNAL_FORMAT)) {
        return Err(format!(
            "format {format} is not {JOURNAL_FORMAT}, the only one this updater reads"
        ));
    }
    let journal: Journal =
        serde_json::from_slice(bytes).map_err(|e| format!("not a valid journal: {e}"))?;
    if let Some(tx) = &journal.transaction {
        if tx.attempt_digest != tx.attempt.digest() {
            return Err(format!(
                "attempt-digest {} does not match the attempt it records ({})",
                tx.attempt_digest,
                tx.attempt.digest()
            ));
        }
        if layout.version_of(&tx.previous_binary).is_none() {
            return Err(format!(
                "previous-binary {} is not a fleet-agent-v<version> in {}",
                tx.previous_binary.display(),
                layout.versions_dir().display()
            ));
        }
        let target = layout.versioned_agent(&tx.attempt.target_version);
        if tx.target_binary != target {
            return Err(format!(
                "target-binary {} is not {}",
                tx.target_binary.display(),
                target.display()
            ));
        }
    }
    Ok(journal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::contracts::{AgentUpgradeAttempt, Bounded, Transitions, UpgradeReason};
    use fleet_common::validate::*;
    use fleet_common::Timestamp;

    pub(crate) fn attempt(version: &str) -> AgentUpgradeAttempt {
        AgentUpgradeAttempt {
            arch: Arch::X86_64,
            artifact_url: ArtifactUrl::parse("https://127.0.0.1:1/a").expect("url"),
            device_id: DeviceId::parse("dev1").expect("device"),
            max_bytes: MaxBytes::new(1024).expect("max"),
            sha256: Sha256Hex::of(b"x"),
            target_version: Version::parse(version).expect("version"),
            uuid: AttemptUuid::new_random(),
        }
    }

    fn tx(layout: &Layout) -> Transaction {
        let a = attempt("2.0");
        let mut t = Transaction {
            phase: JournalPhase::Preparing,
            reason: Some(UpgradeReason::Accepted),
            attempt_digest: a.digest(),
            previous_binary: layout.versioned_agent(&Version::parse("1.0").expect("v")),
            target_binary: layout.versioned_agent(&a.target_version),
            attempt: a,
            started_at: Timestamp::from_unix_millis(1_000),
            drain_duration_ms: None,
            errors: Bounded::default(),
            transitions: Transitions::default(),
        };
        t.enter(
            JournalPhase::Preparing,
            Some(UpgradeReason::Accepted),
            t.started_at,
        );
        t
    }

    fn store(dir: &Path) -> (Layout, JournalStore) {
        let layout = Layout::with_root(dir);
        std::fs::create_dir_all(layout.updater_state_dir()).expect("mkdir");
        let (s, found) = JournalStore::load(&layout).expect("load");
        assert_eq!(found, Found::Missing);
        (layout, s)
    }

    const PHASES: [JournalPhase; 6] = [
        JournalPhase::Preparing,
        JournalPhase::Activating,
        JournalPhase::Committed,
        JournalPhase::RollingBack,
        JournalPhase::Failed,
        JournalPhase::RollbackFailed,
    ];

    /// A store whose transaction is in `phase`, written there through
    /// allowed transitions.
    fn store_in(dir: &Path, phase: JournalPhase) -> (Layout, JournalStore) {
        let (layout, mut s) = store(dir);
        s.begin(tx(&layout)).expect("begin");
        let path: &[JournalPhase] = match phase {
            JournalPhase::Preparing => &[],
            JournalPhase::Activating => &[JournalPhase::Activating],
            JournalPhase::Committed => &[JournalPhase::Activating, JournalPhase::Committed],
            JournalPhase::RollingBack => &[JournalPhase::Activating, JournalPhase::RollingBack],
            JournalPhase::Failed => &[JournalPhase::Failed],
            JournalPhase::RollbackFailed => &[JournalPhase::RollbackFailed],
        };
        for p in path {
            s.update(*p, |tx| {
                tx.enter(*p, None, Timestamp::from_unix_millis(2_000))
            })
            .expect("an allowed transition");
        }
        (layout, s)
    }

    #[test]
    fn every_transition_outside_the_table_is_refused_and_changes_nothing() {
        let (mut allowed, mut refused) = (0, 0);
        for from in PHASES {
            for to in PHASES {
                if from == to {
                    continue;
                }
                let dir = tempfile::tempdir().expect("tempdir");
                let (layout, mut s) = store_in(dir.path(), from);
                let before = std::fs::read(layout.journal()).expect("journal");
                let r = s.update(to, |tx| {
                    tx.enter(to, None, Timestamp::from_unix_millis(3_000))
                });
                if may_enter(from, to) {
                    r.unwrap_or_else(|e| panic!("{from} → {to}: {e}"));
                    assert_eq!(s.transaction().expect("tx").phase, to);
                    allowed += 1;
                } else {
                    let e = r.expect_err("refused");
                    assert_eq!(
                        e.to_string(),
                        format!(
                            "recording phase {to} in the journal: refused, a transaction in {from} may not enter {to} \
                             (the journal's transitions: docs/design/upgrade.md \"The journal\"); the journal is unchanged, \
                             report this as a bug with the updater's log"
                        )
                    );
                    assert_eq!(s.transaction().expect("tx").phase, from);
                    assert_eq!(s.unsynced(), None, "nothing to write again");
                    assert_eq!(std::fs::read(layout.journal()).expect("journal"), before);
                    refused += 1;
                }
            }
        }
        assert_eq!((allowed, refused), (11, 19));
        // Nothing leaves committed or rollback-failed.
        for p in [JournalPhase::Committed, JournalPhase::RollbackFailed] {
            assert!(PHASES.iter().all(|to| !may_enter(p, *to)), "{p}");
        }
        // A write that only records an error stays in its phase.
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, mut s) = store_in(dir.path(), JournalPhase::RollingBack);
        s.update(JournalPhase::RollingBack, |tx| {
            tx.record_error("recovery", "again", Timestamp::from_unix_millis(4_000))
        })
        .expect("a note");
    }

    #[test]
    fn writes_are_durable_json_and_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (layout, mut s) = store(dir.path());
        s.begin(tx(&layout)).expect("begin");
        let now = Timestamp::from_unix_millis(2_000);
        s.update(JournalPhase::Failed, |tx| {
            tx.record_error("probe", "exit code 1", now);
            tx.enter(JournalPhase::Failed, Some(UpgradeReason::Probe), now);
        })
        .expect("update");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(layout.journal())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, found) = JournalStore::load(&layout).expect("reload");
        assert_eq!(found, Found::Existing);
        assert_eq!(again.journal(), s.journal());
        let t = again.transaction().expect("tx");
        assert_eq!(t.phase, JournalPhase::Failed);
        assert_eq!(t.errors.as_slice()[0].message.as_str(), "exit code 1");
        assert_eq!(again.journal().finished.len(), 1);
        assert_eq!(
            again.journal().finished.as_slice()[0].phase,
            JournalPhase::Failed
        );
        // Human-readable: pretty-printed, one key per line.
        let text = std::fs::read_to_string(layout.journal()).expect("read");
        assert!(text.contains("\n    \"phase\": \"failed\",\n"), "{text}");
    }

    #[test]
    fn a_failed_write_leaves_the_journal_as_on_disk_until_retried() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (layout, mut s) = store(dir.path());
        s.begin(tx(&layout)).expect("begin");
        let on_disk = s.journal().clone();
        // The directory is gone: every write fails.
        std::fs::remove_dir_all(layout.updater_state_dir()).expect("rm");
        let now = Timestamp::from_unix_millis(2_000);
        let e = s
            .update(JournalPhase::Activating, |tx| {
                tx.record_error("probe", "slow", now);
                tx.enter(JournalPhase::Activating, None, now);
            })
            .expect_err("no directory");
        assert_eq!(e.phase, JournalPhase::Activating);
        assert_eq!(s.journal(), &on_disk, "memory stays what the disk holds");
        assert_eq!(s.unsynced_phase(), Some(JournalPhase::Activating));
        assert!(
            s.unsynced().expect("why").starts_with(
                "recording phase activating in the journal: creating a temp file beside "
            ),
            "{:?}",
            s.unsynced()
        );
        // A later change keeps the errors of the unwritten one, not its phase.
        let e = s
            .update(JournalPhase::Failed, |tx| {
                tx.enter(JournalPhase::Failed, Some(UpgradeReason::Probe), now);
            })
            .expect_err("no directory");
        assert_eq!(e.phase, JournalPhase::Failed);
        assert_eq!(s.transaction().expect("tx").phase, JournalPhase::Preparing);
        std::fs::create_dir_all(layout.updater_state_dir()).expect("mkdir");
        s.retry().expect("written");
        assert_eq!(s.unsynced(), None);
        let (again, _) = JournalStore::load(&layout).expect("reload");
        let t = again.transaction().expect("tx");
        assert_eq!(t.phase, JournalPhase::Failed);
        assert_eq!(t.errors.as_slice()[0].message.as_str(), "slow");
        let phases: Vec<JournalPhase> = t.transitions.iter().map(|t| t.phase).collect();
        assert_eq!(phases, [JournalPhase::Preparing, JournalPhase::Failed]);
        assert_eq!(again.journal(), s.journal());
        s.retry().expect("nothing pending");
    }

    #[test]
    fn corrupt_journals_are_refused_with_the_repair() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (layout, mut s) = store(dir.path());
        s.begin(tx(&layout)).expect("begin");
        let good = std::fs::read_to_string(layout.journal()).expect("read");
        let cases: Vec<(String, &str)> = vec![
            ("{\"format\":1,".to_owned(), "not a journal"),
            (
                good.replacen("\"format\": 1", "\"format\": 2", 1),
                "format 2 is not 1",
            ),
            (
                good.replacen("\"phase\": \"preparing\"", "\"phase\": \"idle\"", 1),
                "not a valid journal",
            ),
            (
                good.replacen("fleet-agent-v1.0", "fleet-agent-v1.1", 1)
                    .replacen("\"previous-binary\": \"", "\"previous-binary\": \"/etc/", 1),
                "previous-binary /etc/",
            ),
            (
                good.replacen("\"max-bytes\": 1024", "\"max-bytes\": 1025", 1),
                "attempt-digest",
            ),
            ("[]".to_owned(), "not a journal"),
        ];
        for (text, want) in cases {
            std::fs::write(layout.journal(), &text).expect("write");
            let e = JournalStore::load(&layout).expect_err(want).to_string();
            assert!(
                e.starts_with(&format!(
                    "the updater journal {} is corrupt (",
                    layout.journal().display()
                )),
                "{e}"
            );
            assert!(e.contains(want), "{want}: {e}");
            assert!(e.ends_with("then move the journal aside and restart the updater once the active link points at a good agent"), "{e}");
        }
    }
}
