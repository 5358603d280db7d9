//! Disk-pressure reclaim: when a write fails for lack of space, the
//! versioned agents (`/usr/lib/harmony-fleet/fleet-agent-v<version>`) that
//! no transaction can need are removed, oldest first, so the write can be
//! retried once.
//!
//! Never removed: the active agent (the link's target), and the previous
//! and target binaries of the journal's transaction (on disk and about to
//! be written). When the active link cannot be read, nothing is removed:
//! the updater does not guess which agent runs.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use fleet_common::Layout;

/// Free bytes for an unprivileged writer on the file system holding
/// `path`; `None` when it cannot be read (logged as unknown).
pub fn free_bytes(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

/// `free_bytes` for a log line.
pub fn describe_free(path: &Path) -> String {
    match free_bytes(path) {
        Some(b) => format!("{b} bytes free on {}", path.display()),
        None => format!("free space on {} unknown", path.display()),
    }
}

/// What [`reclaim`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Removed binaries and their sizes, oldest first.
    pub removed: Vec<(PathBuf, u64)>,
}

impl Reclaimed {
    pub fn freed(&self) -> u64 {
        self.removed.iter().map(|r| r.1).sum()
    }
}

/// Removes every versioned agent of `layout` but the active one and
/// `keep`, oldest (by modification time) first. Logs each removal, the
/// total freed and the free space after.
pub fn reclaim(layout: &Layout, keep: &[&Path]) -> Reclaimed {
    let dir = layout.versions_dir();
    let link = layout.active_agent_link();
    let active = match std::fs::read_link(&link) {
        Ok(a) => a,
        Err(e) => {
            log::warn!(
                "disk full: not reclaiming old agents, the active link {} cannot be read ({e})",
                link.display()
            );
            return Reclaimed::default();
        }
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Reclaimed::default();
    };
    let mut candidates: Vec<(SystemTime, PathBuf, u64)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| layout.version_of(p).is_some())
        .filter(|p| *p != active && !keep.contains(&p.as_path()))
        .filter_map(|p| {
            let meta = std::fs::symlink_metadata(&p).ok()?;
            let at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            meta.is_file().then_some((at, p, meta.len()))
        })
        .collect();
    candidates.sort();
    let mut done = Reclaimed::default();
    for (_, path, bytes) in candidates {
        match std::fs::remove_file(&path) {
            Ok(()) => {
                log::warn!(
                    "disk full: removed the unused agent {} ({bytes} bytes)",
                    path.display()
                );
                done.removed.push((path, bytes));
            }
            Err(e) => log::warn!(
                "disk full: removing the unused agent {}: {e}",
                path.display()
            ),
        }
    }
    if done.removed.is_empty() {
        log::warn!(
            "disk full: no unused agent to remove in {} (active {}, kept {}); {}",
            dir.display(),
            active.display(),
            keep.len(),
            describe_free(&dir)
        );
    } else {
        let _ = fleet_common::durable::sync_dir(&dir);
        log::warn!(
            "disk full: removed {} unused agent(s), {} bytes freed; {}",
            done.removed.len(),
            done.freed(),
            describe_free(&dir)
        );
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::validate::Version;

    fn install(layout: &Layout, v: &str, age_s: u64) -> PathBuf {
        let p = layout.versioned_agent(&Version::parse(v).expect("version"));
        std::fs::write(&p, vec![b'x'; 100 + v.len()]).expect("write");
        let at = SystemTime::now() - std::time::Duration::from_secs(age_s);
        let f = std::fs::File::options().write(true).open(&p).expect("open");
        f.set_modified(at).expect("mtime");
        p
    }

    #[test]
    fn removes_all_but_active_previous_and_target_oldest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.versions_dir()).expect("mkdir");
        std::fs::create_dir_all(layout.active_agent_link().parent().expect("bin")).expect("mkdir");
        let v1 = install(&layout, "1.0", 500);
        let v2 = install(&layout, "2.0", 100);
        let v3 = install(&layout, "3.0", 300);
        let active = install(&layout, "4.0", 50);
        let previous = install(&layout, "0.9", 900);
        let target = install(&layout, "5.0", 10);
        let updater = layout.updater_binary();
        std::fs::write(&updater, b"updater").expect("write");
        let tmp = layout
            .versions_dir()
            .join(".fleet-agent-v6.0.tmp.1.0123456789ab");
        std::fs::write(&tmp, b"partial").expect("write");
        std::os::unix::fs::symlink(&active, layout.active_agent_link()).expect("link");

        let r = reclaim(&layout, &[&previous, &target]);
        assert_eq!(
            r.removed,
            [(v1.clone(), 103), (v3.clone(), 103), (v2.clone(), 103)]
        );
        assert_eq!(r.freed(), 309);
        for kept in [&active, &previous, &target, &updater, &tmp] {
            assert!(kept.exists(), "{}", kept.display());
        }
        for gone in [&v1, &v2, &v3] {
            assert!(!gone.exists(), "{}", gone.display());
        }
    }

    #[test]
    fn nothing_is_removed_when_the_active_link_is_unreadable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::with_root(dir.path());
        std::fs::create_dir_all(layout.versions_dir()).expect("mkdir");
        let v1 = install(&layout, "1.0", 500);
        assert_eq!(reclaim(&layout, &[]), Reclaimed::default());
        assert!(v1.exists());
    }
}
