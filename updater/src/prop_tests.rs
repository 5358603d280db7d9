//! The updater's own parsers of outside input (private to
//! the crate, so tested here): its config file and a registry's
//! `WWW-Authenticate: Bearer` challenge. Random input and mutations of a
//! valid sample (byte flips, tokens spliced in, truncations) must never
//! panic, must answer within a bound, and random bytes are refused. 64
//! cases each; `make fuzz` sets `PROPTEST_CASES`.

use std::path::Path;

use fleet_harness::fuzz::{bounded, cases, mutated};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::config::UpdaterConfig as Config;
use crate::oci::parse_bearer;

const CONFIG: &str = r#"{"agent-unit":"fleet-agent.service","probe-user":"nobody"}"#;
const CHALLENGE: &str = r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:fleet/agent:pull""#;
const TOKENS: &[&str] = &[
    "\"", "{", "}", ",", "=", ":", "\\", "null", "Bearer ", "realm=", "\u{ff11}", "\0",
];

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
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_bytes_are_refused(bytes in vec(any::<u8>(), 0..2048)) {
        prop_assert!(!config(&bytes));
        prop_assert!(!challenge(&bytes));
    }

    #[test]
    fn a_mutated_config_never_panics(bytes in mutated(CONFIG, TOKENS)) {
        config(&bytes);
    }

    #[test]
    fn a_mutated_challenge_never_panics(bytes in mutated(CHALLENGE, TOKENS)) {
        challenge(&bytes);
    }
}
