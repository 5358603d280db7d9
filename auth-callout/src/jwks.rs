//! The identity provider's signing keys: parsing a JWKS (RFC 7517) into the
//! keys the callout can verify with (RSA of 2048 to 8192 bits for RS256, EC
//! P-256 for ES256), and a cache that fetches it over HTTPS.
//!
//! Cache rules: keys are looked up by `kid`. An unknown `kid`, or a set older
//! than `max_age`, triggers a refetch, at most once per `min_refetch` (an
//! attacker sending random `kid`s cannot make the callout hammer the
//! provider). The fetch runs outside the lock, so requests with known keys
//! are never held up by it. A failed refetch keeps the previous set (logged):
//! devices keep connecting while the provider is briefly unreachable.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleet_common::b64::decode_url;
use fleet_common::limits::{MAX_JWKS_BYTES, MAX_JWKS_KEYS};
use serde_json::Value;

use crate::https::{self, HttpsError};
use crate::jwt::Algorithm;
use crate::strict_json::{self, StrictJsonError};

/// Longest `kid` kept.
const MAX_KID_CHARS: usize = 256;
/// RSA modulus bounds in bytes (2048 to 8192 bits, what ring verifies).
const RSA_MIN_MODULUS_BYTES: usize = 256;
const RSA_MAX_MODULUS_BYTES: usize = 1024;
/// RSA public exponent bound in bytes.
const RSA_MAX_EXPONENT_BYTES: usize = 8;

/// A public key the callout can verify with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// RS256: modulus and exponent, big-endian without leading zeros.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// ES256: the uncompressed point `04 || x || y`.
    EcP256 { point: Vec<u8> },
}

/// One key of a JWKS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwk {
    pub kid: String,
    pub key: PublicKey,
}

impl Jwk {
    /// The one algorithm this key verifies.
    pub fn algorithm(&self) -> Algorithm {
        match self.key {
            PublicKey::Rsa { .. } => Algorithm::Rs256,
            PublicKey::EcP256 { .. } => Algorithm::Es256,
        }
    }
}

/// Why a JWKS could not be used.
#[derive(Debug)]
pub enum JwksError {
    Fetch(HttpsError),
    NotJson,
    /// An object in it names `key` twice.
    DuplicateKey {
        key: String,
    },
    /// No `keys` array at the top.
    NoKeysArray,
    TooManyKeys {
        count: usize,
    },
    DuplicateKid {
        kid: String,
    },
    /// Not one RS256 or ES256 signing key with a `kid`.
    NoUsableKey {
        skipped: usize,
    },
}

impl fmt::Display for JwksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fetch(e) => write!(f, "JWKS fetch: {e}"),
            Self::NotJson => f.write_str("JWKS is not JSON: check jwks_url"),
            Self::DuplicateKey { key } => write!(
                f,
                "JWKS names the key {key:?} twice in one object: refused, as parsers disagree on which one counts"
            ),
            Self::NoKeysArray => {
                f.write_str("JWKS has no \"keys\" array: check that jwks_url is the provider's key set")
            }
            Self::TooManyKeys { count } => {
                write!(f, "JWKS lists {count} keys, more than {MAX_JWKS_KEYS}")
            }
            Self::DuplicateKid { kid } => write!(
                f,
                "JWKS lists two usable keys with kid {kid:?}: a kid must name one key"
            ),
            Self::NoUsableKey { skipped } => write!(
                f,
                "JWKS has no usable key ({skipped} skipped): the provider must publish RS256 (RSA 2048-8192 bits) or ES256 (EC P-256) signing keys with a kid"
            ),
        }
    }
}

impl std::error::Error for JwksError {}

/// The usable keys of one JWKS, by `kid`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: HashMap<String, Arc<Jwk>>,
}

