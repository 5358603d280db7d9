//! Durable file I/O: replace, never edit in place.
//!
//! - [`AtomicFile`]: a temp file in the target's directory; `commit` syncs it,
//!   renames it over the target and syncs the directory. Dropped uncommitted,
//!   the temp file is removed and the target is untouched.
//! - [`write_atomic`]: the same for bytes in memory.
//! - [`switch_symlink`]: a temp symlink renamed over the link, then a directory
//!   sync.
//! - [`read_bounded`]: reads a file refusing more than a limit.
//! - [`remove_stale_temps`]: at a daemon's start, removes the temp files a
//!   kill or power loss left in a directory it owns.
//!
//! If the directory sync fails after a rename, the new content is visible but
//! may not survive power loss; the error is returned so the caller does not
//! record the step as durable.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A durable-I/O step that failed, on which path.
#[derive(Debug)]
pub struct DurableError {
    pub step: DurableStep,
    pub path: PathBuf,
    pub source: io::Error,
}

/// The step of a durable write or read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableStep {
    CreateTemp,
    Write,
    SyncFile,
    SetMode,
    Rename,
    SyncDir,
    Symlink,
    Open,
    Read,
    TooLarge { limit: u64 },
}

impl fmt::Display for DurableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        match self.step {
            DurableStep::CreateTemp => write!(f, "creating a temp file beside {p}: {}: check the directory exists and is writable", self.source),
            DurableStep::Write => write!(f, "writing {p}: {}: check free space", self.source),
            DurableStep::SyncFile => write!(f, "syncing {p} to disk: {}: check the storage device", self.source),
            DurableStep::SetMode => write!(f, "setting the mode of {p}: {}", self.source),
            DurableStep::Rename => write!(f, "renaming into {p}: {}", self.source),
            DurableStep::SyncDir => write!(f, "syncing directory {p}: {}: the change may not survive power loss; check the storage device", self.source),
            DurableStep::Symlink => write!(f, "creating a symlink beside {p}: {}", self.source),
            DurableStep::Open => write!(f, "opening {p}: {}", self.source),
            DurableStep::Read => write!(f, "reading {p}: {}", self.source),
            DurableStep::TooLarge { limit } => write!(f, "{p} is larger than {limit} bytes: inspect it; it is not a file this program wrote"),
        }
    }
}

impl std::error::Error for DurableError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl DurableError {
    /// Whether the file was absent (the caller decides if that is fine).
    pub fn is_not_found(&self) -> bool {
        self.step == DurableStep::Open && self.source.kind() == io::ErrorKind::NotFound
    }

    /// Whether the step failed for lack of space (`ENOSPC`, or a quota):
    /// freeing space and retrying may help.
    pub fn is_no_space(&self) -> bool {
        let full = [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT];
        self.source
            .raw_os_error()
            .is_some_and(|n| full.iter().any(|e| e.raw_os_error() == n))
    }
}

fn err(step: DurableStep, path: &Path, source: io::Error) -> DurableError {
    DurableError {
        step,
        path: path.to_owned(),
        source,
    }
}

/// The directory holding `path` (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Length of the random tag that ends a temp name.
const TEMP_TAG_CHARS: usize = 12;

/// A unique temp name beside `target`: `.<name>.tmp.<pid>.<random>`.
fn temp_beside(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tag = uuid::Uuid::new_v4().simple().to_string();
    parent_of(target).join(format!(
        ".{name}.tmp.{}.{}",
        std::process::id(),
        &tag[..TEMP_TAG_CHARS]
    ))
}

/// Syncs a directory so a rename or new entry in it survives power loss.
pub fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    let d = File::open(dir).map_err(|e| err(DurableStep::SyncDir, dir, e))?;
    d.sync_all().map_err(|e| err(DurableStep::SyncDir, dir, e))
}

/// A file being written beside its target, published by [`AtomicFile::commit`].
#[derive(Debug)]
pub struct AtomicFile {
    file: Option<File>,
    temp: PathBuf,
    target: PathBuf,
    mode: u32,
}

