//! One authorization request in, one decision and the response to send out.
//!
//! Steps of [`Callout::handle`]: decode and verify the server's request
//! (unanswerable when that fails: nothing in it can be trusted to address a
//! refusal); check it is addressed to this issuer; take the bearer token from
//! the client's CONNECT `auth_token` (nats-server discards a CONNECT `jwt`
//! outside operator mode, so that field never arrives); verify it
//! (`jwt::verify`, keys from the JWKS cache); issue a user JWT in `DEVICES`
//! for the device it proves, with exactly the permission template of
//! `fleet_common`, expiring with the token but at most
//! `max_user_lifetime_secs` after now: the server then closes the
//! connection and the device must connect again (its token verified again).
//! Every other outcome is a refusal with its reason; there is no default
//! permission. Nothing the client says about itself (name, user) is used.
//!
//! With enrollment configured (`docs/design/enrollment.md`), a CONNECT that
//! carries an nkey (`nkey`, `sig`) is decided by [`Callout::decide_nkey`]
//! instead: the signature of the server's nonce proves the device holds the
//! key; the claimed `user` names the record read from the registry; an
//! approved record with that key gets the device's user in `DEVICES`, a
//! revoked one nothing, and anything else with a valid enrollment token
//! (`auth_token`) a user in `ENROLL` that may only ask to join. The bearer
//! path may also require approval of the token's device: a device the
//! registry does not know is refused and put in the lobby (a pending
//! record by id, without a key, at most
//! [`ENROLL_NEW_PENDING_PER_MINUTE`](fleet_common::limits::ENROLL_NEW_PENDING_PER_MINUTE)
//! new ones a minute per instance), where `fleetctl device pending` shows it
//! and `fleetctl device approve` lets it in at its next reconnect. It gets
//! no `ENROLL` user: those permissions are named after a key, and a bearer
//! device has none.

use std::fmt;
use std::time::Instant;

use std::sync::Arc;

use fleet_common::callout::{AuthRequestClaims, AuthResponseClaims, UserClaims};
use fleet_common::contracts::{check_facts, DeviceRecord, RecordState, MAX_FACT_CHARS};
use fleet_common::limits::ENROLL_USER_LIFETIME_SECS;
use fleet_common::nkey::{NkeyKind, PublicNkey};
use fleet_common::time::Timestamp;
use fleet_common::validate::DeviceId;

use crate::enroll::PendingBudget;
use crate::registry::Registry;

use crate::jwks::JwksCache;
use crate::jwt::{self, BearerPolicy, TokenError};
use crate::natsjwt::{self, EncodeError, RequestError};
use crate::nkeys::AccountSigner;

/// Why a client was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `auth_token` in the CONNECT.
    NoBearer,
    Token(TokenError),
    /// An nkey whose signature of the nonce does not verify.
    Signature(String),
    /// An nkey CONNECT without a valid device id as `user`.
    NoDeviceId,
    /// Not approved and no valid enrollment token.
    NotApproved {
        device: String,
        state: Option<RecordState>,
    },
    /// An identity-provider device the registry does not approve.
    AwaitingApproval {
        device: DeviceId,
        state: Option<RecordState>,
    },
    /// Revoked by the operator.
    Revoked(DeviceId),
    /// The registry could not be read.
    Registry(String),
    /// A bearer token, and this callout has no identity provider.
    NoIdentityProvider,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoBearer => f.write_str(
                "no bearer token: connect with the identity provider's access token as the NATS token",
            ),
            Self::Token(e) => e.fmt(f),
            Self::Signature(e) => write!(f, "nkey signature of the nonce: {e}"),
            Self::NoDeviceId => f.write_str(
                "an nkey connection must give its device id as the user name",
            ),
            Self::NotApproved { device, state } => write!(
                f,
                "device {device} is not approved ({}) and gave no valid enrollment token",
                state.map_or("no record", |s| s.as_str())
            ),
            Self::AwaitingApproval { device, state } => write!(
                f,
                "device {device} is not approved ({}): an operator approves it with `fleetctl device approve {device}`",
                state.map_or("no record", |s| s.as_str())
            ),
            Self::Revoked(d) => write!(f, "device {d} is revoked"),
            Self::Registry(e) => e.fmt(f),
            Self::NoIdentityProvider => f.write_str(
                "a bearer token, and this callout has no identity provider (issuer, audience and jwks_url are not configured): this fleet admits enrolled devices only; give the device the enrollment method",
            ),
        }
    }
}

