//! The upgrade intent (`fleet-control` `<device>.agent-upgrade-intent`),
//! validated (`docs/design/upgrade.md` "Intent"): the value must be an
//! [`AgentUpgradeAttempt`] (every field valid, unknown fields refused) for
//! this device and this architecture; then its UUID is checked against the
//! attempts already seen ([`verdict`]). Pure functions: the worker decides
//! what to publish and forward.
//!
//! A value that leaves no valid UUID or target version is described for a
//! refused-intent report ([`Unidentified`]): the identity rule it broke and
//! bounded, escaped excerpts of every field that fails its own rule.

use std::fmt;

use fleet_common::contracts::{
    AgentUpgradeAttempt, AttemptOutcome, FieldExcerpt, IntentRule, SeenAttempts,
};
use fleet_common::limits::{MAX_BOUND_ATTEMPTS, MAX_INTENT_EXCERPTS, MAX_KV_VALUE_BYTES};
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use serde_json::{Map, Value};

/// Why the agent refuses an intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// The value is larger than any attempt.
    TooLarge { bytes: usize },
    /// The value is not a valid attempt; the message names the field.
    Invalid(String),
    /// The attempt names another device.
    OtherDevice { named: DeviceId, here: DeviceId },
    /// The attempt is for another architecture.
    OtherArch { named: Arch, here: Arch },
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { bytes } => write!(
                f,
                "the intent is {bytes} bytes, more than the {MAX_KV_VALUE_BYTES}-byte limit of an attempt"
            ),
            Self::Invalid(why) => write!(f, "the intent is not a valid attempt: {why}"),
            Self::OtherDevice { named, here } => write!(
                f,
                "the attempt is for device {named}, and this is device {here}: write the intent with this device's id"
            ),
            Self::OtherArch { named, here } => write!(
                f,
                "the attempt is for {named}, and this device is {here}: use the release's {here} artifact"
            ),
        }
    }
}

/// A refused intent, with as much of its identity as could be read (a
/// failed status can be published only when the UUID and version are valid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub uuid: Option<AttemptUuid>,
    pub target_version: Option<Version>,
    /// The attempt's digest, or the SHA-256 of the raw value when it did
    /// not parse.
    pub digest: Sha256Hex,
    pub rule: Rule,
    /// Set when the UUID or the target version is missing or invalid.
    pub unidentified: Option<Box<Unidentified>>,
}

/// What a refused-intent report says of a value without a valid attempt
/// identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unidentified {
    pub rule: IntentRule,
    /// Bytes of the value as written.
    pub bytes: u64,
    /// Every field that fails its own rule, and every unknown field, in
    /// name order, at most [`MAX_INTENT_EXCERPTS`].
    pub fields: Vec<FieldExcerpt>,
}

/// The identity rule `raw` breaks, if any, and its offending fields.
fn inspect(raw: &[u8]) -> Option<Box<Unidentified>> {
    let bytes = u64::try_from(raw.len()).unwrap_or(u64::MAX);
    let described = |rule, fields| {
        Some(Box::new(Unidentified {
            rule,
            bytes,
            fields,
        }))
    };
    if raw.len() > MAX_KV_VALUE_BYTES {
        return described(IntentRule::TooLarge, Vec::new());
    }
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(raw) else {
        return described(IntentRule::Malformed, Vec::new());
    };
    let fields = offending_fields(&map);
    let rule = match (map.get("uuid"), map.get("target-version")) {
        (None, _) => IntentRule::MissingUuid,
        (Some(u), _) if !valid_field("uuid", u) => IntentRule::InvalidUuid,
        (_, None) => IntentRule::MissingTargetVersion,
        (_, Some(v)) if !valid_field("target-version", v) => IntentRule::InvalidTargetVersion,
        _ => return None,
    };
    described(rule, fields)
}

