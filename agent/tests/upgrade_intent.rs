//! The agent's handling of upgrade intents it refuses, with a real
//! nats-server and no updater: another device, another architecture,
//! invalid content, a UUID reused with other content — each published as
//! `failed` with the rule named — and intents without a valid UUID or
//! target version, published as refused intents; refusals are
//! remembered across a restart.

mod common;

use common::*;
use fleet_common::contracts::{
    AgentUpgradeAttempt, IntentRule, RefusalReason, RefusedIntent, SeenAttempts, UpgradePhase,
    UpgradeReason, UpgradeReport, UpgradeStatus,
};
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_harness::{poll_until, NatsServer, NatsVersion};

fn attempt(device: &str, arch: Arch) -> AgentUpgradeAttempt {
    AgentUpgradeAttempt {
        arch,
        artifact_url: ArtifactUrl::parse("https://releases.example.com/2.0").expect("url"),
        device_id: DeviceId::parse(device).expect("id"),
        max_bytes: MaxBytes::new(1024).expect("max"),
        sha256: Sha256Hex::of(b"binary"),
        target_version: Version::parse("2.0").expect("v"),
        uuid: AttemptUuid::new_random(),
    }
}

/// Writes the intent; returns its sequence.
fn put_intent(admin: &nats::Connection, value: &[u8]) -> u64 {
    bucket(admin, "fleet-control")
        .put("dev1.agent-upgrade-intent", value)
        .expect("put intent")
}

/// Waits for the refused-intent report of the intent at `seq`.
fn refused(admin: &nats::Connection, seq: u64) -> RefusedIntent {
    poll_until(
        &format!("refused intent at sequence {seq}"),
        CONVERGE,
        || match status::<UpgradeReport>(admin, "dev1", "upgrade")? {
            UpgradeReport::RefusedIntent(r) if r.intent.sequence == Some(seq) => Some(r),
            _ => None,
        },
    )
}

/// Waits for the failed status of `uuid` and returns it.
fn failed(admin: &nats::Connection, uuid: AttemptUuid) -> UpgradeStatus {
    poll_until(&format!("failed status of {uuid}"), CONVERGE, || {
        status::<UpgradeStatus>(admin, "dev1", "upgrade")
            .filter(|s| s.attempt_uuid == uuid && s.phase == UpgradePhase::Failed)
    })
}

fn other_arch() -> Arch {
    let here = Arch::current().expect("supported");
    Arch::ALL
        .into_iter()
        .find(|a| *a != here)
        .expect("another arch")
}

#[test]
fn refused_intents_are_published_with_the_rule_and_remembered() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = nats.admin();
    let mut settings = Settings::new(vec![nats.url()]);
    settings.podman = false;
    let dev = Device::new("dev1", &settings, None);
    let mut agent = dev.start(None);
    assert!(
        agent
            .log()
            .contains("starting without the updater's transaction"),
        "{}",
        agent.log()
    );
    let here = Arch::current().expect("supported");

    let other_device = attempt("dev2", here);
    put_intent(&admin, &serde_json::to_vec(&other_device).expect("json"));
    let s = failed(&admin, other_device.uuid);
    assert_eq!(s.reason, Some(UpgradeReason::Rejected));
    assert_eq!(s.attempt_digest, other_device.digest());
    assert_eq!(
        s.error.as_ref().map(|e| e.as_str()),
        Some("the attempt is for device dev2, and this is device dev1: write the intent with this device's id")
    );

    let wrong_arch = attempt("dev1", other_arch());
    put_intent(&admin, &serde_json::to_vec(&wrong_arch).expect("json"));
    let s = failed(&admin, wrong_arch.uuid);
    assert_eq!(s.reason, Some(UpgradeReason::Rejected));
    assert_eq!(
        s.error.as_ref().map(|e| e.to_string()),
        Some(format!(
            "the attempt is for {}, and this device is {here}: use the release's {here} artifact",
            other_arch()
        ))
    );

    // The same UUID with other (otherwise valid) content: a conflict.
    let mut reused = wrong_arch.clone();
    reused.arch = here;
    put_intent(&admin, &serde_json::to_vec(&reused).expect("json"));
    let s = poll_until("the conflict", CONVERGE, || {
        status::<UpgradeStatus>(&admin, "dev1", "upgrade")
            .filter(|s| s.attempt_digest == reused.digest())
    });
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Conflict))
    );
    assert_eq!(
        s.error.as_ref().map(|e| e.to_string()),
        Some(format!(
            "attempt {} was seen before with digest {}, and this content has digest {}: one UUID names one attempt; write a new attempt with a new UUID",
            reused.uuid,
            wrong_arch.digest(),
            reused.digest()
        ))
    );

    // Invalid content under a valid UUID names the field.
    let mut bad = serde_json::to_value(attempt("dev1", here)).expect("value");
    bad["sha256"] = "ABC".into();
    let bad_uuid = AttemptUuid::parse(bad["uuid"].as_str().expect("uuid")).expect("uuid");
    put_intent(&admin, &serde_json::to_vec(&bad).expect("json"));
    let s = failed(&admin, bad_uuid);
    assert!(
        s.error.as_ref().is_some_and(|e| e
            .as_str()
            .starts_with("the intent is not a valid attempt: invalid sha256 \"ABC\"")),
        "{s:#?}"
    );

    // An invalid UUID cannot be reported under an attempt: it is
    // reported as a refused intent.
    let mut no_uuid = serde_json::to_value(attempt("dev1", here)).expect("value");
    no_uuid["uuid"] = "not-a-uuid".into();
    let seq = put_intent(&admin, &serde_json::to_vec(&no_uuid).expect("json"));
    let r = refused(&admin, seq);
    assert_eq!((r.rule, r.intent.uuid), (IntentRule::InvalidUuid, None));

    // Refusals are remembered: after a restart, the current intent is not
    // published again.
    put_intent(&admin, &serde_json::to_vec(&bad).expect("json"));
    poll_until("the record of the refusal", CONVERGE, || {
        let text = std::fs::read(dev.path("var/lib/harmony-fleet/agent/attempts.json")).ok()?;
        let seen: SeenAttempts = serde_json::from_slice(&text).ok()?;
        seen.find(&bad_uuid)
            .is_some_and(|r| r.outcome.as_str() == "rejected")
            .then_some(())
    });
    agent.signal(rustix::process::Signal::TERM);
    assert!(agent.wait_exit(CONVERGE).success(), "{}", agent.log());
    bucket(&admin, "fleet-status")
        .delete("dev1.upgrade")
        .expect("delete");
    let again = dev.start(None);
    again.wait_for_line("snapshot complete: 1 keys bucket=fleet-control", CONVERGE);
    // Logged once the intent is handled (nothing published then).
    again.wait_for_line("refused before:", CONVERGE);
    assert_eq!(
        status::<UpgradeStatus>(&admin, "dev1", "upgrade"),
        None,
        "an ended attempt is not published again"
    );
}

