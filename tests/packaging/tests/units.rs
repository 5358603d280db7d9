//! The units, sysusers and tmpfiles files pass systemd's own checks on the
//! host (systemd 252, Debian 12's): `systemd-analyze verify` in a temp root
//! holding systemd's units, ours, the drop-in device setup writes, and
//! executables at every ExecStart path; `systemd-sysusers` and
//! `systemd-tmpfiles` in temp roots, which must create exactly the users,
//! groups, directories and modes of `docs/design/architecture.md` "Paths on
//! a device".

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use fleet_common::process::run_bounded;
use fleet_harness::{require_tool, workspace_root};
use fleet_packaging_tests::TOOL_TIMEOUT;

fn copy_dir(from: &Path, to: &Path) {
    fleet_packaging_tests::run(
        Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", from.display()))
            .arg(to),
    );
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn units_pass_systemd_analyze_verify_without_a_word() {
    let analyze = require_tool("systemd-analyze", "systemd");
    let root = tempfile::tempdir().expect("tempdir");
    let units = root.path().join("usr/lib/systemd/system");
    std::fs::create_dir_all(&units).expect("mkdir");
    // systemd's own units (sysinit.target and friends) as the host has them.
    let host_units = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("sysinit.target").exists())
        .expect("the host's systemd units (package systemd)");
    copy_dir(host_units, &units);
    for unit in ["fleet-agent.service", "fleet-updater.service"] {
        std::fs::copy(
            workspace_root().join("packaging/systemd").join(unit),
            units.join(unit),
        )
        .expect("copy unit");
    }
    // The drop-in device setup writes (uid 995 as an example).
    write(
        &root.path().join("etc/systemd/system/fleet-agent.service.d/50-rootless-podman.conf"),
        "[Unit]\nWants=user@995.service\nAfter=user@995.service\n[Service]\nEnvironment=XDG_RUNTIME_DIR=/run/user/995\n",
        0o644,
    );
    for exe in [
        "usr/local/bin/fleet-agent",
        "usr/lib/harmony-fleet/fleet-updater",
    ] {
        write(&root.path().join(exe), "#!/bin/sh\n", 0o755);
    }
    let mut cmd = Command::new(analyze);
    cmd.arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .args(["fleet-agent.service", "fleet-updater.service"]);
    let out = run_bounded(&mut cmd, TOOL_TIMEOUT, 1 << 20).expect("systemd-analyze");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    // And it does complain about a broken unit (the check is not vacuous).
    std::fs::remove_file(root.path().join("usr/local/bin/fleet-agent")).expect("rm");
    let out = run_bounded(&mut cmd, TOOL_TIMEOUT, 1 << 20).expect("systemd-analyze");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("/usr/local/bin/fleet-agent"), "{said}");
}

#[test]
fn sysusers_and_tmpfiles_create_the_design_layout() {
    let sysusers = require_tool("systemd-sysusers", "systemd");
    let tmpfiles = require_tool("systemd-tmpfiles", "systemd");
    let root = tempfile::tempdir().expect("tempdir");
    let etc = root.path().join("etc");
    std::fs::create_dir_all(&etc).expect("mkdir");
    for f in ["passwd", "group", "shadow", "gshadow"] {
        // A minimal base system: root only.
        let line = match f {
            "passwd" => "root:x:0:0:root:/root:/bin/sh\n",
            "group" => "root:x:0:\n",
            "shadow" => "root:*:19000:0:99999:7:::\n",
            _ => "root:*::\n",
        };
        write(&etc.join(f), line, 0o644);
    }
    let conf = workspace_root().join("packaging/sysusers.d/harmony-fleet.conf");
    fleet_packaging_tests::run(
        Command::new(sysusers)
            .arg(format!("--root={}", root.path().display()))
            .arg(&conf),
    );
    let passwd = std::fs::read_to_string(etc.join("passwd")).expect("passwd");
    let group = std::fs::read_to_string(etc.join("group")).expect("group");
    let agent: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("fleet-agent:"))
        .expect("user fleet-agent")
        .split(':')
        .collect();
    assert_eq!(agent[5], "/var/lib/harmony-fleet/agent", "home");
    assert_eq!(agent[6], "/usr/sbin/nologin", "shell");
    let gid_of = |name: &str| {
        group
            .lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("group {name} missing:\n{group}"))
            .split(':')
            .nth(2)
            .expect("gid")
            .parse::<u32>()
            .expect("numeric gid")
    };
    assert_eq!(agent[3].parse::<u32>().expect("gid"), gid_of("fleet-agent"));
    let control = gid_of("fleet-control");
    let uid: u32 = agent[2].parse().expect("uid");
    assert!(uid < 1000 && uid > 0, "a system uid: {uid}");

    // tmpfiles resolves the names through the root's passwd and group.
    let conf = workspace_root().join("packaging/tmpfiles.d/harmony-fleet.conf");
    fleet_packaging_tests::run(
        Command::new(tmpfiles)
            .arg("--create")
            .arg(format!("--root={}", root.path().display()))
            .arg(&conf),
    );
    let agent_gid = gid_of("fleet-agent");
    for (path, mode, owner, grp) in [
        ("var/lib/harmony-fleet", 0o755, 0, 0),
        ("var/lib/harmony-fleet/updater", 0o700, 0, 0),
        ("var/lib/harmony-fleet/agent", 0o750, uid, agent_gid),
        ("usr/lib/harmony-fleet", 0o755, 0, 0),
        ("etc/harmony-fleet", 0o750, 0, agent_gid),
        ("run/harmony-fleet", 0o1771, 0, agent_gid),
        ("var/lib/systemd/linger/fleet-agent", 0o644, 0, 0),
    ] {
        let m = std::fs::metadata(root.path().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(
            (m.mode() & 0o7777, m.uid(), m.gid()),
            (mode, owner, grp),
            "{path} (fleet-control is {control})"
        );
    }
}