/// Whether attempt field `name` holds a valid value; false for a field an
/// attempt does not have.
fn valid_field(name: &str, v: &Value) -> bool {
    fn ok<T: serde::de::DeserializeOwned>(v: &Value) -> bool {
        T::deserialize(v).is_ok()
    }
    match name {
        "arch" => ok::<Arch>(v),
        "artifact-url" => ok::<ArtifactUrl>(v),
        "device-id" => ok::<DeviceId>(v),
        "max-bytes" => ok::<MaxBytes>(v),
        "sha256" => ok::<Sha256Hex>(v),
        "target-version" => ok::<Version>(v),
        "uuid" => ok::<AttemptUuid>(v),
        _ => false,
    }
}

fn offending_fields(map: &Map<String, Value>) -> Vec<FieldExcerpt> {
    map.iter()
        .filter(|(name, v)| !valid_field(name, v))
        .take(MAX_INTENT_EXCERPTS)
        .map(|(name, v)| match v {
            Value::String(text) => FieldExcerpt::of(name, text),
            other => FieldExcerpt::of(name, &other.to_string()),
        })
        .collect()
}

/// Validates the raw intent for `device` on `arch`.
pub fn decode(
    raw: &[u8],
    device: &DeviceId,
    arch: Arch,
) -> Result<(AgentUpgradeAttempt, Sha256Hex), Box<Rejection>> {
    let raw_identity = || {
        let v: Option<serde_json::Value> = serde_json::from_slice(raw).ok();
        let field = |name: &str| {
            v.as_ref()
                .and_then(|v| v.get(name))
                .and_then(|f| f.as_str())
                .map(str::to_owned)
        };
        (
            field("uuid").and_then(|u| AttemptUuid::parse(&u).ok()),
            field("target-version").and_then(|t| Version::parse(&t).ok()),
        )
    };
    if raw.len() > MAX_KV_VALUE_BYTES {
        return Err(Box::new(Rejection {
            uuid: None,
            target_version: None,
            digest: Sha256Hex::of(raw),
            rule: Rule::TooLarge { bytes: raw.len() },
            unidentified: inspect(raw),
        }));
    }
    let attempt: AgentUpgradeAttempt = match serde_json::from_slice(raw) {
        Ok(a) => a,
        Err(e) => {
            let (uuid, target_version) = raw_identity();
            return Err(Box::new(Rejection {
                uuid,
                target_version,
                digest: Sha256Hex::of(raw),
                rule: Rule::Invalid(e.to_string()),
                unidentified: inspect(raw),
            }));
        }
    };
    let digest = attempt.digest();
    let refuse = |rule| {
        Box::new(Rejection {
            uuid: Some(attempt.uuid),
            target_version: Some(attempt.target_version.clone()),
            digest: digest.clone(),
            rule,
            unidentified: None,
        })
    };
    if &attempt.device_id != device {
        return Err(refuse(Rule::OtherDevice {
            named: attempt.device_id.clone(),
            here: device.clone(),
        }));
    }
    if attempt.arch != arch {
        return Err(refuse(Rule::OtherArch {
            named: attempt.arch,
            here: arch,
        }));
    }
    Ok((attempt, digest))
}

/// What the record of seen attempts says about a UUID and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Never seen: accept it.
    New,
    /// Seen with other content: refuse it as a conflict.
    Conflict { earlier: Sha256Hex },
    /// Seen, forwarded, not ended: follow it again (after a restart).
    Forwarded,
    /// Seen and ended (or rejected): never again.
    Ended(AttemptOutcome),
    /// Seen long ago, only its binding is left (its full record made room
    /// for later ones): it ended, never again.
    EndedLongAgo,
    /// Never seen, but the device has bound as many attempts as it keeps:
    /// refused (a binding is never forgotten to make room).
    Full,
}

pub fn verdict(seen: &SeenAttempts, uuid: &AttemptUuid, digest: &Sha256Hex) -> Verdict {
    match seen.find(uuid) {
        None => match seen.bound_digest(uuid) {
            None if seen.bound.len() >= MAX_BOUND_ATTEMPTS => Verdict::Full,
            None => Verdict::New,
            Some(earlier) if earlier != digest => Verdict::Conflict {
                earlier: earlier.clone(),
            },
            Some(_) => Verdict::EndedLongAgo,
        },
        Some(s) if &s.digest != digest => Verdict::Conflict {
            earlier: s.digest.clone(),
        },
        Some(s) if s.outcome.has_ended() => Verdict::Ended(s.outcome),
        Some(_) => Verdict::Forwarded,
    }
}