/// What enrollment adds to the callout: the enrollment tokens, and whether
/// a bearer token's device must be approved too.
#[derive(Debug, Clone)]
pub struct EnrollGate {
    pub tokens: Vec<String>,
    pub idp_requires_approval: bool,
}

impl EnrollGate {
    /// Whether `token` is one of the enrollment tokens (compared in
    /// constant time).
    fn accepts(&self, token: Option<&str>) -> bool {
        let Some(token) = token else {
            return false;
        };
        self.tokens.iter().fold(false, |ok, t| ok | same(t, token))
    }
}

/// Constant-time equality of two secrets (time depends on the lengths only).
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the callout decided about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Authorized {
        device: DeviceId,
        /// The user JWT's expiry, unix seconds.
        expires: i64,
        subject: Option<String>,
    },
    /// A device not (yet) approved that proved its key and gave an
    /// enrollment token: a user in `ENROLL`.
    Enroll {
        key: String,
        /// The device id it claimed (for logs).
        claimed: String,
        expires: i64,
    },
    Refused(Refusal),
}

/// Who asked, for logs (the client's own words, never trusted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    pub server: String,
    pub client_host: String,
    pub client_id: u64,
    pub client_name: String,
}

impl Requester {
    fn of(r: &AuthRequestClaims) -> Self {
        Self {
            server: r.nats.server_id.name.clone(),
            client_host: r.nats.client_info.host.clone(),
            client_id: r.nats.client_info.id,
            client_name: r.nats.client_info.name.clone(),
        }
    }
}

/// The outcome of one request.
#[derive(Debug)]
pub enum Outcome {
    /// Send `response` (a signed authorization response JWT) as the reply.
    Answer {
        response: String,
        decision: Decision,
        requester: Requester,
    },
    /// Do not answer: the request itself is not to be trusted.
    Unanswerable(Unanswerable),
}

/// Why a request gets no answer.
#[derive(Debug)]
pub enum Unanswerable {
    Request(RequestError),
    /// Addressed to another issuer account than ours.
    OtherIssuer {
        expected: String,
        found: String,
    },
    Encode(EncodeError),
}

impl fmt::Display for Unanswerable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request(e) => e.fmt(f),
            Self::OtherIssuer { expected, found } => write!(
                f,
                "authorization request for issuer {found}, this callout signs as {expected}: make auth_callout.issuer in the server config this callout's public key"
            ),
            Self::Encode(e) => e.fmt(f),
        }
    }
}

/// The callout: issuer key, JWKS cache (none: enrolled devices only) and
/// bearer policy; with enrollment, the gate and the registry.
pub struct Callout {
    signer: AccountSigner,
    jwks: Option<JwksCache>,
    policy: BearerPolicy,
    enrollment: Option<(EnrollGate, Arc<dyn Registry>)>,
    /// New lobby records of identity-provider devices this minute.
    lobby: PendingBudget,
}

impl fmt::Debug for Callout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Callout")
            .field("issuer", &self.issuer())
            .field("enrollment", &self.enrollment.is_some())
            .finish()
    }
}

impl Callout {
    pub fn new(signer: AccountSigner, jwks: Option<JwksCache>, policy: BearerPolicy) -> Self {
        Self {
            signer,
            jwks,
            policy,
            enrollment: None,
            lobby: PendingBudget::new(),
        }
    }

