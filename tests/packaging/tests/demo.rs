//! `make demo`'s Podman settings (scripts/demo-containers.conf): Podman
//! says nothing on stderr with them, also where Debian's podman left its
//! CNI config whose plugins are not installed (it warned about
//! /etc/cni/net.d/87-podman-bridge.conflist on every call before).

use std::process::Command;

use fleet_harness::{require_tool, workspace_root};
use fleet_packaging_tests::TOOL_TIMEOUT;

#[test]
fn demo_podman_prints_no_warning() {
    let podman = require_tool("podman", "podman");
    let work = tempfile::tempdir().expect("tempdir");
    let conf = workspace_root().join("scripts/demo-containers.conf");
    assert!(conf.is_file(), "missing {}", conf.display());
    let mut cmd = Command::new(podman);
    cmd.env("CONTAINERS_CONF", &conf)
        .arg("--root")
        .arg(work.path().join("root"))
        .arg("--runroot")
        .arg(work.path().join("run"))
        .arg("--tmpdir")
        .arg(work.path().join("tmp"))
        .args([
            "info",
            "--format",
            "{{.Host.NetworkBackend}} {{.Host.OCIRuntime.Name}}",
        ]);
    let out = fleet_common::process::run_bounded(&mut cmd, TOOL_TIMEOUT, 1024 * 1024)
        .unwrap_or_else(|e| panic!("podman info: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.success(), "podman info failed: {stderr}");
    assert_eq!(stderr.trim(), "", "podman warned with the demo's settings");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "netavark runc");
}
