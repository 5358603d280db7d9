//! Agent upgrades end to end, with real parts only: a nats-server with the
//! fleet layout, the real `fleetctl`, the real `fleet-updater` (its test
//! build: fault points and short bounds) running its in-process supervisor
//! in place of systemd, and the real agent at two versions (this crate's
//! binary, and the same source compiled as [`UPGRADE_TEST_VERSION`] by
//! `make test-agents`), the new one served over HTTPS with a test CA.
//!
//! Every test watches `fleet-status` with `fleetctl watch` to see each
//! upgrade status the agents publish, and ends by checking what NATS says
//! against the device: the active link, the journal, the agent reporting.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::status;
use fleet_common::contracts::{
    DeviceInfo, Journal, SeenAttempts, UpgradePhase, UpgradeReason, UpgradeStatus, WorkloadsReport,
};
use fleet_common::validate::{Arch, AttemptUuid, Sha256Hex, Version};
use fleet_harness::{
    bin_path, device_password, device_root, poll_until, test_agent_path, test_updater_path,
    Behavior, ChildGuard, DeviceRoot, HttpsServer, NatsServer, NatsVersion, TestCa,
    NATS_ADMIN_PASSWORD, RELEASED_AGENT_VERSION, UPGRADE_TEST_VERSION,
};
use tempfile::TempDir;

/// Bounds for the updater under test (ms): generous for real agents on a
/// loaded 2-core machine, short where a test waits for one to run out.
const BOUNDS: &str = "https-connect=5000,https-request=60000,probe=60000,stop=20000,start=30000";
const BOUNDS_SHORT_START: &str =
    "https-connect=5000,https-request=60000,probe=60000,stop=20000,start=6000";
/// How long a whole upgrade, or a recovery, may take here.
const SETTLE: Duration = Duration::from_secs(120);
const DEVICE: &str = "dev1";

/// One device with its updater, a NATS server, an HTTPS server for
/// artifacts, and the operator's files.
struct Rig {
    nats: NatsServer,
    admin: nats::Connection,
    /// Kept for the life of the HTTPS server it signed.
    _ca: TestCa,
    https: HttpsServer,
    device: DeviceRoot,
    work: TempDir,
    updater_config: PathBuf,
    v1: String,
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

impl Rig {
    fn new(v: NatsVersion) -> Rig {
        Rig::with_agent(v, PathBuf::from(env!("CARGO_BIN_EXE_fleet-agent")))
    }

    /// A rig whose device starts on `agent` (installed as its compiled version).
    fn with_agent(v: NatsVersion, agent: PathBuf) -> Rig {
        assert_eq!(
            fleet_common::users::current_ids().0,
            0,
            "the upgrade tests run as root (the updater, and the agent it starts)"
        );
        let nats = NatsServer::start_fleet(v, &[DEVICE]);
        let admin = nats.admin();
        let ca = TestCa::new();
        let https = HttpsServer::start(&ca);
        let work = tempfile::tempdir().expect("tempdir");
        let pw = work.path().join("dev1-password");
        std::fs::write(&pw, format!("{}\n", device_password(DEVICE))).expect("write");
        std::fs::write(
            work.path().join("admin-password"),
            format!("{NATS_ADMIN_PASSWORD}\n"),
        )
        .expect("write");
        let v1 = compiled_version(&agent);
        let url = nats.url();
        let device = device_root(&agent, &v1, |root| {
            serde_json::json!({
                "device-id": DEVICE,
                "nats": {
                    "servers": [url],
                    "auth": {"method": "user-password", "user": DEVICE, "password-file": pw},
                },
                "podman": {"enabled": false},
                "intervals": {"heartbeat-secs": 1, "resync-secs": 2, "idle-heartbeat-secs": 1},
                "root": root,
            })
        });
        let updater_config = work.path().join("updater.json");
        std::fs::write(
            &updater_config,
            serde_json::json!({"ca-file": ca.ca_path(), "probe-user": "root"}).to_string(),
        )
        .expect("write");
        Rig {
            nats,
            admin,
            _ca: ca,
            https,
            device,
            work,
            updater_config,
            v1,
        }
    }

