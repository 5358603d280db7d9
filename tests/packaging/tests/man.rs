//! The man pages say what `--help` says: each daemon page the packages
//! ship, rendered by man(1), against the shipped binary's own output,
//! section by section as `scripts/man.sh sections PAGE` lists them.
//! fleet-auth-callout is in no package: its page (target/man) is checked
//! against the debug binary. fleetctl's pages (one per command) are what
//! the shipped fleetctl generates from its clap definition, and each names
//! every option its command's `--help` lists.

use std::collections::{BTreeMap, BTreeSet};
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

/// The long options a `--help` lists (`--name`, at a line's start or after
/// `-x, `).
fn help_options(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.split_once(", ").map_or(l, |(short, rest)| {
                if short.len() == 2 && short.starts_with('-') {
                    rest
                } else {
                    l
                }
            });
            l.strip_prefix("--")
                .and_then(|rest| rest.split([' ', '<']).next())
                .map(|name| format!("--{name}"))
        })
        .collect()
}

#[test]
fn fleetctls_shipped_pages_are_what_it_generates_and_name_every_option() {
    let dir = tempfile::tempdir().expect("tempdir");
    extract_deb(&deb(Role::Fleetctl, Arch::Amd64), dir.path());
    let fleetctl = file(dir.path(), "/usr/bin/fleetctl");
    let man1 = dir.path().join("usr/share/man/man1");
    let mut shipped = BTreeMap::new();
    for e in std::fs::read_dir(&man1).expect("man1").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let page = name.strip_suffix(".gz").expect("gzipped pages").to_owned();
        let text = run(Command::new("gzip").arg("-dc").arg(e.path()));
        shipped.insert(page, text);
    }
    // The date the shipped pages carry (.TH NAME 1 DATE ...).
    let top = shipped
        .get("fleetctl.1")
        .expect("the package has fleetctl.1");
    let date = top
        .lines()
        .find_map(|l| l.strip_prefix(".TH "))
        .and_then(|th| th.split_whitespace().nth(2))
        .expect(".TH line with a date")
        .to_owned();
    let generated = tempfile::tempdir().expect("tempdir");
    run(Command::new(&fleetctl)
        .args(["generate", "man"])
        .arg(generated.path())
        .args(["--date", &date]));
    let mut fresh = BTreeMap::new();
    for e in std::fs::read_dir(generated.path()).expect("dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        fresh.insert(name, std::fs::read_to_string(e.path()).expect("read"));
    }
    assert_eq!(
        shipped.keys().collect::<Vec<_>>(),
        fresh.keys().collect::<Vec<_>>(),
        "the package's pages against `fleetctl generate man`"
    );
    for (page, text) in &shipped {
        assert_eq!(
            text, &fresh[page],
            "{page} differs from what the shipped fleetctl generates (regenerate: make man)"
        );
    }
    // Every command has its page, and the page names every option of the
    // command's --help.
    let commands = [
        &[][..],
        &["workload", "apply"],
        &["workload", "rm"],
        &["device", "label"],
        &["upgrade"],
        &["rollout"],
        &["rollout", "status"],
        &["status"],
        &["watch"],
        &["nats-config"],
        &["artifact", "push"],
        &["buckets", "create"],
    ];
    for words in commands {
        let page = std::iter::once("fleetctl")
            .chain(words.iter().copied())
            .collect::<Vec<_>>()
            .join("-");
        let path = man1.join(format!("{page}.1.gz"));
        assert!(path.is_file(), "the package has no page {page}(1)");
        let rendered: String = render(&path).into_values().collect::<Vec<_>>().join("\n");
        let help = run(Command::new(&fleetctl).args(words.iter()).arg("--help"));
        let options = help_options(&help);
        assert!(
            !options.is_empty() && options.contains("--help"),
            "{page}: {options:?}"
        );
        for o in &options {
            assert!(rendered.contains(o.as_str()), "{page}(1) does not name {o}");
        }
    }
    let name = render(&man1.join("fleetctl.1.gz"))
        .remove("NAME")
        .expect("NAME");
    assert_eq!(name, "fleetctl - operate a Harmony fleet");
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
