//! Every parser of outside input in `fleet_common` under
//! random and mutated input. Each gets random bytes and mutations (flips,
//! insertions of JSON tokens, deletions, truncations, duplicated slices) of
//! a valid sample (the golden files), and must not panic, must answer
//! within a time bound, must refuse random bytes, and may accept a mutated
//! sample only as a value that survives its own round trip (serialized and
//! parsed again, it is the same value: nothing half-valid gets through).
//!
//! Cases: 64 per parser in `cargo test` (well under a second each);
//! `make fuzz` sets `PROPTEST_CASES` for a long run.

use std::fmt::Debug;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    registry_error_summary, AgentArtifact, AgentRequest, AgentUpgradeAttempt, ErrorBody, Journal,
    OciManifest, Release, Response, SeenAttempts, UpdaterReply, UpdaterRequest, WorkloadSpec,
};
use fleet_common::nkey::{NkeyKind, NkeySeed, PublicNkey};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Longest one parse may take (a debug build on a loaded machine; a
/// release build takes microseconds).
const PARSE_BOUND: Duration = Duration::from_secs(2);
/// Cases per parser when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 64;
/// Fragments spliced in: JSON structure, odd numbers and strings.
const TOKENS: &[&str] = &[
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "true",
    "-1",
    "0",
    "1e999",
    "18446744073709551616",
    "-9223372036854775809",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"a\":1",
    "..",
    "/",
    "\\",
    "１",
    "\u{202e}",
    "{\"a\":{\"a\":{\"a\":{}}}}",
    "[[[[[[[[]]]]]]]]",
];

fn config() -> Config {
    let mut c = Config {
        failure_persistence: None,
        ..Config::default()
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
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), prop::sample::select(TOKENS)).prop_map(|(i, t)| Mutation::Insert(i, t)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
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
            Mutation::Duplicate(i, n) => {
                let at = i % len;
                let end = (at + n).min(v.len());
                if at < end {
                    let slice = v[at..end].to_vec();
                    v.splice(end..end, slice);
                }
            }
        }
    }
    v
}

/// Random bytes, or a sample mutated a few times.
#[derive(Debug, Clone)]
enum Input {
    Random(Vec<u8>),
    Mutated(Vec<u8>),
}

fn inputs(samples: Vec<Vec<u8>>) -> impl Strategy<Value = Input> {
    let n = samples.len();
    prop_oneof![
        vec(any::<u8>(), 0..2048).prop_map(Input::Random),
        (0..n, vec(mutation(), 1..6))
            .prop_map(move |(i, ms)| Input::Mutated(apply(samples[i].clone(), &ms))),
    ]
}