    /// `fleet-updater run` on the device root under the supervisor.
    fn launch_updater(&self, bounds: &str, fault: Option<&str>) -> ChildGuard {
        let mut cmd = Command::new(test_updater_path());
        cmd.arg("run")
            .arg("--root")
            .arg(self.device.path())
            .arg("--config")
            .arg(&self.updater_config)
            .args(["--service-manager", "supervisor"])
            .env("FLEET_UPDATER_TEST_BOUNDS", bounds)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("FLEET_UPDATER_FAULT");
        if let Some(f) = fault {
            cmd.env("FLEET_UPDATER_FAULT", f);
        }
        ChildGuard::spawn(cmd, "fleet-updater")
    }

    /// Starts the updater and waits until its recovery (with nothing to
    /// recover: its start of the agent) is complete.
    fn start_updater(&self, bounds: &str, fault: Option<&str>) -> ChildGuard {
        let u = self.launch_updater(bounds, fault);
        u.wait_for_line("recovery complete", SETTLE);
        u
    }

    fn fleetctl(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin_path("fleetctl"));
        c.args(args)
            .args(["--server", &self.nats.url(), "--password-file"])
            .arg(self.work.path().join("admin-password"))
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE");
        c
    }

    fn watch(&self) -> ChildGuard {
        let w = ChildGuard::spawn(self.fleetctl(&["watch"]), "fleetctl-watch");
        w.wait_for_line("watching fleet-status", SETTLE);
        w
    }

    /// Serves `bytes` as an artifact and writes a release of `version`
    /// pointing at it; returns the release file.
    fn release(&self, version: &str, artifact: Artifact) -> PathBuf {
        let path = format!("/releases/{version}/fleet-agent");
        let (sha, size) = match artifact {
            Artifact::File(p) => {
                let bytes = std::fs::read(&p).expect("read artifact");
                let out = (Sha256Hex::of(&bytes), bytes.len());
                self.https.route(&path, Behavior::File(p));
                out
            }
            Artifact::Bytes(b) => {
                let out = (Sha256Hex::of(&b), b.len());
                self.https.route(&path, Behavior::Bytes(b));
                out
            }
        };
        let arch = Arch::current().expect("a supported architecture");
        let release = serde_json::json!({
            "version": version,
            "artifacts": { arch.as_str(): {
                "artifact-url": self.https.url(&path),
                "sha256": sha,
                "max-bytes": size,
            }},
        });
        let file = self.work.path().join(format!("release-{version}.json"));
        std::fs::write(&file, release.to_string()).expect("write");
        file
    }

    /// `fleetctl upgrade dev1 --release <file>`: the attempt written.
    fn upgrade(&self, release: &Path) -> AttemptUuid {
        let out = self
            .fleetctl(&[
                "upgrade",
                DEVICE,
                "--release",
                release.to_str().expect("utf8"),
            ])
            .output()
            .expect("fleetctl upgrade");
        written(&out).unwrap_or_else(|| panic!("fleetctl upgrade wrote nothing: {out:?}"))
    }

    fn info(&self) -> Option<DeviceInfo> {
        status(&self.admin, DEVICE, "info")
    }

    /// Waits until the agent reporting is `version`, started after `since`.
    fn wait_reporting(&self, version: &str, since: fleet_common::Timestamp) -> DeviceInfo {
        poll_until(
            &format!("{DEVICE} reporting agent {version}"),
            SETTLE,
            || {
                self.info()
                    .filter(|i| i.agent_version.as_str() == version && i.agent_started_at >= since)
            },
        )
    }

    /// Waits until `<dev1>.upgrade` is terminal for `uuid`.
    fn wait_terminal(&self, uuid: AttemptUuid) -> UpgradeStatus {
        poll_until(
            &format!("a terminal upgrade status for {uuid}"),
            SETTLE,
            || {
                status::<UpgradeStatus>(&self.admin, DEVICE, "upgrade")
                    .filter(|s| s.attempt_uuid == uuid && s.phase.is_terminal())
            },
        )
    }

