//! The device package on a booted Debian 12 (the harness's systemd
//! container): what installing does (users, subordinate ids, directories,
//! the versioned bootstrap agent, the active link, lingering, both units),
//! that the agent unit's hardening lets rootless Podman run containers that
//! outlive the unit, that an upgrade never moves the link away from a later
//! agent, that setup refuses during a transaction, remove and purge, and a
//! power loss after installing.

use std::time::Duration;

use fleet_harness::{workspace_root, SystemdContainer};
use fleet_packaging_tests::{build_package, deb, workspace_version, Arch, Role};

const UNIT_TIMEOUT: Duration = Duration::from_secs(60);
const UPDATER: &str = "/usr/lib/harmony-fleet/fleet-updater";
const BOOTSTRAP: &str = "/usr/lib/harmony-fleet/bootstrap/fleet-agent";
const LINK: &str = "/usr/local/bin/fleet-agent";

fn versioned(version: &str) -> String {
    format!("/usr/lib/harmony-fleet/fleet-agent-v{version}")
}

/// `mode owner group` of `path` in the container.
fn stat(c: &SystemdContainer, path: &str) -> String {
    c.exec_ok(&["stat", "-c", "%a %U %G", path])
        .trim()
        .to_owned()
}

fn readlink(c: &SystemdContainer) -> String {
    c.exec_ok(&["readlink", LINK]).trim().to_owned()
}

fn invocation(c: &SystemdContainer, unit: &str) -> String {
    c.exec_ok(&["systemctl", "show", "-p", "InvocationID", "--value", unit])
        .trim()
        .to_owned()
}

fn agent_uid(c: &SystemdContainer) -> String {
    c.exec_ok(&["id", "-u", "fleet-agent"]).trim().to_owned()
}

/// A fresh device with the package of this build installed.
fn installed() -> (SystemdContainer, String) {
    let c = SystemdContainer::boot();
    let out = c.install_deb(&deb(Role::Device, Arch::Amd64));
    (c, out)
}

#[test]
fn installing_the_deb_sets_up_the_device() {
    let (c, out) = installed();
    let v = workspace_version();
    assert!(out.contains("waits for its config"), "{out}");

    // Users and groups.
    let passwd = c.exec_ok(&["getent", "passwd", "fleet-agent"]);
    assert!(
        passwd
            .trim()
            .ends_with(":/var/lib/harmony-fleet/agent:/usr/sbin/nologin"),
        "{passwd}"
    );
    c.exec_ok(&["getent", "group", "fleet-control"]);
    // Subordinate ids for rootless Podman, not overlapping anyone's.
    for f in ["/etc/subuid", "/etc/subgid"] {
        let text = c.read_file(f);
        let line = text
            .lines()
            .find(|l| l.starts_with("fleet-agent:"))
            .unwrap_or_else(|| panic!("no fleet-agent in {f}: {text}"));
        let fields: Vec<&str> = line.split(':').collect();
        assert_eq!(fields[2], "65536", "{f}: {line}");
        assert!(
            fields[1].parse::<u64>().expect("start") >= 100_000,
            "{f}: {line}"
        );
    }

    // Directories, `docs/design/architecture.md` "Paths on a device".
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
    ] {
        assert_eq!(stat(&c, path), want, "{path}");
    }

    // The bootstrap agent as a versioned binary, and the active link to it.
    assert_eq!(stat(&c, &versioned(&v)), "755 root root");
    c.exec_ok(&["cmp", BOOTSTRAP, &versioned(&v)]);
    assert_eq!(readlink(&c), versioned(&v));
    assert_eq!(
        c.exec_ok(&[LINK, "--version"]).trim(),
        format!("fleet-agent {v}")
    );

    // Lingering: the agent user's manager runs, and the agent unit names it.
    let uid = agent_uid(&c);
    c.wait_active(&format!("user@{uid}.service"), UNIT_TIMEOUT);
    let env = c.exec_ok(&[
        "systemctl",
        "show",
        "-p",
        "Environment",
        "-p",
        "After",
        "fleet-agent.service",
    ]);
    assert!(
        env.contains(&format!("XDG_RUNTIME_DIR=/run/user/{uid}")),
        "{env}"
    );
    assert!(env.contains(&format!("user@{uid}.service")), "{env}");

    // Both units enabled; the updater READY with its socket; the agent
    // waits for its config instead of failing.
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
    assert_eq!(c.active_state("fleet-agent.service"), "inactive");
    assert_eq!(
        c.exec_ok(&[
            "systemctl",
            "show",
            "-p",
            "ConditionResult",
            "--value",
            "fleet-agent.service"
        ])
        .trim(),
        "no"
    );

    // systemd's verdict on the installed units, drop-in included.
    let verify = c.exec(&[
        "systemd-analyze",
        "verify",
        "fleet-agent.service",
        "fleet-updater.service",
    ]);
    assert!(
        verify.success() && verify.stdout.trim().is_empty() && verify.stderr.trim().is_empty(),
        "systemd-analyze verify: {verify:?}"
    );

    // Setup again changes nothing: no second id range, the same link.
    let subuid = c.read_file("/etc/subuid");
    let again = c.exec_ok(&[UPDATER, "setup", "--agent-binary", BOOTSTRAP]);
    assert!(again.contains("active agent kept"), "{again}");
    assert_eq!(c.read_file("/etc/subuid"), subuid);
    assert_eq!(readlink(&c), versioned(&v));
}

