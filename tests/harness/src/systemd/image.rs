//! The cached systemd image and the one Podman instance every container of
//! this machine shares: debootstrap from the mirror apt uses, the recipe
//! hash in the tag, a file lock so it is built once.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fleet_common::process::run_bounded;
use sha2::{Digest, Sha256};

use crate::require_tool;

use super::owner::{owner_alive, OWNER_LABEL};
use super::tmpfs::HostTmpfs;
use super::util::{
    check, create_dir_all, set_mode, toml_string, write_atomic, write_file, MAX_OUTPUT,
    PODMAN_TIMEOUT,
};

/// Repository of the cached image; the tag is `bookworm-<recipe hash>`.
pub const SYSTEMD_IMAGE_REPO: &str = "localhost/fleet-test/systemd";

/// The Debian suite of the image.
pub(super) const SUITE: &str = "bookworm";

/// Used when no apt source for the suite is found on the host.
pub(super) const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Packages on top of minbase: systemd as init, the rootless Podman stack
/// the agent uses (`podman`, `uidmap`, `slirp4netns`, `fuse-overlayfs`, a
/// user bus for the lingering user manager), `procps` and `socat` for
/// tests.
pub(super) const INCLUDE: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "dbus-user-session",
    "libpam-systemd",
    "ca-certificates",
    "podman",
    // debootstrap does not resolve virtual packages: podman's
    // container-network-stack and its runtime alternative, named.
    "containernetworking-plugins",
    "crun",
    "conmon",
    "uidmap",
    "slirp4netns",
    "fuse-overlayfs",
    "procps",
    // A client for the local sockets (the updater's, the agent's).
    "socat",
    // The packaging tests: `man fleetctl` after installing, and the .rpm
    // installed by rpm itself (there is no RPM-based image offline).
    "man-db",
    "rpm",
];

/// Files added to the rootfs before the import: (path, mode, content).
pub(super) const EXTRA_FILES: &[(&str, u32, &str)] = &[
    // Debian's udev gives these 0666; the container's /dev has them 0600.
    // slirp4netns and fuse-overlayfs open them as the rootless user.
    (
        "etc/tmpfiles.d/fleet-test-devices.conf",
        0o644,
        "z /dev/net/tun 0666 - - -\nz /dev/fuse 0666 - - -\n",
    ),
    ("etc/hostname", 0o644, "fleet-device\n"),
];

/// Default cache dir; `FLEET_TEST_CACHE` overrides it.
pub(super) const DEFAULT_CACHE_DIR: &str = "/var/cache/fleet-test";

/// Runtime state of the shared Podman (lost on a host reboot, as it should).
pub(super) const RUN_DIR: &str = "/run/fleet-test";

/// debootstrap downloads about 120 MB; on a slow mirror this is generous.
pub(super) const DEBOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// `podman import` of the ~400 MB rootfs (measured ~10 s).
pub(super) const IMPORT_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// The cache dir: `$FLEET_TEST_CACHE` or `/var/cache/fleet-test`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("FLEET_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE_DIR))
}

/// The Podman instance all systemd containers of this machine share.
#[derive(Debug)]
pub(super) struct SharedPodman {
    pub(super) binary: PathBuf,
    pub(super) root: PathBuf,
    pub(super) runroot: PathBuf,
    pub(super) tmp: PathBuf,
    pub(super) containers_conf: PathBuf,
    pub(super) storage_conf: PathBuf,
    pub(super) image: String,
}