    fn journal(&self) -> Journal {
        serde_json::from_slice(&std::fs::read(self.device.layout.journal()).expect("journal"))
            .expect("a valid journal")
    }

    fn seen(&self) -> SeenAttempts {
        serde_json::from_slice(
            &std::fs::read(self.device.layout.seen_attempts()).expect("attempts seen"),
        )
        .expect("a valid record")
    }

    fn binary(&self, version: &str) -> PathBuf {
        self.device
            .layout
            .versioned_agent(&Version::parse(version).expect("version"))
    }
}

enum Artifact {
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// The attempt a `fleetctl upgrade` reports it wrote.
fn written(out: &Output) -> Option<AttemptUuid> {
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = text
        .trim()
        .strip_prefix(&format!("{DEVICE}: wrote attempt "))?;
    AttemptUuid::parse(rest.split(' ').next()?).ok()
}

/// The upgrade statuses `fleetctl watch` printed for dev1, as
/// `phase (reason)` strings, in order.
fn phases_seen(watch: &ChildGuard, uuid: AttemptUuid) -> Vec<String> {
    watch
        .lines()
        .iter()
        .filter_map(|l| {
            let rest = l.split_once(&format!(" {DEVICE} upgrade: "))?.1;
            rest.contains(&format!(", attempt {uuid}"))
                .then(|| rest.split(" to ").next().unwrap_or_default().to_owned())
        })
        .collect()
}

/// `want` appears in `seen` in this order (others may come between).
fn assert_in_order(seen: &[String], want: &[&str]) {
    let mut it = seen.iter();
    for w in want {
        assert!(
            it.any(|s| s == w),
            "expected {want:?} in this order within {seen:?}"
        );
    }
}

#[test]
fn an_upgrade_completes_and_the_new_agent_reports() {
    let rig = Rig::new(NatsVersion::V2_14);
    let mut updater = rig.start_updater(BOUNDS, None);
    let first = rig.wait_reporting(&rig.v1, fleet_common::Timestamp::from_unix_millis(0));
    let watch = rig.watch();
    let release = rig.release(
        UPGRADE_TEST_VERSION,
        Artifact::File(test_agent_path(UPGRADE_TEST_VERSION)),
    );

    let started = Instant::now();
    let uuid = rig.upgrade(&release);
    let done = rig.wait_terminal(uuid);
    let took = started.elapsed();
    eprintln!("fleetctl upgrade → complete in {took:?}");
    assert_eq!(
        (done.phase, done.reason),
        (UpgradePhase::Complete, Some(UpgradeReason::Ready)),
        "{done:#?}\n{}",
        updater.log()
    );
    assert_eq!(done.target_version.as_str(), UPGRADE_TEST_VERSION);
    let now = rig.wait_reporting(UPGRADE_TEST_VERSION, first.agent_started_at);
    assert!(now.agent_started_at > first.agent_started_at);
    assert_eq!(rig.device.active(), rig.binary(UPGRADE_TEST_VERSION));

    // Each phase was published: by the old agent up to its drain (with
    // why it stopped), by the new one from `starting` on.
    let seen = poll_until("the watcher to print complete", SETTLE, || {
        let seen = phases_seen(&watch, uuid);
        seen.iter().any(|p| p == "complete (ready)").then_some(seen)
    });
    assert_in_order(
        &seen,
        &[
            "preparing (accepted)",
            "stopping (updater)",
            "starting",
            "complete (ready)",
        ],
    );
    assert!(
        done.transitions
            .iter()
            .any(|t| t.phase == UpgradePhase::Starting),
        "{done:#?}"
    );
    // The record of attempts, shared by both versions, says it ended.
    poll_until("the attempt recorded as complete", SETTLE, || {
        rig.seen()
            .find(&uuid)
            .filter(|r| r.outcome.as_str() == "complete")
            .cloned()
    });
    assert_eq!(
        rig.journal().transaction.map(|t| t.attempt.uuid),
        Some(uuid)
    );
    assert!(updater.try_wait().is_none(), "the updater keeps running");
}

/// A mixed fleet: a device running the released agent 0.1.0 (a consumer per
/// device, generation 1) is served by today's server config and buckets,
/// follows `fleetctl workload` through the legacy keys, and upgrades to this
/// agent, which reads the same desired state without a consumer.
fn an_upgrade_from_the_released_agent(v: NatsVersion) {
    let released = test_agent_path(RELEASED_AGENT_VERSION);
    let rig = Rig::with_agent(v, released);
    assert_eq!(rig.v1, RELEASED_AGENT_VERSION);
    let mut updater = rig.start_updater(BOUNDS, None);
    let first = rig.wait_reporting(&rig.v1, fleet_common::Timestamp::from_unix_millis(0));
    let spec = rig.work.path().join("web.json");
    std::fs::write(&spec, r#"{"image":"localhost/fleet-test/sleeper:1"}"#).expect("write");
    let apply = |name: &str| {
        let out = rig
            .fleetctl(&[
                "workload",
                "apply",
                DEVICE,
                name,
                spec.to_str().expect("utf8"),
            ])
            .output()
            .expect("fleetctl workload apply");
        assert!(out.status.success(), "{out:?}");
    };
    let reported = |names: &[&str]| {
        poll_until(&format!("{names:?} reported"), SETTLE, || {
            status::<WorkloadsReport>(&rig.admin, DEVICE, "workloads")
                .filter(|r| r.workloads.keys().map(|w| w.as_str()).collect::<Vec<_>>() == names)
        })
    };
    apply("web");
    reported(&["web"]);

    let current = PathBuf::from(env!("CARGO_BIN_EXE_fleet-agent"));
    let target = compiled_version(&current);
    let release = rig.release(&target, Artifact::File(current));
    let uuid = rig.upgrade(&release);
    let done = rig.wait_terminal(uuid);
    assert_eq!(
        (done.phase, done.reason),
        (UpgradePhase::Complete, Some(UpgradeReason::Ready)),
        "{done:#?}\n{}",
        updater.log()
    );
    rig.wait_reporting(&target, first.agent_started_at);
    assert_eq!(rig.device.active(), rig.binary(&target));
    // The new agent reads the document fleetctl wrote beside the legacy
    // keys, and follows later changes without a consumer.
    apply("api");
    reported(&["api", "web"]);
    assert!(updater.try_wait().is_none(), "the updater keeps running");
}

#[test]
fn an_upgrade_from_the_released_agent_2_9() {
    an_upgrade_from_the_released_agent(NatsVersion::V2_9);
}

#[test]
fn an_upgrade_from_the_released_agent_2_14() {
    an_upgrade_from_the_released_agent(NatsVersion::V2_14);
}

#[test]
fn a_candidate_that_never_becomes_ready_rolls_back() {
    const NEVER: &str = "0.3.0-never-ready";
    let rig = Rig::new(NatsVersion::V2_14);
    let updater = rig.start_updater(BOUNDS_SHORT_START, None);
    let first = rig.wait_reporting(&rig.v1, fleet_common::Timestamp::from_unix_millis(0));
    let watch = rig.watch();
    // Passes its probe as the right version; never sends READY=1.
    let stand_in = format!(
        r#"#!/usr/bin/python3
import json, sys, time
if "--self-test" in sys.argv:
    print(json.dumps({{"version": "{NEVER}", "checks": [{{"name": "config", "ok": True}}]}}))
    sys.exit(0)
if sys.argv[1:2] == ["run"]:
    while True:
        time.sleep(3600)
sys.exit(2)
"#
    );
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "missing /usr/bin/python3: install the Debian package python3 (make deps)"
    );
    let release = rig.release(NEVER, Artifact::Bytes(stand_in.into_bytes()));
    let started = Instant::now();
    let uuid = rig.upgrade(&release);
    let done = rig.wait_terminal(uuid);
    eprintln!("never ready → failed in {:?}", started.elapsed());
    assert_eq!(
        (done.phase, done.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::StartFailed)),
        "{done:#?}\n{}",
        updater.log()
    );
    assert!(
        done.error
            .as_ref()
            .is_some_and(|e| e.as_str().contains("did not send READY=1")),
        "{done:#?}"
    );
    // The previous agent runs again, and said so before the end.
    rig.wait_reporting(&rig.v1, first.agent_started_at);
    assert_eq!(rig.device.active(), rig.binary(&rig.v1));
    let seen = poll_until("the watcher to print failed", SETTLE, || {
        let seen = phases_seen(&watch, uuid);
        seen.iter()
            .any(|p| p == "failed (start-failed)")
            .then_some(seen)
    });
    assert_in_order(
        &seen,
        &[
            "preparing (accepted)",
            "stopping (updater)",
            "rolling-back (start-failed)",
            "failed (start-failed)",
        ],
    );
    poll_until("the attempt recorded as failed", SETTLE, || {
        rig.seen()
            .find(&uuid)
            .filter(|r| r.outcome.as_str() == "failed")
            .cloned()
    });
}

