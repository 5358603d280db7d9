//! Staged workload rollouts with real parts only: a nats-server with the
//! fleet layout, six devices running this agent and one running the
//! released agent 0.2.0, each with its own isolated Podman, and the real
//! `fleetctl`. A spec whose container exits at once halts the rollout after
//! its first batch: the agents of that batch revert to the spec they ran,
//! nothing is written to the others, and `rollout undo` puts the batch's
//! documents back. A good spec completes and `rollout undo` puts every
//! device back. The 0.2.0 device is left out with the version it needs, and
//! `workload apply` refuses the spec for it. An agent rollout state as
//! fleetctl 0.2 wrote it is still listed and shown.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use fleet_common::contracts::{
    DeviceInfo, HealthReport, HealthState, RolloutState, WorkloadHealth, WorkloadSpec,
};
use fleet_harness::{
    bin_path, device_password, poll_until, test_agent_path, ChildGuard, NatsServer, NatsVersion,
    Podman, NATS_ADMIN_PASSWORD, RELEASED_AGENT_0_2_VERSION,
};
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(120);
const NEW: [&str; 6] = ["wr-1", "wr-2", "wr-3", "wr-4", "wr-5", "wr-6"];
const OLD: &str = "old-1";
/// A container that stops on SIGTERM at once.
const SLEEPER: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

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

struct Dev {
    id: &'static str,
    /// Kept for the test: its containers go when it drops.
    _podman: Podman,
    _root: tempfile::TempDir,
    config: PathBuf,
    binary: PathBuf,
    agent: ChildGuard,
}

impl Dev {
    /// `fleet-agent node freeze|unfreeze` on the device.
    fn node(&self, what: &str) {
        let out = Command::new(&self.binary)
            .args(["node", what, "--config"])
            .arg(&self.config)
            .env_remove("NOTIFY_SOCKET")
            .output()
            .expect("fleet-agent node");
        assert!(out.status.success(), "{what}: {out:?}");
    }
}

struct Rig {
    nats: NatsServer,
    admin: nats::Connection,
    work: tempfile::TempDir,
    admin_pw: PathBuf,
    devices: Vec<Dev>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for d in &self.devices {
                eprintln!("--- {} ---\n{}", d.agent.name(), d.agent.log());
            }
        }
    }
}

fn start_device(id: &'static str, binary: &Path, url: &str, released: bool) -> Dev {
    let podman = Podman::new();
    podman.busybox_image();
    let root = tempfile::Builder::new()
        .prefix("fleet-wr-")
        .tempdir()
        .expect("tempdir");
    let pw = root.path().join("nats-password");
    std::fs::write(&pw, format!("{}\n", device_password(id))).expect("write");
    let config = json!({
        "device-id": id,
        "nats": {
            "servers": [url],
            "auth": {"method": "user-password", "user": id, "password-file": pw},
        },
        "podman": {
            "enabled": true,
            "binary": podman.binary(),
            "global-args": podman.global_args(),
            "containers-conf": podman.env().iter().find(|(k, _)| k == "CONTAINERS_CONF").map(|(_, v)| v.clone()),
            "pull-timeout-secs": 60,
            "command-timeout-secs": 60,
        },
        // 0.2.0 knows no keep-alive (it beats every heartbeat-secs).
        "intervals": if released {
            json!({"heartbeat-secs": 1, "resync-secs": 2})
        } else {
            json!({"heartbeat-secs": 1, "keepalive-secs": 1, "resync-secs": 2})
        },
        "root": root.path(),
    });
    let path = root.path().join("agent.json");
    std::fs::write(&path, config.to_string()).expect("write config");
    let mut cmd = Command::new(binary);
    cmd.arg("run")
        .arg("--config")
        .arg(&path)
        .envs(podman.env())
        .env("FLEET_LOG", "debug")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("INVOCATION_ID")
        .env_remove("JOURNAL_STREAM");
    let agent = ChildGuard::spawn(cmd, &format!("agent-{id}"));
    Dev {
        id,
        _podman: podman,
        _root: root,
        config: path,
        binary: binary.to_owned(),
        agent,
    }
}

