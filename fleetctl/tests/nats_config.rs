//! `fleetctl nats-config` run as a binary: its static config starts on
//! nats-server 2.9.10 and 2.14 and isolates the devices it lists; its
//! auth-callout config starts on 2.14 (and is refused by 2.9, which has no
//! auth callout); a hub with a leafnode listener and two leaf nodes it
//! writes carry a device's reads, writes and presence through the leaves,
//! isolated as on the hub, on both; bad input writes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use std::time::Duration;

use fleet_harness::{
    assert_device_isolation, bin_path, poll_until, DeviceClient, NatsLeaf, NatsServer, NatsVersion,
    NATS_ADMIN_PASSWORD,
};
use tempfile::TempDir;

/// A published account public key (nkeys test suite).
const ISSUER: &str = "ACODERUVFFAWZQDSS6SBIACUA5O6SXF7HJ3YTYXBALHZP3P7R4BUO4J2";

fn fleetctl(args: &[&str]) -> Output {
    Command::new(bin_path("fleetctl"))
        .args(args)
        .output()
        .expect("run fleetctl")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

struct Inputs {
    dir: TempDir,
}

impl Inputs {
    fn new(devices: &str) -> Inputs {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("devices"), devices).expect("write");
        std::fs::write(
            dir.path().join("admin-pw"),
            format!("{NATS_ADMIN_PASSWORD}\n"),
        )
        .expect("write");
        std::fs::write(dir.path().join("callout-pw"), "callout-pw\n").expect("write");
        std::fs::write(dir.path().join("leaf-pw"), "leaf pw/with@odd:chars\n").expect("write");
        std::fs::create_dir(dir.path().join("passwords")).expect("mkdir");
        Inputs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `fleetctl nats-config` for a static config listening on `port`.
    fn static_config(&self, port: u16, store: &Path) -> String {
        let out = self.path("nats.conf");
        let listen = format!("127.0.0.1:{port}");
        let o = fleetctl(&[
            "nats-config",
            "--devices",
            s(&self.path("devices")),
            "--passwords-dir",
            s(&self.path("passwords")),
            "--admin-password-file",
            s(&self.path("admin-pw")),
            "--listen",
            &listen,
            "--store-dir",
            s(store),
            "--output",
            s(&out),
        ]);
        assert!(o.status.success(), "fleetctl: {o:?}");
        std::fs::read_to_string(&out).expect("config written")
    }

    /// A static hub on `port` with its leafnode listener on `leaf_port`.
    fn hub_config(&self, port: u16, store: &Path, leaf_port: u16) -> String {
        let listen = format!("127.0.0.1:{port}");
        let leaf_listen = format!("127.0.0.1:{leaf_port}");
        let o = fleetctl(&[
            "nats-config",
            "--devices",
            s(&self.path("devices")),
            "--passwords-dir",
            s(&self.path("passwords")),
            "--admin-password-file",
            s(&self.path("admin-pw")),
            "--listen",
            &listen,
            "--store-dir",
            s(store),
            "--server-name",
            "hub",
            "--leafnode-listen",
            &leaf_listen,
            "--leaf-password-file",
            s(&self.path("leaf-pw")),
        ]);
        assert!(o.status.success(), "fleetctl: {o:?}");
        String::from_utf8(o.stdout).expect("utf-8")
    }

    /// Leaf `name` on `port` of the hub's leafnode listener `hub`.
    fn leaf_config(&self, name: &str, port: u16, hub: &str) -> String {
        let listen = format!("127.0.0.1:{port}");
        let o = fleetctl(&[
            "nats-config",
            "--leaf-of",
            hub,
            "--leaf-password-file",
            s(&self.path("leaf-pw")),
            "--server-name",
            name,
            "--devices",
            s(&self.path("devices")),
            "--passwords-dir",
            s(&self.path("passwords")),
            "--listen",
            &listen,
        ]);
        assert!(o.status.success(), "fleetctl: {o:?}");
        String::from_utf8(o.stdout).expect("utf-8")
    }

    fn callout_config(&self, port: u16, store: &Path) -> String {
        let listen = format!("127.0.0.1:{port}");
        let o = fleetctl(&[
            "nats-config",
            "--auth-callout",
            "--issuer",
            ISSUER,
            "--callout-password-file",
            s(&self.path("callout-pw")),
            "--admin-password-file",
            s(&self.path("admin-pw")),
            "--listen",
            &listen,
            "--store-dir",
            s(store),
        ]);
        assert!(o.status.success(), "fleetctl: {o:?}");
        String::from_utf8(o.stdout).expect("utf-8")
    }

    fn password(&self, device: &str) -> String {
        std::fs::read_to_string(self.path("passwords").join(device))
            .expect("generated password")
            .trim()
            .to_owned()
    }
}

fn device(server: &NatsServer, id: &str, password: &str) -> std::io::Result<DeviceClient> {
    let options = server
        .client_options(nats::Options::with_user_pass(id, password))
        .max_reconnects(1);
    DeviceClient::connect(options, &server.url(), id)
}

fn static_config_starts_and_isolates_devices(v: NatsVersion) {
    use std::os::unix::fs::PermissionsExt;
    let inputs = Inputs::new("# two devices\ndev-a\ndev-b\n");
    let server = NatsServer::start_with_config(v, |port, store| inputs.static_config(port, store));
    let config_mode = std::fs::metadata(inputs.path("nats.conf"))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(config_mode & 0o777, 0o600, "the config holds passwords");
    let a = device(&server, "dev-a", &inputs.password("dev-a")).expect("dev-a connects");
    let b = device(&server, "dev-b", &inputs.password("dev-b")).expect("dev-b connects");
    let admin = server.admin();
    assert_device_isolation(&admin, &a, &b);
    assert_device_isolation(&admin, &b, &a);
    // Another device's password does not open a device's user.
    assert!(device(&server, "dev-a", &inputs.password("dev-b")).is_err());

    // A re-run keeps every generated password.
    let before = (inputs.password("dev-a"), inputs.password("dev-b"));
    let store = server.store_dir();
    inputs.static_config(server.port(), &store);
    assert_eq!((inputs.password("dev-a"), inputs.password("dev-b")), before);
}

#[test]
fn static_config_starts_and_isolates_devices_2_9() {
    static_config_starts_and_isolates_devices(NatsVersion::V2_9);
}

#[test]
fn static_config_starts_and_isolates_devices_2_14() {
    static_config_starts_and_isolates_devices(NatsVersion::V2_14);
}

fn leaf_configs_carry_isolated_devices_and_their_presence(v: NatsVersion) {
    let inputs = Inputs::new("dev-a\ndev-b\n");
    let leaf_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let hub =
        NatsServer::start_with_config(v, |port, store| inputs.hub_config(port, store, leaf_port));
    let hub_leaf = format!("127.0.0.1:{leaf_port}");
    let leaves: Vec<NatsLeaf> = ["leaf-1", "leaf-2"]
        .iter()
        .map(|name| {
            NatsLeaf::start_with_config(v, name, |port| inputs.leaf_config(name, port, &hub_leaf))
        })
        .collect();
    let on = |leaf: &NatsLeaf, id: &str| {
        let options = hub
            .client_options(nats::Options::with_user_pass(id, &inputs.password(id)))
            .max_reconnects(1);
        DeviceClient::connect(options, &leaf.url(), id).expect("a device connects to a leaf")
    };
    let a = on(&leaves[0], "dev-a");
    let b = on(&leaves[1], "dev-b");
    // The links carry interest a moment after they are up.
    for d in [&a, &b] {
        let inbox = format!("_INBOX.{}.leaf-path", d.id);
        let sub = d.conn.subscribe(&inbox).expect("own inbox");
        let subject = format!(
            "fleetapi.DIRECT.GET.KV_fleet-workloads.$KV.fleet-workloads.{}.desired",
            d.id
        );
        poll_until(
            &format!("{}: a Direct Get through its leaf", d.id),
            Duration::from_secs(20),
            || {
                d.conn.publish_request(&subject, &inbox, "").ok()?;
                sub.next_timeout(Duration::from_millis(500)).ok()
            },
        );
    }
    let admin = hub.admin();
    assert_device_isolation(&admin, &a, &b);
    assert_device_isolation(&admin, &b, &a);
    // A leaf refuses another device's password as the hub does.
    let wrong = hub
        .client_options(nats::Options::with_user_pass(
            "dev-a",
            &inputs.password("dev-b"),
        ))
        .max_reconnects(1)
        .connect(leaves[0].url());
    assert!(wrong.is_err(), "a leaf accepted dev-b's password for dev-a");

    // Presence: the hub's CONNZ reaches the leaves over the bound system
    // account, and each answers with its own devices.
    let inbox = admin.new_inbox();
    let sub = admin.subscribe(&inbox).expect("subscribe");
    admin
        .publish_request("fleetpresence.CONNZ", &inbox, r#"{"auth":true}"#)
        .expect("request");
    let mut seen = std::collections::BTreeMap::new();
    while let Ok(m) = sub.next_timeout(Duration::from_secs(2)) {
        let v: serde_json::Value = serde_json::from_slice(&m.data).expect("json");
        let users: Vec<String> = v["data"]["connections"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["kind"] == "Client")
            .filter_map(|c| c["authorized_user"].as_str().map(str::to_owned))
            .collect();
        seen.insert(
            v["server"]["name"].as_str().unwrap_or_default().to_owned(),
            users,
        );
        if seen.len() == 3 {
            break;
        }
    }
    assert_eq!(
        seen.get("leaf-1"),
        Some(&vec!["dev-a".to_owned()]),
        "{seen:?}"
    );
    assert_eq!(
        seen.get("leaf-2"),
        Some(&vec!["dev-b".to_owned()]),
        "{seen:?}"
    );
    assert_eq!(seen.get("hub"), Some(&Vec::new()), "{seen:?}");
}

#[test]
fn leaf_configs_carry_isolated_devices_and_their_presence_2_9() {
    leaf_configs_carry_isolated_devices_and_their_presence(NatsVersion::V2_9);
}

#[test]
fn leaf_configs_carry_isolated_devices_and_their_presence_2_14() {
    leaf_configs_carry_isolated_devices_and_their_presence(NatsVersion::V2_14);
}

#[test]
fn callout_config_starts_on_2_14_and_is_refused_by_2_9() {
    let inputs = Inputs::new("");
    let server = NatsServer::start_with_config(NatsVersion::V2_14, |port, store| {
        inputs.callout_config(port, store)
    });
    // The admin and the callout user bypass the callout.
    let _admin = server.admin();
    let callout = server
        .client_options(nats::Options::with_user_pass("auth-callout", "callout-pw"))
        .max_reconnects(1)
        .connect(server.url())
        .expect("the callout user connects");
    callout.flush().expect("flush");

    // A leaf of the callout layout: valid for 2.14, no callout password
    // in it.
    let leaf_conf = inputs.path("callout-leaf.conf");
    let o = fleetctl(&[
        "nats-config",
        "--leaf-of",
        "127.0.0.1:7422",
        "--leaf-password-file",
        s(&inputs.path("leaf-pw")),
        "--server-name",
        "leaf-1",
        "--auth-callout",
        "--issuer",
        ISSUER,
        "--output",
        s(&leaf_conf),
    ]);
    assert!(o.status.success(), "fleetctl: {o:?}");
    let text = std::fs::read_to_string(&leaf_conf).expect("written");
    assert!(!text.contains("callout-pw"), "{text}");
    assert!(text.contains("account: AUTH }"), "{text}");
    let o = Command::new(NatsVersion::V2_14.binary())
        .args(["-c", s(&leaf_conf), "-t"])
        .output()
        .expect("run nats-server -t");
    assert!(o.status.success(), "2.14 refused the callout leaf: {o:?}");

    // 2.9.10 has no auth callout: its config test refuses the file.
    let conf = inputs.path("callout.conf");
    std::fs::write(&conf, inputs.callout_config(4222, &inputs.path("store"))).expect("write");
    let o = Command::new(NatsVersion::V2_9.binary())
        .args(["-c", s(&conf), "-t"])
        .output()
        .expect("run nats-server -t");
    assert!(!o.status.success(), "2.9 accepted an auth callout config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("auth_callout"), "{text}");
}

#[test]
fn bad_input_writes_nothing() {
    let inputs = Inputs::new("dev-a\ndev.b\n");
    let out = inputs.path("nats.conf");
    let o = fleetctl(&[
        "nats-config",
        "--devices",
        s(&inputs.path("devices")),
        "--passwords-dir",
        s(&inputs.path("passwords")),
        "--admin-password-file",
        s(&inputs.path("admin-pw")),
        "--output",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(":2: invalid device id \"dev.b\""), "{err}");
    assert!(!out.exists(), "a config was written");
    assert_eq!(
        std::fs::read_dir(inputs.path("passwords"))
            .expect("dir")
            .count(),
        0,
        "passwords were generated for a refused devices file"
    );

    let o = fleetctl(&["nats-config", "--auth-callout", "--issuer", "UABC"]);
    assert_eq!(o.status.code(), Some(2));
    let o = fleetctl(&["nats-config", "--help"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("--auth-callout"));
}
