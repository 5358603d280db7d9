//! What `make packages-for-test` built for the tests: the device packages.
//! Tests never build these themselves; a missing one panics with the make
//! target that builds it.
//!
//! What runs under systemd and qemu is what ships: the packages' daemons
//! (static musl on amd64 and arm64, glibc on armhf), and beside them only
//! the `make test-agents` builds ([`crate::test_agent_path`],
//! [`crate::test_updater_path`]), built for the same target with the same
//! release profile (another version string, or fault injection).

use std::path::PathBuf;

use crate::workspace_root;

/// The workspace version (`[workspace.package] version`): the packages'
/// and the agents' own.
pub fn workspace_version() -> String {
    let text = std::fs::read_to_string(workspace_root().join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("cannot read the workspace Cargo.toml: {e}"));
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
            continue;
        }
        if let Some(v) = in_section
            .then(|| line.strip_prefix("version"))
            .flatten()
            .and_then(|rest| rest.trim().strip_prefix('='))
        {
            return v.trim().trim_matches('"').to_owned();
        }
    }
    panic!("no version in [workspace.package] of the workspace Cargo.toml");
}

/// The cargo target dir (`$CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                workspace_root().join(t)
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// `<target>/packages`, where `make deb` and `make rpm` put packages.
pub fn packages_dir() -> PathBuf {
    target_dir().join("packages")
}

/// The amd64 device package of this build (`harmony-fleet_<v>_amd64.deb`).
pub fn device_deb() -> PathBuf {
    let p = packages_dir().join(format!("harmony-fleet_{}_amd64.deb", workspace_version()));
    if !p.is_file() {
        panic!(
            "missing package {}: run `make packages-for-test` (make test does)",
            p.display()
        );
    }
    p
}
