//! The callout's parsers of outside input under random and
//! mutated input: the bearer JWT (`jwt::verify`), the JWKS
//! (`KeySet::parse`), strict JSON, the server's authorization request
//! (`natsjwt::decode_request`) and the config. Each must not panic, must
//! answer within a time bound, and must refuse what is not valid: a mutated
//! signed token or request is accepted only when what was signed is
//! unchanged. 64 cases per parser in `cargo test`; `make fuzz` sets
//! `PROPTEST_CASES` for a long run.

use std::time::{Duration, Instant};

use fleet_common::b64::decode_url;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::{json, Value};

use crate::config::Config;
use crate::jwks::{KeyError, KeySet};
use crate::jwt::tests::{claims, keys, policy, sign_es256, sign_rs256, NOW};
use crate::jwt::verify;
use crate::natsjwt::decode_request;
use crate::natsjwt::tests::{request_claims, signed_request};
use crate::strict_json;

/// Longest one parse or verification may take (debug build, loaded machine).
const BOUND: Duration = Duration::from_secs(2);
const DEFAULT_CASES: u32 = 64;
/// Fragments spliced in.
const TOKENS: &[&str] = &[
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    ".",
    "=",
    "-",
    "_",
    "null",
    "1e999",
    "\"a\":1",
    "\"alg\":\"none\"",
    "\"device_id\":\"dev2\"",
    "\\u0000",
    "AAAA",
    "eyJ",
];

fn config() -> RunnerConfig {
    let mut c = RunnerConfig {
        failure_persistence: None,
        ..RunnerConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = DEFAULT_CASES;
    }
    c
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, &'static str),
    Delete(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), prop::sample::select(TOKENS)).prop_map(|(i, t)| Mutation::Insert(i, t)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(mut v: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let len = v.len().max(1);
        match m {
            Mutation::Flip(i, b) => {
                if let Some(x) = v.get_mut(i % len) {
                    *x ^= b | 1;
                }
            }
            Mutation::Insert(i, t) => {
                let at = (i % (v.len() + 1)).min(v.len());
                v.splice(at..at, t.bytes());
            }
            Mutation::Delete(i, n) => {
                let at = i % len;
                let end = (at + n).min(v.len());
                if at < end {
                    v.drain(at..end);
                }
            }
            Mutation::Truncate(i) => v.truncate(i % len),
        }
    }
    v
}

/// Random bytes (`true`) or a sample mutated a few times (`false`).
fn inputs(samples: Vec<Vec<u8>>) -> impl Strategy<Value = (Vec<u8>, bool)> {
    let n = samples.len();
    prop_oneof![
        vec(any::<u8>(), 0..4096).prop_map(|b| (b, true)),
        (0..n, vec(mutation(), 1..6))
            .prop_map(move |(i, ms)| (apply(samples[i].clone(), &ms), false)),
    ]
}