impl AtomicFile {
    /// Creates the temp file (mode 0600 until commit) in the target's directory.
    pub fn create(target: &Path, mode: u32) -> Result<Self, DurableError> {
        let temp = temp_beside(target);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| err(DurableStep::CreateTemp, target, e))?;
        Ok(Self {
            file: Some(file),
            temp,
            target: target.to_owned(),
            mode,
        })
    }

    /// The temp file's path (to run it before publishing, for instance).
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Writes all of `buf`.
    pub fn write_all(&mut self, buf: &[u8]) -> Result<(), DurableError> {
        match self.file.as_mut() {
            Some(f) => f
                .write_all(buf)
                .map_err(|e| err(DurableStep::Write, &self.target, e)),
            None => Err(err(
                DurableStep::Write,
                &self.target,
                io::Error::other("file already committed"),
            )),
        }
    }

    /// Syncs the data and sets the final mode, without publishing yet.
    pub fn sync(&mut self) -> Result<(), DurableError> {
        let f = self.file.as_mut().ok_or_else(|| {
            err(
                DurableStep::SyncFile,
                &self.target,
                io::Error::other("file already committed"),
            )
        })?;
        f.set_permissions(fs::Permissions::from_mode(self.mode))
            .map_err(|e| err(DurableStep::SetMode, &self.target, e))?;
        f.sync_all()
            .map_err(|e| err(DurableStep::SyncFile, &self.target, e))
    }

    /// Syncs, renames over the target, syncs the directory.
    pub fn commit(mut self) -> Result<(), DurableError> {
        self.sync()?;
        self.file = None;
        fs::rename(&self.temp, &self.target)
            .map_err(|e| err(DurableStep::Rename, &self.target, e))?;
        // The temp name no longer exists; nothing for Drop to remove.
        self.temp = PathBuf::new();
        sync_dir(parent_of(&self.target))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            self.file = None;
            let _ = fs::remove_file(&self.temp);
        }
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.file.as_mut() {
            Some(f) => f.write(buf),
            None => Err(io::Error::other("file already committed")),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// Replaces `target` with `data`, durably, with file mode `mode`.
pub fn write_atomic(target: &Path, data: &[u8], mode: u32) -> Result<(), DurableError> {
    let mut f = AtomicFile::create(target, mode)?;
    f.write_all(data)?;
    f.commit()
}

/// Points the symlink `link` at `target` atomically: a temp symlink, a rename
/// over `link`, a directory sync. Readers see the old or the new target,
/// never neither.
pub fn switch_symlink(link: &Path, target: &Path) -> Result<(), DurableError> {
    let temp = temp_beside(link);
    std::os::unix::fs::symlink(target, &temp).map_err(|e| err(DurableStep::Symlink, link, e))?;
    if let Err(e) = fs::rename(&temp, link) {
        let _ = fs::remove_file(&temp);
        return Err(err(DurableStep::Rename, link, e));
    }
    sync_dir(parent_of(link))
}

/// The target name of a temp file this module names (`.<name>.tmp.<pid>.<tag>`),
/// `None` for any other name.
pub fn temp_target_name(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix('.')?;
    let (head, tag) = rest.rsplit_once('.')?;
    let (head, pid) = head.rsplit_once('.')?;
    let name = head.strip_suffix(".tmp")?;
    let is_tag = tag.len() == TEMP_TAG_CHARS && tag.bytes().all(|b| b.is_ascii_hexdigit());
    let is_pid = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (is_tag && is_pid && !name.is_empty()).then_some(name)
}

/// A temp file left by a process that was killed mid-write, as
/// [`remove_stale_temps`] found it.
#[derive(Debug)]
pub struct StaleTemp {
    pub path: PathBuf,
    pub bytes: u64,
    /// `Err` when it could not be removed.
    pub removed: io::Result<()>,
}

/// Removes from `dir` every temp file of this module whose target name
/// starts with `target_prefix` (`""` for all). Call it only at start, in a
/// directory no other running process writes with the same names: a live
/// writer's temp file would be removed under it. A missing directory has no
/// leftovers.
pub fn remove_stale_temps(dir: &Path, target_prefix: &str) -> Vec<StaleTemp> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ours = temp_target_name(name).is_some_and(|t| t.starts_with(target_prefix));
        // Never follow or descend: a temp symlink is removed as a link.
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(true);
        if !ours || is_dir {
            continue;
        }
        let path = entry.path();
        let bytes = fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0);
        let removed = fs::remove_file(&path);
        out.push(StaleTemp {
            path,
            bytes,
            removed,
        });
    }
    out
}

