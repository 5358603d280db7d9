//! What the packages ship, for every architecture, as dpkg and rpm list it:
//! exactly the device layout (owners root, modes), the bootstrap agent at a
//! path no upgrade manages, no fleetctl on the device, binaries of the right
//! architecture, dependencies and maintainer scripts.

use std::collections::BTreeMap;
use std::process::Command;

use fleet_harness::{bin_path, require_tool};

use fleet_packaging_tests::{
    deb, deb_entries, deb_field, extract_deb, fleetctl_man_pages, rpm, rpm_entries, rpm_flag,
    rpm_query, run, workspace_version, Arch, Entry, Role,
};

/// The device package's files and modes (`docs/design/architecture.md`
/// "Paths on a device"; the
/// bootstrap agent is not at a managed `fleet-agent-v<version>` path, so a
/// package upgrade can never delete a version the active link points at).
const DEVICE_FILES: &[(&str, u32)] = &[
    ("/usr/lib/harmony-fleet/fleet-updater", 0o755),
    ("/usr/lib/harmony-fleet/bootstrap/fleet-agent", 0o755),
    ("/usr/lib/systemd/system/fleet-agent.service", 0o644),
    ("/usr/lib/systemd/system/fleet-updater.service", 0o644),
    ("/usr/lib/sysusers.d/harmony-fleet.conf", 0o644),
    ("/usr/lib/tmpfiles.d/harmony-fleet.conf", 0o644),
    ("/usr/share/doc/harmony-fleet/README.md", 0o644),
    ("/usr/share/doc/harmony-fleet/REPAIR.md", 0o644),
    ("/usr/share/doc/harmony-fleet/copyright", 0o644),
    ("/usr/share/man/man8/fleet-agent.8.gz", 0o644),
    ("/usr/share/man/man8/fleet-updater.8.gz", 0o644),
];

/// What only the .deb of the device package has besides: the Debian
/// changelog of a native package.
const DEB_DEVICE_FILES: &[(&str, u32)] = &[("/usr/share/doc/harmony-fleet/changelog.gz", 0o644)];

/// And where its static daemons need them, lintian's overrides (a reason
/// each, packaging/deb/harmony-fleet.lintian-overrides).
const DEB_STATIC_DEVICE_FILES: &[(&str, u32)] =
    &[("/usr/share/lintian/overrides/harmony-fleet", 0o644)];

/// What postinst and %post run: device setup, never `--repair`.
const SETUP_LINE: &str =
    "/usr/lib/harmony-fleet/fleet-updater setup --agent-binary /usr/lib/harmony-fleet/bootstrap/fleet-agent\n";

const FLEETCTL_FILES: &[(&str, u32)] = &[
    ("/usr/bin/fleetctl", 0o755),
    ("/usr/share/doc/harmony-fleetctl/copyright", 0o644),
    ("/usr/share/bash-completion/completions/fleetctl", 0o644),
    (
        "/usr/share/harmony-fleet/prometheus/harmony-fleet.rules.yml",
        0o644,
    ),
    (
        "/usr/share/harmony-fleet/prometheus/harmony-fleet.dashboard.json",
        0o644,
    ),
];

/// FLEETCTL_FILES and fleetctl's man pages, one per command (the debug
/// fleetctl, built from the same definition, lists them).
fn fleetctl_files() -> Vec<(String, u32)> {
    let mut files: Vec<(String, u32)> = FLEETCTL_FILES
        .iter()
        .map(|(p, m)| ((*p).to_owned(), *m))
        .collect();
    for page in fleetctl_man_pages(&bin_path("fleetctl")) {
        files.push((format!("/usr/share/man/man1/{page}.gz"), 0o644));
    }
    files
}

/// The fleetctl .deb's changelog (rpm's is in the header).
const DEB_FLEETCTL_FILES: &[(&str, u32)] =
    &[("/usr/share/doc/harmony-fleetctl/changelog.gz", 0o644)];

/// The device package's symlinks: path → target (relative, as Debian
/// policy and rpmlint want them within /usr).
const DEVICE_LINKS: &[(&str, &str)] = &[(
    "/usr/sbin/fleet-updater",
    "../lib/harmony-fleet/fleet-updater",
)];