    /// Decides nkey connections too, and gates bearer ones if `gate` says so.
    pub fn with_enrollment(mut self, gate: EnrollGate, registry: Arc<dyn Registry>) -> Self {
        self.enrollment = Some((gate, registry));
        self
    }

    pub fn issuer(&self) -> String {
        self.signer.public_key().encode()
    }

    pub fn jwks(&self) -> Option<&JwksCache> {
        self.jwks.as_ref()
    }

    /// Decides `payload` (the request message) at unix time `now_unix` and
    /// monotonic time `now`.
    pub fn handle(&self, payload: &[u8], now_unix: i64, now: Instant) -> Outcome {
        let request = match natsjwt::decode_request(payload, now_unix, self.policy.clock_skew_secs)
        {
            Ok(r) => r,
            Err(e) => return Outcome::Unanswerable(Unanswerable::Request(e)),
        };
        let issuer = self.issuer();
        if request.sub != issuer {
            return Outcome::Unanswerable(Unanswerable::OtherIssuer {
                expected: issuer,
                found: request.sub,
            });
        }
        let requester = Requester::of(&request);
        let decision = self.decide(&request, now_unix, now);
        let response = match &decision {
            Decision::Authorized {
                device, expires, ..
            } => {
                let user = UserClaims::for_device(
                    device,
                    &request.nats.user_nkey,
                    &issuer,
                    now_unix,
                    *expires,
                    self.policy.device_protocols,
                );
                natsjwt::encode(user, &self.signer).and_then(|user_jwt| {
                    natsjwt::encode(
                        AuthResponseClaims::authorized(&request, &issuer, now_unix, user_jwt),
                        &self.signer,
                    )
                })
            }
            Decision::Enroll { key, expires, .. } => {
                let user = UserClaims::for_enrollment(
                    key,
                    &request.nats.user_nkey,
                    &issuer,
                    now_unix,
                    *expires,
                );
                natsjwt::encode(user, &self.signer).and_then(|user_jwt| {
                    natsjwt::encode(
                        AuthResponseClaims::authorized(&request, &issuer, now_unix, user_jwt),
                        &self.signer,
                    )
                })
            }
            Decision::Refused(why) => natsjwt::encode(
                AuthResponseClaims::refused(&request, &issuer, now_unix, why.to_string()),
                &self.signer,
            ),
        };
        match response {
            Ok(response) => Outcome::Answer {
                response,
                decision,
                requester,
            },
            Err(e) => Outcome::Unanswerable(Unanswerable::Encode(e)),
        }
    }

    fn decide(&self, request: &AuthRequestClaims, now_unix: i64, now: Instant) -> Decision {
        let opts = &request.nats.connect_opts;
        if let Some((gate, registry)) = &self.enrollment {
            if let Some(nkey) = opts.nkey.as_deref().filter(|k| !k.is_empty()) {
                return self.decide_nkey(gate, registry.as_ref(), request, nkey, now_unix);
            }
        }
        let decision = self.decide_bearer(request, now_unix, now);
        match (&decision, &self.enrollment) {
            (
                Decision::Authorized {
                    device, subject, ..
                },
                Some((gate, registry)),
            ) if gate.idp_requires_approval => match registry.read(device) {
                Ok(r) if r.record.as_ref().is_some_and(|r| r.admits_id()) => decision,
                Ok(r) => {
                    if r.record.is_none() && self.lobby.take(now) {
                        knock(registry.as_ref(), device, subject.as_deref());
                    }
                    Decision::Refused(Refusal::AwaitingApproval {
                        device: device.clone(),
                        state: r.record.map(|r| r.state),
                    })
                }
                Err(e) => Decision::Refused(Refusal::Registry(e.to_string())),
            },
            _ => decision,
        }
    }