/// Reads `path` whole, refusing a file larger than `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, DurableError> {
    let f = File::open(path).map_err(|e| err(DurableStep::Open, path, e))?;
    let mut out = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| err(DurableStep::Read, path, e))?;
    if out.len() as u64 > limit {
        return Err(err(
            DurableStep::TooLarge { limit },
            path,
            io::Error::other("file too large"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp."))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn write_atomic_replaces_and_sets_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("j.json");
        write_atomic(&p, b"one", 0o600).expect("first write");
        write_atomic(&p, b"two", 0o640).expect("second write");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        assert_eq!(
            fs::metadata(&p).expect("meta").permissions().mode() & 0o777,
            0o640
        );
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn uncommitted_file_leaves_target_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("bin");
        write_atomic(&p, b"old", 0o755).expect("write");
        {
            let mut f = AtomicFile::create(&p, 0o755).expect("create");
            f.write_all(b"half a new binary").expect("write");
            assert!(f.temp_path().exists());
        }
        assert_eq!(fs::read(&p).expect("read"), b"old");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn write_into_missing_dir_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("missing/j.json");
        let e = write_atomic(&p, b"x", 0o600).expect_err("no dir");
        assert_eq!(e.step, DurableStep::CreateTemp);
        assert!(e
            .to_string()
            .starts_with(&format!("creating a temp file beside {}", p.display())));
    }

    #[test]
    fn switch_symlink_replaces_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("fleet-agent");
        switch_symlink(&link, Path::new("/usr/lib/harmony-fleet/fleet-agent-v1")).expect("first");
        switch_symlink(&link, Path::new("/usr/lib/harmony-fleet/fleet-agent-v2")).expect("second");
        assert_eq!(
            fs::read_link(&link).expect("readlink"),
            Path::new("/usr/lib/harmony-fleet/fleet-agent-v2")
        );
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn temp_names_are_recognised_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = temp_beside(&dir.path().join("journal.json"));
        let name = t.file_name().expect("name").to_str().expect("utf-8");
        assert_eq!(temp_target_name(name), Some("journal.json"));
        assert_eq!(
            temp_target_name(".fleet-agent-v2.0.tmp.17.0123456789ab"),
            Some("fleet-agent-v2.0")
        );
        for other in [
            "journal.json",
            ".journal.json",
            ".journal.json.tmp",
            ".journal.json.tmp.17",
            ".journal.json.tmp.x.0123456789ab",
            ".journal.json.tmp.17.0123456789a",
            ".journal.json.tmp.17.0123456789az",
            "..tmp.17.0123456789ab",
            "journal.json.tmp.17.0123456789ab",
        ] {
            assert_eq!(temp_target_name(other), None, "{other}");
        }
    }

    #[test]
    fn stale_temps_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let keep = ["journal.json", ".hidden", "x.tmp.1.0123456789ab"];
        for k in keep {
            fs::write(dir.path().join(k), b"keep").expect("write");
        }
        let a = temp_beside(&dir.path().join("journal.json"));
        fs::write(&a, b"half").expect("write");
        let l = temp_beside(&dir.path().join("fleet-agent"));
        std::os::unix::fs::symlink("/nowhere", &l).expect("symlink");
        let d = temp_beside(&dir.path().join("adir"));
        fs::create_dir(&d).expect("mkdir");

        let only_links = remove_stale_temps(dir.path(), "fleet-agent");
        assert_eq!(only_links.len(), 1);
        assert_eq!(only_links[0].path, l);
        assert!(only_links[0].removed.is_ok());
        assert!(fs::symlink_metadata(&l).is_err());
        assert!(a.exists());

        let all = remove_stale_temps(dir.path(), "");
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].path.as_path(), all[0].bytes), (a.as_path(), 4));
        assert!(!a.exists());
        assert!(d.is_dir(), "directories are never removed");
        for k in keep {
            assert!(dir.path().join(k).exists(), "{k}");
        }
        assert!(remove_stale_temps(&dir.path().join("missing"), "").is_empty());
    }

    #[test]
    fn no_space_is_told_apart() {
        let full = err(
            DurableStep::Write,
            Path::new("/j"),
            io::Error::from_raw_os_error(28),
        );
        assert!(full.is_no_space());
        let denied = err(
            DurableStep::CreateTemp,
            Path::new("/j"),
            io::Error::from_raw_os_error(13),
        );
        assert!(!denied.is_no_space());
    }

    #[test]
    fn read_bounded_refuses_larger_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        fs::write(&p, vec![b'a'; 11]).expect("write");
        assert_eq!(read_bounded(&p, 11).expect("fits").len(), 11);
        let e = read_bounded(&p, 10).expect_err("too large");
        assert_eq!(e.step, DurableStep::TooLarge { limit: 10 });
        let missing = read_bounded(&dir.path().join("nope"), 10).expect_err("missing");
        assert!(missing.is_not_found());
    }
}