#[test]
fn a_binary_that_is_not_the_target_exits_22_without_ready_and_rolls_back() {
    const CLAIMED: &str = "0.4.0-claimed";
    let rig = Rig::new(NatsVersion::V2_14);
    let updater = rig.start_updater(BOUNDS, None);
    let first = rig.wait_reporting(&rig.v1, fleet_common::Timestamp::from_unix_millis(0));
    // Its probe claims the target version; what runs is the old agent.
    let wrapper = format!(
        "#!/bin/sh\nif [ \"$1\" = --self-test ]; then echo '{{\"version\":\"{CLAIMED}\"}}'; exit 0; fi\nexec {} \"$@\"\n",
        env!("CARGO_BIN_EXE_fleet-agent")
    );
    let release = rig.release(CLAIMED, Artifact::Bytes(wrapper.into_bytes()));
    let uuid = rig.upgrade(&release);
    let done = rig.wait_terminal(uuid);
    assert_eq!(
        (done.phase, done.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::StartFailed)),
        "{done:#?}\n{}",
        updater.log()
    );
    let log = updater.log();
    assert!(
        log.contains(&format!(
            "this binary is fleet-agent {}, but the updater is starting {CLAIMED}",
            rig.v1
        )),
        "{log}"
    );
    assert!(
        log.contains("the agent exited with exit code 22 before sending READY=1"),
        "{log}"
    );
    rig.wait_reporting(&rig.v1, first.agent_started_at);
    assert_eq!(rig.device.active(), rig.binary(&rig.v1));
}

