//! The small host tmpfs that stands in for a full disk
//! ([`super::BootOptions::small_state_fs_kib`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::owner::{owner_alive, owner_id};
use super::util::create_dir_all;

/// Where the host-side filesystems of [`BootOptions`] are mounted, one
/// directory `<owner pid>-<owner start time>-<n>` each.
pub(super) const STATE_FS_DIR: &str = "/run/fleet-test/state-fs";

/// A tmpfs mounted on a host directory for one container; unmounted and
/// its directory removed on drop (after the container is gone).
#[derive(Debug)]
pub(super) struct HostTmpfs {
    pub(super) dir: PathBuf,
}

impl HostTmpfs {
    pub(super) fn mount(kib: u64) -> HostTmpfs {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        // No ':' in the name: podman's -v splits on it.
        let dir = Path::new(STATE_FS_DIR).join(format!(
            "{}-{}",
            owner_id().replace(':', "-"),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        create_dir_all(&dir);
        // From here a panic unmounts (if mounted) and removes the directory.
        let fs = HostTmpfs { dir };
        let data = std::ffi::CString::new(format!("size={kib}k,mode=0755"))
            .unwrap_or_else(|e| panic!("tmpfs options: {e}"));
        rustix::mount::mount(
            "fleet-state",
            &fs.dir,
            "tmpfs",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            data.as_c_str(),
        )
        .unwrap_or_else(|e| {
            panic!(
                "cannot mount a {kib} KiB tmpfs on {}: {e} (the test needs root with CAP_SYS_ADMIN)",
                fs.dir.display()
            )
        });
        fs
    }

    /// Unmounts `dir` (detached when busy) and removes it; what fails is
    /// said, not fatal.
    pub(super) fn remove(dir: &Path) {
        if crate::podman::mounts_under(dir).iter().any(|m| m == dir) {
            if let Err(e) = rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH) {
                eprintln!("harness: cannot unmount {}: {e}", dir.display());
            }
        }
        if let Err(e) = std::fs::remove_dir(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("harness: cannot remove {}: {e}", dir.display());
            }
        }
    }

    /// Unmounts the filesystems whose owning test process is gone.
    pub(super) fn remove_orphans() {
        let Ok(entries) = std::fs::read_dir(STATE_FS_DIR) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let mut parts = name.splitn(3, '-');
            let owner = match (parts.next(), parts.next()) {
                (Some(pid), Some(start)) => format!("{pid}:{start}"),
                _ => continue,
            };
            if !owner_alive(&owner) {
                Self::remove(&e.path());
            }
        }
    }
}

impl Drop for HostTmpfs {
    fn drop(&mut self) {
        Self::remove(&self.dir);
    }
}
