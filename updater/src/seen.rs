//! The uuid → digest binding of every attempt this updater has started
//! (`Layout::updater_bindings()`), kept for the device's lifetime: the
//! journal's `finished` holds only the latest attempts in full (for their
//! status), and a UUID reused with other content is refused with no window
//! (`docs/design/security.md` "Attempt identity"). Up to `MAX_BOUND_ATTEMPTS`;
//! beyond, a new attempt is refused rather than an old binding forgotten.
//!
//! Steps: [`BindingStore::load`] reads the file (missing: empty) and binds
//! every attempt the journal knows (a file written before this record
//! existed, or a start after a crash between the two writes); the handler
//! asks [`BindingStore::digest_of`] for a UUID the journal no longer holds,
//! [`BindingStore::check`]s a new attempt before its transaction begins and
//! [`BindingStore::bind`]s it durably (temp file, fsync, rename, directory
//! fsync) once the journal holds it: a crash or a failed write in between
//! leaves the binding in the journal, bound again at the next start. A file that
//! cannot be read or understood is kept as an error: every `upgrade` is then
//! refused (root repair), `status` still answers.

use std::fmt;
use std::path::{Path, PathBuf};

use fleet_common::contracts::{AttemptBindings, BindError, Journal};
use fleet_common::durable::{self, DurableError};
use fleet_common::limits::MAX_STATE_FILE_BYTES;
use fleet_common::validate::{AttemptUuid, Sha256Hex};
use fleet_common::Layout;
use serde::{Deserialize, Serialize};

/// Owner read-write only, like the journal.
const FILE_MODE: u32 = 0o600;
/// The file's format number; a file of another format is refused.
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct BindingsFile {
    format: u32,
    bound: AttemptBindings,
}

/// Why an attempt could not be bound, or the record not read.
#[derive(Debug)]
pub enum BindingError {
    /// The file could not be read or understood at start.
    Unreadable {
        path: PathBuf,
        detail: String,
    },
    Bind(BindError),
    Write {
        path: PathBuf,
        source: DurableError,
    },
}

impl fmt::Display for BindingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { path, detail } => write!(
                f,
                "the record of attempts started ({}) cannot be used: {detail}; every upgrade is refused until root repair restores it",
                path.display()
            ),
            Self::Bind(e) => e.fmt(f),
            Self::Write { path, source } => write!(
                f,
                "cannot record the attempt's binding in {}: {source}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for BindingError {}

/// The record and where it lives.
#[derive(Debug)]
pub struct BindingStore {
    path: PathBuf,
    bound: AttemptBindings,
}

impl BindingStore {
    /// Loads the record of `layout` and binds every attempt of `journal`
    /// (in memory; written with the next new binding).
    pub fn load(layout: &Layout, journal: &Journal) -> Result<Self, BindingError> {
        let path = layout.updater_bindings();
        let mut bound = read(&path)?;
        let known = journal
            .transaction
            .iter()
            .map(|tx| (tx.attempt.uuid, tx.attempt_digest.clone()))
            .chain(journal.finished.iter().map(|f| (f.uuid, f.digest.clone())));
        for (uuid, digest) in known {
            match bound.bind(&uuid, &digest) {
                Ok(_) => {}
                // The journal holds it; refusals by the journal still apply.
                Err(e) => {
                    log::error!(attempt = uuid.to_string().as_str(); "binding from the journal: {e}")
                }
            }
        }
        Ok(Self { path, bound })
    }

    /// The digest `uuid` was started with, however long ago.
    pub fn digest_of(&self, uuid: &AttemptUuid) -> Option<&Sha256Hex> {
        self.bound.digest_of(uuid)
    }

    /// Whether `uuid` may be bound to `digest` (see [`AttemptBindings::check`]).
    pub fn check(&self, uuid: &AttemptUuid, digest: &Sha256Hex) -> Result<(), BindingError> {
        self.bound
            .check(uuid, digest)
            .map(|_| ())
            .map_err(BindingError::Bind)
    }

    /// Binds `uuid` to `digest` and writes the record when that is new.
    /// Refused, changing nothing, on another digest or when full.
    pub fn bind(&mut self, uuid: &AttemptUuid, digest: &Sha256Hex) -> Result<(), BindingError> {
        let mut next = self.bound.clone();
        if !next.bind(uuid, digest).map_err(BindingError::Bind)? {
            return Ok(());
        }
        let file = BindingsFile {
            format: FORMAT,
            bound: next,
        };
        let mut bytes = serde_json::to_vec(&file).unwrap_or_default();
        bytes.push(b'\n');
        durable::write_atomic(&self.path, &bytes, FILE_MODE).map_err(|source| {
            BindingError::Write {
                path: self.path.clone(),
                source,
            }
        })?;
        self.bound = file.bound;
        Ok(())
    }
}

fn read(path: &Path) -> Result<AttemptBindings, BindingError> {
    let unreadable = |detail: String| BindingError::Unreadable {
        path: path.to_owned(),
        detail,
    };
    let bytes = match durable::read_bounded(path, MAX_STATE_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(AttemptBindings::default()),
        Err(e) => return Err(unreadable(e.to_string())),
    };
    let file: BindingsFile =
        serde_json::from_slice(&bytes).map_err(|e| unreadable(format!("corrupt: {e}")))?;
    if file.format != FORMAT {
        return Err(unreadable(format!(
            "format {}, which this updater does not know",
            file.format
        )));
    }
    Ok(file.bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> (tempfile::TempDir, Layout) {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.updater_state_dir()).expect("state dir");
        (dir, layout)
    }

    #[test]
    fn bindings_survive_a_restart_and_refuse_other_content() {
        let (_dir, layout) = layout();
        let mut s = BindingStore::load(&layout, &Journal::default()).expect("empty");
        let first = AttemptUuid::new_random();
        let d = Sha256Hex::of(b"first");
        s.bind(&first, &d).expect("new");
        for n in 0..70u32 {
            s.bind(&AttemptUuid::new_random(), &Sha256Hex::of(&n.to_be_bytes()))
                .expect("new");
        }
        let mut again = BindingStore::load(&layout, &Journal::default()).expect("file");
        assert_eq!(again.digest_of(&first), Some(&d));
        let e = again
            .bind(&first, &Sha256Hex::of(b"other"))
            .expect_err("conflict");
        assert!(
            matches!(e, BindingError::Bind(BindError::Conflict { ref earlier }) if *earlier == d),
            "{e}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(layout.updater_bindings())
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_corrupt_or_foreign_file_is_an_error() {
        let (_dir, layout) = layout();
        std::fs::write(layout.updater_bindings(), b"{not json").expect("write");
        let e = BindingStore::load(&layout, &Journal::default()).expect_err("corrupt");
        assert!(
            e.to_string()
                .contains("every upgrade is refused until root repair"),
            "{e}"
        );
        std::fs::write(layout.updater_bindings(), br#"{"format":9,"bound":[]}"#).expect("write");
        let e = BindingStore::load(&layout, &Journal::default()).expect_err("format");
        assert!(e.to_string().contains("format 9"), "{e}");
    }
}
