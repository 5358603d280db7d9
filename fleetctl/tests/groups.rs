//! Operating many devices: labels, selectors, group workloads and staged
//! rollouts, against a real nats-server with the fleet layout. Device
//! facts and upgrade progress are written as the admin the way agents
//! publish them (a small simulator answers each intent), so every case is
//! set up exactly; `staged_e2e.rs` runs the same rollout with real agents
//! and updaters.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use fleet_common::contracts::{
    AgentUpgradeAttempt, ConfigState, ConfigStateReport, DesiredWorkloads, DeviceInfo, Freeze,
    Heartbeat, RolloutPhase, RolloutState, UpgradePhase, UpgradeReason, UpgradeStatus,
};
use fleet_common::subjects::kv_subject;
use fleet_common::validate::{Arch, BoundedText, DeviceId, Version};
use fleet_common::Timestamp;
use fleet_harness::{poll_until, ChildGuard, NatsServer, NatsVersion, NATS_ADMIN_PASSWORD};
use tempfile::TempDir;

mod common;
use common::BudgetWatch;

const SHA: &str = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef";
const SETTLE: Duration = Duration::from_secs(60);

struct Fleet {
    server: NatsServer,
    admin: nats::Connection,
    dir: TempDir,
    pw: PathBuf,
    release: PathBuf,
}

fn info(device: &str, version: &str, arch: Arch, os: &str, frozen: bool) -> DeviceInfo {
    DeviceInfo {
        device_id: DeviceId::parse(device).expect("id"),
        agent_version: Version::parse(version).expect("v"),
        arch,
        os: BoundedText::truncate(os),
        kernel: BoundedText::truncate("6.1.0"),
        podman_version: None,
        boot_id: BoundedText::truncate("boot"),
        config_state: ConfigStateReport {
            state: if frozen {
                ConfigState::Changefreeze(Freeze {
                    since: Timestamp::now(),
                    reason: Some(BoundedText::truncate("vehicle in motion")),
                    caller_uid: 0,
                })
            } else {
                ConfigState::Configured
            },
            waiting_changes: 0,
            intent_waiting: false,
        },
        agent_started_at: Timestamp::now(),
        updated_at: Timestamp::now(),
    }
}

fn heartbeat(version: &str) -> Heartbeat {
    Heartbeat {
        at: Timestamp::now(),
        uptime_secs: 10,
        agent_version: Version::parse(version).expect("v"),
        config_state: ConfigStateReport {
            state: ConfigState::Configured,
            waiting_changes: 0,
            intent_waiting: false,
        },
        stopping: None,
        podman_unreachable: None,
    }
}

fn put(admin: &nats::Connection, bucket: &str, key: &str, value: &[u8]) -> u64 {
    let ack = admin
        .request_timeout(&kv_subject(bucket, key), value, Duration::from_secs(10))
        .expect("ack");
    let v: serde_json::Value = serde_json::from_slice(&ack.data).expect("json");
    assert!(v.get("error").is_none(), "{v}");
    v["seq"].as_u64().expect("seq")
}

fn put_json<T: serde::Serialize>(admin: &nats::Connection, bucket: &str, key: &str, v: &T) {
    put(admin, bucket, key, &serde_json::to_vec(v).expect("json"));
}

