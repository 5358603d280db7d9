//! lintian and rpmlint on every package `make packages-for-test` builds
//! (both packages of amd64, the device packages of arm64 and armhf): any
//! error or warning fails, except those overridden with a reason each —
//! lintian's overrides shipped in the .deb
//! (`packaging/deb/<package>.lintian-overrides`, as Debian does it),
//! rpmlint's filters in `packaging/rpm/rpmlint.toml`. An override nothing
//! matches fails too, so the lists stay true.

use std::path::{Path, PathBuf};
use std::process::Command;

use fleet_common::process::run_bounded;
use fleet_harness::{require_tool, workspace_root};
use fleet_packaging_tests::{deb, rpm, Arch, Role, TOOL_TIMEOUT};

fn packages(find: fn(Role, Arch) -> PathBuf) -> Vec<PathBuf> {
    let mut all = vec![find(Role::Fleetctl, Arch::Amd64)];
    all.extend(Arch::all().into_iter().map(|a| find(Role::Device, a)));
    all
}

/// Runs a linter: whether it exited 0, and its stdout and stderr.
fn lint(cmd: &mut Command) -> (bool, String) {
    let out =
        run_bounded(cmd, TOOL_TIMEOUT, 4 * 1024 * 1024).unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        out.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn lintian(deb: &Path) -> (bool, String) {
    let lintian = require_tool("lintian", "lintian");
    // -I: also the informational tags, for unused-override. It exits
    // non-zero on an error or warning left (or when it could not run).
    lint(
        Command::new(lintian)
            .args([
                "-I",
                "--tag-display-limit",
                "0",
                "--fail-on",
                "error,warning",
            ])
            .arg(deb)
            .env("LC_ALL", "C.UTF-8"),
    )
}

#[test]
fn lintian_finds_nothing_but_the_overrides() {
    let mut failures = Vec::new();
    for deb in packages(deb) {
        let (ok, out) = lintian(&deb);
        let mut bad: Vec<&str> = out
            .lines()
            .filter(|l| {
                l.starts_with("E: ")
                    || l.starts_with("W: ")
                    || l.contains(" unused-override ")
                    || l.contains(" mismatched-override ")
            })
            .collect();
        if !ok && bad.is_empty() {
            bad.push(&out);
        }
        if !bad.is_empty() {
            failures.push(format!("{}:\n{}", deb.display(), bad.join("\n")));
        }
    }
    assert!(
        failures.is_empty(),
        "lintian: fix these (or override one with a reason in packaging/deb/<package>.lintian-overrides):\n{}",
        failures.join("\n")
    );
}

/// Every override line has its reason: a `#` comment right above it.
#[test]
fn every_lintian_override_says_why() {
    let dir = workspace_root().join("packaging/deb");
    for e in std::fs::read_dir(&dir).expect("packaging/deb").flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "lintian-overrides") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read overrides");
        let mut previous = "";
        for line in text.lines() {
            if !line.trim().is_empty() && !line.starts_with('#') {
                assert!(
                    previous.starts_with("# ") && previous.len() > 10,
                    "{}: override {line:?} has no reason (a # line above it)",
                    path.display()
                );
            }
            previous = line;
        }
    }
}

#[test]
fn rpmlint_finds_nothing_but_the_filters() {
    let rpmlint = require_tool("rpmlint", "rpmlint");
    let config = workspace_root().join("packaging/rpm/rpmlint.toml");
    let mut failures = Vec::new();
    for rpm in packages(rpm) {
        let (_, out) = lint(
            Command::new(&rpmlint)
                .arg("--config")
                .arg(&config)
                .arg(&rpm)
                .env("LC_ALL", "C.UTF-8"),
        );
        assert!(
            out.contains("1 packages and 0 specfiles checked"),
            "{}: rpmlint did not check it:\n{out}",
            rpm.display()
        );
        let bad: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(": E: ") || l.contains(": W: "))
            .collect();
        if !bad.is_empty() {
            failures.push(format!("{}:\n{}", rpm.display(), bad.join("\n")));
        }
    }
    assert!(
        failures.is_empty(),
        "rpmlint: fix these (or filter one with a reason in packaging/rpm/rpmlint.toml):\n{}",
        failures.join("\n")
    );
}

/// Without the filters, rpmlint does find `no-signature`: the test above
/// reads real findings, and the filter file is what keeps it quiet.
#[test]
fn rpmlint_without_the_filters_reports_the_unsigned_package() {
    let rpmlint = require_tool("rpmlint", "rpmlint");
    let (_, out) = lint(
        Command::new(rpmlint)
            .arg(rpm(Role::Device, Arch::Amd64))
            .env("LC_ALL", "C.UTF-8"),
    );
    assert!(out.contains("E: no-signature"), "{out}");
}