impl KeySet {
    /// Parses a JWKS, keeping its RS256 and ES256 signing keys; refused
    /// whole when any object in it names a key twice. Keys of other
    /// types, curves or algorithms, for encryption, or without a `kid` are
    /// skipped.
    pub fn parse(bytes: &[u8]) -> Result<KeySet, JwksError> {
        let doc = strict_json::parse(bytes).map_err(|e| match e {
            StrictJsonError::Syntax => JwksError::NotJson,
            StrictJsonError::DuplicateKey(key) => JwksError::DuplicateKey { key },
        })?;
        let list = doc
            .get("keys")
            .and_then(Value::as_array)
            .ok_or(JwksError::NoKeysArray)?;
        if list.len() > MAX_JWKS_KEYS {
            return Err(JwksError::TooManyKeys { count: list.len() });
        }
        let mut keys = HashMap::new();
        let mut skipped = 0;
        for entry in list {
            let Some(jwk) = parse_key(entry) else {
                skipped += 1;
                continue;
            };
            if keys.contains_key(&jwk.kid) {
                return Err(JwksError::DuplicateKid { kid: jwk.kid });
            }
            keys.insert(jwk.kid.clone(), Arc::new(jwk));
        }
        if keys.is_empty() {
            return Err(JwksError::NoUsableKey { skipped });
        }
        Ok(KeySet { keys })
    }

    pub fn get(&self, kid: &str) -> Option<Arc<Jwk>> {
        self.keys.get(kid).cloned()
    }

    #[allow(clippy::len_without_is_empty)] // never empty: parse refuses that
    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

/// One usable key, or `None` to skip it.
fn parse_key(v: &Value) -> Option<Jwk> {
    let s = |name: &str| v.get(name).and_then(Value::as_str);
    let kid = s("kid").filter(|k| !k.is_empty() && k.chars().count() <= MAX_KID_CHARS)?;
    if v.get("use").is_some() && s("use") != Some("sig") {
        return None;
    }
    let alg = v.get("alg").map(|a| a.as_str().and_then(Algorithm::parse));
    let key = match s("kty")? {
        "RSA" => {
            let n = decode_url(s("n")?)?;
            let e = decode_url(s("e")?)?;
            let n_ok = (RSA_MIN_MODULUS_BYTES..=RSA_MAX_MODULUS_BYTES).contains(&n.len())
                && n.first() != Some(&0);
            let e_ok = (1..=RSA_MAX_EXPONENT_BYTES).contains(&e.len()) && e.first() != Some(&0);
            if !n_ok || !e_ok {
                return None;
            }
            PublicKey::Rsa { n, e }
        }
        "EC" => {
            if s("crv")? != "P-256" {
                return None;
            }
            let x = decode_url(s("x")?)?;
            let y = decode_url(s("y")?)?;
            if x.len() != 32 || y.len() != 32 {
                return None;
            }
            let mut point = Vec::with_capacity(65);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            PublicKey::EcP256 { point }
        }
        _ => return None,
    };
    let jwk = Jwk {
        kid: kid.to_owned(),
        key,
    };
    // A key that names an algorithm must name the one it verifies.
    match alg {
        None => Some(jwk),
        Some(Some(a)) if a == jwk.algorithm() => Some(jwk),
        Some(_) => None,
    }
}

/// Where a JWKS comes from.
pub trait JwksSource: Send + Sync {
    fn fetch(&self) -> Result<Vec<u8>, HttpsError>;
    /// For logs: the URL.
    fn location(&self) -> &str;
}

/// A JWKS fetched over HTTPS.
#[derive(Debug)]
pub struct HttpsJwks {
    agent: ureq::Agent,
    url: String,
}

impl HttpsJwks {
    pub fn new(agent: ureq::Agent, url: String) -> Self {
        Self { agent, url }
    }
}

impl JwksSource for HttpsJwks {
    fn fetch(&self) -> Result<Vec<u8>, HttpsError> {
        https::get(&self.agent, &self.url, MAX_JWKS_BYTES)
    }

