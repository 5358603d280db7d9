//! `fleetctl upgrade`, `rollout`, `status`, `watch` and `workload ls|rm`
//! against a real nats-server with the fleet layout. Device state is
//! written directly as the admin (what agents would publish), so every
//! skip rule is set up exactly: frozen, rollback-failed, failed releases,
//! unknown devices, other architectures.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AgentUpgradeAttempt, Bounded, ConfigState, ConfigStateReport, DeviceInfo, FieldExcerpt, Freeze,
    Heartbeat, IntentRef, IntentRule, RefusalReason, RefusedIntent, UpgradePhase, UpgradeReason,
    UpgradeStatus,
};
use fleet_common::subjects::kv_subject;
use fleet_common::validate::{Arch, AttemptUuid, BoundedText, DeviceId, Version};
use fleet_common::Timestamp;
use fleet_harness::{poll_until, ChildGuard, NatsServer, NatsVersion, NATS_ADMIN_PASSWORD};
use tempfile::TempDir;

const SHA: &str = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef";

struct Fleet {
    server: NatsServer,
    admin: nats::Connection,
    dir: TempDir,
    pw: PathBuf,
    release: PathBuf,
}

impl Fleet {
    fn start(v: NatsVersion) -> Fleet {
        Self::on(NatsServer::start_fleet(v, &[]))
    }

    /// On a server config without the cluster's presence: the status
    /// table's connection column then says `-` (presence itself is tested
    /// in agent/tests/presence.rs).
    fn start_without_presence(v: NatsVersion) -> Fleet {
        Self::on(NatsServer::start_fleet_without_presence(v, &[]))
    }