#[test]
fn an_updater_killed_during_the_cutover_recovers_and_nats_tells_the_truth() {
    let rig = Rig::new(NatsVersion::V2_9);
    let mut updater = rig.start_updater(BOUNDS, Some("after-switch-to-target"));
    let first = rig.wait_reporting(&rig.v1, fleet_common::Timestamp::from_unix_millis(0));
    let watch = rig.watch();
    let release = rig.release(
        UPGRADE_TEST_VERSION,
        Artifact::File(test_agent_path(UPGRADE_TEST_VERSION)),
    );
    let uuid = rig.upgrade(&release);
    {
        use std::os::unix::process::ExitStatusExt;
        let status = updater.wait_exit(SETTLE);
        assert_eq!(status.signal(), Some(6), "{}", updater.log());
    }
    // Killed with the old agent stopped and the link on the target.
    assert_eq!(rig.device.active(), rig.binary(UPGRADE_TEST_VERSION));
    let stopping = status::<UpgradeStatus>(&rig.admin, DEVICE, "upgrade").expect("a status");
    assert_eq!(
        (stopping.attempt_uuid, stopping.phase, stopping.reason),
        (uuid, UpgradePhase::Stopping, Some(UpgradeReason::Updater))
    );
    assert!(stopping.drain_duration_ms.is_some(), "{stopping:#?}");

    // systemd would restart it: recovery rolls back to the old agent.
    let recovered = rig.start_updater(BOUNDS, None);
    let done = rig.wait_terminal(uuid);
    assert_eq!(
        (done.phase, done.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Interrupted)),
        "{done:#?}\n{}",
        recovered.log()
    );
    rig.wait_reporting(&rig.v1, first.agent_started_at);
    assert_eq!(rig.device.active(), rig.binary(&rig.v1));
    let seen = poll_until("the watcher to print failed", SETTLE, || {
        let seen = phases_seen(&watch, uuid);
        seen.iter()
            .any(|p| p == "failed (interrupted)")
            .then_some(seen)
    });
    assert_in_order(
        &seen,
        &[
            "preparing (accepted)",
            "stopping (updater)",
            "rolling-back (interrupted)",
            "failed (interrupted)",
        ],
    );
    // The attempt ended: not sent again by the restarted agent.
    let requested = format!("upgrade to {UPGRADE_TEST_VERSION} requested");
    assert!(updater.log().contains(&requested));
    assert!(!recovered.log().contains(&requested), "{}", recovered.log());
    let journal = rig.journal();
    assert_eq!(journal.transaction.map(|t| t.attempt.uuid), Some(uuid));
}

