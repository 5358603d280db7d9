//! The host side of setup: the units, sysusers.d and tmpfiles.d files
//! (steps 2 and 3), the agent user's subordinate ids (step 4), its drop-ins
//! (step 7), the systemd version, and the bounded runs of `systemctl` and
//! the other tools.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_common::durable::{self};
use fleet_common::layout::{AGENT_GROUP, AGENT_UNIT, AGENT_USER, UPDATER_UNIT};
use fleet_common::process::run_bounded;
use fleet_common::Layout;

use super::error::{SetupError, CONF_NAME};

/// Drop-in naming the agent user's manager.
pub(super) const PODMAN_DROPIN: &str = "50-rootless-podman.conf";
/// Drop-in with restart backoff (systemd 254+).
pub(super) const BACKOFF_DROPIN: &str = "60-restart-backoff.conf";
/// The first systemd with `RestartSteps=` and `RestartMaxDelaySec=`.
pub(super) const FIRST_SYSTEMD_WITH_BACKOFF: u32 = 254;
/// Subordinate ids given to the agent user, above every range in use.
pub(super) const SUBID_COUNT: u64 = 65_536;
pub(super) const SUBID_FLOOR: u64 = 100_000;
/// sysusers, tmpfiles, daemon-reload, enable, loginctl: local and quick.
pub(super) const TOOL_TIMEOUT: Duration = Duration::from_secs(60);
/// Output kept from one tool call.
pub(super) const MAX_TOOL_OUTPUT: usize = 64 * 1024;

/// How setup reaches systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Host {
    /// Root `/` with systemd running: every step, systemd included.
    Live,
    /// A root prefix, or no systemd: files only.
    Offline,
}

/// Copies `DIR/systemd/*.service`, `DIR/sysusers.d/harmony-fleet.conf` and
/// `DIR/tmpfiles.d/harmony-fleet.conf` into the root's `/etc`.
pub(super) fn install_units_from(dir: &Path, layout: &Layout) -> Result<(), SetupError> {
    let etc = layout.root().join("etc");
    let mut files = vec![
        (
            dir.join("sysusers.d").join(CONF_NAME),
            etc.join("sysusers.d").join(CONF_NAME),
        ),
        (
            dir.join("tmpfiles.d").join(CONF_NAME),
            etc.join("tmpfiles.d").join(CONF_NAME),
        ),
    ];
    for unit in [AGENT_UNIT, UPDATER_UNIT] {
        files.push((dir.join("systemd").join(unit), layout.unit_dir().join(unit)));
    }
    for (from, to) in files {
        let bytes = std::fs::read(&from).map_err(|source| SetupError::Copy {
            from: from.clone(),
            to: to.clone(),
            source,
        })?;
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|source| SetupError::Copy {
                from: from.clone(),
                to: to.clone(),
                source,
            })?;
        }
        durable::write_atomic(&to, &bytes, 0o644)?;
    }
    Ok(())
}

/// `systemd-sysusers` and `systemd-tmpfiles --create` for our conf (looked
/// up in the root's sysusers.d/tmpfiles.d directories). Under a root
/// prefix, skipped when the root has no such file.
pub(super) fn sysusers_and_tmpfiles(
    layout: &Layout,
    host: Host,
) -> Result<Option<String>, SetupError> {
    let found = |kind: &str| {
        ["etc", "run", "usr/lib"]
            .iter()
            .any(|d| layout.root().join(d).join(kind).join(CONF_NAME).is_file())
    };
    if host == Host::Offline && !(found("sysusers.d") && found("tmpfiles.d")) {
        return Ok(None);
    }
    let root_arg = format!("--root={}", layout.root().display());
    let mut sysusers = vec![CONF_NAME];
    let mut tmpfiles = vec!["--create", CONF_NAME];
    if layout.root() != Path::new("/") {
        sysusers.insert(0, &root_arg);
        tmpfiles.insert(0, &root_arg);
    }
    tool("systemd-sysusers", &sysusers)?;
    tool("systemd-tmpfiles", &tmpfiles)?;
    Ok(Some(format!(
        "users ({AGENT_USER}, groups {AGENT_GROUP}, fleet-control) and directories"
    )))
}

/// Whether both units are installed under the layout's root.
pub(super) fn units_present(layout: &Layout) -> bool {
    [AGENT_UNIT, UPDATER_UNIT].iter().all(|unit| {
        [
            "etc/systemd/system",
            "usr/lib/systemd/system",
            "lib/systemd/system",
        ]
        .iter()
        .any(|d| layout.root().join(d).join(unit).is_file())
    })
}

/// `name`'s uid and gid in the root's `/etc/passwd`.
pub(super) fn lookup_user(layout: &Layout, name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string(layout.root().join("etc/passwd")).ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// `name`'s gid in the root's `/etc/group`.
pub(super) fn lookup_group(layout: &Layout, name: &str) -> Option<u32> {
    let group = std::fs::read_to_string(layout.root().join("etc/group")).ok()?;
    group.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok())?
    })
}

