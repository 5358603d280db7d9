//! The .rpm packages installed, upgraded and removed by rpm itself under
//! real systemd: there is no RPM-based image offline, so Debian's `rpm`
//! runs in the harness's booted Debian 12 container (`--nodeps`: its rpm
//! database knows none of Debian's packages; `--force-debian`: Debian's rpm
//! refuses to install otherwise). The scriptlets then do on a device what
//! the .deb's maintainer scripts do, and this asserts what tests/device.rs
//! asserts of the .deb. packaging/README.md says what it does not prove
//! about a real RPM distribution. Also: `man` finds the pages both formats
//! install.

use std::path::Path;
use std::time::Duration;

use fleet_harness::{AgentSettings, NatsServer, NatsVersion, SystemdContainer};
use fleet_packaging_tests::{build_package, deb, rpm, workspace_version, Arch, Role};

const UNIT_TIMEOUT: Duration = Duration::from_secs(60);
/// The agent reaching NATS and READY on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const DEVICE: &str = "dev1";
const BOOTSTRAP: &str = "/usr/lib/harmony-fleet/bootstrap/fleet-agent";
const LINK: &str = "/usr/local/bin/fleet-agent";

fn versioned(version: &str) -> String {
    format!("/usr/lib/harmony-fleet/fleet-agent-v{version}")
}

fn stat(c: &SystemdContainer, path: &str) -> String {
    c.exec_ok(&["stat", "-c", "%a %U %G", path])
        .trim()
        .to_owned()
}

fn readlink(c: &SystemdContainer) -> String {
    c.exec_ok(&["readlink", LINK]).trim().to_owned()
}

fn show(c: &SystemdContainer, unit: &str, property: &str) -> String {
    c.exec_ok(&["systemctl", "show", "-p", property, "--value", unit])
        .trim()
        .to_owned()
}

/// Copies `pkg` in and runs `rpm ARGS /tmp/<pkg>`; what rpm and the
/// scriptlets printed. Panics when rpm fails.
fn rpm_with(c: &SystemdContainer, args: &[&str], pkg: &Path) -> String {
    let name = pkg
        .file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned();
    let dest = format!("/tmp/{name}");
    c.copy_in(pkg, &dest);
    let mut argv = vec!["rpm"];
    argv.extend_from_slice(args);
    argv.extend(["--nodeps", "--force-debian", dest.as_str()]);
    let out = c.exec(&argv);
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        out.success(),
        "{argv:?} failed ({:?}):\n{text}\nupdater journal:\n{}",
        out.code,
        c.journal("fleet-updater.service")
    );
    text
}

/// `man PAGE` in the container, as text.
fn man(c: &SystemdContainer, args: &[&str]) -> String {
    let mut argv = vec!["env", "MAN_DISABLE_SECCOMP=1", "MANWIDTH=100", "man"];
    argv.extend_from_slice(args);
    c.exec_ok(&argv)
}

