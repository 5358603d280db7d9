//! The one-mutator lock: an exclusive `flock` on `agent.lock` in the run
//! directory, held for the life of the process. Only its holder changes
//! workloads; a second agent exits naming the holder's pid (written into
//! the file once the lock is taken). The kernel drops the lock when the
//! holder exits, however it exits, so a stale file never blocks a start.
//! Probe mode (`--self-test`) never takes it: it runs beside the holder.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// Proof that this process is the one agent allowed to mutate. Functions
/// that change workloads take it (or something holding it) as an argument.
#[derive(Debug)]
pub struct AgentLock {
    // Held open: closing the file would release the lock.
    _file: File,
    path: PathBuf,
}

impl AgentLock {
    /// Takes the lock at `path`, creating its directory when missing.
    pub fn acquire(path: &Path) -> Result<AgentLock, LockError> {
        if let Some(dir) = path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|source| LockError::CreateDir {
                    dir: dir.to_owned(),
                    source,
                })?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map_err(|source| LockError::Open {
                path: path.to_owned(),
                source,
            })?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let pid = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse().ok());
                return Err(LockError::Held {
                    path: path.to_owned(),
                    pid,
                });
            }
            Err(e) => {
                return Err(LockError::Lock {
                    path: path.to_owned(),
                    source: e.into(),
                })
            }
        }
        let write_pid = |f: &mut File| -> io::Result<()> {
            f.set_len(0)?;
            f.seek(SeekFrom::Start(0))?;
            f.write_all(format!("{}\n", std::process::id()).as_bytes())
        };
        // The pid is only for the message of a second instance; failing to
        // write it does not weaken the lock.
        if let Err(e) = write_pid(&mut file) {
            log::warn!("writing the pid into {}: {e}", path.display());
        }
        Ok(AgentLock {
            _file: file,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The lock could not be taken.
#[derive(Debug)]
pub enum LockError {
    CreateDir { dir: PathBuf, source: io::Error },
    Open { path: PathBuf, source: io::Error },
    Held { path: PathBuf, pid: Option<u32> },
    Lock { path: PathBuf, source: io::Error },
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CreateDir { dir, source } => write!(
                f,
                "creating the run directory {}: {source}; it is normally created by systemd-tmpfiles",
                dir.display()
            ),
            Self::Open { path, source } => write!(
                f,
                "opening the lock file {}: {source}; check the run directory's owner",
                path.display()
            ),
            Self::Held { path, pid } => {
                let who = match pid {
                    Some(p) => format!("another fleet-agent (pid {p})"),
                    None => "another fleet-agent".to_owned(),
                };
                write!(
                    f,
                    "{who} holds {}: only one agent may manage workloads; stop it first (systemctl stop fleet-agent), or use --self-test to probe beside it",
                    path.display()
                )
            }
            Self::Lock { path, source } => write!(f, "locking {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for LockError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_pid_and_the_lock_is_released_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("run/harmony-fleet/agent.lock");
        let first = AgentLock::acquire(&path).expect("first");
        assert_eq!(
            fs::read_to_string(&path).expect("read"),
            format!("{}\n", std::process::id())
        );
        // flock conflicts between open file descriptions, even in one process.
        let e = AgentLock::acquire(&path).expect_err("second");
        assert!(matches!(e, LockError::Held { pid: Some(p), .. } if p == std::process::id()));
        assert_eq!(
            e.to_string(),
            format!(
                "another fleet-agent (pid {}) holds {}: only one agent may manage workloads; stop it first (systemctl stop fleet-agent), or use --self-test to probe beside it",
                std::process::id(),
                path.display()
            )
        );
        drop(first);
        let again = AgentLock::acquire(&path).expect("free after drop");
        assert_eq!(again.path(), path);
    }
}