/// Files (not directories) by path → mode; every entry owned root:root and
/// every directory 0755; symlinks are checked by `links`.
fn files(entries: &[Entry], what: &str) -> BTreeMap<String, u32> {
    let mut files = BTreeMap::new();
    for e in entries {
        assert_eq!(
            (e.owner.as_str(), e.group.as_str()),
            ("root", "root"),
            "{what}: {} is owned {}:{}",
            e.path,
            e.owner,
            e.group
        );
        match e.kind {
            'd' => assert_eq!(
                e.mode, 0o755,
                "{what}: directory {} mode {:o}",
                e.path, e.mode
            ),
            '-' => {
                files.insert(e.path.clone(), e.mode);
            }
            'l' => assert!(
                DEVICE_LINKS
                    .iter()
                    .any(|(p, t)| *p == e.path && Some(*t) == e.link.as_deref()),
                "{what}: unexpected symlink {} -> {:?}",
                e.path,
                e.link
            ),
            other => panic!("{what}: unexpected entry type {other:?} for {}", e.path),
        }
    }
    files
}

fn expected(list: &[(&str, u32)]) -> BTreeMap<String, u32> {
    list.iter().map(|(p, m)| ((*p).to_owned(), *m)).collect()
}

#[test]
fn deb_device_packages_ship_exactly_the_device_layout() {
    for arch in Arch::all() {
        let path = deb(Role::Device, arch);
        let what = path.display().to_string();
        assert_eq!(
            files(&deb_entries(&path), &what),
            expected(
                &[
                    DEVICE_FILES,
                    DEB_DEVICE_FILES,
                    if arch.static_daemons() {
                        DEB_STATIC_DEVICE_FILES
                    } else {
                        &[]
                    }
                ]
                .concat()
            ),
            "{what}"
        );
        assert_eq!(deb_field(&path, "Package"), "harmony-fleet");
        assert_eq!(deb_field(&path, "Version"), workspace_version());
        assert_eq!(deb_field(&path, "Architecture"), arch.deb());
        let depends = deb_field(&path, "Depends");
        assert!(
            depends.contains("systemd (>= "),
            "{what}: Depends {depends}"
        );
        // Static daemons depend on no libc; armhf's glibc ones do.
        assert_eq!(
            depends.starts_with("libc6 (>= 2."),
            !arch.static_daemons(),
            "{what}: Depends {depends}"
        );
        let recommends = deb_field(&path, "Recommends");
        for r in ["podman", "uidmap", "slirp4netns"] {
            assert!(recommends.contains(r), "{what}: Recommends {recommends}");
        }
    }
}

#[test]
fn deb_maintainer_scripts_run_setup_and_stop_only_on_removal() {
    let path = deb(Role::Device, Arch::Amd64);
    let dir = tempfile::tempdir().expect("tempdir");
    fleet_packaging_tests::run(
        std::process::Command::new("dpkg-deb")
            .arg("-e")
            .arg(&path)
            .arg(dir.path()),
    );
    let read = |name: &str| {
        let p = dir.path().join(name);
        let mode = std::fs::metadata(&p).expect("script").permissions();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.mode() & 0o777, 0o755, "{name} mode");
        std::fs::read_to_string(&p).expect("read script")
    };
    let postinst = read("postinst");
    assert!(postinst.contains(SETUP_LINE), "{postinst}");
    let prerm = read("prerm");
    let remove_arm = prerm
        .split("remove | deconfigure)")
        .nth(1)
        .expect("remove arm");
    assert!(remove_arm.contains("deb-systemd-invoke stop"), "{prerm}");
    assert!(
        !prerm.contains("upgrade)"),
        "prerm must not stop on upgrade: {prerm}"
    );
    let postrm = read("postrm");
    assert!(postrm.contains("purge)"), "{postrm}");
}

#[test]
fn deb_binaries_are_built_for_their_architecture() {
    for arch in Arch::all() {
        let path = deb(Role::Device, arch);
        let dir = tempfile::tempdir().expect("tempdir");
        extract_deb(&path, dir.path());
        for bin in [
            "usr/lib/harmony-fleet/fleet-updater",
            "usr/lib/harmony-fleet/bootstrap/fleet-agent",
        ] {
            let bytes = std::fs::read(dir.path().join(bin)).expect("binary");
            assert_eq!(&bytes[..4], b"\x7fELF", "{bin} of {arch:?} is not ELF");
            let class = bytes[4];
            let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
            assert_eq!((machine, class), arch.elf(), "{bin} of {arch:?}");
        }
    }
}

