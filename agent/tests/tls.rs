//! The production transport: `tls://` servers verified against the CA in
//! `nats.tls.ca-file`, with the device's user and password on top. A
//! nats-server with the fleet layout and a TLS listener (test CA leaf).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use fleet_common::contracts::DeviceInfo;
use fleet_common::nats_config::ADMIN_USER;
use fleet_harness::{
    create_buckets, device_password, fleet_server_config, ChildGuard, NatsVersion, TestCa,
    NATS_ADMIN_PASSWORD,
};

#[test]
fn agent_connects_over_tls_with_the_configured_ca() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf_files(&["127.0.0.1", "localhost"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut conf = fleet_server_config(
        &[("dev1", &device_password("dev1"))],
        NATS_ADMIN_PASSWORD,
        port,
        &dir.path().join("store"),
    );
    conf.push_str(&format!(
        "\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
        cert.display(),
        key.display()
    ));
    let conf_path = dir.path().join("nats.conf");
    std::fs::write(&conf_path, conf).expect("write config");
    let mut cmd = Command::new(NatsVersion::V2_14.binary());
    cmd.arg("-c").arg(&conf_path);
    let server = ChildGuard::spawn(cmd, "nats-tls");
    server.wait_for_line("Server is ready", Duration::from_secs(20));
    let url = format!("tls://127.0.0.1:{port}");

    let admin = nats::Options::with_user_pass(ADMIN_USER, NATS_ADMIN_PASSWORD)
        .add_root_certificate(ca.ca_path())
        .connect(url.as_str())
        .expect("admin over TLS");
    create_buckets(&admin, 1, Duration::from_secs(30));

    let mut settings = Settings::new(vec![url]);
    settings.podman = false;
    let dev = Device::new("dev1", &settings, None);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&dev.config).expect("read")).expect("json");
    cfg["nats"]["tls"] = serde_json::json!({"ca-file": ca.ca_path()});
    std::fs::write(&dev.config, cfg.to_string()).expect("write");
    let _agent = dev.start(None);
    let info: DeviceInfo = status(&admin, "dev1", "info").expect("device info over TLS");
    assert_eq!(
        info.podman_version, None,
        "podman is disabled on this device"
    );
}