impl Rig {
    fn start() -> Rig {
        let mut all: Vec<&str> = NEW.to_vec();
        all.push(OLD);
        let nats = NatsServer::start_fleet(NatsVersion::V2_14, &all);
        let admin = nats.admin();
        let work = tempfile::tempdir().expect("tempdir");
        let admin_pw = work.path().join("admin-password");
        std::fs::write(&admin_pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("write");
        let url = nats.url();
        let agent = bin_path("fleet-agent");
        let released = test_agent_path(RELEASED_AGENT_0_2_VERSION);
        let mut devices: Vec<Dev> = NEW
            .iter()
            .map(|id| start_device(id, &agent, &url, false))
            .collect();
        devices.push(start_device(OLD, &released, &url, true));
        let rig = Rig {
            nats,
            admin,
            work,
            admin_pw,
            devices,
        };
        for d in &rig.devices {
            poll_until(&format!("{} reporting", d.id), SETTLE, || {
                status::<DeviceInfo>(&rig.admin, d.id, "info")
            });
            let out = rig.fleetctl(&["device", "label", d.id, "ring=a"]);
            assert!(out.status.success(), "{out:?}");
        }
        let info: DeviceInfo = status(&rig.admin, OLD, "info").expect("info");
        assert_eq!(info.agent_version.as_str(), RELEASED_AGENT_0_2_VERSION);
        rig
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin_path("fleetctl"));
        c.args(args)
            .args(["--server", &self.nats.url(), "--password-file"])
            .arg(&self.admin_pw)
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE");
        c
    }

    fn fleetctl(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("fleetctl")
    }

    /// A spec file of a busybox container running `shell`.
    fn spec(&self, name: &str, shell: &str, tag: &str, health: bool) -> (String, String) {
        let mut v = json!({
            "image": fleet_harness::BUSYBOX_IMAGE,
            "command": ["sh", "-c", shell],
            "env": {"TAG": tag},
        });
        if health {
            v["health"] = json!({"healthy-after-secs": 1});
        }
        let text = v.to_string();
        let hash = WorkloadSpec::from_json(text.as_bytes())
            .expect("a valid spec")
            .spec_hash()
            .as_str()
            .to_owned();
        let file = self.work.path().join(format!("{name}.json"));
        std::fs::write(&file, &text).expect("write");
        (file.to_str().expect("utf8").to_owned(), hash)
    }

    fn health(&self, device: &str) -> Option<WorkloadHealth> {
        status::<HealthReport>(&self.admin, device, "health")
            .and_then(|r| r.workloads.into_iter().find(|(k, _)| k.as_str() == "web"))
            .map(|(_, h)| h)
    }

    fn wait_healthy(&self, device: &str, hash: &str) -> WorkloadHealth {
        poll_until(&format!("{device} healthy on {hash}"), SETTLE, || {
            self.health(device)
                .filter(|h| h.health == HealthState::Healthy && h.spec_hash.as_str() == hash)
        })
    }

    /// `fleet-desired` `<device>.<workload>`, what agents 0.1.0 read: the
    /// spec hash of its value (None: no key, or deleted).
    fn legacy(&self, device: &str, workload: &str) -> Option<String> {
        let store = nats::jetstream::new(self.admin.clone())
            .key_value("fleet-desired")
            .expect("bucket");
        let e = store
            .entry(&format!("{device}.{workload}"))
            .expect("entry")?;
        if e.operation != nats::kv::Operation::Put {
            return None;
        }
        Some(
            WorkloadSpec::from_json(&e.value)
                .expect("spec")
                .spec_hash()
                .as_str()
                .to_owned(),
        )
    }

    /// `<device>.desired`: its revision and the spec hash of `web`.
    fn document(&self, device: &str) -> (u64, Option<String>) {
        let store = nats::jetstream::new(self.admin.clone())
            .key_value("fleet-workloads")
            .expect("bucket");
        let Some(e) = store.entry(&format!("{device}.desired")).expect("entry") else {
            return (0, None);
        };
        let doc: serde_json::Value = serde_json::from_slice(&e.value).expect("json");
        let hash = doc["workloads"].get("web").map(|s| {
            WorkloadSpec::from_json(s.to_string().as_bytes())
                .expect("spec")
                .spec_hash()
                .as_str()
                .to_owned()
        });
        (e.revision, hash)
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The rollout id of the `started` event of a `--json` run.
fn started_id(log: &str) -> String {
    log.lines()
        .find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["event"] == "started").then(|| v["rollout"].as_str().map(str::to_owned))?
        })
        .unwrap_or_else(|| panic!("no started event:\n{log}"))
}