#[test]
fn the_agent_unit_lets_rootless_podman_run_containers_that_outlive_it() {
    let (c, _) = installed();
    let uid = agent_uid(&c);
    c.wait_active(&format!("user@{uid}.service"), UNIT_TIMEOUT);
    let image = c.import_busybox_as("fleet-agent");
    // The import started Podman's pause process outside the unit; end it,
    // so that the unit's own sandbox is the one Podman pins (as after a
    // boot, when the agent is Podman's first caller).
    c.sh(&format!(
        "pid=$(cat /run/user/{uid}/libpod/tmp/pause.pid) && kill -9 $pid \
         && while kill -0 $pid 2>/dev/null; do sleep 0.05; done"
    ));

    // The real unit, hardening and drop-in included, with only its command
    // and type replaced: it starts one workload container.
    c.write_file("/etc/harmony-fleet/agent.json", b"{}\n", 0o640);
    c.write_file(
        "/etc/systemd/system/fleet-agent.service.d/90-test-podman.conf",
        format!(
            "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=\nExecStart=/bin/sh -c \
             'podman run -d --name workload {image} sleep 100000'\n"
        )
        .as_bytes(),
        0o644,
    );
    c.exec_ok(&["systemctl", "daemon-reload"]);
    // No podman call outside the unit before this one: it would start the
    // pause process in its own, unhardened, namespace.
    let start = c.exec(&["systemctl", "start", "fleet-agent.service"]);
    assert!(
        start.success(),
        "rootless Podman failed under the agent unit: {start:?}\n{}",
        c.journal("fleet-agent.service")
    );
    let status = |c: &SystemdContainer| {
        let args = c.as_user_args(
            "fleet-agent",
            &[
                "podman",
                "ps",
                "--filter",
                "name=^workload$",
                "--format",
                "{{.Status}}",
            ],
        );
        c.exec(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout
    };
    assert!(status(&c).starts_with("Up"), "the workload is not running");

    // A cutover stops the unit: the workload keeps running.
    c.exec_ok(&["systemctl", "stop", "fleet-agent.service"]);
    assert!(
        status(&c).starts_with("Up"),
        "the workload died with the agent unit:\n{}",
        c.journal("fleet-agent.service")
    );

    // The next invocation (a new mount namespace) still pulls and runs: an
    // image import needs /var/tmp in the namespace Podman pinned. (Podman
    // moves each of its commands into a scope of the user manager, so its
    // output is not in the unit's journal: it goes to a file.)
    c.write_file(
        "/etc/systemd/system/fleet-agent.service.d/90-test-podman.conf",
        "[Service]\nType=oneshot\nExecStart=\nExecStart=/bin/sh -c \
         'podman import --quiet /tmp/busybox-rootfs.tar localhost/fleet-test/again:1 \
         && podman run --rm localhost/fleet-test/again:1 echo second-invocation-ok \
         >/var/lib/harmony-fleet/agent/second.out'\n"
            .as_bytes(),
        0o644,
    );
    c.exec_ok(&["systemctl", "daemon-reload"]);
    let start = c.exec(&["systemctl", "start", "fleet-agent.service"]);
    assert!(
        start.success(),
        "{start:?}\n{}",
        c.journal("fleet-agent.service")
    );
    assert_eq!(
        c.read_file("/var/lib/harmony-fleet/agent/second.out"),
        "second-invocation-ok\n"
    );
    assert!(status(&c).starts_with("Up"), "the workload is gone");
}

#[test]
fn a_probe_that_starts_podman_from_the_updater_unit_leaves_it_usable() {
    let (c, _) = installed();
    let uid = agent_uid(&c);
    c.wait_active(&format!("user@{uid}.service"), UNIT_TIMEOUT);
    let image = c.import_busybox_as("fleet-agent");
    c.sh(&format!(
        "pid=$(cat /run/user/{uid}/libpod/tmp/pause.pid) && kill -9 $pid \
         && while kill -0 $pid 2>/dev/null; do sleep 0.05; done"
    ));
    // The real updater unit, its command replaced by what a candidate probe
    // does first: Podman as fleet-agent, with the updater's clean
    // environment (no XDG_RUNTIME_DIR). Podman's pause process then pins the
    // updater unit's namespace for every later container of the agent.
    c.write_file(
        "/etc/systemd/system/fleet-updater.service.d/90-test-probe.conf",
        b"[Service]\nType=oneshot\nRestart=no\nExecStart=\nExecStart=/usr/bin/setpriv --reuid=fleet-agent \
          --regid=fleet-agent --clear-groups /usr/bin/env -i PATH=/usr/bin:/bin \
          HOME=/var/lib/harmony-fleet/agent USER=fleet-agent podman info --format {{.Host.OCIRuntime.Name}}\n",
        0o644,
    );
    c.exec_ok(&["systemctl", "daemon-reload"]);
    let probe = c.exec(&["systemctl", "restart", "fleet-updater.service"]);
    assert!(
        probe.success(),
        "Podman failed under the updater unit: {probe:?}\n{}",
        c.journal("fleet-updater.service")
    );
    // The agent's workloads still run and pull in that namespace.
    c.write_file("/etc/harmony-fleet/agent.json", b"{}\n", 0o640);
    c.write_file(
        "/etc/systemd/system/fleet-agent.service.d/90-test-podman.conf",
        format!(
            "[Service]\nType=oneshot\nExecStart=\nExecStart=/bin/sh -c \
             'podman import --quiet /tmp/busybox-rootfs.tar localhost/fleet-test/again:1 \
             && podman run --rm {image} echo after-probe-ok >/var/lib/harmony-fleet/agent/out'\n"
        )
        .as_bytes(),
        0o644,
    );
    c.exec_ok(&["systemctl", "daemon-reload"]);
    let start = c.exec(&["systemctl", "start", "fleet-agent.service"]);
    assert!(
        start.success(),
        "{start:?}\n{}",
        c.journal("fleet-agent.service")
    );
    assert_eq!(
        c.read_file("/var/lib/harmony-fleet/agent/out"),
        "after-probe-ok\n"
    );
}

#[test]
fn a_package_upgrade_never_moves_the_link_from_a_later_agent() {
    let (c, _) = installed();
    let v = workspace_version();
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
    let updater_before = invocation(&c, "fleet-updater.service");

    // What an updater cutover to 9.9.9 leaves: a versioned binary and the
    // link switched to it (the bytes are the bootstrap's; the scripts look
    // only at names and links).
    let later = versioned("9.9.9");
    c.sh(&format!(
        "cp {BOOTSTRAP} {later} && ln -s {later} {LINK}.cutover && mv -T {LINK}.cutover {LINK}"
    ));

    let out_dir = tempfile::tempdir().expect("tempdir");
    let next = format!("{v}.1");
    let upgrade = build_package("deb", Role::Device, Arch::Amd64, &next, out_dir.path());
    let out = c.install_deb(&upgrade);
    assert!(out.contains("active agent kept"), "{out}");
    assert_eq!(readlink(&c), later, "the upgrade moved the active link");
    assert_eq!(
        c.exec_ok(&["dpkg-query", "-W", "-f", "${Version}", "harmony-fleet"]),
        next
    );
    // Both agents stay installed; the updater runs the new package's binary.
    c.exec_ok(&["test", "-x", &versioned(&v)]);
    c.exec_ok(&["test", "-x", &later]);
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
    assert_ne!(invocation(&c, "fleet-updater.service"), updater_before);

    // A dangling link (its target removed by hand) is repaired.
    c.exec_ok(&["rm", &later]);
    let out = c.install_deb(&upgrade);
    assert!(out.contains("active agent:"), "{out}");
    assert_eq!(readlink(&c), versioned(&v));
}

#[test]
fn setup_refuses_while_an_upgrade_is_in_progress() {
    let (c, _) = installed();
    let v = workspace_version();
    c.exec_ok(&["systemctl", "stop", "fleet-updater.service"]);
    // A journal in rolling-back (the golden example of fleet-common).
    let golden = std::fs::read(workspace_root().join("common/tests/golden/journal.json"))
        .expect("golden journal");
    c.write_file(
        "/var/lib/harmony-fleet/updater/journal.json",
        &golden,
        0o600,
    );
    c.exec_ok(&["rm", LINK]);

    let out = c.exec(&[UPDATER, "setup", "--agent-binary", BOOTSTRAP]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("an agent upgrade is in progress (phase rolling-back"),
        "{out:?}"
    );
    assert!(
        !c.exec(&["test", "-e", LINK]).success(),
        "setup changed the link during a transaction"
    );
    // dpkg says so too, and leaves the package unconfigured.
    let dpkg = c.exec(&["dpkg", "-i", &format!("/tmp/harmony-fleet_{v}_amd64.deb")]);
    assert!(
        !dpkg.success()
            && format!("{}{}", dpkg.stdout, dpkg.stderr)
                .contains("an agent upgrade is in progress"),
        "{dpkg:?}"
    );

    // Once the transaction is over, setup goes through.
    let done = String::from_utf8_lossy(&golden).replacen(
        "\"phase\": \"rolling-back\"",
        "\"phase\": \"failed\"",
        1,
    );
    c.write_file(
        "/var/lib/harmony-fleet/updater/journal.json",
        done.as_bytes(),
        0o600,
    );
    c.exec_ok(&["dpkg", "--configure", "-a"]);
    assert_eq!(readlink(&c), versioned(&v));
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
}

#[test]
fn remove_keeps_the_device_state_and_purge_removes_it() {
    let (c, _) = installed();
    let v = workspace_version();
    let uid = agent_uid(&c);
    c.write_file("/var/lib/harmony-fleet/agent/freeze.json", b"{}\n", 0o600);

    c.exec_ok(&["dpkg", "-r", "harmony-fleet"]);
    assert_eq!(c.active_state("fleet-updater.service"), "inactive");
    // Disabled: prerm's deb-systemd-helper took back the links setup made.
    for unit in ["fleet-agent.service", "fleet-updater.service"] {
        let link = format!("/etc/systemd/system/multi-user.target.wants/{unit}");
        assert!(
            !c.exec(&["test", "-L", &link]).success(),
            "{link} survived dpkg -r"
        );
    }
    for kept in [
        "/var/lib/harmony-fleet/agent/freeze.json",
        "/etc/harmony-fleet",
        LINK,
    ] {
        c.exec_ok(&["test", "-e", kept]);
    }
    c.exec_ok(&["test", "-x", &versioned(&v)]);
    assert!(!c
        .exec(&["test", "-e", "/usr/lib/harmony-fleet/fleet-updater"])
        .success());

    c.exec_ok(&["dpkg", "-P", "harmony-fleet"]);
    for gone in [
        "/var/lib/harmony-fleet",
        "/etc/harmony-fleet",
        "/usr/lib/harmony-fleet",
        LINK,
        "/var/lib/systemd/linger/fleet-agent",
        "/etc/systemd/system/fleet-agent.service.d",
    ] {
        assert!(
            !c.exec(&["test", "-e", gone]).success(),
            "{gone} survived a purge"
        );
    }
    assert_eq!(c.active_state(&format!("user@{uid}.service")), "inactive");
    // Debian never removes system users.
    c.exec_ok(&["getent", "passwd", "fleet-agent"]);
}

#[test]
fn after_a_power_loss_the_device_comes_back() {
    let (c, _) = installed();
    let v = workspace_version();
    let uid = agent_uid(&c);
    c.power_cycle();
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
    c.wait_active(&format!("user@{uid}.service"), UNIT_TIMEOUT);
    assert_eq!(stat(&c, "/run/harmony-fleet"), "1771 root fleet-agent");
    assert_eq!(readlink(&c), versioned(&v));
}

#[test]
fn the_installed_updater_reads_the_artifact_ca_the_harness_gives_it() {
    let (c, _) = installed();
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
    let before = invocation(&c, "fleet-updater.service");
    let ca = fleet_harness::TestCa::new();
    c.trust_artifact_ca(&ca.ca_pem());
    c.wait_active("fleet-updater.service", UNIT_TIMEOUT);
    assert_ne!(
        invocation(&c, "fleet-updater.service"),
        before,
        "not restarted"
    );

    // It really reads the file: a broken one stops it from starting.
    c.write_file(
        "/etc/harmony-fleet/artifact-ca.pem",
        b"not a certificate\n",
        0o644,
    );
    let restart = c.exec(&["systemctl", "restart", "fleet-updater.service"]);
    assert!(!restart.success(), "{restart:?}");
    let journal = c.journal("fleet-updater.service");
    assert!(
        journal.contains("/etc/harmony-fleet/artifact-ca.pem holds no PEM certificate")
            && journal.contains("(updater config key ca-file)"),
        "{journal}"
    );
}
