//! The agent's handling of upgrade intents it refuses, with a real
//! nats-server and no updater: another device, another architecture,
//! invalid content, a UUID reused with other content — each published as
//! `failed` with the rule named — and an invalid UUID, which cannot be
//! reported under an attempt; refusals are remembered across a restart.

mod common;

use common::*;
use fleet_common::contracts::{
    AgentUpgradeAttempt, SeenAttempts, UpgradePhase, UpgradeReason, UpgradeStatus,
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

fn put_intent(admin: &nats::Connection, value: &[u8]) {
    bucket(admin, "fleet-control")
        .put("dev1.agent-upgrade-intent", value)
        .expect("put intent");
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

    // An invalid UUID cannot be reported under an attempt: logged only.
    let mut no_uuid = serde_json::to_value(attempt("dev1", here)).expect("value");
    no_uuid["uuid"] = "not-a-uuid".into();
    let from = agent.line_count();
    put_intent(&admin, &serde_json::to_vec(&no_uuid).expect("json"));
    agent.wait_for_line_after(from, "cannot report it under an attempt: the intent is not a valid attempt: invalid attempt uuid \"not-a-uuid\"", CONVERGE);
    assert_eq!(
        status::<UpgradeStatus>(&admin, "dev1", "upgrade").map(|s| s.attempt_uuid),
        Some(bad_uuid),
        "nothing published for it"
    );

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

/// Issue 17 item 2: the agent keeps the first UUID's binding after 70 other
/// attempts (more than the 64 full records it keeps) and a restart: the
/// first UUID with other, otherwise valid, content is a conflict, never
/// forwarded.
#[test]
fn a_uuid_stays_bound_after_70_later_attempts_issue_17() {
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