#[test]
fn the_rpm_installs_upgrades_and_erases_under_systemd() {
    let v = workspace_version();
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &[DEVICE]);
    let c = SystemdContainer::boot();
    let out = rpm_with(&c, &["-i"], &rpm(Role::Device, Arch::Amd64));
    assert!(out.contains("waits for its config"), "{out}");
    assert_eq!(
        c.exec_ok(&["rpm", "-q", "--qf", "%{VERSION}", "harmony-fleet"]),
        v
    );

    // Users and groups, subordinate ids.
    let passwd = c.exec_ok(&["getent", "passwd", "fleet-agent"]);
    assert!(
        passwd
            .trim()
            .ends_with(":/var/lib/harmony-fleet/agent:/usr/sbin/nologin"),
        "{passwd}"
    );
    c.exec_ok(&["getent", "group", "fleet-control"]);
    for f in ["/etc/subuid", "/etc/subgid"] {
        let text = c.read_file(f);
        assert!(
            text.lines()
                .any(|l| l.starts_with("fleet-agent:") && l.ends_with(":65536")),
            "no fleet-agent range in {f}: {text}"
        );
    }

    // Directories and modes; the package's files as the spec gives them.
    for (path, want) in [
        ("/var/lib/harmony-fleet", "755 root root"),
        ("/var/lib/harmony-fleet/updater", "700 root root"),
        (
            "/var/lib/harmony-fleet/agent",
            "750 fleet-agent fleet-agent",
        ),
        ("/etc/harmony-fleet", "750 root fleet-agent"),
        ("/run/harmony-fleet", "1771 root fleet-agent"),
        ("/usr/lib/harmony-fleet", "755 root root"),
        ("/usr/lib/harmony-fleet/fleet-updater", "755 root root"),
        (BOOTSTRAP, "755 root root"),
        (
            "/usr/lib/systemd/system/fleet-agent.service",
            "644 root root",
        ),
    ] {
        assert_eq!(stat(&c, path), want, "{path}");
    }
    assert_eq!(
        c.exec_ok(&["readlink", "/usr/sbin/fleet-updater"]).trim(),
        "../lib/harmony-fleet/fleet-updater"
    );

    // `fleet-updater setup` done: the bootstrap as a versioned binary, the
    // link to it, lingering, both units enabled, the updater READY.
    assert_eq!(stat(&c, &versioned(&v)), "755 root root");
    c.exec_ok(&["cmp", BOOTSTRAP, &versioned(&v)]);
    assert_eq!(readlink(&c), versioned(&v));
    c.exec_ok(&["test", "-e", "/var/lib/systemd/linger/fleet-agent"]);
    assert_eq!(
        c.exec_ok(&[
            "systemctl",
            "is-enabled",
            "fleet-updater.service",
            "fleet-agent.service"
        ]),
        "enabled\nenabled\n"
    );
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
    assert_eq!(
        stat(&c, "/run/harmony-fleet/updater.sock"),
        "660 root fleet-agent"
    );
    // The man pages the package installed.
    let page = man(&c, &["8", "fleet-updater"]);
    assert!(
        page.contains("fleet-updater - replaces the fleet agent"),
        "{page}"
    );

    // With its config the agent runs (READY on the host's nats-server).
    c.configure_agent(&AgentSettings {
        podman: false,
        ..AgentSettings::for_fleet_server(DEVICE, &nats)
    });
    let start = c.exec_with_timeout(
        &["systemctl", "start", "fleet-agent.service"],
        READY_TIMEOUT,
    );
    assert!(
        start.success(),
        "{start:?}\n{}",
        c.journal("fleet-agent.service")
    );
    assert_eq!(show(&c, "fleet-agent.service", "User"), "fleet-agent");
    let agent_before = show(&c, "fleet-agent.service", "InvocationID");
    let updater_before = show(&c, "fleet-updater.service", "InvocationID");

    // What an updater cutover to 9.9.9 leaves (the bytes are the
    // bootstrap's; the scriptlets look only at names and links).
    let later = versioned("9.9.9");
    c.sh(&format!(
        "cp {BOOTSTRAP} {later} && ln -s {later} {LINK}.cutover && mv -T {LINK}.cutover {LINK}"
    ));

    // rpm -U to the next version: %post runs setup again, which keeps the
    // updater's agent; the old package's %preun/%postun ($1 = 1) stop
    // nothing.
    let out_dir = tempfile::tempdir().expect("tempdir");
    let next = format!("{v}.1");
    let upgrade = build_package("rpm", Role::Device, Arch::Amd64, &next, out_dir.path());
    let out = rpm_with(&c, &["-U"], &upgrade);
    assert!(out.contains("active agent kept"), "{out}");
    assert_eq!(readlink(&c), later, "the upgrade moved the active link");
    assert_eq!(
        c.exec_ok(&["rpm", "-q", "--qf", "%{VERSION}", "harmony-fleet"]),
        next
    );
    c.exec_ok(&["test", "-x", &versioned(&v)]);
    c.exec_ok(&["test", "-x", &later]);
    assert_eq!(
        c.exec_ok(&[
            "systemctl",
            "is-enabled",
            "fleet-updater.service",
            "fleet-agent.service"
        ]),
        "enabled\nenabled\n"
    );
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
    assert_ne!(
        show(&c, "fleet-updater.service", "InvocationID"),
        updater_before,
        "the upgrade did not restart the updater"
    );
    assert_eq!(c.active_state("fleet-agent.service"), "active");
    assert_eq!(
        show(&c, "fleet-agent.service", "InvocationID"),
        agent_before,
        "the package upgrade restarted the agent"
    );

    // rpm -e: both services stopped and disabled, the package's files gone;
    // state, configuration, the installed versions and the link stay.
    c.write_file("/var/lib/harmony-fleet/agent/freeze.json", b"{}\n", 0o600);
    let erase = c.exec(&["rpm", "-e", "--nodeps", "--force-debian", "harmony-fleet"]);
    assert!(erase.success(), "{erase:?}");
    for unit in ["fleet-updater.service", "fleet-agent.service"] {
        assert_eq!(c.active_state(unit), "inactive", "{unit}");
    }
    for gone in [
        "/usr/lib/harmony-fleet/fleet-updater",
        BOOTSTRAP,
        "/usr/sbin/fleet-updater",
        "/usr/lib/systemd/system/fleet-agent.service",
        "/etc/systemd/system/multi-user.target.wants/fleet-updater.service",
        "/etc/systemd/system/multi-user.target.wants/fleet-agent.service",
    ] {
        assert!(
            !c.exec(&["test", "-e", gone]).success(),
            "{gone} survived rpm -e"
        );
    }
    for kept in [
        "/var/lib/harmony-fleet/agent/freeze.json",
        "/etc/harmony-fleet/agent.json",
        LINK,
    ] {
        c.exec_ok(&["test", "-e", kept]);
    }
    c.exec_ok(&["test", "-x", &versioned(&v)]);
    c.exec_ok(&["test", "-x", &later]);
    c.exec_ok(&["getent", "passwd", "fleet-agent"]);
}

#[test]
fn man_finds_fleetctl_after_either_package_installs_it() {
    let c = SystemdContainer::boot();
    c.install_deb(&deb(Role::Fleetctl, Arch::Amd64));
    let page = man(&c, &["fleetctl"]);
    assert!(
        page.contains("fleetctl - operate a Harmony fleet"),
        "{page}"
    );
    assert!(page.contains("SUBCOMMANDS"), "{page}");
    assert!(page.contains("fleetctl-rollout(1)"), "{page}");
    // Each command group has its own page.
    let rollout = man(&c, &["fleetctl-rollout"]);
    assert!(rollout.contains("fleetctl-rollout"), "{rollout}");
    c.exec_ok(&["dpkg", "-r", "harmony-fleetctl"]);
    assert!(!c.exec(&["man", "-w", "fleetctl"]).success());

    rpm_with(&c, &["-i"], &rpm(Role::Fleetctl, Arch::Amd64));
    let page = man(&c, &["fleetctl"]);
    assert!(
        page.contains("fleetctl - operate a Harmony fleet"),
        "{page}"
    );
    c.exec_ok(&[
        "test",
        "-f",
        "/usr/share/bash-completion/completions/fleetctl",
    ]);
}