    fn on(server: NatsServer) -> Fleet {
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

    fn release(&self) -> &str {
        self.release.to_str().expect("utf8")
    }

    /// Puts `value` at `key` of `bucket` as the admin, acknowledged.
    fn put(&self, bucket: &str, key: &str, value: &[u8]) -> u64 {
        let ack = self
            .admin
            .request_timeout(&kv_subject(bucket, key), value, Duration::from_secs(10))
            .expect("ack");
        let v: serde_json::Value = serde_json::from_slice(&ack.data).expect("json");
        assert!(v.get("error").is_none(), "{v}");
        v["seq"].as_u64().expect("seq")
    }

    fn put_json<T: serde::Serialize>(&self, bucket: &str, key: &str, value: &T) -> u64 {
        self.put(bucket, key, &serde_json::to_vec(value).expect("json"))
    }

    fn info(&self, device: &str, version: &str, arch: Arch, frozen: bool) {
        self.put_json(
            "fleet-status",
            &format!("{device}.info"),
            &info(device, version, arch, frozen),
        );
    }

    fn intent(&self, device: &str) -> Option<AgentUpgradeAttempt> {
        let store = nats::jetstream::new(self.admin.clone())
            .key_value("fleet-control")
            .expect("bucket");
        store
            .get(&format!("{device}.agent-upgrade-intent"))
            .expect("get")
            .map(|b| serde_json::from_slice(&b).expect("a valid attempt"))
    }

    fn intent_revisions(&self, device: &str) -> usize {
        let store = nats::jetstream::new(self.admin.clone())
            .key_value("fleet-control")
            .expect("bucket");
        store
            .history(&format!("{device}.agent-upgrade-intent"))
            .map(|h| h.count())
            .unwrap_or(0)
    }
}

fn info(device: &str, version: &str, arch: Arch, frozen: bool) -> DeviceInfo {
    DeviceInfo {
        device_id: DeviceId::parse(device).expect("id"),
        agent_version: Version::parse(version).expect("v"),
        arch,
        os: BoundedText::truncate("Debian GNU/Linux 12 (bookworm)"),
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

fn status_of(
    a: &AgentUpgradeAttempt,
    phase: UpgradePhase,
    reason: Option<UpgradeReason>,
) -> UpgradeStatus {
    UpgradeStatus::begin(
        a.uuid,
        a.digest(),
        a.target_version.clone(),
        phase,
        reason,
        Timestamp::now(),
    )
}

fn release_attempt(device: &str) -> AgentUpgradeAttempt {
    let r = fleet_common::contracts::Release::from_json(
        format!(
            r#"{{"version":"2.0","artifacts":{{"x86_64":{{"artifact-url":"https://releases.example.com/2.0/x86_64","sha256":"{SHA}","max-bytes":1048576}}}}}}"#
        )
        .as_bytes(),
    )
    .expect("release");
    r.attempt(
        &DeviceId::parse(device).expect("id"),
        Arch::X86_64,
        AttemptUuid::new_random(),
    )
    .expect("x86_64")
}

/// `<device>: wrote attempt <uuid> (2.0 for x86_64, revision <n>)` → uuid.
fn written_uuid(line: &str, device: &str) -> AttemptUuid {
    let rest = line
        .strip_prefix(&format!("{device}: wrote attempt "))
        .unwrap_or_else(|| panic!("{line:?} is not a written line of {device}"));
    let (uuid, tail) = rest.split_once(' ').expect("uuid then details");
    assert!(tail.starts_with("(2.0 for x86_64, revision "), "{line}");
    AttemptUuid::parse(uuid).expect("uuid")
}

fn rollout_applies_the_rules(v: NatsVersion) {
    let f = Fleet::start(v);
    f.info("a-old", "1.0", Arch::X86_64, false);
    f.info("b-current", "2.0", Arch::X86_64, false);
    f.info("c-frozen", "1.0", Arch::X86_64, true);
    f.info("d-quarantined", "1.0", Arch::X86_64, false);
    let q = release_attempt("d-quarantined");
    f.put_json(
        "fleet-status",
        "d-quarantined.upgrade",
        &status_of(
            &q,
            UpgradePhase::RollbackFailed,
            Some(UpgradeReason::RollbackFailed),
        ),
    );
    f.info("e-arm", "1.0", Arch::Aarch64, false);
    f.info("f-failed", "1.0", Arch::X86_64, false);
    let failed = release_attempt("f-failed");
    f.put(
        "fleet-control",
        "f-failed.agent-upgrade-intent",
        &failed.canonical_json(),
    );
    f.put_json(
        "fleet-status",
        "f-failed.upgrade",
        &status_of(
            &failed,
            UpgradePhase::Failed,
            Some(UpgradeReason::StartFailed),
        ),
    );
    // Written to before it ever reported (only its intent exists).
    let early = release_attempt("g-silent");
    f.put(
        "fleet-control",
        "g-silent.agent-upgrade-intent",
        &early.canonical_json(),
    );
    let (code, out, err) = f.run(&["rollout", "--release", f.release()]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 7, "{out}");
    let a = written_uuid(lines[0], "a-old");
    assert_eq!(lines[1], "b-current: up to date (2.0)");
    assert_eq!(lines[2], "c-frozen: skipped: frozen (changefreeze): the agent holds upgrades while frozen; roll out again after the unfreeze, or use fleetctl upgrade to queue it");
    assert_eq!(lines[3], format!("d-quarantined: skipped: rollback-failed after attempt {}: its updater refuses every attempt until root repair on the device; once it is repaired, fleetctl upgrade with --retry issues the next attempt", q.uuid));
    assert_eq!(
        lines[4],
        "e-arm: skipped: the release has no aarch64 artifact: add one to the release file"
    );
    assert_eq!(lines[5], format!("f-failed: skipped: attempt {} of this release failed (start-failed): re-run with --retry to issue it again", failed.uuid));
    assert_eq!(lines[6], "g-silent: skipped: no device info: the device has never reported, so its version and architecture are unknown; start its agent first");
    assert_eq!(
        err,
        "rollout of 2.0 over 7 devices: 1 written, 1 up to date, 5 skipped\n"
    );
    let written = f.intent("a-old").expect("a-old has an intent");
    assert_eq!(written.uuid, a);
    assert_eq!(
        (
            written.device_id.as_str(),
            written.arch,
            written.target_version.as_str()
        ),
        ("a-old", Arch::X86_64, "2.0")
    );
    assert_eq!(written.sha256.as_str(), SHA);
    for untouched in ["b-current", "c-frozen", "d-quarantined", "e-arm"] {
        assert_eq!(f.intent(untouched), None, "{untouched}");
    }
    assert_eq!(f.intent("g-silent"), Some(early));
    assert_eq!(f.intent("f-failed"), Some(failed.clone()));

    // Again: the attempt under way is left alone; nothing new is written.
    let (code, out, _) = f.run(&["rollout", "--release", f.release()]);
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().next(),
        Some(
            format!(
                "a-old: skipped: attempt {a} of this release already issued (not picked up yet)"
            )
            .as_str()
        )
    );
    assert_eq!(f.intent_revisions("a-old"), 1);

    // --retry issues the failed release again, with a new UUID.
    let (code, out, err) = f.run(&["rollout", "--release", f.release(), "--retry"]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("f-failed:"))
        .expect("f-failed line");
    let retried = written_uuid(line, "f-failed");
    assert_ne!(retried, failed.uuid);
    assert_eq!(f.intent("f-failed").map(|a| a.uuid), Some(retried));
}

#[test]
fn rollout_applies_the_rules_2_9() {
    rollout_applies_the_rules(NatsVersion::V2_9);
}

#[test]
fn rollout_applies_the_rules_2_14() {
    rollout_applies_the_rules(NatsVersion::V2_14);
}

#[test]
fn upgrade_writes_by_cas_and_refuses_what_the_state_forbids() {
    let f = Fleet::start(NatsVersion::V2_14);
    let (code, _, err) = f.run(&["upgrade", "dev1", "--release", f.release()]);
    assert_eq!(code, 6, "{err}");
    assert_eq!(err, "fleetctl: dev1: no device info: the device has never reported, so its version and architecture are unknown; start its agent first; nothing written\n");

    f.info("dev1", "1.0", Arch::X86_64, true);
    let (code, out, err) = f.run(&["upgrade", "dev1", "--release", f.release()]);
    assert_eq!(code, 0, "{err}");
    let uuid = written_uuid(out.lines().next().expect("line"), "dev1");
    assert!(
        out.ends_with("; the device is frozen: its agent forwards it after the unfreeze\n"),
        "{out}"
    );
    let a = f.intent("dev1").expect("intent");
    assert_eq!(a.uuid, uuid);

    let (code, out, _) = f.run(&["upgrade", "dev1", "--release", f.release()]);
    assert_eq!(code, 0);
    assert_eq!(out, format!("dev1: attempt {uuid} of this release already issued (not picked up yet); nothing written\n"));
    f.put_json(
        "fleet-status",
        "dev1.upgrade",
        &status_of(&a, UpgradePhase::Starting, None),
    );
    let (_, out, _) = f.run(&["upgrade", "dev1", "--release", f.release()]);
    assert_eq!(
        out,
        format!(
            "dev1: attempt {uuid} of this release already issued (starting); nothing written\n"
        )
    );
    assert_eq!(f.intent_revisions("dev1"), 1);

    f.put_json(
        "fleet-status",
        "dev1.upgrade",
        &status_of(&a, UpgradePhase::Failed, Some(UpgradeReason::Probe)),
    );
    let (code, _, err) = f.run(&["upgrade", "dev1", "--release", f.release()]);
    assert_eq!(code, 6);
    assert_eq!(err, format!("fleetctl: dev1: attempt {uuid} of this release failed (probe): re-run with --retry to issue it again; nothing written\n"));
    let (code, out, err) = f.run(&["upgrade", "dev1", "--release", f.release(), "--retry"]);
    assert_eq!(code, 0, "{err}");
    assert_ne!(
        written_uuid(out.lines().next().expect("line"), "dev1"),
        uuid
    );
    assert_eq!(f.intent_revisions("dev1"), 2);

    f.info("dev1", "2.0", Arch::X86_64, false);
    let (code, out, _) = f.run(&["upgrade", "dev1", "--release", f.release()]);
    assert_eq!(
        (code, out.as_str()),
        (0, "dev1: up to date (runs 2.0); nothing written\n")
    );

    // Invalid input changes nothing and names the problem.
    let bad = f.dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"version":"2.1","artifacts":{"riscv":{}}}"#).expect("write");
    let (code, _, err) = f.run(&["upgrade", "dev1", "--release", bad.to_str().expect("utf8")]);
    assert_eq!(code, 3);
    assert!(
        err.contains("unknown field `riscv`, expected one of `x86_64`, `aarch64`, `armv7`"),
        "{err}"
    );
    let (code, _, err) = f.run(&["upgrade", "dev.1", "--release", f.release()]);
    assert_eq!(code, 3);
    assert!(err.contains("invalid device id \"dev.1\""), "{err}");
    assert_eq!(f.intent_revisions("dev1"), 2);
}

/// Several operators upgrading one device at once: exactly one attempt is
/// written; every other one is told it lost or sees the winner under way.
#[test]
fn racing_operators_write_exactly_one_attempt() {
    let f = Fleet::start(NatsVersion::V2_14);
    f.info("dev1", "1.0", Arch::X86_64, false);
    for round in 0..3 {
        let device = format!("race{round}");
        f.info(&device, "1.0", Arch::X86_64, false);
        let children: Vec<std::process::Child> = (0..4)
            .map(|_| {
                f.command(&["upgrade", &device, "--release", f.release()])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        let outs: Vec<Output> = children
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait"))
            .collect();
        let winners: Vec<AttemptUuid> = outs
            .iter()
            .filter(|o| o.status.code() == Some(0))
            .filter_map(|o| {
                let s = String::from_utf8_lossy(&o.stdout).into_owned();
                s.contains(": wrote attempt ")
                    .then(|| written_uuid(s.trim_end(), &device))
            })
            .collect();
        assert_eq!(winners.len(), 1, "{outs:?}");
        for o in &outs {
            let (out, err) = (
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr),
            );
            match o.status.code() {
                Some(0) => assert!(
                    out.contains(": wrote attempt ") || out.contains("already issued"),
                    "{out}"
                ),
                Some(7) => assert!(
                    err.contains(
                        "lost the race: another writer changed the intent since it was read"
                    ),
                    "{err}"
                ),
                other => panic!("exit {other:?}: {out}{err}"),
            }
        }
        assert_eq!(f.intent(&device).map(|a| a.uuid), Some(winners[0]));
        assert_eq!(f.intent_revisions(&device), 1);
    }
}

#[test]
fn status_shows_the_fleet_and_watch_follows_it() {
    let f = Fleet::start_without_presence(NatsVersion::V2_14);
    let (code, out, _) = f.run(&["status"]);
    assert_eq!((code, out.as_str()), (0, "no device has reported yet\n"));
    f.info("dev1", "1.0", Arch::X86_64, false);
    f.info("dev2", "2.0", Arch::Aarch64, true);
    let a = release_attempt("dev1");
    f.put_json(
        "fleet-status",
        "dev1.upgrade",
        &status_of(&a, UpgradePhase::Preparing, Some(UpgradeReason::Accepted)),
    );
    f.put(
        "fleet-status",
        "dev1.workloads",
        format!(r#"{{"workloads":{{"web":{{"state":"running","image":"localhost/web:1","spec-hash":"{SHA}","restarts":0,"since":"2026-01-01T00:00:00.000Z"}},"db":{{"state":"pending","image":"localhost/db:1","spec-hash":"{SHA}","restarts":0,"since":"2026-01-01T00:00:00.000Z"}}}},"observed-at":"2026-01-01T00:00:00.000Z"}}"#).as_bytes(),
    );
    let (code, out, err) = f.run(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "DEVICE  CONNECTION  AGENT  CONFIG        HEARTBEAT  UPGRADE                   WORKLOADS\n\
         dev1    -           1.0    configured    -          preparing (accepted) 2.0  1/2\n\
         dev2    -           2.0    changefreeze  -          -                         -\n"
    );
    let (code, out, _) = f.run(&["status", "--json"]);
    assert_eq!(code, 0);
    let rows: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(rows[0]["device"], "dev1");
    assert_eq!(rows[0]["upgrade"]["phase"], "preparing");
    assert_eq!(rows[0]["upgrade"]["attempt-uuid"], a.uuid.to_string());
    assert_eq!(
        (
            rows[0]["workloads-ready"].as_u64(),
            rows[0]["workloads-total"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert_eq!(rows[1]["config-state"], "changefreeze");
    assert_eq!(rows[1]["arch"], "aarch64");

    let watch = ChildGuard::spawn(f.command(&["watch"]), "fleetctl-watch");
    watch.wait_for_line("watching fleet-status", Duration::from_secs(20));
    f.put_json(
        "fleet-status",
        "dev3.heartbeat",
        &Heartbeat {
            at: Timestamp::now(),
            uptime_secs: 5,
            agent_version: Version::parse("1.0").expect("v"),
            config_state: ConfigStateReport {
                state: ConfigState::Configured,
                waiting_changes: 0,
                intent_waiting: false,
            },
            stopping: None,
            podman_unreachable: None,
        },
    );
    f.info("dev3", "1.0", Arch::X86_64, false);
    f.put_json(
        "fleet-status",
        "dev1.upgrade",
        &status_of(&a, UpgradePhase::Failed, Some(UpgradeReason::Download)),
    );
    let line = watch.wait_for_line(" dev1 upgrade: ", Duration::from_secs(20));
    assert!(
        line.ends_with(&format!(
            "dev1 upgrade: failed (download) to 2.0, attempt {}",
            a.uuid
        )),
        "{line}"
    );
    let info_line = watch.wait_for_line(" dev3 info: ", Duration::from_secs(20));
    assert!(
        info_line.ends_with("dev3 info: agent 1.0 (x86_64), configured"),
        "{info_line}"
    );
    assert!(
        !watch.log().contains("heartbeat"),
        "heartbeats only with --heartbeats:\n{}",
        watch.log()
    );
    let with_beats = ChildGuard::spawn(f.command(&["watch", "--heartbeats"]), "fleetctl-watch-hb");
    with_beats.wait_for_line("watching fleet-status", Duration::from_secs(20));
    f.put_json(
        "fleet-status",
        "dev3.heartbeat",
        &Heartbeat {
            at: Timestamp::now(),
            uptime_secs: 35,
            agent_version: Version::parse("1.0").expect("v"),
            config_state: ConfigStateReport {
                state: ConfigState::Configured,
                waiting_changes: 0,
                intent_waiting: false,
            },
            stopping: None,
            podman_unreachable: None,
        },
    );
    let hb = with_beats.wait_for_line(" dev3 heartbeat: ", Duration::from_secs(20));
    assert!(hb.ends_with("dev3 heartbeat: up 35 s, configured"), "{hb}");
}

/// An intent the agent refused without a valid attempt
/// identity shows in `status`, `status --json`, `device status` and
/// `watch`; a status an older agent wrote (an attempt's) still reads.
#[test]
fn refused_intents_show_in_status_device_status_and_watch() {
    let f = Fleet::start(NatsVersion::V2_14);
    f.info("dev1", "1.0", Arch::X86_64, false);
    // What an agent of the previous release writes, byte for byte.
    let a = release_attempt("dev1");
    let old = serde_json::to_vec(&status_of(
        &a,
        UpgradePhase::Failed,
        Some(UpgradeReason::Rejected),
    ))
    .expect("json");
    f.put("fleet-status", "dev1.upgrade", &old);
    let (code, out, err) = f.run(&["device", "status", "dev1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "upgrade: failed (rejected) to 2.0, attempt {}",
            a.uuid
        )),
        "{out}"
    );

    let watch = ChildGuard::spawn(f.command(&["watch"]), "fleetctl-watch");
    watch.wait_for_line("watching fleet-status", Duration::from_secs(20));
    let refused = RefusedIntent {
        reason: RefusalReason::Rejected,
        intent: IntentRef {
            sequence: Some(42),
            digest: fleet_common::validate::Sha256Hex::of(b"intent"),
            bytes: 250,
            uuid: Some(a.uuid),
        },
        rule: IntentRule::InvalidTargetVersion,
        fields: {
            let mut b = Bounded::default();
            b.push(FieldExcerpt::of("target-version", "1.0\u{0}\u{1b}[2J"));
            b
        },
        error: BoundedText::truncate(
            "the intent is not a valid attempt: invalid version \"1.0\\0\"",
        ),
        refused_at: Timestamp::from_unix_millis(0),
    };
    f.put_json("fleet-status", "dev1.upgrade", &refused);
    let (code, out, err) = f.run(&["device", "status", "dev1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "upgrade: failed (rejected): the intent at sequence 42 (250 bytes, attempt {}) was refused (invalid-target-version) at 1970-01-01T00:00:00.000Z; it was not sent to the updater\n  field target-version: \"1.0\\u{{0}}\\u{{1b}}[2J\" (8 characters)\n  error: the intent is not a valid attempt: invalid version \"1.0\\0\"\n",
            a.uuid
        )),
        "{out}"
    );
    assert!(!out.contains('\u{1b}'), "escaped: {out:?}");
    let (code, out, _) = f.run(&["status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("failed (rejected) intent: invalid-target-version"),
        "{out}"
    );
    let (code, out, _) = f.run(&["status", "--json"]);
    assert_eq!(code, 0);
    let rows: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(rows[0]["upgrade"]["phase"], "failed");
    assert_eq!(
        rows[0]["upgrade"]["refused-intent"]["intent"]["sequence"],
        42
    );
    assert_eq!(
        rows[0]["upgrade"]["refused-intent"]["rule"],
        "invalid-target-version"
    );
    let line = watch.wait_for_line("refused (invalid-target-version)", Duration::from_secs(20));
    assert!(
        line.ends_with("it was not sent to the updater; target-version \"1.0\\u{0}\\u{1b}[2J\"; error: the intent is not a valid attempt: invalid version \"1.0\\0\""),
        "{line}"
    );
}

#[test]
fn workload_ls_and_rm() {
    let f = Fleet::start(NatsVersion::V2_14);
    let spec = f.dir.path().join("web.json");
    std::fs::write(&spec, r#"{"image":"localhost/web:1"}"#).expect("write");
    let (code, out, _) = f.run(&["workload", "ls", "dev1"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "device dev1 has no desired workloads\n")
    );
    let (code, _, err) = f.run(&[
        "workload",
        "apply",
        "dev1",
        "web",
        spec.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{err}");
    fleet_harness::desired::put_workload(&f.admin, "dev1", "broken", "{\"image\":\"\"}");
    let (code, out, _) = f.run(&["workload", "ls", "dev1"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("broken: invalid spec ("), "{out}");
    assert!(
        lines[1].starts_with("web: image localhost/web:1, spec "),
        "{out}"
    );
    assert!(lines[1].ends_with(", not reported"), "{out}");
    let (code, out, _) = f.run(&["workload", "rm", "dev1", "web"]);
    assert_eq!((code, out.as_str()), (0, "deleted dev1.web\n"));
    let (_, out, _) = f.run(&["workload", "ls", "dev1"]);
    assert!(!out.contains("web:"), "{out}");
}

/// The target of `docs/development/bench.md`: a rollout over 10,000 devices
/// within 10 s (measured by `make bench` too; here with margin for a loaded
/// test machine).
#[test]
fn rollout_over_ten_thousand_devices() {
    const DEVICES: usize = 10_000;
    let f = Fleet::start(NatsVersion::V2_14);
    let started = Instant::now();
    for i in 0..DEVICES {
        let d = format!("dev{i:05}");
        let value = serde_json::to_vec(&info(&d, "1.0", Arch::X86_64, false)).expect("json");
        f.admin
            .publish(&kv_subject("fleet-status", &format!("{d}.info")), value)
            .expect("publish");
    }
    f.admin.flush().expect("flush");
    poll_until(
        "10,000 device infos stored",
        Duration::from_secs(60),
        || {
            let store = nats::jetstream::new(f.admin.clone())
                .key_value("fleet-status")
                .expect("bucket");
            (store.status().expect("status").values() as usize >= DEVICES).then_some(())
        },
    );
    eprintln!("set-up: {:?}", started.elapsed());
    let t = Instant::now();
    let (code, out, err) = f.run(&["rollout", "--release", f.release()]);
    let took = t.elapsed();
    eprintln!("rollout over {DEVICES} devices: {took:?}; {err}");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), DEVICES);
    assert!(out.lines().all(|l| l.contains(": wrote attempt ")));
    assert_eq!(
        err,
        format!(
            "rollout of 2.0 over {DEVICES} devices: {DEVICES} written, 0 up to date, 0 skipped\n"
        )
    );
    assert!(took < Duration::from_secs(30), "rollout took {took:?}");
    let t = Instant::now();
    let (code, out, _) = f.run(&["status"]);
    eprintln!("status over {DEVICES} devices: {:?}", t.elapsed());
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), DEVICES + 1);
}

/// `watch` keeps following across a server restart (its consumer is in
/// memory and gone with the server: it makes a new one).
#[test]
fn watch_follows_across_a_server_restart() {
    let mut f = Fleet::start(NatsVersion::V2_14);
    let watch = ChildGuard::spawn(f.command(&["watch"]), "fleetctl-watch");
    watch.wait_for_line("watching fleet-status", Duration::from_secs(20));
    f.info("dev1", "1.0", Arch::X86_64, false);
    watch.wait_for_line(" dev1 info: agent 1.0", Duration::from_secs(20));
    f.server.restart();
    f.admin = f.server.admin();
    watch.wait_for_line("following again", Duration::from_secs(60));
    let from = watch.line_count();
    f.info("dev2", "1.1", Arch::X86_64, false);
    watch.wait_for_line_after(from, " dev2 info: agent 1.1", Duration::from_secs(60));
}