#[test]
fn two_operators_racing_on_one_device_start_exactly_one_attempt() {
    let rig = Rig::new(NatsVersion::V2_14);
    let _updater = rig.start_updater(BOUNDS, None);
    rig.wait_reporting(&rig.v1, fleet_common::Timestamp::from_unix_millis(0));
    let release = rig.release(
        UPGRADE_TEST_VERSION,
        Artifact::File(test_agent_path(UPGRADE_TEST_VERSION)),
    );
    let release = release.to_str().expect("utf8").to_owned();
    let operators: Vec<std::process::Child> = (0..3)
        .map(|_| {
            rig.fleetctl(&["upgrade", DEVICE, "--release", &release])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn fleetctl")
        })
        .collect();
    let outs: Vec<Output> = operators
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    let winners: Vec<AttemptUuid> = outs.iter().filter_map(written).collect();
    assert_eq!(winners.len(), 1, "{outs:#?}");
    for o in &outs {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            text.contains("wrote attempt")
                || text.contains("already issued")
                || (o.status.code() == Some(7) && text.contains("lost the race")),
            "{text}"
        );
    }
    let done = rig.wait_terminal(winners[0]);
    assert_eq!(done.phase, UpgradePhase::Complete, "{done:#?}");
    // The device ran one transaction, the winner's.
    let journal = rig.journal();
    assert_eq!(
        journal.transaction.map(|t| t.attempt.uuid),
        Some(winners[0])
    );
    assert!(
        journal.finished.iter().all(|f| f.uuid == winners[0]),
        "{:?}",
        journal.finished
    );
    let seen = rig.seen();
    assert_eq!(seen.attempts.len(), 1, "{seen:#?}");
}

/// A device off while its intent was written (a device back after months
/// upgrades directly): at boot the updater's recovery holds its one mutator
/// while it starts the agent, so the agent's first request may be answered
/// `busy`; it is sent again and the upgrade completes.
#[test]
fn an_intent_written_while_the_device_was_off_is_carried_out_at_boot() {
    let rig = Rig::new(NatsVersion::V2_14);
    let release = rig.release(
        UPGRADE_TEST_VERSION,
        Artifact::File(test_agent_path(UPGRADE_TEST_VERSION)),
    );
    // No device info yet: fleetctl upgrade needs the arch, so the operator
    // wrote the intent with the arch known from the device's last report.
    let arch = Arch::current().expect("arch");
    rig.admin
        .request_timeout(
            "$KV.fleet-status.dev1.info",
            serde_json::to_vec(&serde_json::json!({
                "device-id": DEVICE, "agent-version": rig.v1, "arch": arch.as_str(),
                "os": "Debian", "kernel": "6.1", "boot-id": "earlier",
                "config-state": {"state": "configured"},
                "agent-started-at": "2026-01-01T00:00:00.000Z",
                "updated-at": "2026-01-01T00:00:00.000Z",
            }))
            .expect("json"),
            Duration::from_secs(10),
        )
        .expect("earlier report");
    let uuid = rig.upgrade(&release);
    let started = Instant::now();
    let updater = rig.start_updater(BOUNDS, None);
    let done = rig.wait_terminal(uuid);
    eprintln!("boot → complete in {:?}", started.elapsed());
    assert_eq!(
        done.phase,
        UpgradePhase::Complete,
        "{done:#?}\n{}",
        updater.log()
    );
    rig.wait_reporting(
        UPGRADE_TEST_VERSION,
        fleet_common::Timestamp::from_unix_millis(0),
    );
}

