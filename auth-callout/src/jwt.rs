//! The identity provider's bearer JWT (a Zitadel access token): verified
//! before anything in it is believed.
//!
//! Steps of [`verify`], in order, each refusing with its own
//! [`TokenError`]: size; three base64url parts; the header is a JSON object
//! naming no key twice (nor do the claims, checked once signed: a duplicate
//! `device_id`, `alg` or `exp` would mean one thing to us and another to the
//! next parser, see `strict_json`); the header's `alg` is RS256
//! or ES256 (never `none`, HMAC or anything else) with a `kid` and no `crit`;
//! the key named by `kid` comes from the provider's JWKS (never from the
//! token) and is of the header's algorithm; the signature verifies; `iss`
//! equals the configured issuer; `aud` holds the configured audience; `exp`
//! is present and not passed, `nbf` and `iat` are not in the future, each
//! within the configured clock skew; the device claim is a string that is a
//! valid device ID (so safe as a NATS subject token).

use std::fmt;
use std::sync::Arc;

use fleet_common::b64::decode_url;
use fleet_common::limits::MAX_BEARER_JWT_BYTES;
use fleet_common::validate::{DeviceId, ValidationError};
use fleet_common::Timestamp;
use ring::signature::{
    RsaPublicKeyComponents, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, RSA_PKCS1_2048_8192_SHA256,
};
use serde_json::{Map, Value};

use crate::jwks::{Jwk, KeyError, PublicKey};
use crate::strict_json::{self, StrictJsonError};

/// The signature algorithms accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA P-256 with SHA-256.
    Es256,
}

impl Algorithm {
    pub fn parse(alg: &str) -> Option<Self> {
        match alg {
            "RS256" => Some(Self::Rs256),
            "ES256" => Some(Self::Es256),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Es256 => "ES256",
        }
    }
}

/// Header `typ` values accepted (compared case-insensitively); absent is
/// accepted too.
const ACCEPTED_TYPES: [&str; 3] = ["JWT", "at+jwt", "application/at+jwt"];
/// Longest claim value quoted in a refusal.
const SHOWN_CHARS: usize = 80;

/// What the bearer token must satisfy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BearerPolicy {
    /// `iss`, exactly.
    pub issuer: String,
    /// One of `aud`.
    pub audience: String,
    /// The claim holding the device ID.
    pub device_claim: String,
    /// Tolerated clock difference on `exp`, `nbf` and `iat`.
    pub clock_skew_secs: i64,
    /// Longest life of a granted NATS user, from the moment it is granted:
    /// a token expiring later is admitted for this long only (see
    /// `Callout::decide`).
    pub max_user_lifetime_secs: i64,
    /// Which device protocols the granted permissions serve (generation 1,
    /// agent 0.1.0, too until it is retired: `docs/operator/mixed-fleets.md`).
    pub device_protocols: fleet_common::subjects::DeviceProtocols,
}

/// A verified bearer token: the device it proves and when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedBearer {
    pub device: DeviceId,
    /// `exp`, unix seconds.
    pub expires: i64,
    /// `sub`, for logs.
    pub subject: Option<String>,
}

/// Why a bearer token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    TooLarge {
        bytes: usize,
    },
    Malformed {
        what: &'static str,
    },
    /// The header or the claims name one key twice (`part` says which).
    DuplicateKey {
        part: &'static str,
        key: String,
    },
    /// `alg` other than RS256 and ES256 (`none` and HMAC included).
    Algorithm(String),
    Type(String),
    MissingKid,
    CriticalHeader,
    Key(KeyError),
    /// The JWKS key named by `kid` is for another algorithm.
    KeyAlgorithm {
        kid: String,
        key: Algorithm,
        token: Algorithm,
    },
    Signature {
        kid: String,
    },
    Issuer(Option<String>),
    Audience(Option<String>),
    MissingExpiry,
    Expired {
        exp: i64,
        now: i64,
    },
    NotYetValid {
        nbf: i64,
        now: i64,
    },
    IssuedInFuture {
        iat: i64,
        now: i64,
    },
    NoDeviceClaim {
        claim: String,
    },
    DeviceClaimType {
        claim: String,
    },
    DeviceId {
        claim: String,
        error: ValidationError,
    },
}

fn at(unix: i64) -> Timestamp {
    Timestamp::from_unix_millis(u64::try_from(unix).unwrap_or(0).saturating_mul(1000))
}