/// Adds `user:<start>:65536` to the subid `file` unless `user` (by name or
/// uid) has a range; `start` is above every range of the file. Returns what
/// it did.
pub(super) fn ensure_subids(
    file: &Path,
    user: &str,
    uid: u32,
) -> Result<Option<String>, SetupError> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(SetupError::SubIds {
                path: file.to_owned(),
                why: e.to_string(),
            })
        }
    };
    let (has, next) = subid_plan(&text, user, uid);
    if has {
        return Ok(None);
    }
    let mut new = text.clone();
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&format!("{user}:{next}:{SUBID_COUNT}\n"));
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).map_err(|e| SetupError::SubIds {
            path: file.to_owned(),
            why: e.to_string(),
        })?;
    }
    durable::write_atomic(file, new.as_bytes(), 0o644)?;
    Ok(Some(format!(
        "{user} got subordinate ids {next}-{} in {}",
        next + SUBID_COUNT - 1,
        file.display()
    )))
}

/// Whether `user` has a range in `text`, and the first id above every
/// range (at least 100000).
pub(super) fn subid_plan(text: &str, user: &str, uid: u32) -> (bool, u64) {
    let uid = uid.to_string();
    let mut has = false;
    let mut next = SUBID_FLOOR;
    for line in text.lines() {
        let f: Vec<&str> = line.trim().split(':').collect();
        if f.len() != 3 {
            continue;
        }
        if f[0] == user || f[0] == uid {
            has = true;
        }
        if let (Ok(start), Ok(count)) = (f[1].parse::<u64>(), f[2].parse::<u64>()) {
            next = next.max(start.saturating_add(count));
        }
    }
    (has, next)
}

/// The agent's drop-ins (step 7).
pub(super) fn write_dropins(
    layout: &Layout,
    uid: u32,
    systemd: Option<u32>,
) -> Result<(), SetupError> {
    let dir = layout.unit_dir().join(format!("{AGENT_UNIT}.d"));
    std::fs::create_dir_all(&dir).map_err(|source| SetupError::Copy {
        from: PathBuf::from("(drop-in)"),
        to: dir.clone(),
        source,
    })?;
    durable::write_atomic(
        &dir.join(PODMAN_DROPIN),
        podman_dropin(uid).as_bytes(),
        0o644,
    )?;
    let backoff = dir.join(BACKOFF_DROPIN);
    match systemd {
        Some(v) if v >= FIRST_SYSTEMD_WITH_BACKOFF => {
            durable::write_atomic(&backoff, backoff_dropin(v).as_bytes(), 0o644)?;
        }
        _ => match std::fs::remove_file(&backoff) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SetupError::Copy {
                    from: PathBuf::from("(drop-in)"),
                    to: backoff,
                    source,
                })
            }
        },
    }
    Ok(())
}

pub(super) fn podman_dropin(uid: u32) -> String {
    format!(
        "# Written by fleet-updater setup: the lingering user manager of {AGENT_USER}\n\
         # (uid {uid}) holds rootless Podman's containers, so they outlive {AGENT_UNIT}.\n\
         [Unit]\n\
         Wants=user@{uid}.service\n\
         After=user@{uid}.service\n\
         \n\
         [Service]\n\
         Environment=XDG_RUNTIME_DIR=/run/user/{uid}\n"
    )
}

pub(super) fn backoff_dropin(systemd: u32) -> String {
    format!(
        "# Written by fleet-updater setup (systemd {systemd}): back off a failing agent,\n\
         # 5 s doubling up to 5 min.\n\
         [Service]\n\
         RestartSteps=6\n\
         RestartMaxDelaySec=5min\n"
    )
}

/// The major version `systemctl --version` reports.
pub(super) fn systemd_version() -> Option<u32> {
    let mut cmd = Command::new("systemctl");
    cmd.arg("--version");
    let out = run_bounded(&mut cmd, TOOL_TIMEOUT, MAX_TOOL_OUTPUT).ok()?;
    parse_systemd_version(&String::from_utf8_lossy(&out.stdout))
}

pub(super) fn parse_systemd_version(text: &str) -> Option<u32> {
    text.lines()
        .next()?
        .strip_prefix("systemd ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub(super) fn systemctl(args: &[&str]) -> Result<(), SetupError> {
    tool("systemctl", args)
}

pub(super) fn systemctl_bounded(args: &[&str], bound: Duration) -> Result<(), String> {
    let mut cmd = Command::new("systemctl");
    cmd.args(args);
    let out = run_bounded(&mut cmd, bound, MAX_TOOL_OUTPUT).map_err(|e| e.to_string())?;
    if out.success() {
        Ok(())
    } else {
        Err(out.diagnostic())
    }
}

/// Runs `program args`, bounded; its stderr is the error.
pub(super) fn tool(program: &str, args: &[&str]) -> Result<(), SetupError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let what = format!("{program} {}", args.join(" "));
    let out =
        run_bounded(&mut cmd, TOOL_TIMEOUT, MAX_TOOL_OUTPUT).map_err(|e| SetupError::Tool {
            what: what.clone(),
            message: e.to_string(),
        })?;
    if out.success() {
        Ok(())
    } else {
        Err(SetupError::Tool {
            what,
            message: out.diagnostic(),
        })
    }
}