    /// An nkey CONNECT: the signed nonce, the claimed device, its record.
    fn decide_nkey(
        &self,
        gate: &EnrollGate,
        registry: &dyn Registry,
        request: &AuthRequestClaims,
        nkey: &str,
        now_unix: i64,
    ) -> Decision {
        let opts = &request.nats.connect_opts;
        if let Err(e) = verify_nonce(nkey, opts.sig.as_deref(), &request.nats.client_info.nonce) {
            return Decision::Refused(Refusal::Signature(e));
        }
        let claimed = opts.user.clone().unwrap_or_default();
        let Ok(device) = DeviceId::parse(&claimed) else {
            return Decision::Refused(Refusal::NoDeviceId);
        };
        let record = match registry.read(&device) {
            Ok(r) => r.record,
            Err(e) => return Decision::Refused(Refusal::Registry(e.to_string())),
        };
        if let Some(r) = &record {
            if r.admits(nkey) {
                return Decision::Authorized {
                    device,
                    expires: now_unix.saturating_add(self.policy.max_user_lifetime_secs),
                    subject: None,
                };
            }
            if r.state == RecordState::Revoked && r.public_key.as_deref() == Some(nkey) {
                return Decision::Refused(Refusal::Revoked(device));
            }
        }
        if gate.accepts(opts.auth_token.as_deref()) {
            return Decision::Enroll {
                key: nkey.to_owned(),
                claimed,
                expires: now_unix.saturating_add(ENROLL_USER_LIFETIME_SECS),
            };
        }
        Decision::Refused(Refusal::NotApproved {
            device: claimed,
            state: record.map(|r| r.state),
        })
    }

    fn decide_bearer(&self, request: &AuthRequestClaims, now_unix: i64, now: Instant) -> Decision {
        let opts = &request.nats.connect_opts;
        let Some(token) = opts.auth_token.as_deref().filter(|t| !t.is_empty()) else {
            return Decision::Refused(Refusal::NoBearer);
        };
        let Some(jwks) = &self.jwks else {
            return Decision::Refused(Refusal::NoIdentityProvider);
        };
        match jwt::verify(token, |kid| jwks.key(kid, now), &self.policy, now_unix) {
            Ok(v) => Decision::Authorized {
                device: v.device,
                // The user lives as long as the token proves it (within the
                // tolerated skew; `verify` ensured this is after now), and
                // never longer than `max_user_lifetime_secs` from now. Clamped
                // rather than refused: the provider decides how long its
                // tokens live (an operator may well choose days), and
                // refusing would lock every device out over that choice; the
                // clamp alone bounds what we grant. When the user expires the
                // server closes the connection and the device connects again,
                // so its token is verified again against the current JWKS: a
                // withdrawn key or a disabled device loses access within the
                // bound however far away the token's `exp` is (2^53 included).
                expires: v
                    .expires
                    .saturating_add(self.policy.clock_skew_secs)
                    .min(now_unix.saturating_add(self.policy.max_user_lifetime_secs)),
                subject: v.subject,
            },
            Err(e) => Decision::Refused(Refusal::Token(e)),
        }
    }
}

/// Puts an identity-provider device the registry does not know in the
/// lobby: a pending record by id, no key, the token's subject as its one
/// fact, after a lobby ticket (a full lobby: nothing written). Created
/// only if still absent; a failure is logged and changes nothing (the
/// device is refused either way and asks again).
fn knock(registry: &dyn Registry, device: &DeviceId, subject: Option<&str>) {
    let mut facts = std::collections::BTreeMap::new();
    if let Some(sub) = subject {
        let sub: String = sub
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_FACT_CHARS)
            .collect();
        facts.insert(FACT_IDP_SUBJECT.to_owned(), sub);
    }
    if check_facts(&facts).is_err() {
        facts.clear();
    }
    let record = DeviceRecord {
        device_id: device.clone(),
        state: RecordState::Pending,
        public_key: None,
        facts,
        requested_at: Some(Timestamp::now()),
        decided_at: None,
        decided_by: None,
        conflict: None,
    };
    match registry.take_ticket(device, Timestamp::now()) {
        Ok(crate::registry::Ticket::Held) => {}
        Ok(crate::registry::Ticket::Full) => {
            log::warn!(device = device.as_str(); "identity-provider device {device} is not recorded as pending: {}", crate::enroll::lobby_full().reason.unwrap_or_default());
            return;
        }
        Ok(crate::registry::Ticket::NoLobby(why)) => crate::registry::warn_no_lobby(&why),
        Err(e) => {
            log::warn!(device = device.as_str(); "cannot record {device} as pending: {e}");
            return;
        }
    }
    match registry.write(&record, 0) {
        Ok(_) => {
            log::info!(device = device.as_str(); "identity-provider device {device} is waiting for approval: fleetctl device approve {device}")
        }
        Err(crate::registry::RegistryError::Moved) => {}
        Err(e) => log::warn!(device = device.as_str(); "cannot record {device} as pending: {e}"),
    }
}