fn shown(v: &str) -> String {
    let mut out: String = v.chars().take(SHOWN_CHARS).collect();
    if v.chars().count() > SHOWN_CHARS {
        out.push('…');
    }
    format!("{out:?}")
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { bytes } => write!(
                f,
                "bearer token of {bytes} bytes is larger than {MAX_BEARER_JWT_BYTES}"
            ),
            Self::Malformed { what } => write!(f, "bearer token is not a JWT: {what}"),
            Self::DuplicateKey { part, key } => write!(
                f,
                "bearer token {part} {} the key {} twice: refused, as parsers disagree on which one counts; fix the identity provider's token",
                if *part == "claims" { "name" } else { "names" },
                shown(key)
            ),
            Self::Algorithm(alg) => write!(
                f,
                "bearer token alg {} is not accepted: only RS256 and ES256",
                shown(alg)
            ),
            Self::Type(t) => write!(
                f,
                "bearer token typ {} is not an access token type (JWT, at+jwt)",
                shown(t)
            ),
            Self::MissingKid => f.write_str("bearer token header has no kid"),
            Self::CriticalHeader => {
                f.write_str("bearer token header lists crit extensions, none is supported")
            }
            Self::Key(e) => write!(f, "bearer token key: {e}"),
            Self::KeyAlgorithm { kid, key, token } => write!(
                f,
                "bearer token says {} but JWKS key {} is an {} key",
                token.as_str(),
                shown(kid),
                key.as_str()
            ),
            Self::Signature { kid } => write!(
                f,
                "bearer token signature does not verify with JWKS key {}",
                shown(kid)
            ),
            Self::Issuer(found) => match found {
                Some(iss) => write!(
                    f,
                    "bearer token issuer {} is not the configured issuer",
                    shown(iss)
                ),
                None => f.write_str("bearer token has no string iss"),
            },
            Self::Audience(found) => match found {
                Some(aud) => write!(
                    f,
                    "bearer token audience {} does not include the configured audience",
                    shown(aud)
                ),
                None => f.write_str("bearer token has no aud"),
            },
            Self::MissingExpiry => f.write_str("bearer token has no numeric exp"),
            Self::Expired { exp, now } => write!(
                f,
                "bearer token expired at {} (now {}): the device must fetch a new token",
                at(*exp),
                at(*now)
            ),
            Self::NotYetValid { nbf, now } => write!(
                f,
                "bearer token not valid before {} (now {}): check the clocks",
                at(*nbf),
                at(*now)
            ),
            Self::IssuedInFuture { iat, now } => write!(
                f,
                "bearer token issued at {}, in the future (now {}): check the clocks",
                at(*iat),
                at(*now)
            ),
            Self::NoDeviceClaim { claim } => write!(
                f,
                "bearer token has no {} claim: configure the identity provider to add it",
                shown(claim)
            ),
            Self::DeviceClaimType { claim } => {
                write!(f, "bearer token claim {} is not a string", shown(claim))
            }
            Self::DeviceId { claim, error } => {
                write!(f, "bearer token claim {}: {error}", shown(claim))
            }
        }
    }
}

impl std::error::Error for TokenError {}

/// Verifies `token` at unix time `now`, taking keys from `key` (the JWKS
/// cache). See the module comment for the steps.
pub fn verify(
    token: &str,
    key: impl FnOnce(&str) -> Result<Arc<Jwk>, KeyError>,
    policy: &BearerPolicy,
    now: i64,
) -> Result<VerifiedBearer, TokenError> {
    if token.len() > MAX_BEARER_JWT_BYTES {
        return Err(TokenError::TooLarge { bytes: token.len() });
    }
    let malformed = |what| TokenError::Malformed { what };
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("not three dot-separated parts"));
    };
    let header =
        json_object(h, "header")?.ok_or(malformed("header is not base64url JSON object"))?;
    let alg = match header.get("alg") {
        Some(Value::String(a)) => a.as_str(),
        _ => return Err(TokenError::Algorithm(String::new())),
    };
    let alg = Algorithm::parse(alg).ok_or_else(|| TokenError::Algorithm(alg.to_owned()))?;
    if let Some(t) = header.get("typ") {
        let ok = t
            .as_str()
            .is_some_and(|t| ACCEPTED_TYPES.iter().any(|a| a.eq_ignore_ascii_case(t)));
        if !ok {
            return Err(TokenError::Type(t.to_string()));
        }
    }
    if header.contains_key("crit") {
        return Err(TokenError::CriticalHeader);
    }
    let kid = match header.get("kid") {
        Some(Value::String(k)) if !k.is_empty() => k.as_str(),
        _ => return Err(TokenError::MissingKid),
    };
    let signature = decode_url(s).ok_or(malformed("signature is not base64url"))?;
    let jwk = key(kid).map_err(TokenError::Key)?;
    if jwk.algorithm() != alg {
        return Err(TokenError::KeyAlgorithm {
            kid: kid.to_owned(),
            key: jwk.algorithm(),
            token: alg,
        });
    }
    let signing_input = &token.as_bytes()[..h.len() + 1 + p.len()];
    let verified = match &jwk.key {
        PublicKey::Rsa { n, e } => RsaPublicKeyComponents { n, e }.verify(
            &RSA_PKCS1_2048_8192_SHA256,
            signing_input,
            &signature,
        ),
        PublicKey::EcP256 { point } => UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
            .verify(signing_input, &signature),
    };
    if verified.is_err() {
        return Err(TokenError::Signature {
            kid: kid.to_owned(),
        });
    }
    // Only now is the payload the provider's word.
    let claims =
        json_object(p, "claims")?.ok_or(malformed("claims are not base64url JSON object"))?;
    check_claims(&claims, policy, now)
}