/// The updater busy with another attempt (here one a root user sent by
/// hand, stalled on its download): the agent's attempt fails at once with
/// reason `updater-unavailable`, naming the attempt under way.
#[test]
fn an_updater_busy_with_another_attempt_fails_the_agents_attempt() {
    use fleet_common::contracts::{AgentUpgradeAttempt, UpdaterReply, UpdaterRequest};
    use fleet_common::validate::{ArtifactUrl, DeviceId, MaxBytes};
    let rig = Rig::new(NatsVersion::V2_14);
    let updater = rig.start_updater(
        "https-connect=5000,https-request=10000,probe=60000,stop=20000,start=30000",
        None,
    );
    rig.wait_reporting(&rig.v1, fleet_common::Timestamp::from_unix_millis(0));
    rig.https.route("/stalled", Behavior::Stall);
    let by_hand = AgentUpgradeAttempt {
        arch: Arch::current().expect("arch"),
        artifact_url: ArtifactUrl::parse(&rig.https.url("/stalled")).expect("url"),
        device_id: DeviceId::parse(DEVICE).expect("id"),
        max_bytes: MaxBytes::new(1024 * 1024).expect("max"),
        sha256: Sha256Hex::of(b"never arrives"),
        target_version: Version::parse("0.9.0-by-hand").expect("v"),
        uuid: AttemptUuid::new_random(),
    };
    let socket = rig.device.layout.updater_socket();
    let request = UpdaterRequest::Upgrade {
        attempt: by_hand.clone(),
    };
    let by_hand_call = std::thread::spawn(move || {
        fleet_common::socket::call::<_, UpdaterReply>(&socket, &request, Duration::from_secs(120))
    });
    let socket = rig.device.layout.updater_socket();
    poll_until(
        "the hand-sent attempt preparing",
        SETTLE,
        || match fleet_common::socket::call::<_, UpdaterReply>(
            &socket,
            &UpdaterRequest::Status {},
            Duration::from_secs(15),
        ) {
            Ok(fleet_common::contracts::Response::Ok(r)) => r
                .status
                .filter(|s| s.attempt_uuid == by_hand.uuid && s.phase == UpgradePhase::Preparing),
            _ => None,
        },
    );

    let release = rig.release(
        UPGRADE_TEST_VERSION,
        Artifact::File(test_agent_path(UPGRADE_TEST_VERSION)),
    );
    let uuid = rig.upgrade(&release);
    let done = rig.wait_terminal(uuid);
    assert_eq!(
        (done.phase, done.reason),
        (
            UpgradePhase::Failed,
            Some(UpgradeReason::UpdaterUnavailable)
        ),
        "{done:#?}\n{}",
        updater.log()
    );
    let error = done.error.as_ref().expect("an error").to_string();
    assert!(
        error.starts_with("busy: another upgrade or a recovery is in progress")
            && error.contains(&format!(
                "attempt {} to 0.9.0-by-hand is preparing",
                by_hand.uuid
            )),
        "{error}"
    );
    let answer = by_hand_call.join().expect("join").expect("answered");
    assert!(format!("{answer:?}").contains("Failed"), "{answer:?}");
    assert_eq!(rig.device.active(), rig.binary(&rig.v1));
}
