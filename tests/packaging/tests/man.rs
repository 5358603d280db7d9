//! The man pages say what `--help` says: each page the packages ship,
//! rendered by man(1), against the shipped binary's own output, section by
//! section as `scripts/man.sh sections PAGE` lists them. fleet-auth-callout
//! is in no package: its page (target/man) is checked against the debug
//! binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use fleet_harness::{bin_path, require_tool, workspace_root};
use fleet_packaging_tests::{deb, extract_deb, packages_dir, run, Arch, Role};

/// `man -l PAGE` as text: section title → its lines, the 7-space indent of
/// man's layout removed.
fn render(page: &Path) -> BTreeMap<String, String> {
    let man = require_tool("man", "man-db");
    let out = run(Command::new(man)
        .arg("-l")
        .arg(page)
        .env("MANWIDTH", "400")
        .env("LC_ALL", "C.UTF-8")
        .env("MAN_DISABLE_SECCOMP", "1")
        .env_remove("MAN_KEEP_FORMATTING")
        .env_remove("MANPAGER")
        .env_remove("PAGER"));
    let lines: Vec<&str> = out.lines().collect();
    // The first and last lines are man's header and footer.
    let body = &lines[1..lines.len().saturating_sub(1)];
    let mut sections = BTreeMap::new();
    let mut title: Option<String> = None;
    let mut text = String::new();
    for line in body {
        if !line.is_empty() && !line.starts_with(' ') {
            if let Some(t) = title.take() {
                sections.insert(t, normalize(&text));
            }
            title = Some(line.trim().to_owned());
            text.clear();
        } else {
            text.push_str(line.strip_prefix("       ").unwrap_or(line));
            text.push('\n');
        }
    }
    if let Some(t) = title {
        sections.insert(t, normalize(&text));
    }
    sections
}

/// Without trailing blanks on each line and blank lines around.
fn normalize(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    lines.join("\n").trim_matches('\n').to_owned()
}

/// `scripts/man.sh sections PAGE`: (title, the binary's arguments).
fn sections(page: &str) -> Vec<(String, Vec<String>)> {
    let out = run(Command::new(workspace_root().join("scripts/man.sh")).args(["sections", page]));
    out.lines()
        .map(|l| {
            let (title, args) = l.split_once('\t').expect("TITLE<TAB>ARGS");
            (
                title.to_owned(),
                args.split_whitespace().map(str::to_owned).collect(),
            )
        })
        .collect()
}

/// Checks `page` (the man page of `name`) against `binary`'s help.
fn check(name: &str, page: &Path, binary: &Path) {
    let rendered = render(page);
    let what = page.display();
    let sections = sections(name);
    assert!(!sections.is_empty(), "man.sh lists no section of {name}");
    for (title, args) in &sections {
        let help = normalize(&run(Command::new(binary).args(args)));
        let got = rendered
            .get(title)
            .unwrap_or_else(|| panic!("{what}: no section {title:?}; it has {rendered:?}"));
        assert_eq!(
            got,
            &help,
            "{what}: section {title} differs from `{name} {}` (regenerate: make man)",
            args.join(" ")
        );
    }
    let name_line = rendered.get("NAME").expect("a NAME section");
    assert!(
        name_line.starts_with(&format!("{name} - ")),
        "{what}: NAME is {name_line:?}"
    );
}

/// A file of an extracted package.
fn file(root: &Path, path: &str) -> PathBuf {
    let p = root.join(path.trim_start_matches('/'));
    assert!(p.is_file(), "the package has no {path}");
    p
}

#[test]
fn shipped_man_pages_say_what_the_shipped_binaries_help_says() {
    let device = tempfile::tempdir().expect("tempdir");
    extract_deb(&deb(Role::Device, Arch::Amd64), device.path());
    check(
        "fleet-agent",
        &file(device.path(), "/usr/share/man/man8/fleet-agent.8.gz"),
        &file(
            device.path(),
            "/usr/lib/harmony-fleet/bootstrap/fleet-agent",
        ),
    );
    check(
        "fleet-updater",
        &file(device.path(), "/usr/share/man/man8/fleet-updater.8.gz"),
        &file(device.path(), "/usr/lib/harmony-fleet/fleet-updater"),
    );
    let fleetctl = tempfile::tempdir().expect("tempdir");
    extract_deb(&deb(Role::Fleetctl, Arch::Amd64), fleetctl.path());
    check(
        "fleetctl",
        &file(fleetctl.path(), "/usr/share/man/man1/fleetctl.1.gz"),
        &file(fleetctl.path(), "/usr/bin/fleetctl"),
    );
    // The ARM packages carry the same pages (help is the same everywhere).
    for arch in [Arch::Arm64, Arch::Armhf] {
        let other = tempfile::tempdir().expect("tempdir");
        extract_deb(&deb(Role::Device, arch), other.path());
        for page in ["fleet-agent.8.gz", "fleet-updater.8.gz"] {
            let path = format!("/usr/share/man/man8/{page}");
            assert_eq!(
                std::fs::read(file(other.path(), &path)).expect("read"),
                std::fs::read(file(device.path(), &path)).expect("read"),
                "{arch:?}: {page} differs from amd64's"
            );
        }
    }
}

#[test]
fn the_auth_callout_man_page_says_what_its_help_says() {
    let target = packages_dir()
        .parent()
        .expect("target/packages has a parent")
        .to_path_buf();
    let page = target.join("man/fleet-auth-callout.8");
    assert!(page.is_file(), "missing {}: run `make man`", page.display());
    check("fleet-auth-callout", &page, &bin_path("fleet-auth-callout"));
}

/// The comparison is not vacuous: a page whose text differs from the help
/// is caught.
#[test]
fn a_page_that_drifted_from_help_is_caught() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("man");
    std::fs::create_dir(&out).expect("mkdir");
    // A "binary" whose --help says something else than the real one.
    let fake = dir.path().join("fleet-updater");
    std::fs::write(
        &fake,
        "#!/bin/sh\ncase $1 in --version) echo fleet-updater 0.0.1 ;; *) echo 'fleet-updater: an older text' ;; esac\n",
    )
    .expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for name in ["fleet-agent", "fleetctl", "fleet-auth-callout"] {
        std::os::unix::fs::symlink(bin_path(name), dir.path().join(name)).expect("symlink");
    }
    run(Command::new(workspace_root().join("scripts/man.sh"))
        .arg(&out)
        .arg(dir.path()));
    let drifted = std::panic::catch_unwind(|| {
        check(
            "fleet-updater",
            &out.join("fleet-updater.8"),
            &bin_path("fleet-updater"),
        )
    });
    assert!(drifted.is_err(), "a drifted page passed the comparison");
    // And the generator reproduces the fake's help exactly.
    check("fleet-updater", &out.join("fleet-updater.8"), &fake);
}