    fn location(&self) -> &str {
        &self.url
    }
}

/// Why no key was found for a `kid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// Not in the set. `retry_in`: the refetch was rate-limited and is
    /// allowed again after that long; `None`: the set was just refetched.
    UnknownKid {
        kid: String,
        retry_in: Option<Duration>,
    },
    /// There is no set yet and fetching one failed.
    Unavailable { detail: String },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownKid {
                kid,
                retry_in: None,
            } => write!(
                f,
                "unknown kid {kid:?}: not in the provider's JWKS, just refetched"
            ),
            Self::UnknownKid {
                kid,
                retry_in: Some(d),
            } => write!(
                f,
                "unknown kid {kid:?}: not in the cached JWKS; the next refetch is allowed in {} s",
                d.as_secs().max(1)
            ),
            Self::Unavailable { detail } => write!(f, "no JWKS available: {detail}"),
        }
    }
}

struct CacheState {
    keys: Arc<KeySet>,
    fetched_at: Option<Instant>,
    last_attempt: Option<Instant>,
}

/// The provider's keys, fetched on demand (see the module comment).
pub struct JwksCache {
    source: Box<dyn JwksSource>,
    min_refetch: Duration,
    max_age: Duration,
    state: Mutex<CacheState>,
}

impl fmt::Debug for JwksCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwksCache")
            .field("source", &self.source.location())
            .field("min_refetch", &self.min_refetch)
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl JwksCache {
    pub fn new(source: Box<dyn JwksSource>, min_refetch: Duration, max_age: Duration) -> Self {
        Self {
            source,
            min_refetch,
            max_age,
            state: Mutex::new(CacheState {
                keys: Arc::new(KeySet::default()),
                fetched_at: None,
                last_attempt: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        // The state stays consistent whatever a panicking holder did: every
        // write is a whole-field assignment.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fetches the set now (at start), whatever the rate limit; returns the
    /// number of keys.
    pub fn refresh(&self, now: Instant) -> Result<usize, JwksError> {
        self.lock().last_attempt = Some(now);
        let set = self.fetch()?;
        let n = set.len();
        self.install(set, now);
        Ok(n)
    }

    /// The key named `kid` at `now`, refetching the set when the rules allow.
    pub fn key(&self, kid: &str, now: Instant) -> Result<Arc<Jwk>, KeyError> {
        let known = {
            let mut st = self.lock();
            let stale = st
                .fetched_at
                .is_none_or(|t| now.saturating_duration_since(t) >= self.max_age);
            let known = st.keys.get(kid);
            if let (Some(k), false) = (&known, stale) {
                return Ok(Arc::clone(k));
            }
            let since = st.last_attempt.map(|t| now.saturating_duration_since(t));
            if let Some(since) = since.filter(|s| *s < self.min_refetch) {
                return known.ok_or_else(|| KeyError::UnknownKid {
                    kid: kid.to_owned(),
                    retry_in: Some(self.min_refetch - since),
                });
            }
            st.last_attempt = Some(now);
            known
        };
        match self.fetch() {
            Ok(set) => {
                let found = set.get(kid);
                self.install(set, now);
                found.ok_or_else(|| KeyError::UnknownKid {
                    kid: kid.to_owned(),
                    retry_in: None,
                })
            }
            Err(e) => {
                log::warn!(
                    jwks_url = self.source.location();
                    "JWKS refetch failed, keeping the previous keys: {e}"
                );
                known.ok_or_else(|| match (e, self.lock().fetched_at) {
                    (_, Some(_)) => KeyError::UnknownKid {
                        kid: kid.to_owned(),
                        retry_in: Some(self.min_refetch),
                    },
                    (e, None) => KeyError::Unavailable {
                        detail: e.to_string(),
                    },
                })
            }
        }
    }

    fn fetch(&self) -> Result<KeySet, JwksError> {
        let bytes = self.source.fetch().map_err(JwksError::Fetch)?;
        KeySet::parse(&bytes)
    }

    fn install(&self, set: KeySet, now: Instant) {
        log::info!(
            jwks_url = self.source.location(), keys = set.len();
            "JWKS fetched"
        );
        let mut st = self.lock();
        st.keys = Arc::new(set);
        st.fetched_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_common::b64::encode_url;
    use fleet_common::https::ExchangeError;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn ec_key(kid: &str) -> Value {
        json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
               "x": encode_url(&[1u8; 32]), "y": encode_url(&[2u8; 32])})
    }

    fn rsa_key(kid: &str) -> Value {
        let mut n = vec![0xc5u8; 256];
        n[255] = 0x01;
        json!({"kty": "RSA", "kid": kid, "n": encode_url(&n), "e": "AQAB"})
    }

    #[test]
    fn parse_keeps_rs256_and_es256_signing_keys_only() {
        let doc = json!({"keys": [
            rsa_key("r1"),
            ec_key("e1"),
            {"kty": "EC", "crv": "P-384", "kid": "p384", "x": "AA", "y": "AA"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "AA"},
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            rsa_key("enc").as_object().map(|o| { let mut o = o.clone(); o.insert("use".into(), json!("enc")); Value::Object(o) }).expect("obj"),
            rsa_key("ps").as_object().map(|o| { let mut o = o.clone(); o.insert("alg".into(), json!("PS256")); Value::Object(o) }).expect("obj"),
            {"kty": "RSA", "n": encode_url(&[0xc5u8; 256]), "e": "AQAB"},
            {"kty": "RSA", "kid": "small", "n": encode_url(&[0xc5u8; 128]), "e": "AQAB"},
        ]});
        let set = KeySet::parse(doc.to_string().as_bytes()).expect("parses");
        assert_eq!(set.len(), 2);
        assert_eq!(set.get("r1").expect("rsa").algorithm(), Algorithm::Rs256);
        let e1 = set.get("e1").expect("ec");
        assert_eq!(e1.algorithm(), Algorithm::Es256);
        assert!(
            matches!(&e1.key, PublicKey::EcP256 { point } if point.len() == 65 && point[0] == 4)
        );
        for skipped in ["p384", "ed", "hmac", "enc", "ps", "small"] {
            assert!(set.get(skipped).is_none(), "{skipped} kept");
        }
    }

    #[test]
    fn parse_refusals() {
        assert!(matches!(KeySet::parse(b"nope"), Err(JwksError::NotJson)));
        assert!(matches!(
            KeySet::parse(br#"{"key": []}"#),
            Err(JwksError::NoKeysArray)
        ));
        let err = KeySet::parse(
            json!({"keys": [{"kty": "oct", "kid": "h"}]})
                .to_string()
                .as_bytes(),
        )
        .expect_err("none usable");
        assert_eq!(
            err.to_string(),
            "JWKS has no usable key (1 skipped): the provider must publish RS256 (RSA 2048-8192 bits) or ES256 (EC P-256) signing keys with a kid"
        );
        let dup = json!({"keys": [ec_key("k"), rsa_key("k")]});
        assert!(matches!(
            KeySet::parse(dup.to_string().as_bytes()),
            Err(JwksError::DuplicateKid { kid }) if kid == "k"
        ));
        // A key object naming `kid` (or `n`, `x`...)
        // twice, or a document naming `keys` twice, is refused whole.
        let ec = ec_key("e1").to_string();
        for (doc, key) in [
            (
                format!(
                    r#"{{"keys":[{}]}}"#,
                    ec.replacen('{', r#"{"kid":"other","#, 1)
                ),
                "kid",
            ),
            (
                format!(r#"{{"keys":[{}]}}"#, ec.replacen('{', r#"{"x":"AA","#, 1)),
                "x",
            ),
            (format!(r#"{{"keys":[],"keys":[{ec}]}}"#), "keys"),
        ] {
            let e = KeySet::parse(doc.as_bytes()).expect_err("refused");
            assert!(
                matches!(&e, JwksError::DuplicateKey { key: k } if k == key),
                "{doc}: {e:?}"
            );
        }
        assert_eq!(
            JwksError::DuplicateKey { key: "kid".into() }.to_string(),
            "JWKS names the key \"kid\" twice in one object: refused, as parsers disagree on which one counts"
        );
        let many: Vec<Value> = (0..=MAX_JWKS_KEYS)
            .map(|i| ec_key(&format!("k{i}")))
            .collect();
        assert!(matches!(
            KeySet::parse(json!({"keys": many}).to_string().as_bytes()),
            Err(JwksError::TooManyKeys { .. })
        ));
    }

    /// A source serving whatever the test put in, counting fetches.
    struct Served {
        body: Mutex<Result<Vec<u8>, String>>,
        fetches: AtomicUsize,
    }

    impl JwksSource for Arc<Served> {
        fn fetch(&self) -> Result<Vec<u8>, HttpsError> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            self.body.lock().expect("lock").clone().map_err(|detail| {
                HttpsError::Exchange(ExchangeError::Request {
                    url: "test".into(),
                    detail,
                })
            })
        }
        fn location(&self) -> &str {
            "test"
        }
    }

    fn served(keys: &[Value]) -> Arc<Served> {
        Arc::new(Served {
            body: Mutex::new(Ok(json!({ "keys": keys }).to_string().into_bytes())),
            fetches: AtomicUsize::new(0),
        })
    }

    #[test]
    fn unknown_kid_refetches_at_most_once_per_interval() {
        let src = served(&[ec_key("a")]);
        let cache = JwksCache::new(
            Box::new(Arc::clone(&src)),
            Duration::from_secs(30),
            Duration::from_secs(3600),
        );
        let t0 = Instant::now();
        assert_eq!(cache.refresh(t0).expect("fetch"), 1);
        assert!(cache.key("a", t0).is_ok());
        // Rotated: "b" appears at the provider.
        *src.body.lock().expect("lock") = Ok(json!({"keys": [ec_key("a"), ec_key("b")]})
            .to_string()
            .into_bytes());
        let err = cache
            .key("b", t0 + Duration::from_secs(10))
            .expect_err("rate-limited");
        assert_eq!(
            err,
            KeyError::UnknownKid {
                kid: "b".into(),
                retry_in: Some(Duration::from_secs(20))
            }
        );
        assert_eq!(
            src.fetches.load(Ordering::SeqCst),
            1,
            "no refetch within 30 s"
        );
        assert!(
            cache.key("b", t0 + Duration::from_secs(30)).is_ok(),
            "refetched"
        );
        assert_eq!(src.fetches.load(Ordering::SeqCst), 2);
        // A kid the provider does not have: one refetch, then rate-limited.
        let t1 = t0 + Duration::from_secs(61);
        assert_eq!(
            cache.key("zz", t1),
            Err(KeyError::UnknownKid {
                kid: "zz".into(),
                retry_in: None
            })
        );
        assert!(cache.key("zz", t1 + Duration::from_secs(1)).is_err());
        assert_eq!(src.fetches.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn stale_set_is_refreshed_and_kept_when_the_provider_fails() {
        let src = served(&[ec_key("a")]);
        let cache = JwksCache::new(
            Box::new(Arc::clone(&src)),
            Duration::from_secs(30),
            Duration::from_secs(600),
        );
        let t0 = Instant::now();
        cache.refresh(t0).expect("fetch");
        *src.body.lock().expect("lock") = Err("provider down".into());
        // Stale: a refetch is tried, fails, the old key still serves.
        assert!(cache.key("a", t0 + Duration::from_secs(601)).is_ok());
        assert_eq!(src.fetches.load(Ordering::SeqCst), 2);
        // Provider removed the key: once stale again, it is gone.
        *src.body.lock().expect("lock") =
            Ok(json!({"keys": [ec_key("b")]}).to_string().into_bytes());
        assert!(cache.key("a", t0 + Duration::from_secs(1300)).is_err());
    }

    #[test]
    fn no_set_and_no_provider_is_unavailable() {
        let src = served(&[]);
        *src.body.lock().expect("lock") = Err("connection refused".into());
        let cache = JwksCache::new(
            Box::new(Arc::clone(&src)),
            Duration::from_secs(30),
            Duration::from_secs(600),
        );
        let t0 = Instant::now();
        assert!(cache.refresh(t0).is_err());
        let err = cache
            .key("a", t0 + Duration::from_secs(31))
            .expect_err("no set");
        assert_eq!(
            err.to_string(),
            "no JWKS available: JWKS fetch: request to test failed: connection refused; check the URL, the network and the CA"
        );
    }
}
