//! Golden JSON for every contract: the serialized form is pinned byte for
//! byte (files in `tests/golden/`), and each file parses back to the value.
//! A change here is a wire-format change: every deployed agent, updater and
//! fleetctl must still read it.
//!
//! `UPDATE_GOLDEN=1 cargo test -p fleet-common --test golden` rewrites the
//! files; review the diff as a protocol change.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;

use fleet_common::contracts::*;
use fleet_common::time::Timestamp;
use fleet_common::validate::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"))
}

/// Pretty JSON of `value` must equal the golden file, and the file must parse
/// back to `value`.
fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, value: &T) {
    let mut json = serde_json::to_string_pretty(value).expect("serialize");
    json.push('\n');
    let path = golden_path(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &json).expect("write golden");
    }
    let golden = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with UPDATE_GOLDEN=1 once", path.display()));
    assert_eq!(json, golden, "{name}: serialized form changed");
    let back: T = serde_json::from_str(&golden).expect("golden parses");
    assert_eq!(
        &back, value,
        "{name}: golden does not parse back to the value"
    );
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_795_959_871_000 + ms)
}

fn attempt() -> AgentUpgradeAttempt {
    AgentUpgradeAttempt {
        arch: Arch::X86_64,
        artifact_url: ArtifactUrl::parse("https://releases.example.com/fleet-agent/1.4.0/x86_64")
            .expect("url"),
        device_id: DeviceId::parse("truck-0042").expect("device"),
        max_bytes: MaxBytes::new(20 * 1024 * 1024).expect("max"),
        sha256: Sha256Hex::parse(
            "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef",
        )
        .expect("sha"),
        target_version: Version::parse("1.4.0").expect("version"),
        uuid: AttemptUuid::parse("0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10").expect("uuid"),
    }
}

#[test]
fn attempt_and_its_digest() {
    let a = attempt();
    check("attempt", &a);
    assert_eq!(
        String::from_utf8(a.canonical_json()).expect("utf8"),
        r#"{"arch":"x86_64","artifact-url":"https://releases.example.com/fleet-agent/1.4.0/x86_64","device-id":"truck-0042","max-bytes":20971520,"sha256":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","target-version":"1.4.0","uuid":"0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10"}"#
    );
    assert_eq!(
        a.digest().as_str(),
        "95e0c2de3579c0e58b459f78d4c188e86299ef0695024ea105d3faf964adae12"
    );
    // The digest is over the canonical form, whatever the key order or
    // whitespace the operator wrote.
    let reordered = r#"{ "uuid":"0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10", "target-version":"1.4.0",
        "sha256":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef",
        "max-bytes":20971520, "device-id":"truck-0042",
        "artifact-url":"https://releases.example.com/fleet-agent/1.4.0/x86_64", "arch":"x86_64" }"#;
    let parsed: AgentUpgradeAttempt = serde_json::from_str(reordered).expect("parses");
    assert_eq!(parsed.digest(), a.digest());
    let mut other = a.clone();
    other.max_bytes = MaxBytes::new(20 * 1024 * 1024 + 1).expect("max");
    assert_ne!(other.digest(), a.digest());
}

#[test]
fn attempt_refuses_bad_content() {
    let good = serde_json::to_value(attempt()).expect("value");
    let cases: &[(&str, serde_json::Value, &str)] = &[
        ("device-id", "a.b".into(), "invalid device id"),
        ("arch", "amd64".into(), "invalid arch"),
        ("target-version", "../../bin/sh".into(), "invalid version"),
        ("artifact-url", "http://x/y".into(), "invalid artifact url"),
        (
            "max-bytes",
            (200u64 * 1024 * 1024).into(),
            "invalid max-bytes",
        ),
        ("sha256", "ABC".into(), "invalid sha256"),
        ("uuid", "not-a-uuid".into(), "invalid attempt uuid"),
    ];
    for (field, bad, msg) in cases {
        let mut v = good.clone();
        v[*field] = bad.clone();
        let e = serde_json::from_value::<AgentUpgradeAttempt>(v).expect_err(field);
        assert!(e.to_string().contains(msg), "{field}: {e}");
    }
    let mut v = good.clone();
    v["source-version"] = "1.0".into();
    let e = serde_json::from_value::<AgentUpgradeAttempt>(v).expect_err("unknown field");
    assert!(
        e.to_string().contains("unknown field `source-version`"),
        "{e}"
    );
    let mut v = good;
    v.as_object_mut().expect("object").remove("sha256");
    assert!(serde_json::from_value::<AgentUpgradeAttempt>(v).is_err());
}

fn upgrade_status() -> UpgradeStatus {
    let a = attempt();
    let mut s = UpgradeStatus::begin(
        a.uuid,
        a.digest(),
        a.target_version.clone(),
        UpgradePhase::Preparing,
        Some(UpgradeReason::Accepted),
        t(0),
    );
    s.enter(
        UpgradePhase::Stopping,
        Some(UpgradeReason::Updater),
        t(4_000),
    );
    s.drain_duration_ms = Some(850);
    s.enter(UpgradePhase::Starting, None, t(5_000));
    s.enter(
        UpgradePhase::RollingBack,
        Some(UpgradeReason::StartFailed),
        t(245_000),
    );
    s.enter(
        UpgradePhase::Failed,
        Some(UpgradeReason::StartFailed),
        t(247_000),
    );
    s.detail = Some(BoundedText::truncate(
        "previous version 1.3.2 restored and running",
    ));
    s.error = Some(BoundedText::truncate(
        "fleet-agent.service did not report READY within 255 s",
    ));
    s.boot_id = Some(BoundedText::truncate("8c2f1a3e4b5d46f7a8b9c0d1e2f3a4b5"));
    s.invocation_id = Some(BoundedText::truncate("1e5f0c3d2b4a49c8b7a6f5e4d3c2b1a0"));
    s.journal_ref = Some(BoundedText::truncate(
        "_SYSTEMD_UNIT=fleet-agent.service _SYSTEMD_INVOCATION_ID=1e5f0c3d2b4a49c8b7a6f5e4d3c2b1a0",
    ));
    s
}

#[test]
fn upgrade_status_golden() {
    let s = upgrade_status();
    assert_eq!(s.transitions.len(), 5);
    assert_eq!(s.phase_changed_at, t(247_000));
    check("upgrade-status", &s);
    let minimal = UpgradeStatus::begin(
        attempt().uuid,
        attempt().digest(),
        attempt().target_version,
        UpgradePhase::Preparing,
        Some(UpgradeReason::Accepted),
        t(0),
    );
    check("upgrade-status-minimal", &minimal);
}

