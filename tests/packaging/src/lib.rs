//! Helpers of the packaging tests: the architectures, where
//! `make packages-for-test` put the packages, and their contents as dpkg and
//! rpm list them. The tests check what is shipped, so they read the built
//! packages, never the staging scripts' own file list.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_common::process::run_bounded;
use fleet_harness::{require_tool, workspace_root};

/// Bound on one packaging tool call (dpkg-deb, rpm, package.sh).
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_OUTPUT: usize = 16 * 1024 * 1024;

/// A package architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
    Armhf,
}

impl Arch {
    pub fn all() -> [Arch; 3] {
        [Arch::Amd64, Arch::Arm64, Arch::Armhf]
    }

    /// Debian's name (and `make ARCH=`).
    pub fn deb(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
            Arch::Armhf => "armhf",
        }
    }

    /// RPM's name.
    pub fn rpm(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
            Arch::Armhf => "armv7hl",
        }
    }

    /// ELF `e_machine` and class (1: 32-bit, 2: 64-bit) of its binaries.
    pub fn elf(self) -> (u16, u8) {
        match self {
            Arch::Amd64 => (62, 2),
            Arch::Arm64 => (183, 2),
            Arch::Armhf => (40, 1),
        }
    }

    /// Whether its device package ships static (musl) daemons: amd64 and
    /// arm64 do; armhf keeps glibc (Rust's armv7 musl target is not
    /// available here). The Makefile's `DEVICE_TRIPLE_*`.
    pub fn static_daemons(self) -> bool {
        !matches!(self, Arch::Armhf)
    }

    /// The qemu-user binary and the cross sysroot that run its binaries here
    /// (`None` for the host's own).
    pub fn emulator(self) -> Option<(&'static str, &'static str)> {
        match self {
            Arch::Amd64 => None,
            Arch::Arm64 => Some(("qemu-aarch64-static", "/usr/aarch64-linux-gnu")),
            Arch::Armhf => Some(("qemu-arm-static", "/usr/arm-linux-gnueabihf")),
        }
    }
}

pub use fleet_harness::{packages_dir, workspace_version};

/// Which package.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `harmony-fleet`: updater, bootstrap agent, units, setup.
    Device,
    /// `harmony-fleetctl`: the operator CLI.
    Fleetctl,
}

impl Role {
    pub fn package(self) -> &'static str {
        match self {
            Role::Device => "harmony-fleet",
            Role::Fleetctl => "harmony-fleetctl",
        }
    }
    fn arg(self) -> &'static str {
        match self {
            Role::Device => "device",
            Role::Fleetctl => "fleetctl",
        }
    }
}

/// The .deb `make packages-for-test` built; panics saying so when missing.
pub fn deb(role: Role, arch: Arch) -> PathBuf {
    existing(packages_dir().join(format!(
        "{}_{}_{}.deb",
        role.package(),
        workspace_version(),
        arch.deb()
    )))
}

/// The .rpm `make packages-for-test` built; panics saying so when missing.
pub fn rpm(role: Role, arch: Arch) -> PathBuf {
    existing(packages_dir().join(format!(
        "{}-{}-1.{}.rpm",
        role.package(),
        workspace_version(),
        arch.rpm()
    )))
}

fn existing(p: PathBuf) -> PathBuf {
    if !p.is_file() {
        panic!(
            "missing package {}: run `make packages-for-test` (make test does)",
            p.display()
        );
    }
    p
}

/// Builds a package of `version` from the release binaries the packages
/// were built from, into `out_dir` (an upgrade needs a second version).
pub fn build_package(
    format: &str,
    role: Role,
    arch: Arch,
    version: &str,
    out_dir: &Path,
) -> PathBuf {
    let mut cmd = Command::new(workspace_root().join("scripts/package.sh"));
    cmd.args([format, role.arg(), arch.deb()])
        .env("VERSION", version)
        .env("OUT_DIR", out_dir);
    let out = run(&mut cmd);
    let path = out.lines().last().unwrap_or_default().trim().to_owned();
    existing(PathBuf::from(path))
}

/// One entry of a package's file list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `d`, `-` or `l`.
    pub kind: char,
    /// Permission bits (with setuid/setgid/sticky).
    pub mode: u32,
    pub owner: String,
    pub group: String,
    /// Absolute, without a trailing slash.
    pub path: String,
    /// A symlink's target.
    pub link: Option<String>,
}

