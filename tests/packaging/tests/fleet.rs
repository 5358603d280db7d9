//! The installed device in a fleet, end to end on a booted Debian 12: both
//! services reach READY, the agent on the host's nats-server with rootless
//! Podman nested; an upgrade to the test agent version, served over HTTPS from the host, goes
//! through the installed updater under systemd; a package upgrade afterwards
//! keeps the agent the updater installed (the link is not moved, the agent
//! not restarted).

use std::time::Duration;

use fleet_common::contracts::{
    AgentUpgradeAttempt, DeviceInfo, Response, UpdaterReply, UpdaterRequest, UpgradePhase,
    UpgradeStatus,
};
use fleet_common::limits::SOCKET_STATUS_RESPONSE_TIMEOUT;
use fleet_common::subjects::{intent_key, status_key, StatusKey, BUCKET_CONTROL, BUCKET_STATUS};
use fleet_common::validate::{
    Arch as AgentArch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_harness::{
    poll_until, test_agent_path, AgentSettings, Behavior, HttpsServer, NatsServer, NatsVersion,
    SystemdContainer, TestCa, UPGRADE_TEST_VERSION,
};
use fleet_packaging_tests::{build_package, workspace_version, Arch, Role};

/// The agent reaching NATS and READY on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Download, probe, cutover and READY of the new agent.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);
const DEVICE: &str = "dev1";
const LINK: &str = "/usr/local/bin/fleet-agent";
const NEXT_AGENT: &str = UPGRADE_TEST_VERSION;

fn kv(admin: &nats::Connection, bucket: &str) -> nats::kv::Store {
    nats::jetstream::new(admin.clone())
        .key_value(bucket)
        .unwrap_or_else(|e| panic!("bucket {bucket}: {e}"))
}

fn status<T: serde::de::DeserializeOwned>(admin: &nats::Connection, key: StatusKey) -> Option<T> {
    let device = DeviceId::parse(DEVICE).expect("device id");
    let raw = kv(admin, BUCKET_STATUS)
        .get(&status_key(&device, key))
        .unwrap_or_else(|e| panic!("get {key:?}: {e}"))?;
    Some(serde_json::from_slice(&raw).unwrap_or_else(|e| {
        panic!(
            "{key:?} is not valid: {e}: {}",
            String::from_utf8_lossy(&raw)
        )
    }))
}

fn readlink(c: &SystemdContainer) -> String {
    c.exec_ok(&["readlink", LINK]).trim().to_owned()
}

fn show(c: &SystemdContainer, unit: &str, property: &str) -> String {
    c.exec_ok(&["systemctl", "show", "-p", property, "--value", unit])
        .trim()
        .to_owned()
}

/// The binary the agent service's main process runs.
fn running_agent(c: &SystemdContainer) -> String {
    let pid = show(c, "fleet-agent.service", "MainPID");
    c.exec_ok(&["readlink", &format!("/proc/{pid}/exe")])
        .trim()
        .to_owned()
}

#[test]
fn the_device_joins_the_fleet_upgrades_and_a_package_upgrade_keeps_the_upgrade() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &[DEVICE]);
    let admin = nats.admin();
    let ca = TestCa::new();
    let https = HttpsServer::start(&ca);
    let v = workspace_version();

    let c = SystemdContainer::boot();
    c.install_device();
    c.trust_artifact_ca(&ca.ca_pem());
    c.configure_agent(&AgentSettings::for_fleet_server(DEVICE, &nats));
    // Type=notify: `systemctl start` returns once the agent sent READY=1.
    let start = c.exec_with_timeout(
        &["systemctl", "start", "fleet-agent.service"],
        READY_TIMEOUT,
    );
    assert!(
        start.success(),
        "{start:?}\n{}",
        c.journal("fleet-agent.service")
    );
    c.wait_active("fleet-updater.service", READY_TIMEOUT);
    assert_eq!(show(&c, "fleet-agent.service", "User"), "fleet-agent");
    // A hung Podman child is killed with the agent: the main
    // process by SIGTERM first, what is left of the cgroup after it.
    assert_eq!(show(&c, "fleet-agent.service", "KillMode"), "mixed");
    assert_eq!(
        running_agent(&c),
        format!("/usr/lib/harmony-fleet/fleet-agent-v{v}")
    );
    // It reached the host's nats-server as dev1, and Podman in the device.
    let info: DeviceInfo = poll_until("dev1.info in NATS", READY_TIMEOUT, || {
        status(&admin, StatusKey::Info)
    });
    assert_eq!(info.agent_version.as_str(), v);
    assert!(info.podman_version.is_some(), "{info:?}");

    // The operator's attempt: the test agent version over HTTPS from the host.
    let bytes = std::fs::read(test_agent_path(NEXT_AGENT)).expect("test agent");
    https.route("/fleet-agent-next", Behavior::Bytes(bytes.clone()));
    let attempt = AgentUpgradeAttempt {
        arch: AgentArch::X86_64,
        artifact_url: ArtifactUrl::parse(&https.url("/fleet-agent-next")).expect("url"),
        device_id: DeviceId::parse(DEVICE).expect("device"),
        max_bytes: MaxBytes::new(bytes.len() as u64).expect("max bytes"),
        sha256: Sha256Hex::of(&bytes),
        target_version: Version::parse(NEXT_AGENT).expect("version"),
        uuid: AttemptUuid::new_random(),
    };
    // The agent on main does not forward NATS intents yet (upgrade
    // forwarding lands separately): the test forwards the attempt itself,
    // over the updater socket as the agent would (as fleet-agent).
    kv(&admin, BUCKET_CONTROL)
        .put(
            &intent_key(&attempt.device_id),
            serde_json::to_vec(&attempt).expect("json"),
        )
        .expect("put the attempt");
    let request = |r: &UpdaterRequest, timeout| -> Response<UpdaterReply> {
        let line = c.socket_request(
            "fleet-agent",
            "/run/harmony-fleet/updater.sock",
            &serde_json::to_string(r).expect("json"),
            timeout,
        );
        Response::from_slice(line.as_bytes()).unwrap_or_else(|e| panic!("answer {line:?}: {e}"))
    };
    let answer = request(
        &UpdaterRequest::Upgrade {
            attempt: attempt.clone(),
        },
        UPGRADE_TIMEOUT,
    );
    assert!(
        matches!(answer, Response::Ok(_)),
        "{answer:?}\n{}",
        c.journal("fleet-updater.service")
    );
    let deadline = std::time::Instant::now() + UPGRADE_TIMEOUT;
    let done: UpgradeStatus = loop {
        let seen = match request(&UpdaterRequest::Status {}, SOCKET_STATUS_RESPONSE_TIMEOUT) {
            Response::Ok(r) => r.status,
            Response::Err(_) => None,
        };
        if let Some(s) = seen.as_ref().filter(|s| {
            s.attempt_uuid == attempt.uuid
                && matches!(
                    s.phase,
                    UpgradePhase::Complete | UpgradePhase::Failed | UpgradePhase::RollbackFailed
                )
        }) {
            break s.clone();
        }
        if std::time::Instant::now() >= deadline {
            panic!(
                "the upgrade did not finish within {UPGRADE_TIMEOUT:?}; last status {seen:?}\nupdater:\n{}\nagent:\n{}",
                c.journal("fleet-updater.service"),
                c.journal("fleet-agent.service")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        done.phase,
        UpgradePhase::Complete,
        "{done:?}\n{}\n{}",
        c.journal("fleet-updater.service"),
        c.journal("fleet-agent.service")
    );
    let upgraded = format!("/usr/lib/harmony-fleet/fleet-agent-v{NEXT_AGENT}");
    assert_eq!(readlink(&c), upgraded);
    assert_eq!(running_agent(&c), upgraded);
    c.wait_active("fleet-agent.service", READY_TIMEOUT);

    // A package upgrade: the updater restarts, the agent keeps the upgraded version and
    // keeps running.
    let agent_run = show(&c, "fleet-agent.service", "InvocationID");
    let updater_run = show(&c, "fleet-updater.service", "InvocationID");
    let out_dir = tempfile::tempdir().expect("tempdir");
    let next = build_package(
        "deb",
        Role::Device,
        Arch::Amd64,
        &format!("{v}.1"),
        out_dir.path(),
    );
    let said = c.install_deb(&next);
    assert!(said.contains("active agent kept"), "{said}");
    assert_eq!(readlink(&c), upgraded, "the package upgrade moved the link");
    assert_eq!(show(&c, "fleet-agent.service", "InvocationID"), agent_run);
    assert_eq!(c.active_state("fleet-agent.service"), "active");
    c.wait_active("fleet-updater.service", READY_TIMEOUT);
    assert_ne!(
        show(&c, "fleet-updater.service", "InvocationID"),
        updater_run
    );
    // Both agents stay installed.
    c.exec_ok(&[
        "test",
        "-x",
        &format!("/usr/lib/harmony-fleet/fleet-agent-v{v}"),
    ]);
}

#[test]
fn setup_repair_brings_a_quarantined_device_back_only_with_an_agent_that_starts() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &[DEVICE]);
    let v = workspace_version();
    let c = SystemdContainer::boot();
    c.install_device();
    c.configure_agent(&AgentSettings::for_fleet_server(DEVICE, &nats));
    let start = c.exec_with_timeout(
        &["systemctl", "start", "fleet-agent.service"],
        READY_TIMEOUT,
    );
    assert!(
        start.success(),
        "{start:?}\n{}",
        c.journal("fleet-agent.service")
    );

    // What a failed rollback leaves: the link on a candidate that cannot
    // run, the agent down, the journal in rollback-failed (fleet-common's
    // golden journal, its previous binary the installed agent).
    let previous = format!("/usr/lib/harmony-fleet/fleet-agent-v{v}");
    let broken = "/usr/lib/harmony-fleet/fleet-agent-v1.4.0";
    c.exec_ok(&[
        "systemctl",
        "stop",
        "fleet-updater.service",
        "fleet-agent.service",
    ]);
    c.write_file(broken, b"#!/bin/sh\nexit 1\n", 0o755);
    c.sh(&format!("ln -s {broken} {LINK}.x && mv -T {LINK}.x {LINK}"));
    let golden = std::fs::read_to_string(
        fleet_harness::workspace_root().join("common/tests/golden/journal.json"),
    )
    .expect("golden journal")
    .replace("/usr/lib/harmony-fleet/fleet-agent-v1.3.2", &previous)
    .replacen(
        "\"phase\": \"rolling-back\"",
        "\"phase\": \"rollback-failed\"",
        1,
    );
    c.write_file(
        "/var/lib/harmony-fleet/updater/journal.json",
        golden.as_bytes(),
        0o600,
    );
    c.exec_ok(&["systemctl", "start", "fleet-updater.service"]);
    let quarantined = || c.exec_ok(&["fleet-updater", "status"]);
    assert!(
        quarantined().contains("rollback-failed"),
        "{}",
        quarantined()
    );

    // A repair with an agent that does not start keeps the quarantine, and
    // the updater runs again.
    let failed = c.exec(&["fleet-updater", "setup", "--repair", "--select", "1.4.0"]);
    assert_eq!(failed.code, Some(1), "{failed:?}");
    assert!(failed.stderr.contains("did not start"), "{failed:?}");
    c.wait_active("fleet-updater.service", READY_TIMEOUT);
    assert!(
        quarantined().contains("rollback-failed"),
        "{}",
        quarantined()
    );

    // With the previous agent: it starts (READY under systemd), then the
    // quarantine is lifted.
    let repaired = c.exec_with_timeout(
        &["fleet-updater", "setup", "--repair", "--select", &v],
        READY_TIMEOUT,
    );
    assert!(
        repaired.success(),
        "{repaired:?}\n{}",
        c.journal("fleet-agent.service")
    );
    assert!(
        repaired.stdout.contains("quarantine lifted"),
        "{repaired:?}"
    );
    assert_eq!(readlink(&c), previous);
    assert_eq!(c.active_state("fleet-agent.service"), "active");
    assert_eq!(running_agent(&c), previous);
    c.wait_active("fleet-updater.service", READY_TIMEOUT);
    let after = quarantined();
    assert!(!after.contains("rollback-failed"), "{after}");
    c.sh("ls /var/lib/harmony-fleet/updater/journal.json.repaired-*");
}
