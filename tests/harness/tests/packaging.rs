//! `packaging/nats/fleet.conf.example` is the generator's output (so it
//! cannot drift from `fleet_common::subjects`) and both supported
//! nats-server versions accept it.
//!
//! Regenerate: `FLEET_REGENERATE=1 cargo test -p fleet-harness --test packaging`.

use std::process::Command;

use fleet_common::nats_config::{static_server_config, StaticServerConfig};
use fleet_common::validate::DeviceId;
use fleet_harness::{workspace_root, NatsVersion};

fn example() -> String {
    let text = static_server_config(&StaticServerConfig {
        listen: "0.0.0.0:4222".parse().expect("addr"),
        server_name: None,
        store_dir: "/var/lib/nats/jetstream".into(),
        admin_password: "CHANGE-ME-admin".to_owned(),
        devices: ["dev1", "dev2"]
            .iter()
            .map(|d| (DeviceId::parse(d).expect("valid"), format!("CHANGE-ME-{d}")))
            .collect(),
        cluster: None,
        leafnodes: None,
        protocols: fleet_common::subjects::DeviceProtocols::WithLegacy,
    });
    format!(
        "# Example for two devices. Regenerate with\n\
         #   FLEET_REGENERATE=1 cargo test -p fleet-harness --test packaging\n\
         # Also required, not expressible here: create the buckets (KV_fleet-status\n\
         # with allow_rollup_hdrs=false), see README.md.\n{text}"
    )
}

#[test]
fn example_config_is_generated_and_accepted() {
    let path = workspace_root().join("packaging/nats/fleet.conf.example");
    let want = example();
    if std::env::var_os("FLEET_REGENERATE").is_some() {
        std::fs::write(&path, &want).expect("write example");
    }
    let have = std::fs::read_to_string(&path).expect("read example");
    assert_eq!(
        have, want,
        "{} is stale: regenerate with FLEET_REGENERATE=1 cargo test -p fleet-harness --test packaging",
        path.display()
    );
    for v in NatsVersion::all() {
        let out = Command::new(v.binary())
            .arg("-t")
            .arg("-c")
            .arg(&path)
            .output()
            .expect("nats-server -t");
        assert!(
            out.status.success(),
            "{v:?} refuses the example: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
