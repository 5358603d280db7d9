//! The systemd container: it boots to a running systemd, runs commands and
//! takes files, keeps its disk over a power cycle and a clean reboot (and
//! loses /run, as a reboot does), reaches the host's loopback, is removed on
//! drop, and runs rootless Podman nested as a lingering user, with the
//! user's containers outliving the service that started them.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use fleet_harness::SystemdContainer;

const UNIT_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn boots_runs_commands_and_survives_power_loss_with_its_disk() {
    let c = SystemdContainer::boot();
    let state = c.exec(&["systemctl", "is-system-running"]).stdout;
    assert!(
        matches!(state.trim(), "running" | "degraded"),
        "systemd state {state:?}"
    );
    assert_eq!(c.exec_ok(&["cat", "/proc/1/comm"]).trim(), "systemd");
    assert_eq!(c.exec_ok(&["hostname"]).trim(), "fleet-device");

    c.write_file("/var/lib/probe/disk.txt", b"on disk\n", 0o640);
    assert_eq!(c.read_file("/var/lib/probe/disk.txt"), "on disk\n");
    assert_eq!(
        c.exec_ok(&["stat", "-c", "%a %U", "/var/lib/probe/disk.txt"])
            .trim(),
        "640 root"
    );
    c.write_file("/run/probe-volatile", b"x", 0o644);
    let boot1 = c.read_file("/proc/sys/kernel/random/boot_id");

    // A unit that was running dies with the power and comes back enabled.
    c.write_file(
        "/etc/systemd/system/probe.service",
        b"[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
        0o644,
    );
    c.exec_ok(&["systemctl", "daemon-reload"]);
    c.exec_ok(&["systemctl", "enable", "--now", "probe.service"]);
    c.wait_active("probe.service", UNIT_TIMEOUT);
    let invocation = |c: &SystemdContainer| {
        c.exec_ok(&[
            "systemctl",
            "show",
            "-p",
            "InvocationID",
            "--value",
            "probe.service",
        ])
    };
    let first = invocation(&c);

    c.power_cycle();
    assert_eq!(c.read_file("/var/lib/probe/disk.txt"), "on disk\n");
    assert!(
        !c.exec(&["test", "-e", "/run/probe-volatile"]).success(),
        "/run survived a power cycle"
    );
    c.wait_active("probe.service", UNIT_TIMEOUT);
    let second = invocation(&c);
    assert_ne!(first, second, "the service was not started again");
    // The kernel is the host's, so the boot id stays.
    assert_eq!(c.read_file("/proc/sys/kernel/random/boot_id"), boot1);
    let journal = c.journal("probe.service");
    assert!(journal.contains("Started probe.service"), "{journal}");

    c.restart();
    assert_eq!(c.read_file("/var/lib/probe/disk.txt"), "on disk\n");
    c.wait_active("probe.service", UNIT_TIMEOUT);
    assert_ne!(invocation(&c), second, "not started again after the reboot");
}

#[test]
fn reaches_the_hosts_loopback_and_is_removed_on_drop() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).expect("read");
        s.write_all(b"pong\n").expect("write");
        buf
    });
    let c = SystemdContainer::boot();
    // bash's /dev/tcp: no client tool needed in the image.
    let reply = c.exec_ok(&[
        "bash",
        "-c",
        &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'ping\\n' >&3; head -n1 <&3"),
    ]);
    assert_eq!(reply.trim(), "pong");
    assert_eq!(&server.join().expect("server"), b"ping\n");

    let name = c.name().to_owned();
    drop(c);
    assert!(
        !SystemdContainer::exists(&name),
        "{name} still exists after drop"
    );
}

#[test]
fn rootless_podman_runs_nested_and_its_containers_outlive_the_service() {
    let c = SystemdContainer::boot();
    c.sh(
        "useradd --system --create-home --home-dir /var/lib/probe-user --shell /usr/sbin/nologin probe-user \
         && echo probe-user:200000:65536 >>/etc/subuid && echo probe-user:200000:65536 >>/etc/subgid \
         && loginctl enable-linger probe-user",
    );
    let uid = c.exec_ok(&["id", "-u", "probe-user"]).trim().to_owned();
    c.wait_active(&format!("user@{uid}.service"), UNIT_TIMEOUT);
    let image = c.import_busybox_as("probe-user");

    let args = c.as_user_args(
        "probe-user",
        &["podman", "run", "--rm", &image, "echo", "nested-ok"],
    );
    let out = c.exec_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.contains("nested-ok"), "{out}");

    // A service that starts a container and is then stopped: the container
    // lives in the user manager's scopes, not in the service's cgroup.
    c.write_file(
        "/etc/systemd/system/starter.service",
        format!(
            "[Service]\nUser=probe-user\nEnvironment=XDG_RUNTIME_DIR=/run/user/{uid}\n\
             ExecStart=/bin/sh -c 'podman run -d --name keeper {image} sleep 1000 && exec sleep infinity'\n\
             KillMode=mixed\n"
        )
        .as_bytes(),
        0o644,
    );
    c.exec_ok(&["systemctl", "daemon-reload"]);
    c.exec_ok(&["systemctl", "start", "starter.service"]);
    let ps = |c: &SystemdContainer| {
        let args = c.as_user_args(
            "probe-user",
            &[
                "podman",
                "ps",
                "--filter",
                "name=keeper",
                "--format",
                "{{.Status}}",
            ],
        );
        c.exec_ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    fleet_harness::poll_until("keeper running", UNIT_TIMEOUT, || {
        ps(&c).starts_with("Up").then_some(())
    });
    c.exec_ok(&["systemctl", "stop", "starter.service"]);
    assert!(
        ps(&c).starts_with("Up"),
        "the container died with the service that started it"
    );
}
