//! Issue 17 item 10, the updater's own parsers of outside input (private to
//! the crate, so tested here): its config file and a registry's
//! `WWW-Authenticate: Bearer` challenge. Random input and mutations of a
//! valid sample (byte flips, tokens spliced in, truncations) must never
//! panic, must answer within a bound, and random bytes are refused. 64
//! cases each; `make fuzz` sets `PROPTEST_CASES`.

use std::path::Path;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;

use crate::config::UpdaterConfig as Config;
use crate::oci::parse_bearer;

/// Longest one parse may take in a debug build on a loaded machine.
const PARSE_BOUND: Duration = Duration::from_secs(2);

const CONFIG: &str = r#"{"agent-unit":"fleet-agent.service","probe-user":"nobody"}"#;
const CHALLENGE: &str = r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:fleet/agent:pull""#;
const TOKENS: &[&str] = &[
    "\"", "{", "}", ",", "=", ":", "\\", "null", "Bearer ", "realm=", "\u{ff11}", "\0",
];

/// A sample with mutations applied: (position, kind, byte or token).
fn mutated(sample: &'static str) -> impl Strategy<Value = Vec<u8>> {
    vec((any::<usize>(), 0u8..4, any::<u8>()), 1..6).prop_map(move |edits| {
        let mut b = sample.as_bytes().to_vec();
        for (at, kind, x) in edits {
            let at = at % (b.len() + 1);
            match kind {
                0 if at < b.len() => b[at] = x,
                1 => {
                    let t = TOKENS[usize::from(x) % TOKENS.len()].as_bytes();
                    b.splice(at..at, t.iter().copied());
                }
                2 => b.truncate(at),
                _ if at < b.len() => {
                    b.remove(at);
                }
                _ => {}
            }
        }
        b
    })
}

fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    assert!(
        started.elapsed() < PARSE_BOUND,
        "{what} took {:?}",
        started.elapsed()
    );
    out
}

fn config(bytes: &[u8]) -> bool {
    bounded("config", || {
        Config::parse(Path::new("/prop/updater.json"), bytes)
    })
    .is_ok()
}

fn challenge(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    bounded("challenge", || parse_bearer(&text)).is_ok()
}

#[test]
fn the_samples_are_valid() {
    assert!(config(CONFIG.as_bytes()));
    assert!(challenge(CHALLENGE.as_bytes()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64)
    ))]

    #[test]
    fn random_bytes_are_refused(bytes in vec(any::<u8>(), 0..2048)) {
        prop_assert!(!config(&bytes));
        prop_assert!(!challenge(&bytes));
    }

    #[test]
    fn a_mutated_config_never_panics(bytes in mutated(CONFIG)) {
        config(&bytes);
    }

    #[test]
    fn a_mutated_challenge_never_panics(bytes in mutated(CHALLENGE)) {
        challenge(&bytes);
    }
}
