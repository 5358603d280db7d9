//! An isolated rootful Podman per test: its own storage (graphroot, runroot),
//! libpod tmp dir and file locks in a TempDir, selected by the environment
//! (`CONTAINERS_CONF`, `CONTAINERS_STORAGE_CONF`) so that a daemon under test
//! that runs plain `podman` inherits the isolation, and by global arguments
//! for the harness's own calls.
//!
//! File locks (`lock_type = "file"`) matter: with the default shared-memory
//! locks, every fresh instance "refreshes" after what looks like a reboot and
//! frees the locks of every other instance on the machine.
//!
//! The test image is busybox-static imported from a tarball built in memory
//! once per process. Drop removes every container, detaches whatever storage
//! mount is left under the TempDir, then removes it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use fleet_common::process::run_bounded;
use tempfile::TempDir;

use crate::require_tool;

/// The test image every Podman instance imports on first use.
pub const BUSYBOX_IMAGE: &str = "localhost/fleet-test/busybox:1";
/// Commands the image links to busybox in `/bin`.
const BUSYBOX_APPLETS: [&str; 12] = [
    "sh", "sleep", "echo", "cat", "ls", "nc", "httpd", "wget", "true", "false", "env", "kill",
];
const BUSYBOX: &str = "/bin/busybox";
/// Bound on one podman call from the harness (an image import, a run).
const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);
/// Output kept from one podman call.
const MAX_PODMAN_OUTPUT: usize = 16 * 1024 * 1024;

/// An isolated Podman; see the module doc.
#[derive(Debug)]
pub struct Podman {
    binary: PathBuf,
    dir: TempDir,
    image: OnceLock<String>,
}