/// Runs `check` (which returns `Err` for a property broken) on every input,
/// within the time bound.
fn run(what: &str, samples: Vec<Vec<u8>>, check: impl Fn(&[u8], bool) -> Result<(), String>) {
    let mut runner = TestRunner::new(config());
    let result = runner.run(&inputs(samples), |(bytes, random)| {
        let started = Instant::now();
        let verdict = check(&bytes, random);
        let took = started.elapsed();
        prop_assert!(took < BOUND, "{what}: {took:?} for {} bytes", bytes.len());
        if let Err(why) = verdict {
            prop_assert!(false, "{what}: {why}");
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{what}: {e}");
    }
}

/// The signed parts of a JWT: header and claims text, decoded signature.
fn signed_parts(token: &str) -> Option<(String, String, Vec<u8>)> {
    let mut it = token.split('.');
    let (h, p, s) = (it.next()?, it.next()?, it.next()?);
    Some((h.to_owned(), p.to_owned(), decode_url(s)?))
}

#[test]
fn bearer_tokens() {
    let k = keys();
    let set = KeySet::parse(
        json!({"keys": [k.rsa_jwk, k.ec_jwk]})
            .to_string()
            .as_bytes(),
    )
    .expect("jwks");
    let rs = sign_rs256(
        &k.rsa,
        &json!({"alg": "RS256", "typ": "JWT", "kid": "rsa-test-1"}),
        &claims("dev-a"),
    );
    let es = sign_es256(
        &k.ec,
        &json!({"alg": "ES256", "kid": "ec-test-1"}),
        &claims("dev-b"),
    );
    let originals = [rs.clone(), es.clone()];
    run(
        "bearer token",
        vec![rs.into_bytes(), es.into_bytes()],
        |bytes, random| {
            let Ok(token) = std::str::from_utf8(bytes) else {
                return Ok(());
            };
            let got = verify(
                token,
                |kid| {
                    set.get(kid).ok_or(KeyError::UnknownKid {
                        kid: kid.to_owned(),
                        retry_in: None,
                    })
                },
                &policy(),
                NOW,
            );
            let Ok(v) = got else {
                return Ok(());
            };
            if random {
                return Err(format!("random bytes verified as {v:?}"));
            }
            // Only a token whose signed parts are untouched verifies (the
            // signature's base64 may differ in unused bits).
            let mine = signed_parts(token);
            if originals
                .iter()
                .any(|o| signed_parts(o).is_some() && signed_parts(o) == mine)
            {
                Ok(())
            } else {
                Err(format!("a changed token verified: {token}"))
            }
        },
    );
}

#[test]
fn key_sets() {
    let k = keys();
    let sample = json!({"keys": [k.rsa_jwk, k.ec_jwk, {"kty": "oct", "kid": "h", "k": "AA"}]})
        .to_string()
        .into_bytes();
    run("JWKS", vec![sample], |bytes, random| {
        match KeySet::parse(bytes) {
            Ok(set) if random => Err(format!("random bytes parsed as {set:?}")),
            Ok(set) => {
                // Accepted: no duplicate key anywhere, at most the limit.
                if strict_json::parse(bytes).is_err() {
                    return Err("accepted JSON that strict parsing refuses".into());
                }
                if set.len() > fleet_common::limits::MAX_JWKS_KEYS {
                    return Err("more keys than the limit".into());
                }
                Ok(())
            }
            Err(_) => Ok(()),
        }
    });
}

#[test]
fn strict_json_agrees_with_serde_json_except_for_duplicates() {
    let sample = br#"{"a":[1,2,{"b":null,"c":"x"}],"d":{"e":-1.5e3},"f":"\u00e9"}"#.to_vec();
    run("strict JSON", vec![sample], |bytes, _| {
        let strict = strict_json::parse(bytes);
        let loose = serde_json::from_slice::<Value>(bytes);
        match (strict, loose) {
            (Ok(a), Ok(b)) if a == b => Ok(()),
            (Ok(a), Ok(b)) => Err(format!("{a} != {b}")),
            (Ok(a), Err(e)) => Err(format!("strict accepted {a}, serde_json refused: {e}")),
            (Err(strict_json::StrictJsonError::Syntax), Ok(v)) => Err(format!(
                "serde_json accepted {v}, strict called it not JSON"
            )),
            (Err(_), _) => Ok(()),
        }
    });
}

#[test]
fn authorization_requests() {
    let server = nkeys::KeyPair::new_server();
    let issuer = nkeys::KeyPair::new_account().public_key();
    let user = nkeys::KeyPair::new_user().public_key();
    let request = signed_request(&server, &request_claims(&server, &issuer, &user, NOW));
    let original = signed_parts(&request);
    run(
        "authorization request",
        vec![request.clone().into_bytes()],
        |bytes, random| match decode_request(bytes, NOW, 60) {
            Ok(r) if random => Err(format!("random bytes decoded as {r:?}")),
            Ok(_) => {
                let mine = std::str::from_utf8(bytes).ok().and_then(signed_parts);
                (mine == original)
                    .then_some(())
                    .ok_or_else(|| "a changed request verified".to_owned())
            }
            Err(_) => Ok(()),
        },
    );
}

#[test]
fn configs() {
    let sample = json!({
        "issuer": "https://idp.example.com",
        "audience": "fleet",
        "jwks_url": "https://idp.example.com/oauth/v2/keys",
        "max_user_lifetime_secs": 3600,
        "nats_url": "nats://127.0.0.1:4222",
        "nats_password_file": "/etc/harmony-fleet/auth-callout/nats-password",
        "issuer_seed_file": "/etc/harmony-fleet/auth-callout/issuer.nk"
    })
    .to_string()
    .into_bytes();
    run("config", vec![sample], |bytes, random| {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Ok(());
        };
        match Config::from_json(text) {
            Ok(c) if random => Err(format!("random bytes parsed as {c:?}")),
            Ok(c) => {
                let ok = c.policy.issuer.starts_with("https://")
                    && c.jwks
                        .as_ref()
                        .is_some_and(|j| j.url.starts_with("https://"))
                    && (60..=2_592_000).contains(&c.policy.max_user_lifetime_secs)
                    && c.nats_password_file.is_absolute()
                    && c.issuer_seed_file.is_absolute();
                ok.then_some(())
                    .ok_or_else(|| format!("accepted an invalid config {c:?}"))
            }
            Err(_) => Ok(()),
        }
    });
}