/// The conflict message (published as the failed status's error).
pub fn conflict_message(uuid: &AttemptUuid, earlier: &Sha256Hex, digest: &Sha256Hex) -> String {
    format!(
        "attempt {uuid} was seen before with digest {earlier}, and this content has digest {digest}: one UUID names one attempt; write a new attempt with a new UUID"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::contracts::SeenAttempt;
    use fleet_common::validate::{ArtifactUrl, MaxBytes};
    use fleet_common::Timestamp;

    fn device() -> DeviceId {
        DeviceId::parse("dev1").expect("device")
    }

    fn attempt() -> AgentUpgradeAttempt {
        AgentUpgradeAttempt {
            arch: Arch::X86_64,
            artifact_url: ArtifactUrl::parse("https://releases.example.com/a").expect("url"),
            device_id: device(),
            max_bytes: MaxBytes::new(1024).expect("max"),
            sha256: Sha256Hex::of(b"binary"),
            target_version: Version::parse("2.0").expect("version"),
            uuid: AttemptUuid::parse("0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10").expect("uuid"),
        }
    }

    fn json(a: &AgentUpgradeAttempt) -> Vec<u8> {
        serde_json::to_vec(a).expect("json")
    }

    #[test]
    fn a_valid_attempt_for_this_device_and_arch_is_accepted() {
        let a = attempt();
        let (got, digest) = decode(&json(&a), &device(), Arch::X86_64).expect("valid");
        assert_eq!(got, a);
        assert_eq!(digest, a.digest());
    }

    #[test]
    fn another_device_is_refused_naming_both() {
        let mut a = attempt();
        a.device_id = DeviceId::parse("dev2").expect("device");
        let r = decode(&json(&a), &device(), Arch::X86_64).expect_err("other device");
        assert_eq!(r.uuid, Some(a.uuid));
        assert_eq!(r.target_version, Some(a.target_version.clone()));
        assert_eq!(r.digest, a.digest());
        assert_eq!(
            r.rule.to_string(),
            "the attempt is for device dev2, and this is device dev1: write the intent with this device's id"
        );
    }

    #[test]
    fn another_arch_is_refused_naming_both() {
        let mut a = attempt();
        a.arch = Arch::Aarch64;
        let r = decode(&json(&a), &device(), Arch::X86_64).expect_err("other arch");
        assert_eq!(
            r.rule,
            Rule::OtherArch {
                named: Arch::Aarch64,
                here: Arch::X86_64
            }
        );
        assert_eq!(
            r.rule.to_string(),
            "the attempt is for aarch64, and this device is x86_64: use the release's x86_64 artifact"
        );
    }

    #[test]
    fn an_invalid_uuid_is_refused_and_has_no_identity() {
        let mut v = serde_json::to_value(attempt()).expect("value");
        v["uuid"] = "0F6E4C1A-6D0B-4C39-9B64-3F1D2A7E5C10".into();
        let raw = serde_json::to_vec(&v).expect("json");
        let r = decode(&raw, &device(), Arch::X86_64).expect_err("uppercase uuid");
        assert_eq!(r.uuid, None, "no UUID to publish a status under");
        assert_eq!(r.target_version, Some(Version::parse("2.0").expect("v")));
        assert_eq!(r.digest, Sha256Hex::of(&raw));
        assert!(
            r.rule.to_string().starts_with(
                "the intent is not a valid attempt: invalid attempt uuid \"0F6E4C1A-6D0B-4C39-9B64-3F1D2A7E5C10\""
            ),
            "{}",
            r.rule
        );
        for nil in ["00000000-0000-0000-0000-000000000000", "not-a-uuid"] {
            v["uuid"] = nil.into();
            let r = decode(
                &serde_json::to_vec(&v).expect("json"),
                &device(),
                Arch::X86_64,
            )
            .expect_err(nil);
            assert_eq!(r.uuid, None);
        }
    }

    #[test]
    fn invalid_content_keeps_a_valid_uuid_so_it_can_be_reported() {
        let mut v = serde_json::to_value(attempt()).expect("value");
        v["sha256"] = "ABC".into();
        v["source-version"] = "1.0".into();
        let raw = serde_json::to_vec(&v).expect("json");
        let r = decode(&raw, &device(), Arch::X86_64).expect_err("bad sha");
        assert_eq!(r.uuid, Some(attempt().uuid));
        assert!(matches!(r.rule, Rule::Invalid(_)), "{:?}", r.rule);
        let r = decode(b"not json", &device(), Arch::X86_64).expect_err("not json");
        assert_eq!((r.uuid, r.target_version), (None, None));
        let big = vec![b' '; MAX_KV_VALUE_BYTES + 1];
        let r = decode(&big, &device(), Arch::X86_64).expect_err("too large");
        assert_eq!(
            r.rule.to_string(),
            format!(
                "the intent is {} bytes, more than the {MAX_KV_VALUE_BYTES}-byte limit of an attempt",
                MAX_KV_VALUE_BYTES + 1
            )
        );
    }

    /// Each value without a valid attempt identity is
    /// described for a refused-intent report, quoting the offending fields.
    #[test]
    fn values_without_an_identity_are_described() {
        let good = serde_json::to_value(attempt()).expect("value");
        let with = |field: &str, v: Value| {
            let mut x = good.clone();
            x[field] = v;
            serde_json::to_vec(&x).expect("json")
        };
        let long = "1".repeat(256);
        let cases: [(Vec<u8>, IntentRule, &str, &str); 5] = [
            (
                with("target-version", "1.0/../../etc/x".into()),
                IntentRule::InvalidTargetVersion,
                "target-version",
                "1.0/../../etc/x",
            ),
            (
                with("target-version", "1.0\u{0}".into()),
                IntentRule::InvalidTargetVersion,
                "target-version",
                "1.0\\u{0}",
            ),
            (
                with("target-version", "\u{ff11}.\u{ff10}".into()),
                IntentRule::InvalidTargetVersion,
                "target-version",
                "\\u{ff11}.\\u{ff10}",
            ),
            (
                with("target-version", long.as_str().into()),
                IntentRule::InvalidTargetVersion,
                "target-version",
                &format!("{}…", "1".repeat(64)),
            ),
            (
                with("uuid", "not-a-uuid".into()),
                IntentRule::InvalidUuid,
                "uuid",
                "not-a-uuid",
            ),
        ];
        for (raw, rule, field, excerpt) in &cases {
            let r = decode(raw, &device(), Arch::X86_64).expect_err(excerpt);
            let u = r.unidentified.expect("described");
            assert_eq!(u.rule, *rule, "{excerpt}");
            assert_eq!(u.bytes, raw.len() as u64);
            assert_eq!(u.fields.len(), 1, "{:?}", u.fields);
            assert_eq!(
                (u.fields[0].field.as_str(), u.fields[0].excerpt.as_str()),
                (*field, *excerpt)
            );
        }
        // Both identity fields bad, plus an unknown field: the UUID's rule,
        // every offender quoted in name order.
        let mut x = good.clone();
        x["uuid"] = 7.into();
        x["target-version"] = "..".into();
        x["extra"] = serde_json::json!({"a": [1]});
        let raw = serde_json::to_vec(&x).expect("json");
        let u = decode(&raw, &device(), Arch::X86_64)
            .expect_err("bad")
            .unidentified
            .expect("described");
        assert_eq!(u.rule, IntentRule::InvalidUuid);
        let quoted: Vec<(&str, &str)> = u
            .fields
            .iter()
            .map(|f| (f.field.as_str(), f.excerpt.as_str()))
            .collect();
        assert_eq!(
            quoted,
            [
                ("extra", "{\"a\":[1]}"),
                ("target-version", ".."),
                ("uuid", "7")
            ]
        );
        // Missing fields, not an object, too large.
        let mut x = good.clone();
        x.as_object_mut().expect("object").remove("target-version");
        let raw = serde_json::to_vec(&x).expect("json");
        let u = decode(&raw, &device(), Arch::X86_64)
            .expect_err("missing")
            .unidentified
            .expect("described");
        assert_eq!(
            (u.rule, u.fields.len()),
            (IntentRule::MissingTargetVersion, 0)
        );
        for (raw, rule) in [
            (b"[1]".to_vec(), IntentRule::Malformed),
            (b"{".to_vec(), IntentRule::Malformed),
            (vec![b' '; MAX_KV_VALUE_BYTES + 1], IntentRule::TooLarge),
        ] {
            let u = decode(&raw, &device(), Arch::X86_64)
                .expect_err("bad")
                .unidentified
                .expect("described");
            assert_eq!(u.rule, rule);
        }
        // A valid identity with another invalid field keeps the attempt form.
        let r = decode(&with("sha256", "ABC".into()), &device(), Arch::X86_64).expect_err("sha");
        assert_eq!(r.unidentified, None);
        assert!(r.uuid.is_some() && r.target_version.is_some());
    }

    #[test]
    fn verdicts_follow_the_record() {
        let a = attempt();
        let mut seen = SeenAttempts::default();
        assert_eq!(verdict(&seen, &a.uuid, &a.digest()), Verdict::New);
        let record = |outcome| SeenAttempt {
            uuid: a.uuid,
            digest: a.digest(),
            target_version: Some(a.target_version.clone()),
            outcome,
            at: Timestamp::from_unix_millis(0),
        };
        seen.record(record(AttemptOutcome::Forwarded)).expect("new");
        assert_eq!(verdict(&seen, &a.uuid, &a.digest()), Verdict::Forwarded);
        let other = Sha256Hex::of(b"other content");
        assert_eq!(
            verdict(&seen, &a.uuid, &other),
            Verdict::Conflict {
                earlier: a.digest()
            }
        );
        for outcome in [
            AttemptOutcome::Complete,
            AttemptOutcome::Failed,
            AttemptOutcome::RollbackFailed,
            AttemptOutcome::Rejected,
        ] {
            seen.record(record(outcome)).expect("same digest");
            assert_eq!(
                verdict(&seen, &a.uuid, &a.digest()),
                Verdict::Ended(outcome)
            );
        }
        assert_eq!(
            conflict_message(&a.uuid, &a.digest(), &other),
            format!("attempt 0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10 was seen before with digest {}, and this content has digest {other}: one UUID names one attempt; write a new attempt with a new UUID", a.digest())
        );
    }

    /// 70 other attempts later (more than the full records
    /// kept), the first UUID with another digest is still a conflict, and
    /// with its own digest it is still ended.
    #[test]
    fn the_binding_outlives_the_full_records() {
        let a = attempt();
        let mut seen = SeenAttempts::default();
        let record = |uuid, digest| SeenAttempt {
            uuid,
            digest,
            target_version: None,
            outcome: AttemptOutcome::Failed,
            at: Timestamp::from_unix_millis(0),
        };
        seen.record(record(a.uuid, a.digest())).expect("new");
        for n in 0..70u32 {
            seen.record(record(
                AttemptUuid::new_random(),
                Sha256Hex::of(&n.to_be_bytes()),
            ))
            .expect("new");
        }
        assert_eq!(seen.find(&a.uuid), None, "the full record made room");
        let other = Sha256Hex::of(b"v4.0 content");
        assert_eq!(
            verdict(&seen, &a.uuid, &other),
            Verdict::Conflict {
                earlier: a.digest()
            }
        );
        assert_eq!(verdict(&seen, &a.uuid, &a.digest()), Verdict::EndedLongAgo);
    }
}
