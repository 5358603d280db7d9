//! Enrollment: what a new device asks ([`EnrollRequest`]), what it is told
//! ([`EnrollAnswer`]), and the fleet's record of every device it knows
//! ([`DeviceRecord`], key `<device>` of `fleet-registry`).
//!
//! The flow and who may write what: `docs/design/enrollment.md`. A device's
//! identity is its own user nkey (generated on the device, the seed never
//! leaves it); the registry binds a device id to one public key and says
//! whether that pair may join.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::nkey::{NkeyKind, PublicNkey};
use crate::time::Timestamp;
use crate::validate::DeviceId;

/// Largest enrollment request accepted, in bytes (the ENROLL user's
/// `payload` limit too).
pub const MAX_ENROLL_REQUEST_BYTES: usize = 4096;
/// Facts a request may carry.
pub const MAX_FACTS: usize = 16;
/// Characters of a fact's value.
pub const MAX_FACT_CHARS: usize = 128;
/// Characters of a reason (a refusal's, an operator's note).
pub const MAX_REASON_CHARS: usize = 256;

/// Fact names every agent sends (others may be added, up to [`MAX_FACTS`]).
pub const FACT_ARCH: &str = "arch";
pub const FACT_OS: &str = "os";
pub const FACT_MACHINE_ID: &str = "machine-id";
pub const FACT_SERIAL: &str = "serial";
pub const FACT_AGENT_VERSION: &str = "agent-version";

/// A device's request to join, sent on `fleetenroll.key.<public key>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct EnrollRequest {
    pub device_id: DeviceId,
    /// The device's user nkey (`U...`); must equal the key in the subject,
    /// which the auth callout verified the device holds.
    pub public_key: String,
    /// Name → value, each name a label key ([`crate::contracts::is_label_key`]).
    pub facts: BTreeMap<String, String>,
}

/// Why an enrollment request is refused before anything is read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrollRequestError {
    TooLarge(usize),
    Malformed(String),
    PublicKey(String),
    /// The request's key is not the key the connection proved.
    KeyMismatch,
    Facts(String),
}

impl std::fmt::Display for EnrollRequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge(n) => write!(
                f,
                "enrollment request of {n} bytes, over the {MAX_ENROLL_REQUEST_BYTES}-byte limit"
            ),
            Self::Malformed(e) => write!(f, "malformed enrollment request: {e}"),
            Self::PublicKey(e) => write!(f, "enrollment request's public key: {e}"),
            Self::KeyMismatch => f.write_str(
                "the request's public key is not the key this connection proved it holds",
            ),
            Self::Facts(e) => write!(f, "enrollment request's facts: {e}"),
        }
    }
}

impl std::error::Error for EnrollRequestError {}

impl EnrollRequest {
    /// Parses and checks a request that arrived on the subject of
    /// `proven_key`.
    pub fn parse(payload: &[u8], proven_key: &str) -> Result<Self, EnrollRequestError> {
        if payload.len() > MAX_ENROLL_REQUEST_BYTES {
            return Err(EnrollRequestError::TooLarge(payload.len()));
        }
        let r: Self = serde_json::from_slice(payload)
            .map_err(|e| EnrollRequestError::Malformed(e.to_string()))?;
        PublicNkey::parse_kind(&r.public_key, NkeyKind::User)
            .map_err(|e| EnrollRequestError::PublicKey(e.to_string()))?;
        if r.public_key != proven_key {
            return Err(EnrollRequestError::KeyMismatch);
        }
        check_facts(&r.facts).map_err(EnrollRequestError::Facts)?;
        Ok(r)
    }
}

/// Facts within their limits: names are label keys, values bounded
/// printable text.
pub fn check_facts(facts: &BTreeMap<String, String>) -> Result<(), String> {
    if facts.len() > MAX_FACTS {
        return Err(format!("{} facts, at most {MAX_FACTS}", facts.len()));
    }
    for (k, v) in facts {
        if !crate::contracts::is_label_key(k) {
            return Err(format!("fact name {k:?} is not a label key"));
        }
        if v.chars().count() > MAX_FACT_CHARS {
            return Err(format!("fact {k} is over {MAX_FACT_CHARS} characters"));
        }
        if v.chars().any(char::is_control) {
            return Err(format!("fact {k} has control characters"));
        }
    }
    Ok(())
}

/// Where a device stands with the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordState {
    /// Asked to join; waiting for an operator or the auto-approve rule.
    Pending,
    /// May connect as itself with the recorded key.
    Approved,
    /// Refused by an operator; asking again changes nothing until an
    /// operator approves.
    Rejected,
    /// May not connect; its data stays.
    Revoked,
    /// Revoked and its data removed; re-enrolling needs an explicit approval.
    Decommissioned,
}

impl RecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Revoked => "revoked",
            Self::Decommissioned => "decommissioned",
        }
    }
}

/// A request that named this record's device with another key: refused,
/// kept here for the operator (the newest one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Conflict {
    pub public_key: String,
    pub facts: BTreeMap<String, String>,
    pub at: Timestamp,
    /// Conflicting requests seen (saturating).
    pub count: u32,
}

/// A place in the lobby (`fleet-lobby` key `<device>`): taken by the
/// enrollment service or the callout before it writes a new pending
/// record, freed by fleetctl once the device is decided. The lobby's
/// stream refuses a new key beyond [`MAX_PENDING_DEVICES`](crate::limits::MAX_PENDING_DEVICES).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LobbyTicket {
    pub requested_at: Timestamp,
}