/// The JSON object of a base64url part; `None` when it is not one, an error
/// when it names a key twice (at any depth).
fn json_object(part: &str, name: &'static str) -> Result<Option<Map<String, Value>>, TokenError> {
    let Some(bytes) = decode_url(part) else {
        return Ok(None);
    };
    match strict_json::parse_object(&bytes) {
        Ok(m) => Ok(m),
        Err(StrictJsonError::Syntax) => Ok(None),
        Err(StrictJsonError::DuplicateKey(key)) => {
            Err(TokenError::DuplicateKey { part: name, key })
        }
    }
}

/// A NumericDate as whole seconds (fractions dropped).
fn numeric_date(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite())
            .map(|f| f.floor().clamp(i64::MIN as f64, i64::MAX as f64) as i64)
    })
}

fn check_claims(
    claims: &Map<String, Value>,
    policy: &BearerPolicy,
    now: i64,
) -> Result<VerifiedBearer, TokenError> {
    let skew = policy.clock_skew_secs;
    match claims.get("iss") {
        Some(Value::String(iss)) if *iss == policy.issuer => {}
        Some(Value::String(iss)) => return Err(TokenError::Issuer(Some(iss.clone()))),
        _ => return Err(TokenError::Issuer(None)),
    }
    match claims.get("aud") {
        Some(Value::String(aud)) if *aud == policy.audience => {}
        Some(Value::Array(list))
            if list
                .iter()
                .any(|a| a.as_str() == Some(policy.audience.as_str())) => {}
        Some(other) => {
            let found = match other {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            return Err(TokenError::Audience(Some(found)));
        }
        None => return Err(TokenError::Audience(None)),
    }
    let exp = claims
        .get("exp")
        .and_then(numeric_date)
        .ok_or(TokenError::MissingExpiry)?;
    // RFC 7519: not accepted on or after `exp`.
    if now >= exp.saturating_add(skew) {
        return Err(TokenError::Expired { exp, now });
    }
    if let Some(nbf) = claims.get("nbf").and_then(numeric_date) {
        if now.saturating_add(skew) < nbf {
            return Err(TokenError::NotYetValid { nbf, now });
        }
    }
    if let Some(iat) = claims.get("iat").and_then(numeric_date) {
        if iat > now.saturating_add(skew) {
            return Err(TokenError::IssuedInFuture { iat, now });
        }
    }
    let claim = &policy.device_claim;
    let device = match claims.get(claim) {
        None | Some(Value::Null) => {
            return Err(TokenError::NoDeviceClaim {
                claim: claim.clone(),
            })
        }
        Some(Value::String(d)) => DeviceId::parse(d).map_err(|error| TokenError::DeviceId {
            claim: claim.clone(),
            error,
        })?,
        Some(_) => {
            return Err(TokenError::DeviceClaimType {
                claim: claim.clone(),
            })
        }
    };
    Ok(VerifiedBearer {
        device,
        expires: exp,
        subject: claims.get("sub").and_then(Value::as_str).map(str::to_owned),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fleet_common::b64::encode_url;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivatePkcs8KeyDer;
    use serde_json::json;

    pub(crate) const NOW: i64 = 1_800_000_000;
    const RSA_PEM: &[u8] = fleet_harness::RSA_TEST_KEY_PEM;
    const RSA_JWK: &str = fleet_harness::RSA_TEST_KEY_JWK;

    pub(crate) fn policy() -> BearerPolicy {
        BearerPolicy {
            issuer: "https://idp.test".into(),
            audience: "fleet".into(),
            device_claim: "device_id".into(),
            clock_skew_secs: 60,
            max_user_lifetime_secs: 86_400,
            device_protocols: fleet_common::subjects::DeviceProtocols::WithLegacy,
        }
    }

    pub(crate) fn claims(device: &str) -> Value {
        json!({"iss": "https://idp.test", "aud": ["fleet", "other"], "sub": "u1",
               "exp": NOW + 3600, "nbf": NOW - 10, "iat": NOW - 10, "device_id": device})
    }

    /// Signing keys of both kinds, with their JWKS entries.
    pub(crate) struct Keys {
        pub rsa: RsaKeyPair,
        pub rsa_jwk: Value,
        pub ec: EcdsaKeyPair,
        pub ec_jwk: Value,
    }

    pub(crate) fn keys() -> Keys {
        let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_PEM).expect("pem");
        let rsa = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).expect("rsa key");
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("ec gen");
        let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("ec key");
        let ec_jwk = ec_jwk(&ec, "ec-test-1");
        Keys {
            rsa,
            rsa_jwk: serde_json::from_str(RSA_JWK).expect("jwk json"),
            ec,
            ec_jwk,
        }
    }

    pub(crate) fn ec_jwk(ec: &EcdsaKeyPair, kid: &str) -> Value {
        let point = ec.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
               "x": encode_url(&point[1..33]), "y": encode_url(&point[33..65])})
    }

    pub(crate) fn sign_rs256(key: &RsaKeyPair, header: &Value, claims: &Value) -> String {
        sign_rs256_text(key, &header.to_string(), &claims.to_string())
    }

    /// Signs header and claims given as JSON text (which a `Value` cannot
    /// hold when it names a key twice).
    pub(crate) fn sign_rs256_text(key: &RsaKeyPair, header: &str, claims: &str) -> String {
        let input = format!(
            "{}.{}",
            encode_url(header.as_bytes()),
            encode_url(claims.as_bytes())
        );
        let mut sig = vec![0u8; key.public().modulus_len()];
        key.sign(
            &ring::signature::RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            input.as_bytes(),
            &mut sig,
        )
        .expect("rsa sign");
        format!("{input}.{}", encode_url(&sig))
    }

    pub(crate) fn sign_es256(key: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
        let input = format!(
            "{}.{}",
            encode_url(header.to_string().as_bytes()),
            encode_url(claims.to_string().as_bytes())
        );
        let sig = key
            .sign(&SystemRandom::new(), input.as_bytes())
            .expect("ec sign");
        format!("{input}.{}", encode_url(sig.as_ref()))
    }

    fn set(k: &Keys) -> crate::jwks::KeySet {
        crate::jwks::KeySet::parse(
            json!({"keys": [k.rsa_jwk, k.ec_jwk]})
                .to_string()
                .as_bytes(),
        )
        .expect("jwks")
    }

    fn check(k: &Keys, token: &str) -> Result<VerifiedBearer, TokenError> {
        let s = set(k);
        verify(
            token,
            |kid| {
                s.get(kid).ok_or(KeyError::UnknownKid {
                    kid: kid.to_owned(),
                    retry_in: None,
                })
            },
            &policy(),
            NOW,
        )
    }

    fn rs(k: &Keys, claims: &Value) -> String {
        sign_rs256(
            &k.rsa,
            &json!({"alg": "RS256", "typ": "JWT", "kid": "rsa-test-1"}),
            claims,
        )
    }

    fn es(k: &Keys, claims: &Value) -> String {
        sign_es256(&k.ec, &json!({"alg": "ES256", "kid": "ec-test-1"}), claims)
    }

    #[test]
    fn rs256_and_es256_tokens_verify_and_yield_the_device() {
        let k = keys();
        let v = check(&k, &rs(&k, &claims("dev-a"))).expect("rs256");
        assert_eq!(v.device.as_str(), "dev-a");
        assert_eq!(v.expires, NOW + 3600);
        assert_eq!(v.subject.as_deref(), Some("u1"));
        let v = check(&k, &es(&k, &claims("dev_b"))).expect("es256");
        assert_eq!(v.device.as_str(), "dev_b");
        // aud as a plain string, exp inside the skew, fractional dates.
        let mut c = claims("dev-c");
        c["aud"] = json!("fleet");
        c["exp"] = json!(NOW - 30);
        c["nbf"] = json!(NOW as f64 + 30.5);
        assert!(check(&k, &rs(&k, &c)).is_ok());
    }

    #[test]
    fn header_refusals() {
        let k = keys();
        let c = claims("dev-a");
        let none = format!(
            "{}.{}.",
            encode_url(br#"{"alg":"none","kid":"rsa-test-1"}"#),
            encode_url(c.to_string().as_bytes())
        );
        assert_eq!(check(&k, &none), Err(TokenError::Algorithm("none".into())));
        let hs = sign_rs256(&k.rsa, &json!({"alg": "HS256", "kid": "rsa-test-1"}), &c);
        assert_eq!(check(&k, &hs), Err(TokenError::Algorithm("HS256".into())));
        let no_alg = sign_rs256(&k.rsa, &json!({"kid": "rsa-test-1"}), &c);
        assert_eq!(
            check(&k, &no_alg),
            Err(TokenError::Algorithm(String::new()))
        );
        let no_kid = sign_rs256(&k.rsa, &json!({"alg": "RS256"}), &c);
        assert_eq!(check(&k, &no_kid), Err(TokenError::MissingKid));
        let crit = sign_rs256(
            &k.rsa,
            &json!({"alg": "RS256", "kid": "rsa-test-1", "crit": ["exp"]}),
            &c,
        );
        assert_eq!(check(&k, &crit), Err(TokenError::CriticalHeader));
        let typ = sign_rs256(
            &k.rsa,
            &json!({"alg": "RS256", "kid": "rsa-test-1", "typ": "logout+jwt"}),
            &c,
        );
        assert!(matches!(check(&k, &typ), Err(TokenError::Type(_))));
        let unknown = sign_rs256(&k.rsa, &json!({"alg": "RS256", "kid": "nope"}), &c);
        assert_eq!(
            check(&k, &unknown),
            Err(TokenError::Key(KeyError::UnknownKid {
                kid: "nope".into(),
                retry_in: None
            }))
        );
        // Algorithm confusion: an RS256 header naming the EC key.
        let confused = sign_rs256(&k.rsa, &json!({"alg": "RS256", "kid": "ec-test-1"}), &c);
        assert_eq!(
            check(&k, &confused),
            Err(TokenError::KeyAlgorithm {
                kid: "ec-test-1".into(),
                key: Algorithm::Es256,
                token: Algorithm::Rs256
            })
        );
        assert!(matches!(
            check(&k, "a.b"),
            Err(TokenError::Malformed { .. })
        ));
        let big = "a".repeat(MAX_BEARER_JWT_BYTES + 1);
        assert!(matches!(check(&k, &big), Err(TokenError::TooLarge { .. })));
    }

    #[test]
    fn signature_refusals() {
        let k = keys();
        let good = rs(&k, &claims("dev-a"));
        // A claim changed after signing.
        let (h, rest) = good.split_once('.').expect("dot");
        let (_, sig) = rest.split_once('.').expect("dot");
        let forged = format!(
            "{h}.{}.{sig}",
            encode_url(claims("dev-b").to_string().as_bytes())
        );
        assert_eq!(
            check(&k, &forged),
            Err(TokenError::Signature {
                kid: "rsa-test-1".into()
            })
        );
        // Signed by another EC key under the JWKS key's kid.
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("gen");
        let other =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                .expect("key");
        let t = sign_es256(
            &other,
            &json!({"alg": "ES256", "kid": "ec-test-1"}),
            &claims("dev-a"),
        );
        assert_eq!(
            check(&k, &t),
            Err(TokenError::Signature {
                kid: "ec-test-1".into()
            })
        );
    }

    #[test]
    fn claim_refusals_with_messages() {
        let k = keys();
        let refuse = |f: &dyn Fn(&mut Value)| {
            let mut c = claims("dev-a");
            f(&mut c);
            check(&k, &rs(&k, &c)).expect_err("refused")
        };
        let e = refuse(&|c| c["exp"] = json!(NOW - 61));
        assert_eq!(
            e,
            TokenError::Expired {
                exp: NOW - 61,
                now: NOW
            }
        );
        assert_eq!(
            e.to_string(),
            "bearer token expired at 2027-01-15T07:58:59.000Z (now 2027-01-15T08:00:00.000Z): the device must fetch a new token"
        );
        assert_eq!(
            refuse(&|c| c["nbf"] = json!(NOW + 61)),
            TokenError::NotYetValid {
                nbf: NOW + 61,
                now: NOW
            }
        );
        assert_eq!(
            refuse(&|c| c["iat"] = json!(NOW + 61)),
            TokenError::IssuedInFuture {
                iat: NOW + 61,
                now: NOW
            }
        );
        assert_eq!(
            refuse(&|c| {
                c.as_object_mut().expect("obj").remove("exp");
            }),
            TokenError::MissingExpiry
        );
        let e = refuse(&|c| c["iss"] = json!("https://evil.test"));
        assert_eq!(
            e.to_string(),
            "bearer token issuer \"https://evil.test\" is not the configured issuer"
        );
        let e = refuse(&|c| c["aud"] = json!(["other"]));
        assert_eq!(
            e.to_string(),
            "bearer token audience \"[\\\"other\\\"]\" does not include the configured audience"
        );
        assert_eq!(
            refuse(&|c| {
                c.as_object_mut().expect("obj").remove("aud");
            }),
            TokenError::Audience(None)
        );
        let e = refuse(&|c| {
            c.as_object_mut().expect("obj").remove("device_id");
        });
        assert_eq!(
            e.to_string(),
            "bearer token has no \"device_id\" claim: configure the identity provider to add it"
        );
        assert_eq!(
            refuse(&|c| c["device_id"] = json!(42)),
            TokenError::DeviceClaimType {
                claim: "device_id".into()
            }
        );
        for bad in ["dev.b", "dev*", "dev>", "dev b", "", "dev\nb"] {
            let e = refuse(&|c| c["device_id"] = json!(bad));
            assert!(
                matches!(&e, TokenError::DeviceId { error: ValidationError::DeviceId(v), .. } if v == bad),
                "{bad:?}: {e:?}"
            );
        }
        let e = refuse(&|c| c["device_id"] = json!("a.>"));
        assert_eq!(
            e.to_string(),
            "bearer token claim \"device_id\": invalid device id \"a.>\": use 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'"
        );
    }

    /// A signed token naming a key twice is refused, in the
    /// claims (`device_id`, `exp`) and in the header (`alg`, `kid`), rather
    /// than read as whichever value came last.
    #[test]
    fn duplicate_keys_are_refused() {
        let k = keys();
        let header = r#"{"alg":"RS256","typ":"JWT","kid":"rsa-test-1"}"#;
        let base = format!(
            r#""iss":"https://idp.test","aud":"fleet","exp":{},"device_id":"dev1""#,
            NOW + 3600
        );
        // The control: the same text without a duplicate is admitted.
        let ok = sign_rs256_text(&k.rsa, header, &format!("{{{base}}}"));
        assert_eq!(check(&k, &ok).expect("valid").device.as_str(), "dev1");
        let twice = sign_rs256_text(&k.rsa, header, &format!(r#"{{{base},"device_id":"dev2"}}"#));
        let e = check(&k, &twice).expect_err("refused");
        assert_eq!(
            e,
            TokenError::DuplicateKey {
                part: "claims",
                key: "device_id".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "bearer token claims name the key \"device_id\" twice: refused, as parsers disagree on which one counts; fix the identity provider's token"
        );
        let exp = sign_rs256_text(
            &k.rsa,
            header,
            &format!(r#"{{{base},"exp":9007199254740992}}"#),
        );
        assert_eq!(
            check(&k, &exp),
            Err(TokenError::DuplicateKey {
                part: "claims",
                key: "exp".into()
            })
        );
        // Nested too: an object inside a claim.
        let nested = sign_rs256_text(
            &k.rsa,
            header,
            &format!(r#"{{{base},"x":{{"a":1,"a":2}}}}"#),
        );
        assert_eq!(
            check(&k, &nested),
            Err(TokenError::DuplicateKey {
                part: "claims",
                key: "a".into()
            })
        );
        let claims = format!("{{{base}}}");
        for (header, key) in [
            (r#"{"alg":"RS256","kid":"rsa-test-1","alg":"ES256"}"#, "alg"),
            (
                r#"{"alg":"RS256","kid":"ec-test-1","kid":"rsa-test-1"}"#,
                "kid",
            ),
            (r#"{"alg":"none","alg":"RS256","kid":"rsa-test-1"}"#, "alg"),
        ] {
            let t = sign_rs256_text(&k.rsa, header, &claims);
            assert_eq!(
                check(&k, &t),
                Err(TokenError::DuplicateKey {
                    part: "header",
                    key: key.into()
                }),
                "{header}"
            );
        }
    }
}