/// Runs `parse` over random and mutated inputs; `accepted` checks a value
/// that was accepted (its round trip).
fn fuzz<T: Debug, E: Debug>(
    what: &str,
    samples: Vec<Vec<u8>>,
    parse: impl Fn(&[u8]) -> Result<T, E>,
    accepted: impl Fn(&T) -> Result<(), String>,
) {
    for s in &samples {
        assert!(parse(s).is_ok(), "{what}: the sample is refused");
    }
    let mut runner = TestRunner::new(config());
    let result = runner.run(&inputs(samples), |input| {
        let (bytes, random) = match &input {
            Input::Random(b) => (b, true),
            Input::Mutated(b) => (b, false),
        };
        let started = Instant::now();
        let parsed = parse(bytes);
        let took = started.elapsed();
        prop_assert!(
            took < PARSE_BOUND,
            "{what}: {took:?} for {} bytes",
            bytes.len()
        );
        match parsed {
            Ok(v) if random => {
                prop_assert!(false, "{what}: random bytes accepted as {v:?}");
            }
            Ok(v) => {
                if let Err(why) = accepted(&v) {
                    prop_assert!(false, "{what}: accepted {v:?} but {why}");
                }
            }
            Err(_) => {}
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{what}: {e}");
    }
}

fn golden(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Serialized and parsed again by `parse`, the value is the same.
fn round_trip<T: serde::Serialize + PartialEq + Debug, E: Debug>(
    parse: impl Fn(&[u8]) -> Result<T, E>,
) -> impl Fn(&T) -> Result<(), String> {
    move |v| {
        let bytes = serde_json::to_vec(v).map_err(|e| format!("does not serialize: {e}"))?;
        match parse(&bytes) {
            Ok(back) if back == *v => Ok(()),
            Ok(back) => Err(format!("round trip gives {back:?}")),
            Err(e) => Err(format!("its own serialization is refused: {e:?}")),
        }
    }
}

#[test]
fn upgrade_intents() {
    let parse = |b: &[u8]| serde_json::from_slice::<AgentUpgradeAttempt>(b);
    fuzz("attempt", vec![golden("attempt")], parse, round_trip(parse));
}

#[test]
fn workload_specs() {
    fuzz(
        "workload spec",
        vec![golden("workload-spec"), golden("workload-spec-minimal")],
        WorkloadSpec::from_json,
        round_trip(WorkloadSpec::from_json),
    );
}

#[test]
fn release_files() {
    fuzz(
        "release",
        vec![golden("release")],
        Release::from_json,
        round_trip(Release::from_json),
    );
}

#[test]
fn oci_manifests() {
    let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    fuzz(
        "OCI manifest",
        vec![golden("oci-agent-manifest")],
        AgentArtifact::from_manifest,
        |a: &AgentArtifact| {
            let again = OciManifest::for_agent(&a.sha256, a.size).to_bytes();
            match AgentArtifact::from_manifest(&again) {
                Ok(b) if b == *a => Ok(()),
                other => Err(format!("the manifest for it parses as {other:?}")),
            }
        },
    );
    // An index is refused (the updater asks for a manifest by tag).
    assert!(AgentArtifact::from_manifest(index).is_err());
}

#[test]
fn registry_error_bodies() {
    let sample = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#;
    let parse = |b: &[u8]| registry_error_summary(b).ok_or(());
    fuzz(
        "registry error",
        vec![sample.to_vec()],
        parse,
        |s: &String| {
            (s.chars().count() <= 256)
                .then_some(())
                .ok_or_else(|| "too long".to_owned())
        },
    );
}

#[test]
fn socket_requests() {
    let parse = |b: &[u8]| serde_json::from_slice::<UpdaterRequest>(b);
    fuzz(
        "updater request",
        vec![
            golden("updater-request-status"),
            golden("updater-request-upgrade"),
        ],
        parse,
        round_trip(parse),
    );
    let parse = |b: &[u8]| serde_json::from_slice::<AgentRequest>(b);
    fuzz(
        "agent request",
        vec![
            golden("agent-request-status"),
            golden("agent-request-get"),
            golden("agent-request-freeze"),
        ],
        parse,
        round_trip(parse),
    );
}

#[test]
fn socket_responses() {
    let ok = Response::Ok(UpdaterReply { status: None }).to_line();
    let err = Response::<UpdaterReply>::Err(ErrorBody::new(
        fleet_common::contracts::ErrorCode::Busy,
        "retry",
    ))
    .to_line();
    let parse = |b: &[u8]| Response::<UpdaterReply>::from_slice(b);
    fuzz(
        "updater response",
        vec![ok, err],
        parse,
        |r| match Response::<UpdaterReply>::from_slice(&r.to_line()) {
            Ok(back) if back == *r => Ok(()),
            other => Err(format!("round trip gives {other:?}")),
        },
    );
}

#[test]
fn state_files() {
    let parse = |b: &[u8]| serde_json::from_slice::<Journal>(b);
    fuzz(
        "journal",
        vec![golden("journal"), golden("journal-empty")],
        parse,
        round_trip(parse),
    );
    let parse = |b: &[u8]| serde_json::from_slice::<SeenAttempts>(b);
    fuzz(
        "seen attempts",
        vec![golden("seen-attempts")],
        parse,
        round_trip(parse),
    );
}

#[test]
fn nkeys() {
    // Published pair from the nkeys test suite.
    let seed = "SAAPN4W3EG6KCJGUQTKTJ5GSB5NHK5CHAJL4DBGFUM3HHROI4XUEP4OBK4".to_owned();
    let public = NkeySeed::parse_kind(&seed, NkeyKind::Account)
        .expect("published seed")
        .public_key()
        .encode();
    let parse = |b: &[u8]| {
        std::str::from_utf8(b)
            .map_err(|_| ())
            .and_then(|t| PublicNkey::parse(t).map_err(|_| ()))
    };
    // Accepted only as its own canonical text: a mutation that still
    // decodes must be caught by the checksum.
    fuzz(
        "public nkey",
        vec![public.clone().into_bytes()],
        parse,
        |k: &PublicNkey| {
            (k.encode() == public)
                .then_some(())
                .ok_or_else(|| format!("{} is another key", k.encode()))
        },
    );
    let parse = |b: &[u8]| {
        std::str::from_utf8(b)
            .map_err(|_| ())
            .and_then(|t| NkeySeed::parse(t).map_err(|_| ()))
    };
    fuzz(
        "seed",
        vec![seed.clone().into_bytes()],
        parse,
        |s: &NkeySeed| {
            (s.encode() == seed)
                .then_some(())
                .ok_or_else(|| "another seed".to_owned())
        },
    );
}