impl Fleet {
    fn start(v: NatsVersion, devices: &[&str]) -> Fleet {
        // The devices here are simulated by writing their keys, never
        // connected: without presence, fleetctl judges them by heartbeat.
        let server = NatsServer::start_fleet_without_presence(v, devices);
        let admin = server.admin();
        let dir = tempfile::tempdir().expect("tempdir");
        let pw = dir.path().join("admin-pw");
        std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("write");
        let release = dir.path().join("release.json");
        std::fs::write(
            &release,
            format!(
                r#"{{"version":"2.0","artifacts":{{"x86_64":{{"artifact-url":"https://releases.example.com/2.0/x86_64","sha256":"{SHA}","max-bytes":1048576}}}}}}"#
            ),
        )
        .expect("write");
        Fleet {
            server,
            admin,
            dir,
            pw,
            release,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        c.args(args)
            .args(["--server", &self.server.url(), "--password-file"])
            .arg(&self.pw)
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE");
        c
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out: Output = self.command(args).output().expect("run fleetctl");
        (
            out.status.code().expect("exit code"),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "fleetctl {args:?}: {out}{err}");
        out
    }

    fn release(&self) -> &str {
        self.release.to_str().expect("utf8")
    }

    fn device(&self, id: &str, version: &str, arch: Arch, os: &str, frozen: bool) {
        put_json(
            &self.admin,
            "fleet-status",
            &format!("{id}.info"),
            &info(id, version, arch, os, frozen),
        );
        put_json(
            &self.admin,
            "fleet-status",
            &format!("{id}.heartbeat"),
            &heartbeat(version),
        );
    }

    /// The devices `device ls -l sel` lists.
    fn ls(&self, sel: &str) -> BTreeSet<String> {
        let out = self.ok(&["device", "ls", "-l", sel]);
        out.lines()
            .skip(1)
            .filter(|l| !l.ends_with(" devices"))
            .map(|l| l.split_whitespace().next().expect("a device").to_owned())
            .collect()
    }

    fn document(&self, device: &str) -> Option<(DesiredWorkloads, u64)> {
        let store = nats::jetstream::new(self.admin.clone())
            .key_value("fleet-workloads")
            .expect("bucket");
        store
            .entry(&format!("{device}.desired"))
            .expect("get")
            .filter(|e| !e.value.is_empty())
            .map(|e| (serde_json::from_slice(&e.value).expect("doc"), e.revision))
    }

    fn intent(&self, device: &str) -> Option<AgentUpgradeAttempt> {
        nats::jetstream::new(self.admin.clone())
            .key_value("fleet-control")
            .expect("bucket")
            .get(&format!("{device}.agent-upgrade-intent"))
            .expect("get")
            .map(|b| serde_json::from_slice(&b).expect("attempt"))
    }

    /// Intents ever written to `device` (the bucket keeps 5).
    fn intent_revisions(&self, device: &str) -> usize {
        common::intent_revisions(&self.admin, device)
    }

    fn rollout(&self, id: &str) -> RolloutState {
        let b = nats::jetstream::new(self.admin.clone())
            .key_value("fleet-operator")
            .expect("bucket")
            .get(&format!("rollouts.{id}"))
            .expect("get")
            .expect("the rollout's state");
        serde_json::from_slice(&b).expect("state")
    }

    fn staged(&self, extra: &[&str]) -> ChildGuard {
        let mut args = vec!["rollout", "--release", self.release()];
        args.extend_from_slice(extra);
        ChildGuard::spawn(self.command(&args), "fleetctl-rollout")
    }
}

/// `rollout r-xxxx started: ...` → the id.
fn rollout_id(g: &ChildGuard) -> String {
    let line = g.wait_for_line("started: ", SETTLE);
    line.split_whitespace().nth(1).expect("id").to_owned()
}

#[test]
fn labels_and_selectors_pick_exactly_the_matching_devices() {
    let f = Fleet::start(NatsVersion::V2_14, &["b1"]);
    f.device(
        "b1",
        "1.0",
        Arch::X86_64,
        "Debian GNU/Linux 12 (bookworm)",
        false,
    );
    f.device(
        "b2",
        "1.0",
        Arch::Aarch64,
        "Debian GNU/Linux 12 (bookworm)",
        false,
    );
    f.device("p1", "2.0", Arch::X86_64, "Ubuntu 24.04", true);
    f.device(
        "p2",
        "1.0",
        Arch::Armv7,
        "Debian GNU/Linux 12 (bookworm)",
        false,
    );
    f.device(
        "x1",
        "1.0",
        Arch::X86_64,
        "Debian GNU/Linux 12 (bookworm)",
        false,
    );
    let out = f.ok(&[
        "device",
        "label",
        "b1",
        "site=berlin",
        "env=prod",
        "tier=canary",
    ]);
    assert!(
        out.starts_with("b1: env=prod,site=berlin,tier=canary (revision "),
        "{out}"
    );
    f.ok(&["device", "label", "b2", "site=berlin", "env=stage"]);
    f.ok(&["device", "label", "p1", "site=paris", "env=prod", "legacy="]);
    f.ok(&["device", "label", "p2", "site=paris", "env=lab"]);
    // A label before the device ever reported: selectable already.
    f.ok(&["device", "label", "n1", "site=berlin"]);
    // Removal, and a changed value.
    f.ok(&["device", "label", "b1", "tier-", "env=prod"]);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    for (sel, want) in [
        ("site=berlin", &["b1", "b2", "n1"][..]),
        ("site==berlin", &["b1", "b2", "n1"]),
        ("site!=berlin", &["p1", "p2", "x1"]),
        ("env in (prod,stage)", &["b1", "b2", "p1"]),
        ("env notin (prod)", &["b2", "n1", "p2", "x1"]),
        ("legacy", &["p1"]),
        ("!legacy", &["b1", "b2", "n1", "p2", "x1"]),
        ("tier", &[]),
        ("site=berlin,env in (prod,stage),!legacy", &["b1", "b2"]),
        ("arch=x86_64", &["b1", "p1", "x1"]),
        ("arch in (aarch64,armv7)", &["b2", "p2"]),
        ("agent-version=2.0", &["p1"]),
        ("agent-version!=2.0", &["b1", "b2", "n1", "p2", "x1"]),
        ("os=ubuntu", &["p1"]),
        ("frozen=true", &["p1"]),
        ("config-state=configured,site", &["b1", "b2", "p2"]),
        ("device in (x1,b2)", &["b2", "x1"]),
        ("", &["b1", "b2", "n1", "p1", "p2", "x1"]),
    ] {
        assert_eq!(f.ls(sel), set(want), "selector {sel:?}");
    }
    let table = f.ok(&["device", "ls", "-l", "site=paris"]);
    assert_eq!(
        table,
        "DEVICE  AGENT  ARCH    CONFIG        LABELS\n\
         p1      2.0    x86_64  changefreeze  env=prod,legacy=,site=paris\n\
         p2      1.0    armv7   configured    env=lab,site=paris\n\
         2 devices\n"
    );
    let json: serde_json::Value =
        serde_json::from_str(&f.ok(&["device", "ls", "-l", "device=p1", "--json"])).expect("json");
    assert_eq!(
        json,
        serde_json::json!([{
            "device": "p1",
            "labels": {"env": "prod", "legacy": "", "site": "paris"},
            "facts": {"agent-version": "2.0", "arch": "x86_64", "config-state": "changefreeze",
                      "device": "p1", "frozen": "true", "os": "ubuntu"},
        }])
    );
    // Bad syntax: refused before anything is read, saying why.
    for (sel, says) in [
        ("env in (prod", "'(' without ')'"),
        ("site=ber lin", "may hold only letters"),
        ("env within (a)", "unknown operator"),
        ("site=berlin,", "an empty requirement"),
    ] {
        let (code, out, err) = f.run(&["device", "ls", "-l", sel]);
        assert_eq!(code, 2, "{sel}: {out}{err}");
        assert!(out.is_empty());
        assert!(err.contains(says) && err.contains("use key=value"), "{err}");
    }
    let (code, _, err) = f.run(&["device", "label", "b1", "os=hurd"]);
    assert_eq!(code, 2);
    assert!(err.contains("is the name of a device fact"), "{err}");
    // status -l and --group-by.
    let out = f.ok(&["status", "-l", "site", "--group-by", "site"]);
    assert!(out.contains("\nsite=berlin: 3 devices, agents 1.0 (2) unknown (1), 0 upgrading, 0 failed, 0 frozen, 1 stale heartbeats\n"), "{out}");
    assert!(out.contains("\nsite=paris: 2 devices, agents 1.0 (1) 2.0 (1), 0 upgrading, 0 failed, 1 frozen, 0 stale heartbeats\n"), "{out}");
    assert!(!out.contains("x1"), "{out}");
    // Devices never see labels: nothing of fleet-operator is theirs to read.
    let dev = f.server.device("b1");
    for subject in [
        "fleetapi.DIRECT.GET.KV_fleet-operator.$KV.fleet-operator.labels.b1",
        "$JS.API.DIRECT.GET.KV_fleet-operator.$KV.fleet-operator.labels.b1",
    ] {
        assert!(
            dev.request_timeout(subject, "", Duration::from_secs(2))
                .is_err(),
            "{subject} answered a device"
        );
    }
}

#[test]
fn a_group_apply_reaches_every_matching_device_and_no_other() {
    let f = Fleet::start(NatsVersion::V2_9, &[]);
    for d in ["b1", "b2", "b3", "p1"] {
        f.device(d, "1.0", Arch::X86_64, "Debian", false);
    }
    for d in ["b1", "b2", "b3"] {
        f.ok(&["device", "label", d, "site=berlin"]);
    }
    f.ok(&["device", "label", "p1", "site=paris"]);
    // b3 already runs web at another spec, and another workload.
    fleet_harness::desired::put_workload(&f.admin, "b3", "web", r#"{"image":"localhost/web:0"}"#);
    fleet_harness::desired::put_workload(&f.admin, "b3", "db", r#"{"image":"localhost/db:1"}"#);
    let spec = f.dir.path().join("web.json");
    std::fs::write(&spec, r#"{"image":"localhost/web:1"}"#).expect("write");
    let spec = spec.to_str().expect("utf8");

    let (code, out, err) = f.run(&[
        "workload",
        "apply",
        "-l",
        "site=berlin",
        "web",
        spec,
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("b1: would be added (web spec "),
        "{out}"
    );
    assert!(
        lines[2].starts_with("b3: would be changed (web spec "),
        "{out}"
    );
    assert!(
        err.starts_with(
            "dry run: web on 3 devices matching \"site=berlin\": 2 added, 1 changed, 0 unchanged"
        ),
        "{err}"
    );
    assert!(f.document("b1").is_none(), "a dry run wrote");

    let (code, out, err) = f.run(&["workload", "apply", "-l", "site=berlin", "web", spec]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .next()
            .expect("b1")
            .starts_with("b1: added (web spec "),
        "{out}"
    );
    assert!(out.contains("\nb3: changed (web spec "), "{out}");
    assert_eq!(
        err,
        "web on 3 devices matching \"site=berlin\": 2 added, 1 changed, 0 unchanged\n"
    );
    for d in ["b1", "b2", "b3"] {
        let (doc, _) = f.document(d).expect("a document");
        let web = doc
            .workloads
            .iter()
            .find(|(n, _)| n.as_str() == "web")
            .expect("web");
        assert_eq!(web.1.image.to_string(), "localhost/web:1", "{d}");
    }
    assert!(
        f.document("b3")
            .expect("b3")
            .0
            .workloads
            .keys()
            .any(|n| n.as_str() == "db"),
        "the other workload of b3 is kept"
    );
    assert!(f.document("p1").is_none(), "p1 is not in the group");
    // The legacy key too, while fleet-desired exists.
    assert!(nats::jetstream::new(f.admin.clone())
        .key_value("fleet-desired")
        .expect("bucket")
        .get("b2.web")
        .expect("get")
        .is_some());

    // Idempotent: nothing written again.
    let revs: Vec<u64> = ["b1", "b2", "b3"]
        .iter()
        .map(|d| f.document(d).expect("doc").1)
        .collect();
    // A device joins the group since.
    f.device("b4", "1.0", Arch::X86_64, "Debian", false);
    f.ok(&["device", "label", "b4", "site=berlin"]);
    let (code, out, err) = f.run(&["workload", "apply", "-l", "site=berlin", "web", spec]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("b1: unchanged (web spec "), "{out}");
    assert!(out.contains("\nb4: added (web spec "), "{out}");
    assert_eq!(
        err,
        "web on 4 devices matching \"site=berlin\": 1 added, 0 changed, 3 unchanged\n"
    );
    let after: Vec<u64> = ["b1", "b2", "b3"]
        .iter()
        .map(|d| f.document(d).expect("doc").1)
        .collect();
    assert_eq!(revs, after, "unchanged devices were written");

    let out = f.ok(&["workload", "ls", "-l", "site=berlin,device in (b3)"]);
    assert!(
        out.starts_with("b3: db: image localhost/db:1, spec "),
        "{out}"
    );
    assert!(
        out.contains("\nb3: web: image localhost/web:1, spec "),
        "{out}"
    );
    let (code, out, err) = f.run(&["workload", "rm", "-l", "device in (b1,b2,p1)", "web"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "b1: removed web\nb2: removed web\np1: has no web\n");
    assert!(f.document("b1").expect("b1").0.workloads.is_empty());
    assert!(!f.document("b3").expect("b3").0.workloads.is_empty());
}

/// Answers intents the way an agent and its updater report them: an
/// attempt goes `preparing` then, after `work`, `complete` (the agent then
/// reports the new version) or `failed (probe)` for the devices in `fail`.
struct Simulator {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Simulator {
    fn start(f: &Fleet, devices: &[&str], fail: &[&str], work: Duration) -> Simulator {
        let admin = f.server.admin();
        let devices: Vec<String> = devices.iter().map(|s| s.to_string()).collect();
        let fail: BTreeSet<String> = fail.iter().map(|s| s.to_string()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let store = nats::jetstream::new(admin.clone())
                .key_value("fleet-control")
                .expect("bucket");
            let mut handled: BTreeSet<String> = BTreeSet::new();
            let mut busy: Vec<(AgentUpgradeAttempt, std::time::Instant)> = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                for d in &devices {
                    let Ok(Some(b)) = store.get(&format!("{d}.agent-upgrade-intent")) else {
                        continue;
                    };
                    let Ok(a) = serde_json::from_slice::<AgentUpgradeAttempt>(&b) else {
                        continue;
                    };
                    if handled.insert(a.uuid.to_string()) {
                        let s = UpgradeStatus::begin(
                            a.uuid,
                            a.digest(),
                            a.target_version.clone(),
                            UpgradePhase::Preparing,
                            Some(UpgradeReason::Accepted),
                            Timestamp::now(),
                        );
                        put_json(&admin, "fleet-status", &format!("{d}.upgrade"), &s);
                        busy.push((a, std::time::Instant::now()));
                    }
                }
                let now = std::time::Instant::now();
                busy.retain(|(a, at)| {
                    if now.duration_since(*at) < work {
                        return true;
                    }
                    let d = a.device_id.as_str();
                    let failed = fail.contains(d);
                    let (phase, reason) = if failed {
                        (UpgradePhase::Failed, UpgradeReason::Probe)
                    } else {
                        (UpgradePhase::Complete, UpgradeReason::Ready)
                    };
                    let mut s = UpgradeStatus::begin(
                        a.uuid,
                        a.digest(),
                        a.target_version.clone(),
                        phase,
                        Some(reason),
                        Timestamp::now(),
                    );
                    if failed {
                        s.error = Some(BoundedText::truncate(
                            "the candidate's self-test failed: exit status 1",
                        ));
                    } else {
                        put_json(
                            &admin,
                            "fleet-status",
                            &format!("{d}.info"),
                            &info(d, a.target_version.as_str(), Arch::X86_64, "Debian", false),
                        );
                    }
                    put_json(&admin, "fleet-status", &format!("{d}.upgrade"), &s);
                    false
                });
                thread::sleep(Duration::from_millis(50));
            }
        });
        Simulator {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[test]
fn a_staged_rollout_halts_after_a_failing_first_batch() {
    let f = Fleet::start(NatsVersion::V2_14, &[]);
    let devices = ["d1", "d2", "d3", "d4", "d5", "d6"];
    for d in devices {
        f.device(d, "1.0", Arch::X86_64, "Debian", false);
    }
    f.device("other", "1.0", Arch::X86_64, "Debian", false);
    // Cannot take the release: left out, never counted in a batch.
    f.device("arm", "1.0", Arch::Aarch64, "Debian", false);
    for d in devices.iter().chain(&["arm"]) {
        f.ok(&["device", "label", d, "ring=a"]);
    }
    let _sim = Simulator::start(&f, &devices, &["d1"], Duration::from_millis(200));
    let mut r = f.staged(&[
        "-l",
        "ring=a",
        "--batches",
        "1,50%,100%",
        "--success-threshold",
        "95%",
        "--batch-timeout",
        "60s",
    ]);
    let id = rollout_id(&r);
    let status = r.wait_exit(SETTLE);
    let log = r.log();
    assert_eq!(status.code(), Some(8), "{log}");
    assert!(
        log.contains(
            "\narm: left out: the release has no aarch64 artifact: add one to the release file\n"
        ),
        "{log}"
    );
    assert!(
        log.contains(&format!("rollout {id}: batch 1/3 started: 1 devices")),
        "{log}"
    );
    assert!(
        log.contains(&format!("rollout {id}: d1: issued attempt ")),
        "{log}"
    );
    assert!(
        log.contains(&format!("rollout {id}: d1: failed: failed (probe): the candidate's self-test failed: exit status 1")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "rollout {id}: batch 1/3 ended: 0 succeeded, 1 failed, 0 frozen"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("rollout {id}: halted: batch 1 of 3: 0 of 1 devices succeeded (0%), below the 95% threshold; failed: d1: failed (probe): the candidate's self-test failed")),
        "{log}"
    );
    // Nothing issued to the rest, nor to the device outside the selector.
    for d in ["d2", "d3", "d4", "d5", "d6", "other"] {
        assert!(f.intent(d).is_none(), "{d} got an intent\n{log}");
    }
    let state = f.rollout(&id);
    assert_eq!(state.phase, RolloutPhase::Halted);
    assert_eq!(state.devices.len(), 6);
    assert_eq!(state.results[0].failed[0].device.as_str(), "d1");
    let out = f.ok(&["rollout", "status", &id]);
    assert!(
        out.starts_with(&format!(
            "rollout {id} (halted): 2.0 to 6 devices matching \"ring=a\""
        )),
        "{out}"
    );
    assert!(out.contains("  batch 1/3 (1 devices): 0 done, 1 failed, 0 in flight, 0 waiting, 0 frozen\n    d1: failed (probe): the candidate's self-test failed: exit status 1\n"), "{out}");
    assert!(
        out.contains(
            "  batch 2/3 (2 devices): 0 done, 0 failed, 0 in flight, 2 waiting, 0 frozen\n"
        ),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&f.ok(&["rollout", "status", &id, "--json"])).expect("json");
    assert_eq!(json["state"]["phase"], "halted");
    assert_eq!(json["batches"][0]["failures"][0]["device"], "d1");
    assert_eq!(json["batches"][1]["waiting"], 2);
    // A halted rollout is not resumed.
    let (code, _, err) = f.run(&["rollout", "resume", &id]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("halted"), "{err}");
    thread::sleep(Duration::from_millis(1500));
    for d in ["d2", "d3", "d4", "d5", "d6"] {
        assert!(f.intent(d).is_none(), "{d} got an intent");
    }
}

#[test]
fn a_killed_rollout_resumes_from_another_process_without_duplicate_intents_and_frozen_devices_are_picked_up(
) {
    let f = Fleet::start(NatsVersion::V2_9, &[]);
    let devices = ["d1", "d2", "d3", "d4", "d5", "d6"];
    for d in devices {
        f.device(d, "1.0", Arch::X86_64, "Debian", false);
    }
    // d5 is frozen.
    f.device("d5", "1.0", Arch::X86_64, "Debian", true);
    let _sim = Simulator::start(&f, &devices, &[], Duration::from_secs(3));
    let mut r = f.staged(&["--batches", "2,100%", "--batch-timeout", "60s", "--json"]);
    let first = r.wait_for_line("\"event\":\"started\"", SETTLE);
    let v: serde_json::Value = serde_json::from_str(&first).expect("json");
    let id = v["rollout"].as_str().expect("id").to_owned();
    // Mid-batch: the first two intents issued, not yet complete.
    r.wait_for_line("\"event\":\"issued\",", SETTLE);
    poll_until("both intents of batch 1", SETTLE, || {
        (f.intent("d1").is_some() && f.intent("d2").is_some()).then_some(())
    });
    r.kill();
    assert_eq!(f.rollout(&id).phase, RolloutPhase::Running);
    // Another process takes over.
    let mut again = ChildGuard::spawn(f.command(&["rollout", "resume", &id]), "fleetctl-resume");
    let status = again.wait_exit(SETTLE);
    let log = again.log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains(&format!("rollout {id}: complete")), "{log}");
    assert!(
        log.contains(&format!("rollout {id}: d5: frozen: ")),
        "{log}"
    );
    assert!(!log.contains("d1: issued"), "d1 issued again:\n{log}");
    for d in ["d1", "d2", "d3", "d4", "d6"] {
        assert_eq!(f.intent_revisions(d), 1, "{d}: intents written\n{log}");
        assert_eq!(f.intent(d).expect("intent").target_version.as_str(), "2.0");
    }
    assert!(f.intent("d5").is_none(), "the frozen device got an intent");
    let state = f.rollout(&id);
    assert_eq!(state.phase, RolloutPhase::Complete);
    assert_eq!(state.results.last().expect("results").frozen.len(), 1);
    // Unfrozen: resume picks it up.
    f.device("d5", "1.0", Arch::X86_64, "Debian", false);
    let mut last = ChildGuard::spawn(f.command(&["rollout", "resume", &id]), "fleetctl-resume-2");
    let status = last.wait_exit(SETTLE);
    let log = last.log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        log.contains(&format!("rollout {id}: d5: issued attempt ")),
        "{log}"
    );
    assert_eq!(f.intent_revisions("d5"), 1);
    for d in ["d1", "d2", "d3", "d4", "d6"] {
        assert_eq!(f.intent_revisions(d), 1, "{d}\n{log}");
    }
}

#[test]
fn the_disruption_budget_is_never_exceeded_and_an_abort_stops_it() {
    let f = Fleet::start(NatsVersion::V2_14, &[]);
    let mut groups = BTreeMap::new();
    let mut devices = Vec::new();
    for site in ["berlin", "paris"] {
        for i in 0..4 {
            let d = format!("{site}-{i}");
            f.device(&d, "1.0", Arch::X86_64, "Debian", false);
            f.ok(&["device", "label", &d, &format!("site={site}")]);
            groups.insert(d.clone(), site.to_owned());
            devices.push(d);
        }
    }
    let names: Vec<&str> = devices.iter().map(String::as_str).collect();
    let budget = BudgetWatch::start(f.server.admin(), groups);
    let sim = Simulator::start(&f, &names, &[], Duration::from_millis(700));
    let mut r = f.staged(&[
        "--batches",
        "100%",
        "--max-unavailable",
        "1",
        "--group-by",
        "site",
    ]);
    let status = r.wait_exit(SETTLE);
    assert_eq!(status.code(), Some(0), "{}", r.log());
    for d in &devices {
        assert_eq!(f.intent_revisions(d), 1, "{d}");
    }
    let max = budget.max();
    assert_eq!(max.get("berlin"), Some(&1), "{max:?}\n{}", r.log());
    assert_eq!(max.get("paris"), Some(&1), "{max:?}");
    drop(sim);

    // An abort stops a rollout: nothing issued after it.
    let f2 = Fleet::start(NatsVersion::V2_14, &[]);
    let devices = ["a1", "a2", "a3", "a4"];
    for d in devices {
        f2.device(d, "1.0", Arch::X86_64, "Debian", false);
    }
    // Slow devices: the first batch is still under way at the abort.
    let _sim = Simulator::start(&f2, &devices, &[], Duration::from_secs(30));
    let mut r = f2.staged(&["--batches", "1,100%"]);
    let id = rollout_id(&r);
    r.wait_for_line("a1: issued attempt", SETTLE);
    let out = f2.ok(&["rollout", "abort", &id]);
    assert_eq!(
        out,
        format!("rollout {id} aborted (was running): nothing more is issued; attempts already issued run to their end\n")
    );
    let status = r.wait_exit(SETTLE);
    assert_eq!(status.code(), Some(9), "{}", r.log());
    assert!(r.log().contains(&format!("rollout {id}: aborted")));
    assert_eq!(f2.rollout(&id).phase, RolloutPhase::Aborted);
    let (code, _, err) = f2.run(&["rollout", "resume", &id]);
    assert_eq!(code, 6, "{err}");
    for d in ["a2", "a3", "a4"] {
        assert!(f2.intent(d).is_none(), "{d} got an intent after the abort");
    }
    let out = f2.ok(&["rollout", "ls"]);
    assert!(
        out.starts_with(&format!(
            "{id} (aborted): 2.0 to 4 devices, batch 1/2, created "
        )),
        "{out}"
    );
}

/// A deployment from before labels: `status` and `rollout` work without
/// `fleet-operator`; what needs it says how to create it.
#[test]
fn commands_work_before_the_operator_bucket_exists() {
    let f = Fleet::start(NatsVersion::V2_9, &[]);
    f.device("dev1", "1.0", Arch::X86_64, "Debian", false);
    let reply = f
        .admin
        .request_timeout(
            "$JS.API.STREAM.DELETE.KV_fleet-operator",
            "",
            Duration::from_secs(10),
        )
        .expect("delete");
    assert!(
        String::from_utf8_lossy(&reply.data).contains("\"success\":true"),
        "{}",
        String::from_utf8_lossy(&reply.data)
    );
    let out = f.ok(&["status"]);
    assert!(out.contains("\ndev1 "), "{out}");
    assert!(f
        .ok(&["device", "ls", "-l", "arch=x86_64"])
        .contains("dev1"));
    let (code, _, err) = f.run(&["device", "label", "dev1", "site=berlin"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("fleetctl buckets create"), "{err}");
    let out = f.ok(&["buckets", "create"]);
    assert!(out.contains("fleet-operator: ready"), "{out}");
    f.ok(&["device", "label", "dev1", "site=berlin"]);
    assert_eq!(f.ls("site=berlin"), BTreeSet::from(["dev1".to_owned()]));
}

#[test]
fn upgrade_and_watch_take_a_selector() {
    let f = Fleet::start(NatsVersion::V2_14, &[]);
    for (d, site) in [("b1", "berlin"), ("b2", "berlin"), ("p1", "paris")] {
        f.device(d, "1.0", Arch::X86_64, "Debian", false);
        f.ok(&["device", "label", d, &format!("site={site}")]);
    }
    let (code, out, err) = f.run(&["upgrade", "-l", "site=berlin", "--release", f.release()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("b1: wrote attempt "), "{out}");
    assert!(out.contains("\nb2: wrote attempt "), "{out}");
    assert!(!out.contains("p1"), "{out}");
    assert!(f.intent("b1").is_some() && f.intent("b2").is_some());
    assert!(f.intent("p1").is_none(), "p1 is not in the group");

    let w = ChildGuard::spawn(f.command(&["watch", "-l", "site=paris"]), "fleetctl-watch");
    w.wait_for_line("watching fleet-status", SETTLE);
    f.device("b1", "1.1", Arch::X86_64, "Debian", false);
    f.device("p1", "1.1", Arch::X86_64, "Debian", false);
    // A device labelled into the group after the watch started.
    f.device("p2", "1.0", Arch::X86_64, "Debian", false);
    f.ok(&["device", "label", "p2", "site=paris"]);
    w.wait_for_line(" p1 info: agent 1.1 (x86_64), configured", SETTLE);
    // Membership is read again at most once a second: p2's next changes
    // are printed once it has been.
    poll_until("p2's change printed", SETTLE, || {
        f.device("p2", "1.2", Arch::X86_64, "Debian", false);
        w.try_wait_for_line(
            0,
            " p2 info: agent 1.2 (x86_64), configured",
            Duration::from_millis(300),
        )
    });
    assert!(!w.log().contains(" b1 "), "{}", w.log());
}

/// A staged rollout's NATS bookkeeping over 10,000 devices in 10 sites:
/// every tick reads the fleet (facts, heartbeats, upgrades, intents,
/// labels) and issues within the budget. Nobody answers, so batches end
/// by their timeout; with a 0% threshold the rollout runs to its end,
/// and the budget (200 per site) caps what was issued at 2,000.
#[test]
fn a_staged_rollout_over_ten_thousand_devices() {
    const DEVICES: usize = 10_000;
    let f = Fleet::start(NatsVersion::V2_14, &[]);
    let started = std::time::Instant::now();
    for i in 0..DEVICES {
        let d = format!("dev{i:05}");
        for (bucket, key, value) in [
            (
                "fleet-status",
                format!("{d}.info"),
                serde_json::to_vec(&info(&d, "1.0", Arch::X86_64, "Debian", false)),
            ),
            (
                "fleet-status",
                format!("{d}.heartbeat"),
                serde_json::to_vec(&heartbeat("1.0")),
            ),
            (
                "fleet-operator",
                format!("labels.{d}"),
                serde_json::to_vec(
                    &serde_json::json!({"labels": {"site": format!("s{}", i % 10)}}),
                ),
            ),
        ] {
            f.admin
                .publish(&kv_subject(bucket, &key), value.expect("json"))
                .expect("publish");
        }
    }
    f.admin.flush().expect("flush");
    poll_until("10,000 devices stored", Duration::from_secs(120), || {
        let n = |b: &str| {
            nats::jetstream::new(f.admin.clone())
                .key_value(b)
                .expect("bucket")
                .status()
                .expect("status")
                .values() as usize
        };
        (n("fleet-status") >= 2 * DEVICES && n("fleet-operator") >= DEVICES).then_some(())
    });
    eprintln!("set-up: {:?}", started.elapsed());
    let t = std::time::Instant::now();
    let (code, out, err) = f.run(&[
        "rollout",
        "--release",
        f.release(),
        "--batches",
        "1%,100%",
        "--success-threshold",
        "0%",
        "--batch-timeout",
        "2s",
        "--max-unavailable",
        "200",
        "--group-by",
        "site",
    ]);
    let took = t.elapsed();
    eprintln!("staged rollout over {DEVICES} devices (two 2 s batches): {took:?}");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("started: 2.0 to 10000 devices in 2 batches (100,10000)"),
        "{err}"
    );
    assert!(out.contains("batch 1/2 ended: 0 succeeded, 100 failed, 0 frozen (timed out)"));
    assert!(out.contains("batch 2/2 ended: 0 succeeded, 9900 failed, 0 frozen (timed out)"));
    assert_eq!(out.matches(": issued attempt ").count(), 2000);
    let intents = nats::jetstream::new(f.admin.clone())
        .key_value("fleet-control")
        .expect("bucket")
        .status()
        .expect("status")
        .values();
    assert_eq!(intents, 2000, "the budget of 200 per site");
    assert!(took < Duration::from_secs(60), "{took:?}");
}