/// The device daemons of amd64 and arm64 are statically linked (no
/// program interpreter, no shared library); armhf's load glibc.
#[test]
fn device_daemons_are_static_where_musl_is_available() {
    let readelf = require_tool("readelf", "binutils");
    for arch in Arch::all() {
        let path = deb(Role::Device, arch);
        let dir = tempfile::tempdir().expect("tempdir");
        extract_deb(&path, dir.path());
        for bin in [
            "usr/lib/harmony-fleet/fleet-updater",
            "usr/lib/harmony-fleet/bootstrap/fleet-agent",
        ] {
            let file = dir.path().join(bin);
            let headers = run(Command::new(&readelf).arg("-lW").arg(&file));
            let dynamic = run(Command::new(&readelf).arg("-dW").arg(&file));
            let interp = headers.contains("Requesting program interpreter");
            let needed = dynamic.contains("(NEEDED)");
            if arch.static_daemons() {
                assert!(
                    !interp && !needed,
                    "{bin} of {arch:?} is dynamically linked:\n{headers}\n{dynamic}"
                );
            } else {
                assert!(
                    interp && dynamic.contains("[libc.so.6]"),
                    "{bin} of {arch:?} should load glibc:\n{headers}\n{dynamic}"
                );
            }
        }
    }
}

#[test]
fn fleetctl_is_a_package_of_its_own_and_never_on_the_device() {
    // `make packages-for-test` builds fleetctl for amd64 only (`make
    // packages` for every architecture).
    let d = deb(Role::Fleetctl, Arch::Amd64);
    let fleetctl = fleetctl_files();
    let mut deb_files: BTreeMap<String, u32> = fleetctl.iter().cloned().collect();
    deb_files.extend(expected(DEB_FLEETCTL_FILES));
    assert_eq!(files(&deb_entries(&d), &d.display().to_string()), deb_files);
    let r = rpm(Role::Fleetctl, Arch::Amd64);
    assert_eq!(
        files(&rpm_entries(&r), &r.display().to_string()),
        fleetctl.into_iter().collect::<BTreeMap<_, _>>()
    );
    for arch in Arch::all() {
        for e in deb_entries(&deb(Role::Device, arch)) {
            assert!(
                !e.path.contains("fleetctl"),
                "device package has {}",
                e.path
            );
        }
        for e in rpm_entries(&rpm(Role::Device, arch)) {
            assert!(
                !e.path.contains("fleetctl"),
                "device package has {}",
                e.path
            );
        }
    }
}

#[test]
fn rpm_device_packages_ship_the_same_layout_and_scriptlets() {
    for arch in Arch::all() {
        let path = rpm(Role::Device, arch);
        let what = path.display().to_string();
        // rpm lists only the directories the package owns; all are 0755.
        assert_eq!(
            files(&rpm_entries(&path), &what),
            expected(DEVICE_FILES),
            "{what}"
        );
        assert_eq!(
            rpm_query(&path, "%{NAME} %{VERSION} %{ARCH}"),
            format!("harmony-fleet {} {}", workspace_version(), arch.rpm())
        );
        let requires = rpm_flag(&path, "--requires");
        assert!(requires.contains("systemd >= 247"), "{what}: {requires}");
        assert_eq!(
            requires.contains("libc.so.6"),
            !arch.static_daemons(),
            "{what}: {requires}"
        );
        if arch.static_daemons() {
            // Static: no loader either (rpm's ELF scan would ask for one).
            assert!(!requires.contains("rtld("), "{what}: {requires}");
        }
        let scripts = rpm_flag(&path, "--scripts");
        assert!(scripts.contains(SETUP_LINE), "{what}: {scripts}");
        let preun = scripts
            .split("preuninstall scriptlet")
            .nth(1)
            .expect("a %preun");
        assert!(
            preun.contains("if [ \"$1\" -eq 0 ]"),
            "{what}: stop only on erase: {preun}"
        );
    }
}