/// `dpkg-deb -c`: `drwxr-xr-x root/root 0 2026-11-29 14:39 ./usr/`.
pub fn deb_entries(deb: &Path) -> Vec<Entry> {
    require_tool("dpkg-deb", "dpkg");
    let out = run(Command::new("dpkg-deb").arg("-c").arg(deb));
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 6, "unexpected dpkg-deb -c line {l:?}");
            let (owner, group) = f[1].split_once('/').unwrap_or((f[1], ""));
            let path = f[5].trim_start_matches('.').trim_end_matches('/');
            let link = (f.len() >= 8 && f[6] == "->").then(|| f[7].to_owned());
            Entry {
                kind: f[0].chars().next().unwrap_or('?'),
                mode: parse_mode(f[0]),
                owner: owner.to_owned(),
                group: group.to_owned(),
                path: if path.is_empty() {
                    "/".to_owned()
                } else {
                    path.to_owned()
                },
                link,
            }
        })
        .collect()
}

/// `rpm -qlvp`: `-rwxr-xr-x 1 root root 2394168 Nov 29 14:39 /usr/lib/...`.
pub fn rpm_entries(rpm: &Path) -> Vec<Entry> {
    require_tool("rpm", "rpm");
    let out = run(Command::new("rpm").arg("-qlvp").arg(rpm));
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 9, "unexpected rpm -qlv line {l:?}");
            Entry {
                kind: f[0].chars().next().unwrap_or('?'),
                mode: parse_mode(f[0]),
                owner: f[2].to_owned(),
                group: f[3].to_owned(),
                path: f[8].to_owned(),
                link: (f.len() >= 11 && f[9] == "->").then(|| f[10].to_owned()),
            }
        })
        .collect()
}

/// `rwxr-xr-x`-style permissions (after the type letter) as bits.
pub fn parse_mode(s: &str) -> u32 {
    let p: Vec<char> = s.chars().skip(1).collect();
    assert_eq!(p.len(), 9, "unexpected permissions {s:?}");
    let mut mode = 0;
    for (i, c) in p.iter().enumerate() {
        let bit = 1 << (8 - i);
        match c {
            'r' | 'w' | 'x' => mode |= bit,
            's' if i == 2 => mode |= bit | 0o4000,
            'S' if i == 2 => mode |= 0o4000,
            's' if i == 5 => mode |= bit | 0o2000,
            'S' if i == 5 => mode |= 0o2000,
            't' if i == 8 => mode |= bit | 0o1000,
            'T' if i == 8 => mode |= 0o1000,
            '-' => {}
            other => panic!("unexpected permission letter {other:?} in {s:?}"),
        }
    }
    mode
}

/// One control field of a .deb.
pub fn deb_field(deb: &Path, field: &str) -> String {
    run(Command::new("dpkg-deb").arg("-f").arg(deb).arg(field))
        .trim()
        .to_owned()
}

/// `rpm -qp --queryformat FORMAT`.
pub fn rpm_query(rpm: &Path, format: &str) -> String {
    run(Command::new("rpm")
        .args(["-qp", "--queryformat", format])
        .arg(rpm))
}

/// `rpm -qp FLAG` (`--requires`, `--scripts`, ...).
pub fn rpm_flag(rpm: &Path, flag: &str) -> String {
    run(Command::new("rpm").args(["-qp", flag]).arg(rpm))
}

/// Unpacks the .deb's files into `dir`.
pub fn extract_deb(deb: &Path, dir: &Path) {
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir));
}

/// Runs `cmd` (bounded); panics with its stderr unless it exits 0; stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = run_bounded(cmd, TOOL_TIMEOUT, MAX_OUTPUT).unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    if !out.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}\n{}",
            fleet_common::process::describe_status(out.status),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The man pages `fleetctl` generates (one per command: `fleetctl.1`,
/// `fleetctl-rollout.1`, ...), by file name: what the fleetctl package and
/// `make install` must carry, gzipped, in `man1`.
pub fn fleetctl_man_pages(fleetctl: &Path) -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    run(Command::new(fleetctl)
        .args(["generate", "man"])
        .arg(dir.path()));
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .expect("generated pages")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    assert!(
        pages.iter().any(|p| p == "fleetctl.1") && pages.len() > 10,
        "fleetctl generate man wrote {pages:?}"
    );
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_with_special_bits() {
        assert_eq!(parse_mode("-rwxr-xr-x"), 0o755);
        assert_eq!(parse_mode("-rw-r-----"), 0o640);
        assert_eq!(parse_mode("drwxrwx--t"), 0o1771);
        assert_eq!(parse_mode("-rwsr-xr-x"), 0o4755);
        assert_eq!(parse_mode("drwxr-sr-T"), 0o3754);
    }

    #[test]
    fn the_workspace_version_is_found() {
        let v = workspace_version();
        assert!(v.chars().next().is_some_and(|c| c.is_ascii_digit()), "{v}");
    }
}