/// Intents without a valid attempt identity were
/// refused silently (only logged, `<device>.upgrade` unchanged). Each is
/// now published as a refused intent: its sequence and digest, the rule,
/// escaped excerpts of the offending field, and an error naming it.
#[test]
fn intents_without_an_identity_are_reported_2_9() {
    intents_without_an_identity_are_reported(NatsVersion::V2_9);
}

#[test]
fn intents_without_an_identity_are_reported_2_14() {
    intents_without_an_identity_are_reported(NatsVersion::V2_14);
}

fn intents_without_an_identity_are_reported(v: NatsVersion) {
    let nats = NatsServer::start_fleet(v, &["dev1"]);
    let admin = nats.admin();
    let mut settings = Settings::new(vec![nats.url()]);
    settings.podman = false;
    let dev = Device::new("dev1", &settings, None);
    let _agent = dev.start(None);
    let here = Arch::current().expect("supported");
    let long = "1".repeat(256);
    let long_excerpt = format!("{}…", "1".repeat(64));
    let cases: [(&str, &str, IntentRule, &str, u64, &str); 5] = [
        (
            "target-version",
            "1.0/../../etc/x",
            IntentRule::InvalidTargetVersion,
            "1.0/../../etc/x",
            15,
            "invalid version \"1.0/../../etc/x\"",
        ),
        (
            "target-version",
            "1.0\u{0}",
            IntentRule::InvalidTargetVersion,
            "1.0\\u{0}",
            4,
            "invalid version \"1.0\\0\"",
        ),
        (
            "target-version",
            "\u{ff11}.\u{ff10}",
            IntentRule::InvalidTargetVersion,
            "\\u{ff11}.\\u{ff10}",
            3,
            "invalid version \"\u{ff11}.\u{ff10}\"",
        ),
        (
            "target-version",
            &long,
            IntentRule::InvalidTargetVersion,
            &long_excerpt,
            256,
            "invalid version \"111",
        ),
        (
            "uuid",
            "0F6E4C1A-6D0B-4C39-9B64-3F1D2A7E5C10",
            IntentRule::InvalidUuid,
            "0F6E4C1A-6D0B-4C39-9B64-3F1D2A7E5C10",
            36,
            "invalid attempt uuid \"0F6E4C1A",
        ),
    ];
    let mut last = None;
    for (field, value, rule, excerpt, chars, error) in cases {
        let a = attempt("dev1", here);
        let mut v = serde_json::to_value(&a).expect("value");
        v[field] = value.into();
        let raw = serde_json::to_vec(&v).expect("json");
        let seq = put_intent(&admin, &raw);
        let r = refused(&admin, seq);
        assert_eq!(r.reason, RefusalReason::Rejected, "{value:?}");
        assert_eq!(r.rule, rule, "{value:?}");
        assert_eq!(r.intent.digest, Sha256Hex::of(&raw));
        assert_eq!(r.intent.bytes, raw.len() as u64);
        let expected_uuid = (field != "uuid").then_some(a.uuid);
        assert_eq!(r.intent.uuid, expected_uuid, "a valid UUID is named");
        let quoted: Vec<(&str, &str, u64)> = r
            .fields
            .iter()
            .map(|f| (f.field.as_str(), f.excerpt.as_str(), f.chars))
            .collect();
        assert_eq!(quoted, [(field, excerpt, chars)], "{value:?}");
        assert!(
            r.error
                .as_str()
                .starts_with(&format!("the intent is not a valid attempt: {error}")),
            "{value:?}: {}",
            r.error
        );
        // The raw form on the wire: phase failed, excerpts escaped ASCII.
        let json = bucket(&admin, "fleet-status")
            .get("dev1.upgrade")
            .expect("get")
            .expect("a report");
        let wire: serde_json::Value = serde_json::from_slice(&json).expect("json");
        assert_eq!(
            (wire["phase"].as_str(), wire["reason"].as_str()),
            (Some("failed"), Some("rejected"))
        );
        assert!(wire["fields"][0]["excerpt"].as_str().is_some_and(|e| e
            .trim_end_matches('…')
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b))));
        last = Some(raw);
    }

    let raw = last.expect("cases ran");
    // A valid UUID under an invalid version is recorded: the same UUID
    // with other content is then a conflict, reported the same way.
    let mut v: serde_json::Value = serde_json::from_slice(&raw).expect("json");
    let reused = AttemptUuid::new_random();
    v["uuid"] = reused.to_string().into();
    v["target-version"] = "2.0/..".into();
    let first = put_intent(&admin, &serde_json::to_vec(&v).expect("json"));
    assert_eq!(refused(&admin, first).reason, RefusalReason::Rejected);
    v["target-version"] = "3.0/..".into();
    let second = put_intent(&admin, &serde_json::to_vec(&v).expect("json"));
    let r = refused(&admin, second);
    assert_eq!(
        (r.reason, r.intent.uuid),
        (RefusalReason::Conflict, Some(reused))
    );
    assert!(
        r.error
            .as_str()
            .starts_with(&format!("attempt {reused} was seen before with digest")),
        "{}",
        r.error
    );
}

