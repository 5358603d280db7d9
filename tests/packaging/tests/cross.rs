//! The shipped binaries of every architecture run: each package's updater
//! and bootstrap agent print their version, the ARM ones under qemu-user:
//! arm64's static musl builds with no sysroot at all, armhf's glibc ones
//! with Debian's cross sysroot (its glibc and loader).

use std::process::Command;

use fleet_harness::require_tool;
use fleet_packaging_tests::{deb, extract_deb, run, workspace_version, Arch, Role};

#[test]
fn every_architectures_binaries_print_their_version() {
    for arch in Arch::all() {
        let dir = tempfile::tempdir().expect("tempdir");
        extract_deb(&deb(Role::Device, arch), dir.path());
        for (bin, name) in [
            ("usr/lib/harmony-fleet/fleet-updater", "fleet-updater"),
            ("usr/lib/harmony-fleet/bootstrap/fleet-agent", "fleet-agent"),
        ] {
            let path = dir.path().join(bin);
            let mut cmd = match arch.emulator() {
                None => Command::new(&path),
                Some((qemu, sysroot)) => {
                    let mut c = Command::new(require_tool(qemu, "qemu-user-static"));
                    // Static daemons need no sysroot: run them without one.
                    if !arch.static_daemons() {
                        c.arg("-L").arg(sysroot);
                    }
                    c.arg(&path);
                    c
                }
            };
            cmd.arg("--version");
            let out = run(&mut cmd);
            assert_eq!(
                out.trim(),
                format!("{name} {}", workspace_version()),
                "{arch:?} {bin}"
            );
        }
    }
}