impl Podman {
    /// Requires podman, runc and busybox-static.
    pub fn new() -> Podman {
        let binary = require_tool("podman", "podman");
        let runc = require_tool("runc", "runc");
        require_tool(BUSYBOX, "busybox-static");
        let dir = tempfile::Builder::new()
            .prefix("fleet-podman-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir: {e}"));
        let p = Podman {
            binary,
            dir,
            image: OnceLock::new(),
        };
        let conf = format!(
            "[containers]\n\
             default_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
             [engine]\n\
             runtime = \"runc\"\n\
             cgroup_manager = \"cgroupfs\"\n\
             events_logger = \"file\"\n\
             lock_type = \"file\"\n\
             tmp_dir = {}\n\
             [engine.runtimes]\n\
             runc = [{}]\n",
            toml_string(&p.tmp_dir()),
            toml_string(&runc),
        );
        let storage = format!(
            "[storage]\ndriver = \"overlay\"\ngraphroot = {}\nrunroot = {}\n",
            toml_string(&p.graphroot()),
            toml_string(&p.runroot()),
        );
        write_file(&p.containers_conf(), &conf);
        write_file(&p.storage_conf(), &storage);
        p
    }

    /// The `podman` binary.
    pub fn binary(&self) -> PathBuf {
        self.binary.clone()
    }

    /// `--root`, `--runroot` and `--tmpdir` of this instance (the environment
    /// says the same; these make the harness's own calls explicit).
    pub fn global_args(&self) -> Vec<String> {
        vec![
            "--root".to_owned(),
            self.graphroot().to_string_lossy().into_owned(),
            "--runroot".to_owned(),
            self.runroot().to_string_lossy().into_owned(),
            "--tmpdir".to_owned(),
            self.tmp_dir().to_string_lossy().into_owned(),
        ]
    }

    /// `CONTAINERS_CONF` and `CONTAINERS_STORAGE_CONF`: enough on their own to
    /// isolate a `podman` started by a process under test.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "CONTAINERS_CONF".to_owned(),
                self.containers_conf().to_string_lossy().into_owned(),
            ),
            (
                "CONTAINERS_STORAGE_CONF".to_owned(),
                self.storage_conf().to_string_lossy().into_owned(),
            ),
        ]
    }

    /// `podman` with the global args and environment of this instance.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.args(self.global_args()).envs(self.env());
        cmd
    }

    /// The instance's TempDir (config, storage, tmp).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// [`BUSYBOX_IMAGE`], imported into this instance on first call: a
    /// rootfs of `/bin/busybox` and links for sh, sleep, echo, cat, ls, nc,
    /// httpd, wget, true, false, env, kill.
    pub fn busybox_image(&self) -> String {
        self.image
            .get_or_init(|| {
                let tar = self.dir().join("busybox-rootfs.tar");
                write_bytes(&tar, busybox_rootfs_tar());
                self.run(&["import", "--quiet", &tar.to_string_lossy(), BUSYBOX_IMAGE]);
                BUSYBOX_IMAGE.to_owned()
            })
            .clone()
    }

    /// Runs podman with `args`; panics with its stderr on failure or after
    /// two minutes; returns stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let mut cmd = self.command();
        cmd.args(args);
        let out = run_bounded(&mut cmd, PODMAN_TIMEOUT, MAX_PODMAN_OUTPUT)
            .unwrap_or_else(|e| panic!("podman {args:?}: {e}"));
        if !out.success() {
            panic!(
                "podman {args:?} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Removes container `id` by hand, as a person would (`rm -f -t 0`),
    /// until it is gone. Podman 4.3 refuses the removal of a container
    /// caught between its process's exit and its cleanup ("container
    /// state improper"): asked again, it succeeds.
    pub fn remove_container(&self, id: &str) {
        let deadline = std::time::Instant::now() + PODMAN_TIMEOUT;
        loop {
            let mut cmd = self.command();
            cmd.args(["rm", "-f", "-t", "0", id]);
            let out = run_bounded(&mut cmd, PODMAN_TIMEOUT, MAX_PODMAN_OUTPUT)
                .unwrap_or_else(|e| panic!("podman rm -f {id}: {e}"));
            if out.success() {
                return;
            }
            let mut exists = self.command();
            exists.args(["container", "exists", id]);
            let gone = run_bounded(&mut exists, PODMAN_TIMEOUT, MAX_PODMAN_OUTPUT)
                .is_ok_and(|e| e.status.code() == Some(1));
            if gone {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "podman rm -f {id} kept failing:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `podman ps -a --format json`: every container of this instance.
    pub fn ps_all(&self) -> Vec<serde_json::Value> {
        let out = self.run(&["ps", "-a", "--format", "json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("podman ps: bad JSON ({e}): {out}"))
    }

    fn graphroot(&self) -> PathBuf {
        self.dir().join("root")
    }
    fn runroot(&self) -> PathBuf {
        self.dir().join("runroot")
    }
    fn tmp_dir(&self) -> PathBuf {
        self.dir().join("tmp")
    }
    fn containers_conf(&self) -> PathBuf {
        self.dir().join("containers.conf")
    }
    fn storage_conf(&self) -> PathBuf {
        self.dir().join("storage.conf")
    }
}

impl Default for Podman {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let mut cmd = self.command();
        cmd.args(["rm", "--all", "--force", "--time", "0"]);
        match run_bounded(&mut cmd, PODMAN_TIMEOUT, MAX_PODMAN_OUTPUT) {
            Ok(out) if out.success() => {}
            Ok(out) => eprintln!("harness: podman rm -af failed: {}", out.diagnostic()),
            Err(e) => eprintln!("harness: podman rm -af: {e}"),
        }
        // Podman unmounts the overlay home when its last user exits; detach
        // whatever a killed podman left, deepest first, so the TempDir can go.
        for mount in mounts_under(self.dir()) {
            if let Err(e) = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH) {
                eprintln!("harness: cannot unmount {}: {e}", mount.display());
            }
        }
    }
}

/// Mount points at or under `dir`, deepest first, from /proc/self/mountinfo.
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(p: &str) -> String {
    let bytes = p.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|s| u8::from_str_radix(s, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The busybox rootfs as an uncompressed tar, built once per process.
pub(crate) fn busybox_rootfs_tar() -> &'static [u8] {
    static TAR: OnceLock<Vec<u8>> = OnceLock::new();
    TAR.get_or_init(|| {
        let busybox = std::fs::read(BUSYBOX)
            .unwrap_or_else(|e| panic!("cannot read {BUSYBOX} (busybox-static): {e}"));
        let mut tar = Vec::with_capacity(busybox.len() + 64 * 1024);
        tar_entry(&mut tar, "bin/", TarKind::Dir, 0o755, &[]);
        tar_entry(&mut tar, "etc/", TarKind::Dir, 0o755, &[]);
        tar_entry(&mut tar, "tmp/", TarKind::Dir, 0o1777, &[]);
        tar_entry(&mut tar, "bin/busybox", TarKind::File, 0o755, &busybox);
        for applet in BUSYBOX_APPLETS {
            tar_entry(
                &mut tar,
                &format!("bin/{applet}"),
                TarKind::Symlink("busybox"),
                0o777,
                &[],
            );
        }
        // End of archive: two zero blocks.
        tar.resize(tar.len() + 2 * TAR_BLOCK, 0);
        tar
    })
}

const TAR_BLOCK: usize = 512;

enum TarKind<'a> {
    File,
    Dir,
    Symlink(&'a str),
}

/// Appends one ustar entry (root-owned, mtime 0) to `tar`.
fn tar_entry(tar: &mut Vec<u8>, name: &str, kind: TarKind<'_>, mode: u32, data: &[u8]) {
    let mut h = [0u8; TAR_BLOCK];
    let put = |h: &mut [u8; TAR_BLOCK], at: usize, field: &[u8]| {
        h[at..at + field.len()].copy_from_slice(field);
    };
    let octal = |width: usize, v: u64| format!("{v:0w$o}\0", w = width - 1).into_bytes();
    assert!(name.len() < 100, "tar name too long: {name}");
    put(&mut h, 0, name.as_bytes());
    put(&mut h, 100, &octal(8, u64::from(mode)));
    put(&mut h, 108, &octal(8, 0));
    put(&mut h, 116, &octal(8, 0));
    put(&mut h, 124, &octal(12, data.len() as u64));
    put(&mut h, 136, &octal(12, 0));
    let (flag, link) = match kind {
        TarKind::File => (b'0', ""),
        TarKind::Dir => (b'5', ""),
        TarKind::Symlink(target) => (b'2', target),
    };
    h[156] = flag;
    put(&mut h, 157, link.as_bytes());
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    put(&mut h, 265, b"root");
    put(&mut h, 297, b"root");
    // The checksum is computed with its own field read as spaces.
    put(&mut h, 148, b"        ");
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    tar.extend_from_slice(&h);
    tar.extend_from_slice(data);
    let pad = (TAR_BLOCK - data.len() % TAR_BLOCK) % TAR_BLOCK;
    tar.resize(tar.len() + pad, 0);
}

/// A TOML basic string.
fn toml_string(p: &Path) -> String {
    format!("{:?}", p.to_string_lossy())
}

fn write_file(path: &Path, text: &str) {
    write_bytes(path, text.as_bytes());
}

fn write_bytes(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mount_path("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_path("/x\\134y\\011z"), "/x\\y\tz");
        assert_eq!(unescape_mount_path("/plain\\"), "/plain\\");
    }

    #[test]
    fn rootfs_tar_has_busybox_and_its_links() {
        let tar = busybox_rootfs_tar();
        assert_eq!(tar.len() % TAR_BLOCK, 0);
        let names: Vec<String> = tar
            .chunks(TAR_BLOCK)
            .filter(|h| h[257..262] == *b"ustar")
            .map(|h| {
                let end = h[..100].iter().position(|&b| b == 0).unwrap_or(100);
                String::from_utf8_lossy(&h[..end]).into_owned()
            })
            .collect();
        assert!(names.contains(&"bin/busybox".to_owned()), "{names:?}");
        for applet in BUSYBOX_APPLETS {
            assert!(names.contains(&format!("bin/{applet}")), "{applet}");
        }
    }
}