impl SharedPodman {
    /// The instance, its image built; a failure is kept, so the other tests
    /// of the process fail at once with it instead of building again.
    pub(super) fn get() -> &'static SharedPodman {
        static SHARED: OnceLock<Result<SharedPodman, String>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| {
            std::panic::catch_unwind(|| {
                let p = SharedPodman::configure();
                p.remove_orphans();
                p.ensure_image();
                p
            })
            .map_err(|panic| {
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "unknown panic".to_owned())
            })
        });
        match shared {
            Ok(p) => p,
            Err(e) => panic!("the systemd test image is unavailable: {e}"),
        }
    }

    pub(super) fn configure() -> SharedPodman {
        let binary = require_tool("podman", "podman");
        let runc = require_tool("runc", "runc");
        let cache = cache_dir();
        let run = PathBuf::from(RUN_DIR);
        let p = SharedPodman {
            binary,
            root: cache.join("podman/root"),
            runroot: run.join("runroot"),
            tmp: run.join("tmp"),
            containers_conf: cache.join("podman/containers.conf"),
            storage_conf: cache.join("podman/storage.conf"),
            image: format!("{SYSTEMD_IMAGE_REPO}:{SUITE}-{}", recipe_hash()),
        };
        for dir in [&p.root, &p.runroot, &p.tmp] {
            create_dir_all(dir);
        }
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
            toml_string(&p.tmp),
            toml_string(&runc),
        );
        let storage = format!(
            "[storage]\ndriver = \"overlay\"\ngraphroot = {}\nrunroot = {}\n",
            toml_string(&p.root),
            toml_string(&p.runroot),
        );
        // Concurrent processes write the same bytes; a rename keeps every
        // reader from seeing a half-written file.
        write_atomic(&p.containers_conf, conf.as_bytes());
        write_atomic(&p.storage_conf, storage.as_bytes());
        p
    }

    pub(super) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--runroot")
            .arg(&self.runroot)
            .arg("--tmpdir")
            .arg(&self.tmp)
            .env("CONTAINERS_CONF", &self.containers_conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage_conf);
        cmd
    }

    /// Runs podman with `args`; `Err(stderr)` when it fails.
    pub(super) fn try_run(&self, args: &[&str], timeout: Duration) -> Result<String, String> {
        let mut cmd = self.command();
        cmd.args(args);
        let out = run_bounded(&mut cmd, timeout, MAX_OUTPUT).map_err(|e| e.to_string())?;
        if out.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{}: {}",
                fleet_common::process::describe_status(out.status),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    pub(super) fn run(&self, args: &[&str]) -> String {
        self.try_run(args, PODMAN_TIMEOUT)
            .unwrap_or_else(|e| panic!("podman {args:?} failed: {e}"))
    }

    /// Removes containers whose owning test process is gone (a test killed
    /// before its Drop ran).
    pub(super) fn remove_orphans(&self) {
        let out = self.run(&[
            "ps",
            "-a",
            "--filter",
            &format!("label={OWNER_LABEL}"),
            "--format",
            &format!("{{{{.Names}}}} {{{{index .Labels \"{OWNER_LABEL}\"}}}}"),
        ]);
        for line in out.lines() {
            let mut parts = line.split_whitespace();
            let (Some(name), Some(owner)) = (parts.next(), parts.next()) else {
                continue;
            };
            if !owner_alive(owner) {
                let _ = self.try_run(&["rm", "-f", "-t", "0", name], PODMAN_TIMEOUT);
            }
        }
        // Their small state filesystems, once no container uses them.
        HostTmpfs::remove_orphans();
    }

    /// Builds the image unless it exists; one process at a time.
    pub(super) fn ensure_image(&self) {
        if self.image_exists() {
            return;
        }
        let lock_path = cache_dir().join("systemd-image.lock");
        let lock = File::create(&lock_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
        // Another process may have built it while this one waited.
        if !self.image_exists() {
            self.build_image();
        }
        // The lock is released when `lock` closes.
    }

    pub(super) fn image_exists(&self) -> bool {
        let mut cmd = self.command();
        cmd.args(["image", "exists", &self.image]);
        run_bounded(&mut cmd, PODMAN_TIMEOUT, MAX_OUTPUT)
            .map(|o| o.success())
            .unwrap_or(false)
    }

    pub(super) fn build_image(&self) {
        let debootstrap = require_tool("debootstrap", "debootstrap");
        let started = Instant::now();
        let work = tempfile::Builder::new()
            .prefix("systemd-image-")
            .tempdir_in(cache_dir())
            .unwrap_or_else(|e| {
                panic!("cannot create a temp dir in {}: {e}", cache_dir().display())
            });
        let rootfs = work.path().join("rootfs");
        let mirror = apt_mirror();
        let mut cmd = Command::new(debootstrap);
        cmd.arg("--variant=minbase")
            .arg(format!("--include={}", INCLUDE.join(",")))
            .arg(SUITE)
            .arg(&rootfs)
            .arg(&mirror);
        check(
            &format!("debootstrap {SUITE} from {mirror}"),
            run_bounded(&mut cmd, DEBOOTSTRAP_TIMEOUT, MAX_OUTPUT),
        );
        for (path, mode, content) in EXTRA_FILES {
            let p = rootfs.join(path);
            write_file(&p, content.as_bytes());
            set_mode(&p, *mode);
        }
        // Downloaded .debs are not needed in the image.
        let archives = rootfs.join("var/cache/apt/archives");
        if let Ok(entries) = std::fs::read_dir(&archives) {
            for e in entries.flatten() {
                if e.path().extension().is_some_and(|x| x == "deb") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let tar = work.path().join("rootfs.tar");
        let mut cmd = Command::new("tar");
        cmd.arg("-C").arg(&rootfs).arg("-cf").arg(&tar).arg(".");
        check(
            "tar of the rootfs",
            run_bounded(&mut cmd, IMPORT_TIMEOUT, MAX_OUTPUT),
        );
        self.try_run(
            &["import", "--quiet", &tar.to_string_lossy(), &self.image],
            IMPORT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("podman import {}: {e}", self.image));
        // Images of older recipes are dead weight (one in use by a running
        // container of another process stays: rmi refuses it).
        if let Ok(list) = self.try_run(
            &[
                "images",
                "--format",
                "{{.Repository}}:{{.Tag}}",
                "--filter",
                &format!("reference={SYSTEMD_IMAGE_REPO}"),
            ],
            PODMAN_TIMEOUT,
        ) {
            for old in list.lines().map(str::trim).filter(|i| *i != self.image) {
                let _ = self.try_run(&["rmi", old], PODMAN_TIMEOUT);
            }
        }
        eprintln!(
            "harness: built {} in {:.0?} (cached in {})",
            self.image,
            started.elapsed(),
            cache_dir().display()
        );
    }
}

/// The Debian mirror apt uses for the suite here (deb822 `.sources` files or
/// `sources.list`), else deb.debian.org.
pub fn apt_mirror() -> String {
    let mut candidates = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if p.extension().is_some_and(|x| x == "sources") {
                candidates.extend(mirrors_in_deb822(
                    &std::fs::read_to_string(&p).unwrap_or_default(),
                ));
            } else if p.extension().is_some_and(|x| x == "list") {
                candidates.extend(mirrors_in_list(
                    &std::fs::read_to_string(&p).unwrap_or_default(),
                ));
            }
        }
    }
    candidates.extend(mirrors_in_list(
        &std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default(),
    ));
    candidates
        .into_iter()
        .next()
        .unwrap_or_else(|| DEFAULT_MIRROR.to_owned())
}

/// URIs of deb822 stanzas of type `deb` for [`SUITE`] (not its -updates or
/// -security suites).
pub(super) fn mirrors_in_deb822(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
                .unwrap_or_default()
        };
        let types = field("Types:");
        let suites = field("Suites:");
        if types.split_whitespace().any(|t| t == "deb")
            && suites.split_whitespace().any(|s| s == SUITE)
        {
            found.extend(field("URIs:").split_whitespace().map(str::to_owned));
        }
    }
    found
}

/// URIs of one-line `deb URI SUITE ...` entries.
pub(super) fn mirrors_in_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().filter(|w| !w.starts_with('['));
            (words.next()? == "deb").then_some(())?;
            let uri = words.next()?;
            (words.next()? == SUITE).then(|| uri.to_owned())
        })
        .collect()
}

/// The recipe: a change in it builds a new image.
pub(super) fn recipe_hash() -> String {
    let mut h = Sha256::new();
    h.update(SUITE);
    for p in INCLUDE {
        h.update(p);
        h.update([0]);
    }
    for (path, mode, content) in EXTRA_FILES {
        h.update(path);
        h.update(mode.to_le_bytes());
        h.update(content);
    }
    let d = h.finalize();
    d.iter().take(6).map(|b| format!("{b:02x}")).collect()
}