fn refused_intent() -> RefusedIntent {
    let mut fields = Bounded::default();
    fields.push(FieldExcerpt::of("target-version", "1.0/../../etc/x"));
    fields.push(FieldExcerpt::of(
        "uuid",
        "0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10",
    ));
    RefusedIntent {
        reason: RefusalReason::Rejected,
        intent: IntentRef {
            sequence: Some(42),
            digest: Sha256Hex::of(b"the intent as written"),
            bytes: 331,
            uuid: Some(attempt().uuid),
        },
        rule: IntentRule::InvalidTargetVersion,
        fields,
        error: BoundedText::truncate("the intent is not a valid attempt: invalid version \"1.0/../../etc/x\": use 1 to 64 ASCII characters from A-Z, a-z, 0-9, '.', '+', '_' and '-', starting with a letter or digit, without '..'"),
        refused_at: t(1_000),
    }
}

/// An intent without a valid attempt identity is
/// reported in its own form; both forms read as an `UpgradeReport`, and
/// every status an older agent wrote still reads (as an attempt).
#[test]
fn upgrade_report_golden_and_backward_readable() {
    let r = refused_intent();
    check("upgrade-refused-intent", &r);
    let minimal = RefusedIntent {
        reason: RefusalReason::Rejected,
        intent: IntentRef {
            sequence: None,
            digest: Sha256Hex::of(b"not json"),
            bytes: 8,
            uuid: None,
        },
        rule: IntentRule::Malformed,
        fields: Bounded::default(),
        error: BoundedText::truncate(
            "the intent is not a valid attempt: expected ident at line 1 column 2",
        ),
        refused_at: t(0),
    };
    check("upgrade-refused-intent-minimal", &minimal);
    check(
        "upgrade-refused-intent",
        &UpgradeReport::RefusedIntent(r.clone()),
    );
    check("upgrade-status", &UpgradeReport::Attempt(upgrade_status()));
    for name in ["upgrade-status", "upgrade-status-minimal"] {
        let old = std::fs::read_to_string(golden_path(name)).expect("golden");
        let report: UpgradeReport = serde_json::from_str(&old).expect(name);
        assert!(matches!(report, UpgradeReport::Attempt(_)), "{name}");
    }
    let v = serde_json::to_value(&r).expect("value");
    assert_eq!(
        (v["phase"].as_str(), v["reason"].as_str()),
        (Some("failed"), Some("rejected"))
    );

    // Refusals: another phase or reason, unescaped excerpts, too many
    // fields, neither form.
    let mut bad = v.clone();
    bad["phase"] = "complete".into();
    let e = serde_json::from_value::<UpgradeReport>(bad).expect_err("phase");
    assert!(
        e.to_string()
            .contains("a refused intent has phase failed, not complete"),
        "{e}"
    );
    let mut bad = v.clone();
    bad["reason"] = "download".into();
    let e = serde_json::from_value::<UpgradeReport>(bad).expect_err("reason");
    assert!(
        e.to_string()
            .contains("reason rejected or conflict, not download"),
        "{e}"
    );
    let mut bad = v.clone();
    bad["fields"][0]["excerpt"] = "1.0\u{0}\u{1b}[2J".into();
    let e = serde_json::from_value::<UpgradeReport>(bad).expect_err("raw control characters");
    assert!(
        e.to_string()
            .starts_with("invalid excerpt \"1.0\\0\\u{1b}[2J\""),
        "{e}"
    );
    let mut bad = v.clone();
    bad["fields"] = serde_json::Value::Array(vec![v["fields"][0].clone(); 9]);
    let e = serde_json::from_value::<UpgradeReport>(bad).expect_err("9 fields");
    assert!(
        e.to_string()
            .contains("9 entries, more than the limit of 8"),
        "{e}"
    );
    let e = serde_json::from_str::<UpgradeReport>(r#"{"phase":"failed"}"#).expect_err("neither");
    assert!(
        e.to_string()
            .starts_with("an upgrade report has attempt-uuid"),
        "{e}"
    );
}

#[test]
fn excerpts_are_bounded_and_escaped() {
    let cases = [
        ("1.0/../../etc/x", "1.0/../../etc/x", 15),
        ("1.0\u{0}", "1.0\\u{0}", 4),
        ("\u{ff11}.\u{ff10}", "\\u{ff11}.\\u{ff10}", 3),
        ("a\\u{0}\n\"", "a\\\\u{0}\\u{a}\"", 8),
    ];
    for (raw, excerpt, chars) in cases {
        let f = FieldExcerpt::of("target-version", raw);
        assert_eq!((f.excerpt.as_str(), f.chars), (excerpt, chars), "{raw:?}");
        assert_eq!(Excerpt::parse(excerpt), Ok(f.excerpt.clone()), "reads back");
    }
    let long = FieldExcerpt::of("target-version", &"1".repeat(256));
    assert_eq!(long.excerpt.as_str(), format!("{}…", "1".repeat(64)));
    assert_eq!(long.chars, 256);
    let worst = Excerpt::of(&"\u{10ffff}".repeat(1000));
    assert_eq!(worst.as_str().chars().count(), Excerpt::MAX_CHARS);
    assert_eq!(Excerpt::parse(worst.as_str()), Ok(worst.clone()));
    assert!(Excerpt::parse("x…y").is_err(), "… only at the end");
}

#[test]
fn every_phase_and_reason_is_kebab_case() {
    let phases = [
        (UpgradePhase::Preparing, "preparing"),
        (UpgradePhase::Stopping, "stopping"),
        (UpgradePhase::Starting, "starting"),
        (UpgradePhase::Complete, "complete"),
        (UpgradePhase::RollingBack, "rolling-back"),
        (UpgradePhase::Failed, "failed"),
        (UpgradePhase::RollbackFailed, "rollback-failed"),
    ];
    for (p, s) in phases {
        assert_eq!(serde_json::to_value(p).expect("json"), s);
        assert_eq!(p.as_str(), s);
    }
    let reasons = [
        UpgradeReason::Accepted,
        UpgradeReason::Updater,
        UpgradeReason::Ready,
        UpgradeReason::AlreadyActive,
        UpgradeReason::Download,
        UpgradeReason::Checksum,
        UpgradeReason::TooLarge,
        UpgradeReason::Artifact,
        UpgradeReason::Install,
        UpgradeReason::Probe,
        UpgradeReason::VersionMismatch,
        UpgradeReason::StopFailed,
        UpgradeReason::StartFailed,
        UpgradeReason::Interrupted,
        UpgradeReason::RollbackFailed,
        UpgradeReason::Rejected,
        UpgradeReason::Conflict,
        UpgradeReason::Quarantined,
        UpgradeReason::Frozen,
        UpgradeReason::UpdaterUnavailable,
    ];
    let names: Vec<String> = reasons
        .iter()
        .map(|r| {
            let v = serde_json::to_value(r).expect("json");
            assert_eq!(v, r.as_str());
            r.as_str().to_owned()
        })
        .collect();
    check("upgrade-reasons", &names);
    let journal_phases = [
        (JournalPhase::Preparing, "preparing"),
        (JournalPhase::Activating, "activating"),
        (JournalPhase::Committed, "committed"),
        (JournalPhase::RollingBack, "rolling-back"),
        (JournalPhase::Failed, "failed"),
        (JournalPhase::RollbackFailed, "rollback-failed"),
    ];
    for (p, s) in journal_phases {
        assert_eq!(serde_json::to_value(p).expect("json"), s);
    }
}

#[test]
fn status_refuses_more_than_16_transitions_and_long_text() {
    let mut v = serde_json::to_value(upgrade_status()).expect("value");
    let one = v["transitions"][0].clone();
    v["transitions"] = serde_json::Value::Array(vec![one; 17]);
    let e = serde_json::from_value::<UpgradeStatus>(v).expect_err("17 transitions");
    assert!(
        e.to_string()
            .contains("17 entries, more than the limit of 16"),
        "{e}"
    );
    let mut v = serde_json::to_value(upgrade_status()).expect("value");
    v["detail"] = "x".repeat(1025).into();
    let e = serde_json::from_value::<UpgradeStatus>(v).expect_err("long detail");
    assert!(
        e.to_string().contains("longer than the limit of 1024"),
        "{e}"
    );
    let mut s = upgrade_status();
    for i in 0..40 {
        let phase = if i % 2 == 0 {
            UpgradePhase::Stopping
        } else {
            UpgradePhase::Starting
        };
        s.enter(phase, None, t(300_000 + i));
    }
    assert_eq!(s.transitions.len(), 16);
}

fn journal() -> Journal {
    let a = attempt();
    let mut tx = Transaction {
        phase: JournalPhase::Preparing,
        reason: None,
        attempt_digest: a.digest(),
        attempt: a,
        previous_binary: "/usr/lib/harmony-fleet/fleet-agent-v1.3.2".into(),
        target_binary: "/usr/lib/harmony-fleet/fleet-agent-v1.4.0".into(),
        started_at: t(0),
        drain_duration_ms: None,
        errors: Bounded::default(),
        transitions: Transitions::default(),
    };
    tx.enter(JournalPhase::Preparing, None, t(0));
    tx.enter(JournalPhase::Activating, None, t(4_000));
    tx.record_error(
        "start-candidate",
        "fleet-agent.service did not report READY within 255 s",
        t(245_000),
    );
    tx.enter(
        JournalPhase::RollingBack,
        Some(UpgradeReason::StartFailed),
        t(245_000),
    );
    let mut finished = Bounded::default();
    finished.push(FinishedAttempt {
        uuid: AttemptUuid::parse("7d1b2c3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e").expect("uuid"),
        digest: Sha256Hex::of(b"an earlier attempt"),
        target_version: Version::parse("1.3.2").expect("version"),
        phase: JournalPhase::Committed,
        finished_at: Timestamp::from_unix_millis(1_795_000_000_000),
    });
    Journal {
        format: JOURNAL_FORMAT,
        transaction: Some(tx),
        finished,
    }
}

#[test]
fn journal_golden() {
    check("journal", &journal());
    check("journal-empty", &Journal::default());
    let mut v = serde_json::to_value(journal()).expect("value");
    v["transaction"]["phase"] = "idle".into();
    assert!(serde_json::from_value::<Journal>(v).is_err());
}

fn spec() -> WorkloadSpec {
    WorkloadSpec {
        image: ImageRef::parse("registry.example.com/telemetry:2.1").expect("image"),
        command: vec!["/bin/telemetry".into(), "--interval=5s".into()],
        env: BTreeMap::from([
            ("RUST_LOG".to_owned(), "info".to_owned()),
            ("UPLINK".to_owned(), "mqtt://10.0.0.1".to_owned()),
        ]),
        ports: vec![PortMapping {
            host: 8080,
            container: 80,
            protocol: Protocol::Tcp,
        }],
        volumes: vec![VolumeMount {
            source: "telemetry-data".into(),
            target: "/data".into(),
            read_only: false,
        }],
        restart: RestartPolicy::Always,
        pull: PullPolicy::Missing,
        memory_bytes: Some(64 * 1024 * 1024),
        health: None,
        update_strategy: UpdateStrategy::StopFirst,
    }
}

#[test]
fn workload_spec_golden_and_hash() {
    check("workload-spec", &spec());
    let minimal =
        WorkloadSpec::from_json(br#"{"image":"localhost/busybox:test"}"#).expect("minimal");
    check("workload-spec-minimal", &minimal);
    assert_eq!(minimal.restart, RestartPolicy::Always);
    assert_eq!(minimal.pull, PullPolicy::Missing);
    // The hash is canonical: the same spec written differently hashes equal.
    let written = br#"{"restart":"always","image":"localhost/busybox:test","command":[]}"#;
    assert_eq!(
        WorkloadSpec::from_json(written)
            .expect("parses")
            .spec_hash(),
        minimal.spec_hash()
    );
    let mut changed = minimal.clone();
    changed.command = vec!["sleep".into(), "1".into()];
    assert_ne!(changed.spec_hash(), minimal.spec_hash());
}

#[test]
fn workload_spec_refusals() {
    let cases: &[(&str, &str)] = &[
        (r#"{"image":"-rm"}"#, "invalid image"),
        (r#"{"image":"a b"}"#, "invalid image"),
        (
            r#"{"image":"x","privileged":true}"#,
            "unknown field `privileged`",
        ),
        (
            r#"{"image":"x","env":{"1X":"y"}}"#,
            "invalid environment variable name",
        ),
        (
            r#"{"image":"x","ports":[{"host":0,"container":80}]}"#,
            "invalid port mapping",
        ),
        (
            r#"{"image":"x","ports":[{"host":70000,"container":80}]}"#,
            "not valid JSON",
        ),
        (
            r#"{"image":"x","volumes":[{"source":"/etc/../root","target":"/r"}]}"#,
            "invalid volume",
        ),
        (
            r#"{"image":"x","volumes":[{"source":"data","target":"relative"}]}"#,
            "invalid volume",
        ),
        (r#"{"image":"x","restart":"sometimes"}"#, "not valid JSON"),
        (r#"{"image":"x","memory-bytes":0}"#, "invalid memory-bytes"),
        (
            r#"{"image":"x","command":["a\u0000b"]}"#,
            "contains a NUL character",
        ),
        (r#"not json"#, "not valid JSON"),
    ];
    for (json, msg) in cases {
        let e = WorkloadSpec::from_json(json.as_bytes()).expect_err(json);
        assert!(e.to_string().contains(msg), "{json}: {e}");
    }
}

#[test]
fn workloads_report_golden() {
    let report = WorkloadsReport {
        workloads: BTreeMap::from([
            (
                WorkloadName::parse("telemetry").expect("name"),
                WorkloadStatus {
                    state: WorkloadState::Running,
                    image: spec().image,
                    spec_hash: spec().spec_hash(),
                    container_id: Some("70a0eab752cc".into()),
                    restarts: 1,
                    last_error: None,
                    since: t(10_000),
                    waiting: None,
                },
            ),
            (
                WorkloadName::parse("camera").expect("name"),
                WorkloadStatus {
                    state: WorkloadState::BackOff,
                    image: ImageRef::parse("registry.example.com/camera:3").expect("image"),
                    spec_hash: Sha256Hex::of(b"camera"),
                    container_id: None,
                    restarts: 4,
                    last_error: Some(BoundedText::truncate(
                        "pulling registry.example.com/camera:3: connection refused",
                    )),
                    since: t(20_000),
                    waiting: None,
                },
            ),
        ]),
        observed_at: t(30_000),
        podman_unreachable: None,
    };
    assert_eq!(report.ready(), (1, 2));
    check("workloads-report", &report);
}

/// While Podman does not answer, the report says since when and
/// why; what was running is `unknown`, a new workload waits, saying why.
#[test]
fn workloads_report_with_podman_unreachable_golden() {
    let error = "podman ps has not answered within 2 s";
    let report = WorkloadsReport {
        workloads: BTreeMap::from([
            (
                WorkloadName::parse("telemetry").expect("name"),
                WorkloadStatus {
                    state: WorkloadState::Unknown,
                    image: spec().image,
                    spec_hash: spec().spec_hash(),
                    container_id: None,
                    restarts: 1,
                    last_error: None,
                    since: t(40_000),
                    waiting: None,
                },
            ),
            (
                WorkloadName::parse("camera").expect("name"),
                WorkloadStatus {
                    state: WorkloadState::Pending,
                    image: ImageRef::parse("registry.example.com/camera:3").expect("image"),
                    spec_hash: Sha256Hex::of(b"camera"),
                    container_id: None,
                    restarts: 0,
                    last_error: None,
                    since: t(41_000),
                    waiting: Some(BoundedText::truncate(format!(
                        "Podman unreachable: {error}"
                    ))),
                },
            ),
        ]),
        observed_at: t(42_000),
        podman_unreachable: Some(PodmanUnreachable {
            since: t(40_000),
            error: BoundedText::truncate(error),
        }),
    };
    assert_eq!(report.ready(), (0, 2));
    check("workloads-report-podman-unreachable", &report);
}

#[test]
fn applied_specs_golden() {
    let applied = AppliedSpecs {
        format: AppliedSpecs::FORMAT,
        workloads: BTreeMap::from([(WorkloadName::parse("telemetry").expect("name"), spec())]),
        written_at: t(0),
    };
    check("applied-specs", &applied);
    let bad = r#"{"format":1,"workloads":{},"written-at":"2026-11-29T13:44:31.000Z","extra":true}"#;
    assert!(serde_json::from_str::<AppliedSpecs>(bad).is_err());
}

fn frozen_report() -> ConfigStateReport {
    ConfigStateReport {
        state: ConfigState::Changefreeze(Freeze {
            since: t(0),
            reason: Some(BoundedText::truncate("vehicle in motion")),
            caller_uid: 0,
        }),
        waiting_changes: 2,
        intent_waiting: true,
    }
}

#[test]
fn device_info_heartbeat_and_freeze_golden() {
    let info = DeviceInfo {
        device_id: DeviceId::parse("truck-0042").expect("device"),
        agent_version: Version::parse("1.4.0").expect("version"),
        arch: Arch::Aarch64,
        os: BoundedText::truncate("Debian GNU/Linux 12 (bookworm)"),
        kernel: BoundedText::truncate("6.1.0-28-arm64"),
        podman_version: Some(BoundedText::truncate("4.3.1")),
        boot_id: BoundedText::truncate("8c2f1a3e-4b5d-46f7-a8b9-c0d1e2f3a4b5"),
        config_state: ConfigStateReport {
            state: ConfigState::Configured,
            waiting_changes: 0,
            intent_waiting: false,
        },
        agent_started_at: t(0),
        updated_at: t(1_000),
    };
    check("device-info", &info);
    let hb = Heartbeat {
        at: t(30_000),
        uptime_secs: 30,
        agent_version: Version::parse("1.4.0").expect("version"),
        config_state: frozen_report(),
        stopping: None,
        podman_unreachable: None,
    };
    check("heartbeat", &hb);
    let unhealthy = Heartbeat {
        config_state: ConfigStateReport {
            state: ConfigState::Configured,
            waiting_changes: 0,
            intent_waiting: false,
        },
        podman_unreachable: Some(PodmanUnreachable {
            since: t(20_000),
            error: BoundedText::truncate(
                "podman ps: podman did not finish within 60 s and was killed",
            ),
        }),
        ..hb.clone()
    };
    check("heartbeat-podman-unreachable", &unhealthy);
    let last = Heartbeat {
        at: t(31_000),
        uptime_secs: 31,
        agent_version: Version::parse("1.4.0").expect("version"),
        config_state: ConfigStateReport {
            state: ConfigState::Configured,
            waiting_changes: 0,
            intent_waiting: false,
        },
        stopping: Some(Stopping {
            at: t(31_000),
            drain_duration_ms: 2_150,
        }),
        podman_unreachable: None,
    };
    check("heartbeat-stopping", &last);
    let file = FreezeFile {
        format: FreezeFile::FORMAT,
        config_state: frozen_report().state,
        written_at: t(0),
    };
    check("freeze-file", &file);
    let thawed = FreezeFile {
        format: FreezeFile::FORMAT,
        config_state: ConfigState::Configured,
        written_at: t(5),
    };
    check("freeze-file-configured", &thawed);
    let bad = r#"{"format":1,"config-state":{"state":"changefreeze","since":"2026-11-29T13:44:31.000Z","caller-uid":0,"extra":1},"written-at":"2026-11-29T13:44:31.000Z"}"#;
    assert!(serde_json::from_str::<FreezeFile>(bad).is_err());
}

#[test]
fn socket_requests_and_responses_golden() {
    check("updater-request-status", &UpdaterRequest::Status {});
    check(
        "updater-request-upgrade",
        &UpdaterRequest::Upgrade { attempt: attempt() },
    );
    assert_eq!(
        serde_json::from_str::<UpdaterRequest>(r#"{"request":"status"}"#).expect("parses"),
        UpdaterRequest::Status {}
    );
    assert!(serde_json::from_str::<UpdaterRequest>(r#"{"request":"reboot"}"#).is_err());
    assert!(serde_json::from_str::<UpdaterRequest>(r#"{"request":"status","x":1}"#).is_err());
    check(
        "agent-request-freeze",
        &AgentRequest::Configstate {
            set: Some(ConfigStateName::Changefreeze),
            reason: Some(BoundedText::truncate("vehicle in motion")),
        },
    );
    check(
        "agent-request-get",
        &AgentRequest::Configstate {
            set: None,
            reason: None,
        },
    );

    let ok: Response<UpdaterReply> = Response::Ok(UpdaterReply {
        status: Some(upgrade_status()),
    });
    let line = ok.to_line();
    assert_eq!(line.last(), Some(&b'\n'));
    assert_eq!(
        Response::<UpdaterReply>::from_slice(&line).expect("parses"),
        ok
    );
    let idle = Response::Ok(UpdaterReply { status: None }).to_line();
    assert_eq!(idle, b"{\"ok\":true,\"status\":null}\n");

    let refused: Response<ConfigStateReply> = Response::Err(ErrorBody {
        code: ErrorCode::Refused,
        message: BoundedText::truncate("cannot enter changefreeze now"),
        reasons: vec![Refusal::ReconcilerBusy, Refusal::IntentPending],
        retry_after_secs: Some(30),
    });
    assert_eq!(
        String::from_utf8(refused.to_line()).expect("utf8"),
        "{\"ok\":false,\"error\":{\"code\":\"refused\",\"message\":\"cannot enter changefreeze now\",\"reasons\":[\"reconciler-busy\",\"intent-pending\"],\"retry-after-secs\":30}}\n"
    );
    assert_eq!(
        Response::<ConfigStateReply>::from_slice(&refused.to_line()).expect("parses"),
        refused
    );
    let frozen: Response<ConfigStateReply> = Response::Ok(ConfigStateReply {
        config_state: frozen_report(),
    });
    assert_eq!(
        String::from_utf8(frozen.to_line()).expect("utf8"),
        "{\"ok\":true,\"config-state\":{\"state\":\"changefreeze\",\"since\":\"2026-11-29T13:44:31.000Z\",\"reason\":\"vehicle in motion\",\"caller-uid\":0,\"waiting-changes\":2,\"intent-waiting\":true}}\n"
    );
    assert_eq!(
        Response::<ConfigStateReply>::from_slice(&frozen.to_line()).expect("parses"),
        frozen
    );
    check("agent-request-status", &AgentRequest::Status {});
    let status = AgentStatusReply {
        device_id: DeviceId::parse("truck-0042").expect("device"),
        agent_version: Version::parse("1.4.0").expect("version"),
        config_state: ConfigStateReport {
            state: ConfigState::Configured,
            waiting_changes: 0,
            intent_waiting: false,
        },
        nats: NatsView::Disconnected { for_secs: 42 },
        snapshot_complete: true,
        mutations: MutationsView {
            admission: MutationAdmission::Open,
            in_flight: Some(BoundedText::truncate("replace web")),
            pending: 1,
            pulling: Some(BoundedText::truncate("registry.example.com/web:2")),
        },
        upgrade: UpgradeView {
            updater: UpdaterView::Transaction {
                phase: UpgradePhase::Preparing,
                attempt: attempt().uuid,
                target_version: Version::parse("1.5.0").expect("version"),
            },
            intent_pending: true,
        },
        freeze_blockers: vec![
            Refusal::Disconnected,
            Refusal::UpgradeInProgress,
            Refusal::IntentPending,
            Refusal::ReconcilerBusy,
            Refusal::DownloadInProgress,
        ],
    };
    check("agent-status", &status);
    let frozen = AgentStatusReply {
        config_state: frozen_report(),
        nats: NatsView::Connected {},
        mutations: MutationsView {
            admission: MutationAdmission::Frozen,
            in_flight: None,
            pending: 0,
            pulling: None,
        },
        upgrade: UpgradeView {
            updater: UpdaterView::Absent {},
            intent_pending: false,
        },
        freeze_blockers: Vec::new(),
        ..status
    };
    check("agent-status-frozen", &frozen);
    for updater in [
        UpdaterView::Idle {},
        UpdaterView::Unknown {
            error: BoundedText::truncate("no answer within 5 s"),
        },
    ] {
        let json = serde_json::to_string(&updater).expect("json");
        assert_eq!(
            serde_json::from_str::<UpdaterView>(&json).expect("parses"),
            updater
        );
    }
    assert!(serde_json::from_str::<UpdaterView>(r#"{"state":"idle","x":1}"#).is_err());
    assert_eq!(
        serde_json::to_string(&MutationAdmission::Draining).expect("json"),
        "\"draining\""
    );

    let codes = [
        ErrorCode::Busy,
        ErrorCode::Invalid,
        ErrorCode::Conflict,
        ErrorCode::Quarantined,
        ErrorCode::Frozen,
        ErrorCode::Refused,
        ErrorCode::Forbidden,
        ErrorCode::TooLarge,
        ErrorCode::Timeout,
        ErrorCode::Internal,
    ];
    let names: Vec<String> = codes
        .iter()
        .map(|c| {
            assert_eq!(serde_json::to_value(c).expect("json"), c.as_str());
            c.as_str().to_owned()
        })
        .collect();
    check("error-codes", &names);
}

#[test]
fn self_test_report_golden_and_forward_compatible() {
    let report = SelfTestReport {
        version: Version::parse("1.4.0").expect("version"),
        checks: {
            let mut c = Bounded::default();
            c.push(SelfTestCheck {
                name: BoundedText::truncate("config"),
                ok: true,
                detail: None,
            });
            c.push(SelfTestCheck {
                name: BoundedText::truncate("nats"),
                ok: false,
                detail: Some(BoundedText::truncate(
                    "connecting to nats://10.0.0.1:4222: connection refused",
                )),
            });
            c
        },
    };
    check("self-test-report", &report);
    assert_eq!(
        report.failures(),
        vec!["nats: connecting to nats://10.0.0.1:4222: connection refused".to_owned()]
    );
    let minimal = SelfTestReport {
        version: Version::parse("1.4.0").expect("version"),
        checks: Bounded::default(),
    };
    check("self-test-report-minimal", &minimal);
    // A newer agent may say more: the (never self-updated) updater reads it.
    let newer: SelfTestReport = serde_json::from_str(
        r#"{"version":"9.0","features":["oci"],"checks":[{"name":"x","ok":true,"elapsed-ms":3}]}"#,
    )
    .expect("newer report parses");
    assert_eq!(newer.version.as_str(), "9.0");
    assert!(serde_json::from_str::<SelfTestReport>(r#"{"checks":[]}"#).is_err());
    assert!(serde_json::from_str::<SelfTestReport>(r#"{"version":"../x"}"#).is_err());
}

#[test]
fn oci_agent_manifest_as_fleetctl_pushes_it() {
    let binary =
        Sha256Hex::parse("5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef")
            .expect("sha");
    let m = OciManifest::for_agent(&binary, 7_340_032);
    check("oci-agent-manifest", &m);
    // The bytes pushed, and so the manifest digest a release is pinned by.
    let bytes = m.to_bytes();
    assert_eq!(
        String::from_utf8(bytes.clone()).expect("utf8"),
        r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.harmony.fleet-agent.v1","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[{"mediaType":"application/vnd.harmony.fleet-agent.binary.v1","digest":"sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","size":7340032}]}"#
    );
    assert_eq!(
        Sha256Hex::of(&bytes).as_str(),
        "536f5d579d4b4f17c8b2220b0952a558e9e13d70a87fa06439be45203372fb0d"
    );
    assert_eq!(
        AgentArtifact::from_manifest(&bytes),
        Ok(AgentArtifact {
            sha256: binary,
            size: 7_340_032
        })
    );
}

#[test]
fn seen_attempts_golden() {
    let a = attempt();
    let mut seen = SeenAttempts::default();
    seen.record(SeenAttempt {
        uuid: a.uuid,
        digest: a.digest(),
        target_version: Some(a.target_version.clone()),
        outcome: AttemptOutcome::Complete,
        at: t(0),
    })
    .expect("new");
    seen.record(SeenAttempt {
        uuid: AttemptUuid::parse("7d3e2f10-9a4b-4c5d-8e6f-a1b2c3d4e5f6").expect("uuid"),
        digest: Sha256Hex::of(b"{\"uuid\":\"7d3e2f10-9a4b-4c5d-8e6f-a1b2c3d4e5f6\"}"),
        target_version: None,
        outcome: AttemptOutcome::Rejected,
        at: t(1_000),
    })
    .expect("new");
    check("seen-attempts", &seen);
    let outcomes: Vec<String> = [
        AttemptOutcome::Forwarded,
        AttemptOutcome::Rejected,
        AttemptOutcome::Complete,
        AttemptOutcome::Failed,
        AttemptOutcome::RollbackFailed,
    ]
    .iter()
    .map(|o| {
        let json = serde_json::to_string(o).expect("json");
        assert_eq!(json, format!("\"{o}\""));
        o.to_string()
    })
    .collect();
    assert_eq!(
        outcomes,
        [
            "forwarded",
            "rejected",
            "complete",
            "failed",
            "rollback-failed"
        ]
    );
    let bad = r#"{"format":1,"attempts":[],"extra":1}"#;
    assert!(serde_json::from_str::<SeenAttempts>(bad).is_err());
}

fn release() -> Release {
    Release::from_json(
        br#"{
            "version": "1.4.0",
            "artifacts": {
                "x86_64": {
                    "artifact-url": "https://releases.example.com/fleet-agent/1.4.0/x86_64",
                    "sha256": "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef",
                    "max-bytes": 20971520
                },
                "aarch64": {
                    "artifact-url": "oci://registry.example.com/fleet-agent@sha256:9a1c6f2b0e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b",
                    "sha256": "0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c",
                    "max-bytes": 20971520
                }
            }
        }"#,
    )
    .expect("release")
}

#[test]
fn release_golden_and_its_attempts() {
    let r = release();
    check("release", &r);
    let device = DeviceId::parse("truck-0042").expect("device");
    let uuid = AttemptUuid::parse("0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10").expect("uuid");
    let a = r
        .attempt(&device, Arch::X86_64, uuid)
        .expect("x86_64 artifact");
    assert_eq!(a, attempt(), "the release makes exactly the pinned attempt");
    assert!(r.is_release_of(&a));
    assert_eq!(r.attempt(&device, Arch::Armv7, uuid), None);
    let mut other = a.clone();
    other.sha256 = Sha256Hex::of(b"another build");
    assert!(
        !r.is_release_of(&other),
        "changed metadata is another release"
    );
    let mut older = a;
    older.target_version = Version::parse("1.3.0").expect("v");
    assert!(!r.is_release_of(&older));
}

#[test]
fn release_refusals_name_the_problem() {
    let cases: &[(&str, &str)] = &[
        (r#"{"version":"1.4.0","artifacts":{}}"#, "lists no artifact"),
        (
            r#"{"version":"1.4.0","artifacts":{"riscv64":{}}}"#,
            "unknown field `riscv64`, expected one of `x86_64`, `aarch64`, `armv7`",
        ),
        (r#"{"version":"../x","artifacts":{}}"#, "invalid version"),
        (
            r#"{"version":"1.4.0","artifacts":{"x86_64":{"artifact-url":"http://h/a","sha256":"00","max-bytes":1}}}"#,
            "invalid artifact url",
        ),
        (
            r#"{"version":"1.4.0","artifacts":{"x86_64":{"artifact-url":"https://h/a","sha256":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","max-bytes":0}}}"#,
            "invalid max-bytes 0",
        ),
        (r#"{"version":"1.4.0"}"#, "missing field `artifacts`"),
        (
            r#"{"version":"1.4.0","artifacts":{},"notes":"x"}"#,
            "unknown field `notes`",
        ),
    ];
    for (json, says) in cases {
        let e = Release::from_json(json.as_bytes()).expect_err(json);
        assert!(e.to_string().contains(says), "{json}: {e}");
    }
}

#[test]
fn operator_labels_and_rollout_state() {
    let labels = DeviceLabels {
        labels: BTreeMap::from([
            ("site".to_owned(), "berlin".to_owned()),
            ("tier".to_owned(), "canary".to_owned()),
        ]),
    };
    check("device-labels", &labels);
    assert!(DeviceLabels::from_json(br#"{"labels":{"arch":"x"}}"#)
        .expect_err("a fact name")
        .contains("name of a device fact"));
    let d = |s: &str| DeviceId::parse(s).expect("device");
    let state = RolloutState {
        id: "r-6d0b4c39".to_owned(),
        release: Some(release()),
        workload: None,
        selector: Some("site=berlin,tier!=lab".to_owned()),
        batches: vec!["1".to_owned(), "50%".to_owned(), "100%".to_owned()],
        success_threshold_pct: 95,
        batch_timeout_secs: 1800,
        max_unavailable: Some(1),
        group_by: Some("site".to_owned()),
        devices: vec![d("truck-0001"), d("truck-0002"), d("truck-0003")],
        batch_ends: vec![1, 2, 3],
        phase: RolloutPhase::Halted,
        current_batch: 0,
        batch_started_at: t(0),
        results: vec![BatchResult {
            succeeded: 0,
            failed: vec![RolloutFailure {
                device: d("truck-0001"),
                reason: "failed (probe): the candidate's self-test failed".to_owned(),
            }],
            frozen: vec![],
            timed_out: false,
            ended_at: t(60_000),
        }],
        halt_reason: Some("batch 1: 0% succeeded, below 95%".to_owned()),
        created_at: t(0),
        updated_at: t(60_000),
    };
    check("rollout-state", &state);
    assert_eq!(state.batch(1), &[d("truck-0002")]);
    assert_eq!(state.batch_of(2), 2);

    // A workload rollout (fleetctl 0.3 on): the same state with a workload
    // target instead of a release, and each device's previous spec.
    let old =
        WorkloadSpec::from_json(br#"{"image":"registry.example.com/web:1.4"}"#).expect("spec");
    let new = WorkloadSpec::from_json(
        br#"{"image":"registry.example.com/web:1.5","health":{"healthy-after-secs":5}}"#,
    )
    .expect("spec");
    let mut previous = PreviousSpecs::default();
    previous.record(
        d("truck-0001"),
        &PreviousSpec::Spec(old.spec_hash()),
        Some(&old),
    );
    previous.record(d("truck-0002"), &PreviousSpec::Absent, None);
    let workload = RolloutState {
        release: None,
        workload: Some(WorkloadRollout {
            workload: WorkloadName::parse("web").expect("name"),
            spec_hash: new.spec_hash(),
            spec: new,
            previous,
            undone_at: Some(t(120_000)),
        }),
        ..state
    };
    check("workload-rollout-state", &workload);
    assert_eq!(workload.kind(), RolloutKind::Workload);
}

fn healthy_spec() -> WorkloadSpec {
    let mut s = spec();
    s.health = Some(HealthCheck {
        probe: Some(Probe::Http {
            port: 8080,
            path: "/healthz".into(),
        }),
        start_period_secs: 5,
        interval_secs: 10,
        timeout_secs: 2,
        retries: 3,
        healthy_after_secs: DEFAULT_HEALTHY_AFTER_SECS,
    });
    s
}

#[test]
fn workload_spec_with_health_golden() {
    check("workload-spec-health", &healthy_spec());
    let mut exec = spec();
    exec.ports.clear();
    exec.update_strategy = UpdateStrategy::StartFirst;
    exec.health = Some(HealthCheck {
        probe: Some(Probe::Exec {
            command: vec!["/bin/check".into(), "--quick".into()],
        }),
        ..HealthCheck::default()
    });
    check("workload-spec-health-exec-start-first", &exec);
    // Defaults fill in; a spec without the new fields hashes as before.
    let tcp = WorkloadSpec::from_json(
        br#"{"image":"x","ports":[{"host":9000,"container":9000}],"health":{"probe":{"kind":"tcp","port":9000}}}"#,
    )
    .expect("tcp probe");
    let h = tcp.health.as_ref().expect("health");
    assert_eq!((h.interval_secs, h.timeout_secs, h.retries), (10, 2, 3));
    assert_eq!(h.deadline_secs(), 32);
    assert_eq!(HealthCheck::default().deadline_secs(), 22);
    let golden_minimal = std::fs::read(golden_path("workload-spec-minimal")).expect("golden");
    let minimal = WorkloadSpec::from_json(&golden_minimal).expect("parses");
    assert!(minimal.health.is_none() && minimal.update_strategy.is_default());
    assert_eq!(
        serde_json::to_vec(&minimal).expect("json"),
        br#"{"image":"localhost/busybox:test","restart":"always","pull":"missing"}"#,
        "the canonical form (and so the spec hash) of a spec without the new fields is unchanged"
    );
}

#[test]
fn workload_spec_health_refusals() {
    let port = r#""ports":[{"host":8080,"container":80}]"#;
    let cases: Vec<(String, &str)> = vec![
        (
            format!(r#"{{"image":"x",{port},"health":{{"interval-secs":0}}}}"#),
            "interval-secs is 1 to 3600",
        ),
        (
            format!(r#"{{"image":"x",{port},"health":{{"interval-secs":3601}}}}"#),
            "interval-secs is 1 to 3600",
        ),
        (
            format!(r#"{{"image":"x",{port},"health":{{"interval-secs":5,"timeout-secs":6}}}}"#),
            "may not be longer than interval-secs",
        ),
        (
            format!(r#"{{"image":"x",{port},"health":{{"retries":0}}}}"#),
            "retries is 1 to 10",
        ),
        (
            format!(r#"{{"image":"x",{port},"health":{{"start-period-secs":4000}}}}"#),
            "start-period-secs is 0 to 3600",
        ),
        (
            format!(r#"{{"image":"x",{port},"health":{{"probe":{{"kind":"http","port":0}}}}}}"#),
            "a probe port is 1 to 65535",
        ),
        (
            format!(
                r#"{{"image":"x",{port},"health":{{"probe":{{"kind":"http","port":70000}}}}}}"#
            ),
            "not valid JSON",
        ),
        (
            format!(r#"{{"image":"x",{port},"health":{{"probe":{{"kind":"tcp","port":9090}}}}}}"#),
            "a TCP host port the workload publishes",
        ),
        (
            format!(
                r#"{{"image":"x",{port},"health":{{"probe":{{"kind":"http","port":8080,"path":"no-slash"}}}}}}"#
            ),
            "path starts with '/'",
        ),
        (
            r#"{"image":"x","health":{"probe":{"kind":"exec","command":[]}}}"#.to_owned(),
            "needs a command",
        ),
        (
            format!(
                r#"{{"image":"x","health":{{"probe":{{"kind":"exec","command":{}}}}}}}"#,
                serde_json::to_string(&vec!["a"; 17]).expect("json")
            ),
            "at most 16 arguments",
        ),
        (
            format!(
                r#"{{"image":"x","health":{{"probe":{{"kind":"exec","command":[{:?}]}}}}}}"#,
                "a".repeat(1025)
            ),
            "at most 1024 characters",
        ),
        (
            r#"{"image":"x","health":{"probe":{"kind":"shell","command":"true"}}}"#.to_owned(),
            "not valid JSON",
        ),
        (
            r#"{"image":"x","health":{"probe":{"kind":"tcp","port":1,"extra":1}}}"#.to_owned(),
            "not valid JSON",
        ),
        (
            format!(r#"{{"image":"x",{port},"update-strategy":"start-first"}}"#),
            "only for workloads without host ports",
        ),
        (
            r#"{"image":"x","update-strategy":"blue-green"}"#.to_owned(),
            "not valid JSON",
        ),
    ];
    for (json, want) in cases {
        let err = WorkloadSpec::from_json(json.as_bytes())
            .expect_err(&json)
            .to_string();
        assert!(err.contains(want), "{json}: {err}");
    }
}

#[test]
fn new_spec_fields_need_the_agent_version_that_reads_them() {
    let plain = spec();
    let v = |s: &str| Version::parse(s).expect("version");
    assert_eq!(plain.needs_agent(&v("0.1.0")), Ok(()));
    let h = healthy_spec();
    assert_eq!(h.versioned_fields(), vec![("health", "0.3.0")]);
    assert_eq!(h.needs_agent(&v("0.2.0")), Err(("health", "0.3.0")));
    assert_eq!(h.needs_agent(&v("0.3.0")), Ok(()));
    assert_eq!(h.needs_agent(&v("0.3.0-upgrade-test")), Ok(()));
    assert_eq!(h.needs_agent(&v("1.0.0+build.7")), Ok(()));
    assert_eq!(h.needs_agent(&v("dev")), Err(("health", "0.3.0")));
    let mut sf = spec();
    sf.ports.clear();
    sf.update_strategy = UpdateStrategy::StartFirst;
    assert_eq!(
        sf.needs_agent(&v("0.2.9")),
        Err(("update-strategy", "0.3.0"))
    );
    // Every versioned field is named in the table.
    for (field, since) in SPEC_FIELDS_SINCE {
        assert!(
            Version::parse(since).expect("version").release().is_some(),
            "{field}"
        );
    }
}

fn health_report() -> HealthReport {
    let sha = |c: char| Sha256Hex::parse(&c.to_string().repeat(64)).expect("sha");
    HealthReport {
        workloads: BTreeMap::from([
            (
                WorkloadName::parse("telemetry").expect("name"),
                WorkloadHealth {
                    health: HealthState::Healthy,
                    spec_hash: sha('a'),
                    last_probe: Some(ProbeResult {
                        at: t(9_000),
                        ok: true,
                        took_ms: 3,
                        detail: Some(BoundedText::truncate("HTTP 200")),
                    }),
                    restarts_last_hour: 0,
                    reverted: None,
                    since: t(1_000),
                },
            ),
            (
                WorkloadName::parse("web").expect("name"),
                WorkloadHealth {
                    health: HealthState::Healthy,
                    spec_hash: sha('b'),
                    last_probe: None,
                    restarts_last_hour: 4,
                    reverted: Some(Revert {
                        failed_spec_hash: sha('c'),
                        restored_spec_hash: sha('b'),
                        reason: RevertReason::CrashLoop,
                        detail: Some(BoundedText::truncate(
                            "the container exited 3 times within 40 s (exit code 1)",
                        )),
                        at: t(8_000),
                    }),
                    since: t(8_000),
                },
            ),
        ]),
        observed_at: t(10_000),
    }
}

#[test]
fn health_report_golden_and_read_tolerantly() {
    check("health-report", &health_report());
    // A newer agent's report, with a state, a reason and fields this reader
    // does not know, still reads.
    let newer = br#"{"workloads":{"web":{"health":"degraded","spec-hash":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","since":"2026-11-30T09:04:31.000Z","cpu":"high","reverted":{"failed-spec-hash":"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc","restored-spec-hash":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","reason":"oom","at":"2026-11-30T09:04:31.000Z"}}},"observed-at":"2026-11-30T09:04:31.000Z","site":"x"}"#;
    let r: HealthReport = serde_json::from_slice(newer).expect("tolerant");
    let w = &r.workloads[&WorkloadName::parse("web").expect("name")];
    assert_eq!(w.health, HealthState::Other);
    assert_eq!(
        w.reverted.as_ref().map(|r| r.reason),
        Some(RevertReason::Other)
    );
}

#[test]
fn traffic_report_golden_and_read_tolerantly() {
    let c = TrafficCounters {
        bytes_sent: 1_200,
        bytes_received: 900,
        segments_sent: 20,
        segments_received: 18,
        reconnects: 1,
    };
    let report = TrafficReport {
        since: t(0),
        total: c,
        today: TrafficDay {
            day: "2026-11-30".into(),
            counters: c,
        },
        yesterday: None,
        observed_at: t(60_000),
    };
    check("traffic-report", &report);
    assert_eq!(c.wire_bytes(), 2_100 + 38 * TCP_IPV4_HEADER_BYTES);
    let mut v = serde_json::to_value(&report).expect("value");
    v["total"]["tls-bytes"] = 5.into();
    v["new-field"] = true.into();
    let back: TrafficReport = serde_json::from_value(v).expect("tolerant");
    assert_eq!(back, report);
}
