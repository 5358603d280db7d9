//! `make install` honours DESTDIR and PREFIX (PREFIX moves only fleetctl:
//! the device paths are fixed) and `make uninstall` takes back exactly what
//! it installed.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use fleet_harness::{bin_path, workspace_root};
use fleet_packaging_tests::{fleetctl_man_pages, run};

fn make(args: &[&str]) -> String {
    let mut cmd = Command::new("make");
    cmd.arg("-s")
        .arg("-C")
        .arg(workspace_root())
        .args(args)
        // Not the jobserver of a `make test` this runs under.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL");
    run(&mut cmd)
}

/// Every file under `root` (relative, sorted) with its mode.
fn files(root: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir").flatten() {
            let m = e.metadata().expect("metadata");
            if m.is_dir() {
                stack.push(e.path());
            } else {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .expect("under root")
                    .to_string_lossy()
                    .into_owned();
                out.push((format!("/{rel}"), m.permissions().mode() & 0o7777));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn install_honours_destdir_and_prefix_and_uninstall_takes_it_back() {
    let stage = tempfile::tempdir().expect("tempdir");
    let destdir = stage.path().join("root");
    let destdir_arg = format!("DESTDIR={}", destdir.display());
    make(&["install-files", &destdir_arg, "PREFIX=/opt/fleet"]);
    let mut want: Vec<(String, u32)> = [
        ("/opt/fleet/bin/fleetctl", 0o755),
        ("/opt/fleet/share/doc/harmony-fleetctl/copyright", 0o644),
        (
            "/opt/fleet/share/bash-completion/completions/fleetctl",
            0o644,
        ),
        (
            "/opt/fleet/share/harmony-fleet/prometheus/harmony-fleet.rules.yml",
            0o644,
        ),
        (
            "/opt/fleet/share/harmony-fleet/prometheus/harmony-fleet.dashboard.json",
            0o644,
        ),
        ("/usr/share/man/man8/fleet-agent.8.gz", 0o644),
        ("/usr/share/man/man8/fleet-updater.8.gz", 0o644),
        ("/usr/lib/harmony-fleet/fleet-updater", 0o755),
        ("/usr/lib/sysusers.d/harmony-fleet.conf", 0o644),
        ("/usr/lib/systemd/system/fleet-agent.service", 0o644),
        ("/usr/lib/systemd/system/fleet-updater.service", 0o644),
        ("/usr/lib/tmpfiles.d/harmony-fleet.conf", 0o644),
        ("/usr/share/doc/harmony-fleet/README.md", 0o644),
        ("/usr/share/doc/harmony-fleet/REPAIR.md", 0o644),
        ("/usr/share/doc/harmony-fleet/copyright", 0o644),
        ("/usr/lib/harmony-fleet/bootstrap/fleet-agent", 0o755),
        ("/usr/sbin/fleet-updater", 0o777),
    ]
    .iter()
    .map(|(p, m)| ((*p).to_owned(), *m))
    .collect();
    // fleetctl's man pages, one per command.
    for page in fleetctl_man_pages(&bin_path("fleetctl")) {
        want.push((format!("/opt/fleet/share/man/man1/{page}.gz"), 0o644));
    }
    want.sort();
    assert_eq!(files(&destdir), want);

    // Something of the device's own in the same tree stays.
    let state = destdir.join("usr/lib/harmony-fleet/fleet-agent-v0.0.1");
    std::fs::write(&state, b"installed by the updater").expect("write");
    make(&["uninstall", &destdir_arg, "PREFIX=/opt/fleet"]);
    assert_eq!(
        files(&destdir),
        vec![(
            "/usr/lib/harmony-fleet/fleet-agent-v0.0.1".to_owned(),
            0o644
        )]
    );
}