/// The agent keeps the first UUID's binding after 70 other
/// attempts (more than the 64 full records it keeps) and a restart: the
/// first UUID with other, otherwise valid, content is a conflict, never
/// forwarded.
#[test]
fn a_uuid_stays_bound_after_70_later_attempts() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = nats.admin();
    let mut settings = Settings::new(vec![nats.url()]);
    settings.podman = false;
    let dev = Device::new("dev1", &settings, None);
    let mut agent = dev.start(None);
    let here = Arch::current().expect("supported");
    let first = attempt("dev1", other_arch());
    put_intent(&admin, &serde_json::to_vec(&first).expect("json"));
    failed(&admin, first.uuid);
    for _ in 0..70 {
        let later = attempt("dev1", other_arch());
        put_intent(&admin, &serde_json::to_vec(&later).expect("json"));
        failed(&admin, later.uuid);
    }
    let seen = || -> SeenAttempts {
        serde_json::from_slice(
            &std::fs::read(dev.path("var/lib/harmony-fleet/agent/attempts.json")).expect("file"),
        )
        .expect("json")
    };
    assert!(
        seen().find(&first.uuid).is_none(),
        "its full record is gone"
    );
    agent.signal(rustix::process::Signal::TERM);
    assert!(agent.wait_exit(CONVERGE).success(), "{}", agent.log());
    let again = dev.start(None);
    again.wait_for_line("snapshot complete: 1 keys bucket=fleet-control", CONVERGE);

    let mut reused = first.clone();
    reused.arch = here;
    reused.target_version = Version::parse("4.0").expect("v");
    put_intent(&admin, &serde_json::to_vec(&reused).expect("json"));
    let s = poll_until("the conflict", CONVERGE, || {
        status::<UpgradeStatus>(&admin, "dev1", "upgrade")
            .filter(|s| s.attempt_digest == reused.digest())
    });
    assert_eq!(
        (s.phase, s.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::Conflict)),
        "{s:#?}"
    );
    assert!(
        s.error
            .as_ref()
            .is_some_and(|e| e.as_str().contains(&format!(
                "attempt {} was seen before with digest {}",
                first.uuid,
                first.digest()
            ))),
        "{s:#?}"
    );
    assert!(
        !again.log().contains("sending it to the updater"),
        "forwarded: {}",
        again.log()
    );
}
