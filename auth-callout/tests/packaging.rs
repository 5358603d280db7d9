//! The shipped examples: `packaging/nats/fleet-callout.conf.example` is the
//! generator's output for the callout layout and nats-server 2.14 accepts it;
//! `packaging/auth-callout/auth-callout.json.example` is a valid callout
//! config.
//!
//! Regenerate: `FLEET_REGENERATE=1 cargo test -p fleet-auth-callout --test packaging`.

use std::process::Command;

use fleet_auth_callout::Config;
use fleet_common::nats_config::{callout_server_config, CalloutServerConfig};
use fleet_common::nkey::{NkeyKind, PublicNkey};
use fleet_harness::{workspace_root, NatsVersion};

/// A published account public key (nkeys test suite): replace it with the
/// output of `fleet-auth-callout keygen`.
const EXAMPLE_ISSUER: &str = "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2";

/// The nonce user of the example (`fleet_common::nats_config::NONCE_USER_NOTE`).
const EXAMPLE_NONCE_KEY: &str = "UAMMBNV2EYR65NYZZ7IAK5SIR5ODNTTERJOBOF4KJLMWI45YOXOSWULM";

fn example() -> String {
    let text = callout_server_config(&CalloutServerConfig {
        listen: "0.0.0.0:4222".parse().expect("addr"),
        server_name: None,
        store_dir: "/var/lib/nats/jetstream".into(),
        admin_password: "CHANGE-ME-admin".to_owned(),
        callout_password: "CHANGE-ME-auth-callout".to_owned(),
        issuer: PublicNkey::parse_kind(EXAMPLE_ISSUER, NkeyKind::Account).expect("account key"),
        // A published user key (the nats crate's docs): fleetctl writes a
        // fresh one whose seed it drops; this one's user may do nothing.
        nonce_key: PublicNkey::parse_kind(EXAMPLE_NONCE_KEY, NkeyKind::User).expect("user key"),
        cluster: None,
        leafnodes: None,
        protocols: fleet_common::subjects::DeviceProtocols::WithLegacy,
    });
    format!(
        "# Example of the auth callout layout (nats-server 2.10 or later). Generate\n\
         # yours with `fleetctl nats-config --auth-callout ...`; the issuer is the\n\
         # output of `fleet-auth-callout keygen`. Regenerate this file with\n\
         #   FLEET_REGENERATE=1 cargo test -p fleet-auth-callout --test packaging\n\
         # Also required, not expressible here: create the buckets (KV_fleet-status\n\
         # with allow_rollup_hdrs=false), see packaging/nats/README.md.\n{text}"
    )
}

#[test]
fn callout_example_config_is_generated_and_accepted_by_2_14() {
    let path = workspace_root().join("packaging/nats/fleet-callout.conf.example");
    let want = example();
    if std::env::var_os("FLEET_REGENERATE").is_some() {
        std::fs::write(&path, &want).expect("write example");
    }
    let have = std::fs::read_to_string(&path).expect("read example");
    assert_eq!(
        have,
        want,
        "{} is stale: regenerate with FLEET_REGENERATE=1 cargo test -p fleet-auth-callout --test packaging",
        path.display()
    );
    let out = Command::new(NatsVersion::V2_14.binary())
        .arg("-t")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("nats-server -t");
    assert!(
        out.status.success(),
        "2.14 refuses the example: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn example_callout_config_is_valid() {
    let path = workspace_root().join("packaging/auth-callout/auth-callout.json.example");
    let c = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.nats_user, "auth-callout");
    assert!(c
        .issuer_seed_file
        .starts_with("/run/credentials/fleet-auth-callout.service"));
}
