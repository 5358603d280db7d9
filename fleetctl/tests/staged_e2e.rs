//! A staged rollout with real parts only: a nats-server with the fleet
//! layout, three devices each running the real agent (Podman disabled:
//! containers do not matter here) under the real `fleet-updater` with its
//! in-process supervisor under a temporary root, and the real `fleetctl`.
//! The candidate is served over HTTPS and fails its probe: the rollout
//! halts after its first batch, and nothing is issued to the rest.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_common::contracts::{DeviceInfo, UpgradePhase, UpgradeReason, UpgradeStatus};
use fleet_common::validate::{Arch, Sha256Hex, Version};
use fleet_harness::{
    bin_path, device_password, device_root, poll_until, Behavior, ChildGuard, DeviceRoot,
    HttpsServer, NatsServer, NatsVersion, TestCa, NATS_ADMIN_PASSWORD,
};

const SETTLE: Duration = Duration::from_secs(120);
const DEVICES: [&str; 3] = ["edge-1", "edge-2", "edge-3"];

struct Device {
    id: &'static str,
    root: DeviceRoot,
    /// Kept running for the test (killed on drop).
    _updater: ChildGuard,
}

fn status<T: serde::de::DeserializeOwned>(
    admin: &nats::Connection,
    device: &str,
    key: &str,
) -> Option<T> {
    nats::jetstream::new(admin.clone())
        .key_value("fleet-status")
        .ok()?
        .get(&format!("{device}.{key}"))
        .ok()?
        .and_then(|b| serde_json::from_slice(&b).ok())
}

fn compiled_version(binary: &Path) -> String {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .expect("--version");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("fleet-agent ")
        .expect("fleet-agent <version>")
        .to_owned()
}

#[test]
fn a_staged_rollout_whose_candidate_fails_its_probe_halts_after_the_first_batch() {
    assert_eq!(
        fleet_common::users::current_ids().0,
        0,
        "this test runs as root (the updater, and the agent it starts)"
    );
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "missing /usr/bin/python3: install the Debian package python3 (make deps)"
    );
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &DEVICES);
    let admin = nats.admin();
    let ca = TestCa::new();
    let https = HttpsServer::start(&ca);
    let work = tempfile::tempdir().expect("tempdir");
    let admin_pw = work.path().join("admin-password");
    std::fs::write(&admin_pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("write");
    let updater_config = work.path().join("updater.json");
    std::fs::write(
        &updater_config,
        serde_json::json!({"ca-file": ca.ca_path(), "probe-user": "root"}).to_string(),
    )
    .expect("write");
    let agent = bin_path("fleet-agent");
    let v1 = compiled_version(&agent);
    let url = nats.url();
    let devices: Vec<Device> = DEVICES
        .iter()
        .map(|id| {
            let pw: PathBuf = work.path().join(format!("{id}-password"));
            std::fs::write(&pw, format!("{}\n", device_password(id))).expect("write");
            let root = device_root(&agent, &v1, |root| {
                serde_json::json!({
                    "device-id": id,
                    "nats": {
                        "servers": [url],
                        "auth": {"method": "user-password", "user": id, "password-file": pw},
                    },
                    "podman": {"enabled": false},
                    "intervals": {"heartbeat-secs": 1, "resync-secs": 2, "idle-heartbeat-secs": 1},
                    "root": root,
                })
            });
            let mut cmd = Command::new(bin_path("fleet-updater"));
            cmd.arg("run")
                .arg("--root")
                .arg(root.path())
                .arg("--config")
                .arg(&updater_config)
                .args(["--service-manager", "supervisor"])
                .env_remove("NOTIFY_SOCKET");
            let updater = ChildGuard::spawn(cmd, &format!("fleet-updater-{id}"));
            updater.wait_for_line("recovery complete", SETTLE);
            Device {
                id,
                root,
                _updater: updater,
            }
        })
        .collect();
    for d in &devices {
        poll_until(&format!("{} reporting agent {v1}", d.id), SETTLE, || {
            status::<DeviceInfo>(&admin, d.id, "info").filter(|i| i.agent_version.as_str() == v1)
        });
    }
    for d in &devices {
        let out = Command::new(bin_path("fleetctl"))
            .args(["device", "label", d.id, "ring=edge"])
            .args(["--server", &url, "--password-file"])
            .arg(&admin_pw)
            .output()
            .expect("fleetctl");
        assert!(out.status.success(), "{out:?}");
    }

    // The candidate: fails its self-test.
    const BAD: &str = "0.9.0-bad-probe";
    let stand_in = b"#!/usr/bin/python3\nimport sys\nif '--self-test' in sys.argv:\n    print('config: cannot read', file=sys.stderr)\n    sys.exit(1)\nsys.exit(2)\n".to_vec();
    let arch = Arch::current().expect("a supported architecture");
    let path = format!("/releases/{BAD}/fleet-agent");
    let release = serde_json::json!({
        "version": BAD,
        "artifacts": { arch.as_str(): {
            "artifact-url": https.url(&path),
            "sha256": Sha256Hex::of(&stand_in),
            "max-bytes": stand_in.len(),
        }},
    });
    https.route(&path, Behavior::Bytes(stand_in));
    let release_file = work.path().join("release.json");
    std::fs::write(&release_file, release.to_string()).expect("write");

    let mut rollout = ChildGuard::spawn(
        {
            let mut c = Command::new(bin_path("fleetctl"));
            c.args(["rollout", "--release"])
                .arg(&release_file)
                .args([
                    "-l",
                    "ring=edge",
                    "--batches",
                    "1,100%",
                    "--success-threshold",
                    "100%",
                    "--batch-timeout",
                    "2m",
                    "--max-unavailable",
                    "1",
                ])
                .args(["--server", &url, "--password-file"])
                .arg(&admin_pw);
            c
        },
        "fleetctl-rollout",
    );
    let exit = rollout.wait_exit(SETTLE);
    let log = rollout.log();
    assert_eq!(exit.code(), Some(8), "{log}");
    assert!(log.contains("batch 1/2 started: 1 devices"), "{log}");
    assert!(log.contains("edge-1: issued attempt "), "{log}");
    assert!(log.contains("edge-1: failed: failed (probe)"), "{log}");
    assert!(
        log.contains("halted: batch 1 of 2: 0 of 1 devices succeeded (0%), below the 100% threshold; failed: edge-1: failed (probe)"),
        "{log}"
    );
    // edge-1's updater says why, and its agent still runs the old version.
    let s: UpgradeStatus = status(&admin, "edge-1", "upgrade").expect("edge-1 upgrade status");
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Probe)),
        "{s:#?}"
    );
    assert_eq!(
        status::<DeviceInfo>(&admin, "edge-1", "info")
            .expect("info")
            .agent_version
            .as_str(),
        v1
    );
    assert_eq!(
        devices[0].root.active(),
        devices[0]
            .root
            .layout
            .versioned_agent(&Version::parse(&v1).expect("version"))
    );
    // Nothing was issued to the rest.
    let control = nats::jetstream::new(admin.clone())
        .key_value("fleet-control")
        .expect("bucket");
    for id in ["edge-2", "edge-3"] {
        assert!(
            control
                .get(&format!("{id}.agent-upgrade-intent"))
                .expect("get")
                .is_none(),
            "{id} got an intent\n{log}"
        );
        assert!(
            status::<UpgradeStatus>(&admin, id, "upgrade").is_none(),
            "{id}"
        );
    }
}
