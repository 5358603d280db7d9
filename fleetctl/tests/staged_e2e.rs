//! A staged rollout with real parts only: a nats-server with the fleet
//! layout, three devices each running the real agent (Podman disabled:
//! containers do not matter here) under the real `fleet-updater` with its
//! in-process supervisor under a temporary root, and the real `fleetctl`.
//! The candidate is served over HTTPS and fails its probe: the rollout
//! halts after its first batch, and nothing is issued to the rest; a
//! `fleetctl` killed mid-batch is resumed by another without issuing
//! anything twice; the disruption budget holds at every status change.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use fleet_common::contracts::{DeviceInfo, UpgradePhase, UpgradeReason, UpgradeStatus};
use fleet_common::validate::{Arch, Sha256Hex, Version};
use fleet_harness::{
    bin_path, device_password, device_root, poll_until, Behavior, ChildGuard, DeviceRoot,
    HttpsServer, NatsServer, NatsVersion, ResponseSpec, TestCa, NATS_ADMIN_PASSWORD,
};

mod common;
use common::BudgetWatch;

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

/// A nats-server, an HTTPS server for artifacts, and [`DEVICES`] each with
/// its updater (which starts its agent) reporting the first version.
struct Rig {
    nats: NatsServer,
    admin: nats::Connection,
    _ca: TestCa,
    https: HttpsServer,
    work: tempfile::TempDir,
    admin_pw: PathBuf,
    devices: Vec<Device>,
    v1: String,
}

/// Holds the candidate's download until opened (the test's mid-batch window).
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn open(&self) {
        let (m, c) = &*self.0;
        *m.lock().expect("lock") = true;
        c.notify_all();
    }

    /// Waits until open, at most `SETTLE`.
    fn pass(&self) {
        let (m, c) = &*self.0;
        let open = m.lock().expect("lock");
        let _ = c.wait_timeout_while(open, SETTLE, |open| !*open);
    }
}

impl Rig {
    fn start() -> Rig {
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
                status::<DeviceInfo>(&admin, d.id, "info")
                    .filter(|i| i.agent_version.as_str() == v1)
            });
        }
        let rig = Rig {
            nats,
            admin,
            _ca: ca,
            https,
            work,
            admin_pw,
            devices,
            v1,
        };
        for d in DEVICES {
            let out = rig
                .fleetctl(&["device", "label", d, "ring=edge"])
                .output()
                .expect("fleetctl");
            assert!(out.status.success(), "{out:?}");
        }
        rig
    }

    fn fleetctl(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin_path("fleetctl"));
        c.args(args)
            .args(["--server", &self.nats.url(), "--password-file"])
            .arg(&self.admin_pw)
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE");
        c
    }

    /// A release of `version` whose candidate fails its self-test, served
    /// once `gate` (if any) opens; returns the release file.
    fn failing_release(&self, version: &str, gate: Option<Gate>) -> String {
        let stand_in = b"#!/usr/bin/python3\nimport sys\nif '--self-test' in sys.argv:\n    print('config: cannot read', file=sys.stderr)\n    sys.exit(1)\nsys.exit(2)\n".to_vec();
        let arch = Arch::current().expect("a supported architecture");
        let path = format!("/releases/{version}/fleet-agent");
        let release = serde_json::json!({
            "version": version,
            "artifacts": { arch.as_str(): {
                "artifact-url": self.https.url(&path),
                "sha256": Sha256Hex::of(&stand_in),
                "max-bytes": stand_in.len(),
            }},
        });
        match gate {
            None => self.https.route(&path, Behavior::Bytes(stand_in)),
            Some(g) => self.https.route(
                &path,
                Behavior::Handler(Box::new(move |_| {
                    g.pass();
                    ResponseSpec {
                        status: 200,
                        headers: Vec::new(),
                        body: stand_in.clone(),
                    }
                })),
            ),
        }
        let file = self.work.path().join(format!("release-{version}.json"));
        std::fs::write(&file, release.to_string()).expect("write");
        file.to_str().expect("utf8").to_owned()
    }

    /// Intents ever written to `device` (the bucket keeps 5).
    fn intent_revisions(&self, device: &str) -> usize {
        common::intent_revisions(&self.admin, device)
    }
}