/// The fact naming the identity-provider subject of a lobby record.
pub const FACT_IDP_SUBJECT: &str = "idp-subject";

/// Whether `sig` (base64url, as NATS clients send it) is `nkey`'s signature
/// of the nonce the server sent.
fn verify_nonce(nkey: &str, sig: Option<&str>, nonce: &str) -> Result<(), String> {
    if nonce.is_empty() {
        return Err("the server sent no nonce (the config needs its nkey user)".to_owned());
    }
    let key = PublicNkey::parse_kind(nkey, NkeyKind::User).map_err(|e| e.to_string())?;
    let sig = sig
        .and_then(fleet_common::b64::decode_url)
        .ok_or_else(|| "missing or not base64url".to_owned())?;
    let pair = nkeys::KeyPair::from_public_key(key.as_str()).map_err(|e| e.to_string())?;
    pair.verify(nonce.as_bytes(), &sig)
        .map_err(|_| "does not verify".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jwks::KeySet;
    use crate::jwt::tests::{claims, keys, policy, sign_rs256, NOW};
    use crate::natsjwt::tests::{request_claims, signed_request};
    use fleet_common::b64::decode_url;
    use fleet_common::subjects::{leaf_device_permissions, DeviceProtocols};
    use serde_json::{json, Value};
    use std::time::Duration;

    /// A callout whose JWKS cache is filled from `set` (no HTTPS: the source
    /// points nowhere and the cache never needs it within the test).
    fn callout(set: &Value) -> Callout {
        let seed = crate::nkeys::generate_account_seed().expect("seed");
        let signer = AccountSigner::from_seed(&seed).expect("signer");
        struct Fixed(Vec<u8>);
        impl crate::jwks::JwksSource for Fixed {
            fn fetch(&self) -> Result<Vec<u8>, crate::https::HttpsError> {
                Ok(self.0.clone())
            }
            fn location(&self) -> &str {
                "fixed"
            }
        }
        KeySet::parse(set.to_string().as_bytes()).expect("valid set");
        let jwks = JwksCache::new(
            Box::new(Fixed(set.to_string().into_bytes())),
            Duration::from_secs(30),
            Duration::from_secs(3600),
        );
        jwks.refresh(Instant::now()).expect("fills");
        Callout::new(signer, Some(jwks), policy())
    }

    fn payload(t: &str) -> Value {
        let p = t.split('.').nth(1).expect("payload");
        serde_json::from_slice(&decode_url(p).expect("b64")).expect("json")
    }

    fn ask(c: &Callout, opts: Value) -> (Value, Decision) {
        let server = nkeys::KeyPair::new_server();
        let user = nkeys::KeyPair::new_user().public_key();
        let mut req = request_claims(&server, &c.issuer(), &user, NOW);
        req["nats"]["connect_opts"] = opts;
        let token = signed_request(&server, &req);
        match c.handle(token.as_bytes(), NOW, Instant::now()) {
            Outcome::Answer {
                response, decision, ..
            } => {
                let p = payload(&response);
                assert_eq!(p["aud"], server.public_key().as_str());
                assert_eq!(p["sub"], user.as_str());
                assert_eq!(p["iss"], c.issuer().as_str());
                (p, decision)
            }
            Outcome::Unanswerable(e) => panic!("unanswered: {e}"),
        }
    }

    #[test]
    fn a_valid_token_gets_exactly_the_device_permissions() {
        let k = keys();
        let c = callout(&json!({"keys": [k.rsa_jwk]}));
        let token = sign_rs256(
            &k.rsa,
            &json!({"alg": "RS256", "kid": "rsa-test-1"}),
            &claims("dev-a"),
        );
        let (resp, decision) = ask(
            &c,
            json!({"auth_token": token, "name": "dev-b", "user": "dev-b"}),
        );
        let device = DeviceId::parse("dev-a").expect("valid");
        assert!(
            matches!(&decision, Decision::Authorized { device: d, expires, .. }
            if *d == device && *expires == NOW + 3600 + 60)
        );
        assert!(resp["nats"]["error"].is_null());
        let user = payload(resp["nats"]["jwt"].as_str().expect("user jwt"));
        let p = leaf_device_permissions(&device, DeviceProtocols::WithLegacy);
        assert_eq!(user["aud"], "DEVICES");
        assert_eq!(
            user["name"], "dev-a",
            "the token's device, not the client's name"
        );
        assert_eq!(user["sub"], resp["sub"]);
        assert_eq!(user["exp"], NOW + 3600 + 60);
        assert_eq!(user["nats"]["pub"], json!({"allow": p.publish_allow}));
        assert_eq!(user["nats"]["sub"], json!({"allow": p.subscribe_allow}));
        assert!(user["nats"]["resp"].is_null());
    }

    #[test]
    fn refusals_are_answered_with_their_reason() {
        let k = keys();
        let c = callout(&json!({"keys": [k.rsa_jwk]}));
        let (resp, decision) = ask(&c, json!({"user": "dev-a", "pass": "x"}));
        assert_eq!(decision, Decision::Refused(Refusal::NoBearer));
        assert_eq!(
            resp["nats"]["error"],
            Refusal::NoBearer.to_string().as_str()
        );
        assert!(resp["nats"]["jwt"].is_null());
        // A CONNECT jwt is not a bearer token (the server never forwards one).
        let (_, decision) = ask(&c, json!({"jwt": "d.e.f"}));
        assert_eq!(decision, Decision::Refused(Refusal::NoBearer));
        let mut expired = claims("dev-a");
        expired["exp"] = json!(NOW - 3600);
        let token = sign_rs256(
            &k.rsa,
            &json!({"alg": "RS256", "kid": "rsa-test-1"}),
            &expired,
        );
        let (resp, decision) = ask(&c, json!({"auth_token": token}));
        assert!(matches!(
            decision,
            Decision::Refused(Refusal::Token(TokenError::Expired { .. }))
        ));
        assert!(resp["nats"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("bearer token expired at")));
        assert!(
            !resp.to_string().contains(&token),
            "the token is never echoed"
        );
    }

    #[test]
    fn requests_for_another_issuer_or_forged_are_unanswered() {
        let k = keys();
        let c = callout(&json!({"keys": [k.rsa_jwk]}));
        let server = nkeys::KeyPair::new_server();
        let user = nkeys::KeyPair::new_user().public_key();
        let other = nkeys::KeyPair::new_account().public_key();
        let req = signed_request(&server, &request_claims(&server, &other, &user, NOW));
        assert!(matches!(
            c.handle(req.as_bytes(), NOW, Instant::now()),
            Outcome::Unanswerable(Unanswerable::OtherIssuer { .. })
        ));
        let forged = signed_request(
            &nkeys::KeyPair::new_server(),
            &request_claims(&server, &c.issuer(), &user, NOW),
        );
        assert!(matches!(
            c.handle(forged.as_bytes(), NOW, Instant::now()),
            Outcome::Unanswerable(Unanswerable::Request(RequestError::Signature))
        ));
    }

    fn ask_nkey(c: &Callout, opts: Value, nonce: &str) -> (Value, Decision) {
        let server = nkeys::KeyPair::new_server();
        let user = nkeys::KeyPair::new_user().public_key();
        let mut req = request_claims(&server, &c.issuer(), &user, NOW);
        req["nats"]["connect_opts"] = opts;
        req["nats"]["client_info"]["nonce"] = json!(nonce);
        let token = signed_request(&server, &req);
        match c.handle(token.as_bytes(), NOW, Instant::now()) {
            Outcome::Answer {
                response, decision, ..
            } => (payload(&response), decision),
            Outcome::Unanswerable(e) => panic!("unanswered: {e}"),
        }
    }

    fn signed(kp: &nkeys::KeyPair, nonce: &str) -> String {
        fleet_common::b64::encode_url(&kp.sign(nonce.as_bytes()).expect("sign"))
    }

    #[test]
    fn an_nkey_device_is_decided_by_the_registry() {
        use crate::registry::tests::MemRegistry;
        use fleet_common::contracts::DeviceRecord;
        let k = keys();
        let reg = Arc::new(MemRegistry::default());
        let c = callout(&json!({"keys": [k.rsa_jwk]})).with_enrollment(
            EnrollGate {
                tokens: vec!["batch-7-token".to_owned()],
                idp_requires_approval: true,
            },
            reg.clone(),
        );
        let dev = nkeys::KeyPair::new_user();
        let key = dev.public_key();
        let nonce = "server-nonce-1";
        let opts = |token: Option<&str>, sig: String| json!({"nkey": key, "sig": sig, "user": "dev-a", "auth_token": token});
        // Unknown, with the enrollment token: ENROLL, its own subjects only.
        let (resp, d) = ask_nkey(&c, opts(Some("batch-7-token"), signed(&dev, nonce)), nonce);
        assert!(
            matches!(&d, Decision::Enroll { key: k2, .. } if *k2 == key),
            "{d:?}"
        );
        let user = payload(resp["nats"]["jwt"].as_str().expect("user jwt"));
        assert_eq!(user["aud"], "ENROLL");
        assert_eq!(
            user["nats"]["pub"]["allow"],
            json!([format!("fleetenroll.key.{key}")])
        );
        assert_eq!(
            user["nats"]["sub"]["allow"],
            json!([format!("_INBOX.{key}.>")])
        );
        assert_eq!(user["exp"], NOW + ENROLL_USER_LIFETIME_SECS);
        // Without a token, a wrong token, a bad signature, no device id: refused.
        for (o, n) in [
            (opts(None, signed(&dev, nonce)), nonce),
            (opts(Some("batch-7-tokeN"), signed(&dev, nonce)), nonce),
            (opts(Some("batch-7-token"), signed(&dev, "other")), nonce),
            (
                opts(
                    Some("batch-7-token"),
                    signed(&nkeys::KeyPair::new_user(), nonce),
                ),
                nonce,
            ),
            (opts(Some("batch-7-token"), signed(&dev, "")), ""),
            (
                json!({"nkey": key, "sig": signed(&dev, nonce), "user": "dev.a", "auth_token": "batch-7-token"}),
                nonce,
            ),
        ] {
            let (resp, d) = ask_nkey(&c, o.clone(), n);
            assert!(matches!(d, Decision::Refused(_)), "{o}: {d:?}");
            assert!(resp["nats"]["jwt"].is_null());
        }
        // Approved with this key: DEVICES, with or without the token.
        let mut r = DeviceRecord {
            device_id: DeviceId::parse("dev-a").expect("id"),
            state: RecordState::Approved,
            public_key: Some(key.clone()),
            facts: Default::default(),
            requested_at: None,
            decided_at: None,
            decided_by: None,
            conflict: None,
        };
        reg.write(&r, 0).expect("approve");
        let (resp, d) = ask_nkey(&c, opts(None, signed(&dev, nonce)), nonce);
        assert!(matches!(&d, Decision::Authorized { device, .. } if device.as_str() == "dev-a"));
        let user = payload(resp["nats"]["jwt"].as_str().expect("user jwt"));
        assert_eq!(user["aud"], "DEVICES");
        assert_eq!(user["exp"], NOW + policy().max_user_lifetime_secs);
        // Another key claiming dev-a with the token: only ENROLL.
        let thief = nkeys::KeyPair::new_user();
        let o = json!({"nkey": thief.public_key(), "sig": signed(&thief, nonce), "user": "dev-a", "auth_token": "batch-7-token"});
        assert!(matches!(ask_nkey(&c, o, nonce).1, Decision::Enroll { .. }));
        // Revoked: refused even with the token.
        r.state = RecordState::Revoked;
        let rev = reg.read(&r.device_id).expect("read").revision;
        reg.write(&r, rev).expect("revoke");
        let (_, d) = ask_nkey(&c, opts(Some("batch-7-token"), signed(&dev, nonce)), nonce);
        assert!(matches!(d, Decision::Refused(Refusal::Revoked(_))), "{d:?}");
        // The registry down: refused (the device connects again).
        reg.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let (_, d) = ask_nkey(&c, opts(Some("batch-7-token"), signed(&dev, nonce)), nonce);
        assert!(
            matches!(d, Decision::Refused(Refusal::Registry(_))),
            "{d:?}"
        );
        // A bearer device must be approved by id when the gate says so.
        reg.down.store(false, std::sync::atomic::Ordering::SeqCst);
        let token = sign_rs256(
            &k.rsa,
            &json!({"alg": "RS256", "kid": "rsa-test-1"}),
            &claims("dev-b"),
        );
        let (resp, d) = ask(&c, json!({"auth_token": token}));
        assert!(
            matches!(d, Decision::Refused(Refusal::AwaitingApproval { .. })),
            "{d:?}"
        );
        assert!(
            resp["nats"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("fleetctl device approve dev-b")),
            "{resp}"
        );
        // It waits in the lobby: pending by id, no key, its subject.
        let dev_b = DeviceId::parse("dev-b").expect("id");
        let lobby = reg.read(&dev_b).expect("read");
        let waiting = lobby.record.clone().expect("a lobby record");
        assert_eq!(waiting.state, RecordState::Pending);
        assert_eq!(waiting.public_key, None);
        assert!(waiting.facts.contains_key(FACT_IDP_SUBJECT), "{waiting:?}");
        // Asking again writes nothing more.
        let (_, d) = ask(&c, json!({"auth_token": token}));
        assert!(matches!(d, Decision::Refused(_)), "{d:?}");
        assert_eq!(reg.read(&dev_b).expect("read").revision, lobby.revision);
        let b = DeviceRecord {
            state: RecordState::Approved,
            ..waiting
        };
        reg.write(&b, lobby.revision).expect("approve by id");
        let (_, d) = ask(&c, json!({"auth_token": token}));
        assert!(matches!(d, Decision::Authorized { .. }), "{d:?}");
    }

    /// A validly signed token with `exp` = 2^53 is admitted
    /// for the configured maximum user lifetime, not until 2^53.
    #[test]
    fn a_far_expiry_is_clamped_to_the_max_user_lifetime() {
        let k = keys();
        let c = callout(&json!({"keys": [k.rsa_jwk]}));
        let mut far = claims("dev-a");
        far["exp"] = json!(9_007_199_254_740_992_i64);
        let token = sign_rs256(&k.rsa, &json!({"alg": "RS256", "kid": "rsa-test-1"}), &far);
        let (resp, decision) = ask(&c, json!({ "auth_token": token }));
        let limit = NOW + policy().max_user_lifetime_secs;
        assert!(
            matches!(&decision, Decision::Authorized { expires, .. } if *expires == limit),
            "{decision:?}"
        );
        let user = payload(resp["nats"]["jwt"].as_str().expect("user jwt"));
        assert_eq!(user["exp"], limit);
    }
}