fn rollout_id(log: &str) -> String {
    let line = log
        .lines()
        .find(|l| l.contains(" started: "))
        .unwrap_or_else(|| panic!("no start line:\n{log}"));
    line.split_whitespace().nth(1).expect("id").to_owned()
}

#[test]
fn a_bad_workload_release_halts_after_its_first_batch_is_reverted_and_undone() {
    let rig = Rig::start();
    let (v1, h1) = rig.spec("v1", SLEEPER, "v1", true);
    let (plain, h_plain) = rig.spec("plain", SLEEPER, "plain", false);

    // The spec with `health` is refused for the 0.2.0 device, by name.
    let out = rig.fleetctl(&["workload", "apply", OLD, "web", &v1]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(
        text(&out).contains(
            "device old-1: agent 0.2.0 does not read the spec's `health` (it needs agent 0.3.0 or later)"
        ),
        "{}",
        text(&out)
    );
    assert_eq!(rig.document(OLD), (0, None), "nothing written");
    let out = rig.fleetctl(&["workload", "apply", "-l", "ring=a", "web", &v1]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(
        text(&out).contains("old-1: refused: agent 0.2.0 does not read the spec's `health`"),
        "{}",
        text(&out)
    );
    let out = rig.fleetctl(&["workload", "apply", OLD, "web", &plain]);
    assert!(out.status.success(), "{}", text(&out));
    for d in NEW {
        rig.wait_healthy(d, &h1);
    }
    poll_until("old-1 runs the plain spec", SETTLE, || {
        status::<fleet_common::contracts::WorkloadsReport>(&rig.admin, OLD, "workloads").filter(
            |r| {
                r.workloads.iter().any(|(k, w)| {
                    k.as_str() == "web"
                        && w.spec_hash.as_str() == h_plain
                        && w.state == fleet_common::contracts::WorkloadState::Running
                })
            },
        )
    });

    // Bad input is refused before anything is written.
    let (invalid, _) = {
        let file = rig.work.path().join("invalid.json");
        std::fs::write(
            &file,
            json!({"image": fleet_harness::BUSYBOX_IMAGE, "health": {"interval-secs": 0}})
                .to_string(),
        )
        .expect("write");
        (file.to_str().expect("utf8").to_owned(), ())
    };
    let before: Vec<(u64, Option<String>)> = NEW.iter().map(|d| rig.document(d)).collect();
    let out = rig.fleetctl(&[
        "workload",
        "rollout",
        "-l",
        "ring=a",
        "web",
        &invalid,
        "--batches",
        "2,100%",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("interval-secs is 1 to 3600"),
        "{}",
        text(&out)
    );
    let out = rig.fleetctl(&["rollout", "ls"]);
    assert_eq!(text(&out).trim(), "no rollouts", "{}", text(&out));

    // A dry run says the batches and who is left out, and writes nothing.
    let (bad, h_bad) = rig.spec("bad", "exit 1", "bad", true);
    let out = rig.fleetctl(&[
        "workload",
        "rollout",
        "-l",
        "ring=a",
        "web",
        &bad,
        "--batches",
        "2,100%",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let dry = text(&out);
    eprintln!("--- dry run ---\n{dry}");
    assert!(dry.contains("batch 1/2: wr-1 wr-2\n"), "{dry}");
    assert!(dry.contains("batch 2/2: wr-3 wr-4 wr-5 wr-6\n"), "{dry}");
    assert!(dry.contains("old-1: left out: agent 0.2.0"), "{dry}");

    // The bad release: halts after batch 1, whose agents revert.
    let mut r = ChildGuard::spawn(
        rig.command(&[
            "workload",
            "rollout",
            "-l",
            "ring=a",
            "web",
            &bad,
            "--batches",
            "2,100%",
            "--success-threshold",
            "100%",
            "--batch-timeout",
            "90s",
        ]),
        "fleetctl-workload-rollout",
    );
    let exit = r.wait_exit(SETTLE);
    let log = r.log();
    assert_eq!(exit.code(), Some(8), "{log}");
    eprintln!("--- bad rollout ---\n{log}");
    let bad_id = rollout_id(&log);
    assert!(
        log.contains("old-1: left out: agent 0.2.0 does not read the spec's `health` (it needs agent 0.3.0 or later)"),
        "{log}"
    );
    assert!(log.contains("wr-1: wrote web spec "), "{log}");
    // Failed as soon as reported unhealthy on the spec, or reverted.
    let halted = log
        .lines()
        .find(|l| l.contains("halted: "))
        .unwrap_or_else(|| panic!("no halt line:\n{log}"));
    assert!(
        halted.contains(
            "halted: batch 1 of 2: 0 of 2 devices succeeded (0%), below the 100% threshold; failed: wr-1: "
        ),
        "{log}"
    );
    assert!(
        halted.contains(&format!("wr-1: unhealthy on spec {}", &h_bad[..12]))
            || halted.contains(&format!("wr-1: reverted to spec {}", &h1[..12])),
        "{log}"
    );
    for d in ["wr-1", "wr-2"] {
        assert_eq!(rig.document(d).1.as_deref(), Some(h_bad.as_str()), "{d}");
        let h = rig.wait_healthy(d, &h1);
        let rv = h.reverted.expect("reverted");
        assert_eq!(rv.failed_spec_hash.as_str(), h_bad, "{d}");
        assert_eq!(rv.restored_spec_hash.as_str(), h1, "{d}");
    }
    for (d, was) in NEW.iter().zip(&before).skip(2) {
        assert_eq!(&rig.document(d), was, "{d} was written\n{log}");
    }
    assert_eq!(rig.document(OLD).1.as_deref(), Some(h_plain.as_str()));
    let out = rig.fleetctl(&["rollout", "resume", &bad_id]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    eprintln!("--- resume ---\n{}", text(&out));
    let out = rig.fleetctl(&["rollout", "status", &bad_id]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("--- status ---\n{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "rollout {bad_id} (halted): workload web spec {} to 6 devices",
            &h_bad[..12]
        )),
        "{}",
        text(&out)
    );

    // Undo the halted one: batch 1's documents hold v1 again.
    let out = rig.fleetctl(&["rollout", "undo", &bad_id]);
    assert!(out.status.success(), "{}", text(&out));
    let undo = text(&out);
    eprintln!("--- undo ---\n{undo}");
    assert!(
        undo.contains(&format!("wr-1: put back: web spec {}", &h1[..12])),
        "{undo}"
    );
    assert!(
        undo.contains("undone: 2 devices put back, 0 already back, 0 changed since (left alone), 0 not put back"),
        "{undo}"
    );
    for d in NEW {
        assert_eq!(rig.document(d).1.as_deref(), Some(h1.as_str()), "{d}");
    }
    let again = rig.fleetctl(&["rollout", "undo", &bad_id]);
    assert!(
        text(&again).contains("wr-1: already on its previous spec"),
        "{}",
        text(&again)
    );

    // A good release completes on the six (wr-6 frozen: skipped, then
    // written by a resume once unfrozen); undo puts every device back.
    let (v2, h2) = rig.spec("v2", SLEEPER, "v2", true);
    let wr6 = &rig.devices[5];
    assert_eq!(wr6.id, "wr-6");
    wr6.node("freeze");
    poll_until("wr-6 reported frozen", SETTLE, || {
        status::<DeviceInfo>(&rig.admin, "wr-6", "info")
            .filter(|i| i.config_state.state.is_frozen())
    });
    let wr6_before = rig.document("wr-6");
    let mut r = ChildGuard::spawn(
        rig.command(&[
            "workload",
            "rollout",
            "-l",
            "ring=a",
            "web",
            &v2,
            "--batches",
            "2,100%",
            "--batch-timeout",
            "90s",
            "--json",
        ]),
        "fleetctl-workload-rollout-2",
    );
    let exit = r.wait_exit(SETTLE);
    let log = r.log();
    assert_eq!(exit.code(), Some(0), "{log}");
    eprintln!("--- good rollout ---\n{log}");
    assert!(log.contains("\"event\":\"complete\""), "{log}");
    let good_id = started_id(&log);
    assert!(
        log.contains("\"device\":\"wr-6\",\"event\":\"device\",\"rollout\":\"")
            && log.contains("\"state\":\"frozen\""),
        "{log}"
    );
    assert_eq!(
        rig.document("wr-6"),
        wr6_before,
        "a frozen device is not written"
    );
    wr6.node("unfreeze");
    poll_until("wr-6 reported unfrozen", SETTLE, || {
        status::<DeviceInfo>(&rig.admin, "wr-6", "info")
            .filter(|i| !i.config_state.state.is_frozen())
    });
    let out = rig.fleetctl(&["rollout", "resume", &good_id]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("wr-6: wrote web spec "),
        "{}",
        text(&out)
    );
    eprintln!("--- resume after unfreeze ---\n{}", text(&out));
    for d in NEW {
        rig.wait_healthy(d, &h2);
    }
    let out = rig.fleetctl(&["rollout", "undo", &good_id]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("undone: 6 devices put back, 0 already back"),
        "{}",
        text(&out)
    );
    for d in NEW {
        assert_eq!(rig.document(d).1.as_deref(), Some(h1.as_str()), "{d}");
        assert_eq!(rig.legacy(d, "web").as_deref(), Some(h1.as_str()), "{d}");
        rig.wait_healthy(d, &h1);
    }

    // A fleetctl killed mid-batch: another process resumes it and writes
    // no device twice.
    let v3 = {
        let file = rig.work.path().join("v3.json");
        std::fs::write(
            &file,
            json!({"image": fleet_harness::BUSYBOX_IMAGE, "command": ["sh", "-c", SLEEPER],
                   "env": {"TAG": "v3"}, "health": {"healthy-after-secs": 4}})
            .to_string(),
        )
        .expect("write");
        file.to_str().expect("utf8").to_owned()
    };
    let mut first = ChildGuard::spawn(
        rig.command(&[
            "workload",
            "rollout",
            "-l",
            "ring=a",
            "web",
            &v3,
            "--batches",
            "2,100%",
        ]),
        "fleetctl-killed",
    );
    first.wait_for_line("wr-2: wrote web spec ", SETTLE);
    first.kill();
    let killed_id = rollout_id(&first.log());
    let revisions: Vec<u64> = ["wr-1", "wr-2"].iter().map(|d| rig.document(d).0).collect();
    let mut second = ChildGuard::spawn(
        rig.command(&["rollout", "resume", &killed_id]),
        "fleetctl-resume",
    );
    let exit = second.wait_exit(SETTLE);
    let log2 = second.log();
    assert_eq!(exit.code(), Some(0), "{log2}");
    assert!(
        log2.contains(&format!("rollout {killed_id} resumed")),
        "{log2}"
    );
    let all = format!("{}{log2}", first.log());
    for d in NEW {
        assert_eq!(
            all.matches(&format!("{d}: wrote web spec ")).count(),
            1,
            "{d} written once\n{all}"
        );
    }
    for (d, rev) in ["wr-1", "wr-2"].iter().zip(revisions) {
        assert_eq!(rig.document(d).0, rev, "{d} written again\n{all}");
    }

    // An agent rollout state of fleetctl 0.2 is listed beside them.
    let old_state = std::fs::read(
        fleet_harness::workspace_root().join("common/tests/golden/rollout-state.json"),
    )
    .expect("golden rollout state");
    let parsed: RolloutState = serde_json::from_slice(&old_state).expect("an old state reads");
    nats::jetstream::new(rig.admin.clone())
        .key_value("fleet-operator")
        .expect("bucket")
        .put(&format!("rollouts.{}", parsed.id), old_state)
        .expect("put");
    let out = rig.fleetctl(&["rollout", "ls"]);
    let ls = text(&out);
    eprintln!("--- ls ---\n{ls}");
    assert!(out.status.success(), "{ls}");
    assert!(
        ls.contains(&format!(
            "{bad_id} (halted): workload web spec {}",
            &h_bad[..12]
        )),
        "{ls}"
    );
    assert!(
        ls.contains(&format!("{good_id} (complete): workload web spec")),
        "{ls}"
    );
    assert!(ls.contains("r-6d0b4c39 (halted): "), "{ls}");
    assert!(ls.contains(&format!("{killed_id} (complete): ")), "{ls}");
    let out = rig.fleetctl(&["rollout", "status", "r-6d0b4c39"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = rig.fleetctl(&["rollout", "undo", "r-6d0b4c39"]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));

    // A workload new to the device: undo removes it, the legacy key too.
    let out = rig.fleetctl(&[
        "workload",
        "rollout",
        "-l",
        "device in (wr-1)",
        "extra",
        &v3,
        "--batches",
        "100%",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let extra_id = started_id(&text(&out));
    assert!(rig.legacy("wr-1", "extra").is_some());
    let out = rig.fleetctl(&["rollout", "undo", &extra_id]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("wr-1: put back: extra removed (it did not have it)"),
        "{}",
        text(&out)
    );
    assert_eq!(rig.legacy("wr-1", "extra"), None, "the legacy key deleted");
}