#[test]
fn a_staged_rollout_whose_candidate_fails_its_probe_halts_after_the_first_batch() {
    let rig = Rig::start();
    let release = rig.failing_release("0.9.0-bad-probe", None);
    let mut rollout = ChildGuard::spawn(
        rig.fleetctl(&[
            "rollout",
            "--release",
            &release,
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
        ]),
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
    let s: UpgradeStatus = status(&rig.admin, "edge-1", "upgrade").expect("edge-1 upgrade status");
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Probe)),
        "{s:#?}"
    );
    assert_eq!(
        status::<DeviceInfo>(&rig.admin, "edge-1", "info")
            .expect("info")
            .agent_version
            .as_str(),
        rig.v1
    );
    assert_eq!(
        rig.devices[0].root.active(),
        rig.devices[0]
            .root
            .layout
            .versioned_agent(&Version::parse(&rig.v1).expect("version"))
    );
    // Nothing was issued to the rest.
    for id in ["edge-2", "edge-3"] {
        assert_eq!(rig.intent_revisions(id), 0, "{id} got an intent\n{log}");
        assert!(
            status::<UpgradeStatus>(&rig.admin, id, "upgrade").is_none(),
            "{id}"
        );
    }
}

/// fleetctl is killed while the first batch's device downloads; another
/// process resumes the rollout: it issues nothing twice and halts when the
/// probe fails.
#[test]
fn a_rollout_killed_mid_batch_resumes_from_another_process_without_duplicate_intents() {
    let rig = Rig::start();
    let gate = Gate::default();
    let release = rig.failing_release("0.9.1-bad-probe", Some(gate.clone()));
    let mut first = ChildGuard::spawn(
        rig.fleetctl(&["rollout", "--release", &release, "--batches", "1,100%"]),
        "fleetctl-rollout",
    );
    let started = first.wait_for_line(" started: ", SETTLE);
    let id = started.split_whitespace().nth(1).expect("id").to_owned();
    first.wait_for_line("edge-1: issued attempt ", SETTLE);
    poll_until("edge-1 preparing (its download held)", SETTLE, || {
        status::<UpgradeStatus>(&rig.admin, "edge-1", "upgrade")
            .filter(|s| s.phase == UpgradePhase::Preparing)
    });
    first.kill();
    let mut second =
        ChildGuard::spawn(rig.fleetctl(&["rollout", "resume", &id]), "fleetctl-resume");
    second.wait_for_line(&format!("rollout {id} resumed"), SETTLE);
    gate.open();
    let exit = second.wait_exit(SETTLE);
    let log = second.log();
    assert_eq!(exit.code(), Some(8), "{log}");
    assert!(!log.contains("issued attempt"), "issued again:\n{log}");
    assert!(log.contains("edge-1: failed: failed (probe)"), "{log}");
    assert!(log.contains("halted: batch 1 of 2"), "{log}");
    assert_eq!(rig.intent_revisions("edge-1"), 1, "{log}");
    for id in ["edge-2", "edge-3"] {
        assert_eq!(rig.intent_revisions(id), 0, "{id}\n{log}");
    }
}

/// Every device fails its probe, the threshold is 0%: the rollout runs to
/// its end, never more than one device upgrading at once.
#[test]
fn the_disruption_budget_holds_with_real_agents() {
    let rig = Rig::start();
    let release = rig.failing_release("0.9.2-bad-probe", None);
    let groups = DEVICES
        .iter()
        .map(|d| (d.to_string(), String::new()))
        .collect();
    let budget = BudgetWatch::start(rig.nats.admin(), groups);
    let mut r = ChildGuard::spawn(
        rig.fleetctl(&[
            "rollout",
            "--release",
            &release,
            "--batches",
            "100%",
            "--success-threshold",
            "0%",
            "--max-unavailable",
            "1",
            "--json",
        ]),
        "fleetctl-rollout",
    );
    let exit = r.wait_exit(SETTLE);
    let log = r.log();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("\"event\":\"complete\""), "{log}");
    for id in DEVICES {
        assert_eq!(rig.intent_revisions(id), 1, "{id}\n{log}");
        let s: UpgradeStatus = status(&rig.admin, id, "upgrade").expect("status");
        assert_eq!(s.phase, UpgradePhase::Failed, "{id}");
    }
    assert_eq!(budget.max().get(""), Some(&1), "{:?}\n{log}", budget.max());
}
