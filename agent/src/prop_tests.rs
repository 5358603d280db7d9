//! The agent's own parsers of outside input (private to
//! this binary, so tested here): the config file, the desired-workloads
//! document with its specs, and the upgrade intent. Random bytes and
//! mutations of a valid sample (byte flips, JSON tokens spliced in,
//! truncations) must never panic, must answer within a bound, and random
//! bytes are refused. 64 cases each; `make fuzz` sets `PROPTEST_CASES`.

use std::path::Path;

use fleet_common::validate::{Arch, DeviceId};
use fleet_harness::fuzz::{bounded, cases, mutated};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::config::Config;
use crate::desired::{decode_value, expand_document};
use crate::upgrade::intent;

const CONFIG: &str = r#"{"device-id":"truck-0042","nats":{"servers":["nats://127.0.0.1:4222"],"auth":{"method":"none"}},"podman":{"enabled":false},"intervals":{"heartbeat-secs":30,"resync-secs":30,"check-secs":300},"root":"/"}"#;
const DOCUMENT: &str = r#"{"workloads":{"web":{"image":"localhost/web:1","command":["sleep","1"],"env":{"A":"b"},"ports":[{"host":8080,"container":80}]},"bad":{"image":""}}}"#;
const INTENT: &str = r#"{"arch":"x86_64","artifact-url":"https://releases.example.com/fleet-agent/1.4.0/x86_64","device-id":"truck-0042","max-bytes":20971520,"sha256":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","target-version":"1.4.0","uuid":"0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10"}"#;
const TOKENS: &[&str] = &[
    "\"", "{", "}", "[", "]", ",", ":", "null", "-1", "1e999", "\\u0000", "\u{ff11}", "/..", "*",
    ">",
];

fn config(bytes: &[u8]) -> bool {
    bounded("config", || {
        Config::parse(Path::new("/prop/agent.json"), bytes)
    })
    .is_ok()
}

fn document(bytes: &[u8]) -> bool {
    let keys = bounded("document", || expand_document(Some(bytes.to_vec())));
    if let Ok(keys) = &keys {
        for v in keys.values() {
            bounded("spec", || decode_value(v));
        }
    }
    keys.is_ok()
}

fn intent(bytes: &[u8]) -> bool {
    let device = DeviceId::parse("truck-0042").expect("valid");
    bounded("intent", || intent::decode(bytes, &device, Arch::X86_64)).is_ok()
}

#[test]
fn the_samples_are_valid() {
    assert!(config(CONFIG.as_bytes()));
    assert!(document(DOCUMENT.as_bytes()));
    assert!(intent(INTENT.as_bytes()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_bytes_are_refused(bytes in vec(any::<u8>(), 0..2048)) {
        prop_assert!(!config(&bytes));
        prop_assert!(!intent(&bytes));
        document(&bytes);
    }

    #[test]
    fn a_mutated_config_never_panics(bytes in mutated(CONFIG, TOKENS)) {
        config(&bytes);
    }

    #[test]
    fn a_mutated_document_never_panics(bytes in mutated(DOCUMENT, TOKENS)) {
        document(&bytes);
    }

    #[test]
    fn a_mutated_intent_never_panics(bytes in mutated(INTENT, TOKENS)) {
        intent(&bytes);
    }
}