/// The fleet's record of one device (`fleet-registry` key `<device>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct DeviceRecord {
    pub device_id: DeviceId,
    pub state: RecordState,
    /// The device's user nkey; `None` for a device approved by id alone
    /// (one that authenticates with an identity-provider token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    #[serde(default)]
    pub facts: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Timestamp>,
    /// Who decided: `operator`, `preauthorized`, `auto-approve <selector>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<Conflict>,
}

impl DeviceRecord {
    /// Whether `key` may connect as this device now.
    pub fn admits(&self, key: &str) -> bool {
        self.state == RecordState::Approved && self.public_key.as_deref() == Some(key)
    }

    /// Whether this device may connect by id alone (an identity-provider
    /// token proved the id).
    pub fn admits_id(&self) -> bool {
        self.state == RecordState::Approved
    }
}

/// What a device is told about its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnswerState {
    /// Waiting for approval: ask again after `retry-after-secs`.
    Pending,
    /// Connect as yourself.
    Approved,
    /// Refused by an operator (or the request was bad): `reason` says why.
    Rejected,
    /// This device was decommissioned: an operator must approve it again.
    Decommissioned,
    /// Too many requests: ask again after `retry-after-secs`.
    SlowDown,
}

impl AnswerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Decommissioned => "decommissioned",
            Self::SlowDown => "slow-down",
        }
    }
}

/// The answer to an [`EnrollRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct EnrollAnswer {
    pub state: AnswerState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When to ask again (pending, slow-down, and after a refusal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

/// The agent's record of its approval (`enrolled.json` in its state
/// directory): with it, a restart connects as the device at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Enrolled {
    pub device_id: DeviceId,
    pub public_key: String,
    pub approved_at: Timestamp,
}

/// A device id and public key of a device provisioned at the factory
/// (`fleetctl device preauthorize --file`: one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Preauthorized {
    pub device_id: DeviceId,
    pub public_key: String,
}

impl Preauthorized {
    pub fn check(&self) -> Result<(), String> {
        PublicNkey::parse_kind(&self.public_key, NkeyKind::User)
            .map(|_| ())
            .map_err(|e| format!("device {}: public key: {e}", self.device_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> String {
        nkeys::KeyPair::new_user().public_key()
    }

    fn request(id: &str, key: &str) -> Vec<u8> {
        serde_json::json!({
            "device-id": id, "public-key": key,
            "facts": {"arch": "arm64", "os": "Debian GNU/Linux 12"}
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_good_request_parses_and_bad_ones_say_why() {
        let k = key();
        let r = EnrollRequest::parse(&request("dev-a", &k), &k).expect("valid");
        assert_eq!(r.device_id.as_str(), "dev-a");
        assert_eq!(
            EnrollRequest::parse(&request("dev-a", &k), &key()),
            Err(EnrollRequestError::KeyMismatch)
        );
        for bad in ["dev.a", "dev a", "*", ">", ""] {
            assert!(matches!(
                EnrollRequest::parse(&request(bad, &k), &k),
                Err(EnrollRequestError::Malformed(_))
            ));
        }
        let account = nkeys::KeyPair::new_account().public_key();
        assert!(matches!(
            EnrollRequest::parse(&request("dev-a", &account), &account),
            Err(EnrollRequestError::PublicKey(_))
        ));
        let big = vec![b' '; MAX_ENROLL_REQUEST_BYTES + 1];
        assert!(matches!(
            EnrollRequest::parse(&big, &k),
            Err(EnrollRequestError::TooLarge(_))
        ));
        let long = serde_json::json!({
            "device-id": "dev-a", "public-key": k,
            "facts": {"serial": "x".repeat(MAX_FACT_CHARS + 1)}
        });
        assert!(matches!(
            EnrollRequest::parse(long.to_string().as_bytes(), &k),
            Err(EnrollRequestError::Facts(_))
        ));
        let many: BTreeMap<String, String> = (0..=MAX_FACTS)
            .map(|i| (format!("f{i}"), "v".to_owned()))
            .collect();
        let many = serde_json::json!({"device-id": "dev-a", "public-key": k, "facts": many});
        assert!(matches!(
            EnrollRequest::parse(many.to_string().as_bytes(), &k),
            Err(EnrollRequestError::Facts(_))
        ));
        let odd = serde_json::json!({"device-id": "dev-a", "public-key": k, "facts": {}, "x": 1});
        assert!(matches!(
            EnrollRequest::parse(odd.to_string().as_bytes(), &k),
            Err(EnrollRequestError::Malformed(_))
        ));
    }

    #[test]
    fn a_record_admits_only_its_approved_key() {
        let k = key();
        let mut r = DeviceRecord {
            device_id: DeviceId::parse("dev-a").expect("valid"),
            state: RecordState::Pending,
            public_key: Some(k.clone()),
            facts: BTreeMap::new(),
            requested_at: None,
            decided_at: None,
            decided_by: None,
            conflict: None,
        };
        assert!(!r.admits(&k));
        r.state = RecordState::Approved;
        assert!(r.admits(&k));
        assert!(!r.admits(&key()));
        for s in [
            RecordState::Rejected,
            RecordState::Revoked,
            RecordState::Decommissioned,
        ] {
            r.state = s;
            assert!(!r.admits(&k) && !r.admits_id());
        }
    }
}
