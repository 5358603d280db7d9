//! nats-server 2.14 with the fleet's auth-callout layout
//! (`fleet_common::nats_config::callout_server_config`) and the real
//! `fleet-auth-callout` binary answering its authorization requests,
//! trusting an [`Idp`]. Devices connect with a bearer token as the NATS
//! token; `admin` and the callout's own user bypass the callout.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleet_common::nats_config::{callout_server_config, CalloutServerConfig, LeafnodeListener};
use fleet_common::nkey::{NkeyKind, PublicNkey};
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::bin_path;
use crate::idp::{Idp, IDP_AUDIENCE, IDP_ISSUER};
use crate::isolation::DeviceClient;
use crate::nats::{
    free_port, CalloutLayout, ClusterOptions, NatsCluster, NatsServer, NatsVersion, LEAF_PASSWORD,
    NATS_ADMIN_PASSWORD,
};
use crate::proc::ChildGuard;

/// The callout's password in account `AUTH`.
pub const CALLOUT_PASSWORD: &str = "callout-pw";
/// The callout answers (and logs) within this.
const CALLOUT_WAIT: Duration = Duration::from_secs(10);

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

fn spawn_callout(config: &Path) -> ChildGuard {
    let mut cmd = Command::new(bin_path("fleet-auth-callout"));
    cmd.arg("--config").arg(config).env("FLEET_LOG", "info");
    let callout = ChildGuard::spawn(cmd, "fleet-auth-callout");
    callout.wait_for_line("answering authorization requests", CALLOUT_WAIT);
    callout
}

/// The server and the callout process; dropping it stops both.
#[derive(Debug)]
pub struct CalloutNats {
    pub server: NatsServer,
    pub callout: ChildGuard,
    /// The callout's issuer: a callout-layout leaf's config names it.
    pub issuer: PublicNkey,
    /// The leafnode listener, with [`start_hub`](Self::start_hub).
    leafnode_port: Option<u16>,
    /// The callout's config, for [`start_callout`](Self::start_callout).
    config_path: PathBuf,
    _dir: TempDir,
}

impl CalloutNats {
    /// Everything up, the callout answering. `extra` is merged into the
    /// callout's config (`clock_skew_secs`, `jwks_min_refetch_secs`, ...).
    pub fn start(idp: &Idp, extra: Value) -> CalloutNats {
        Self::start_inner(idp, extra, false, &|text| text)
    }

    /// [`start`](Self::start) with the generated server config passed
    /// through `edit` first: a config as an older `fleetctl nats-config`
    /// wrote it.
    pub fn start_edited(idp: &Idp, extra: Value, edit: &dyn Fn(String) -> String) -> CalloutNats {
        Self::start_inner(idp, extra, false, edit)
    }

    /// [`start`](Self::start) with a leafnode listener on loopback
    /// ([`leafnode_hubs`](Self::leafnode_hubs)) for callout-layout
    /// [`NatsLeaf`](crate::NatsLeaf)s, the server named `hub`.
    pub fn start_hub(idp: &Idp, extra: Value) -> CalloutNats {
        Self::start_inner(idp, extra, true, &|text| text)
    }

    /// The leafnode listener of a [`start_hub`](Self::start_hub) server.
    pub fn leafnode_hubs(&self) -> Vec<String> {
        self.leafnode_port
            .map(|p| format!("127.0.0.1:{p}"))
            .into_iter()
            .collect()
    }

    fn start_inner(
        idp: &Idp,
        extra: Value,
        leaves: bool,
        edit: &dyn Fn(String) -> String,
    ) -> CalloutNats {
        let leafnode_port = leaves.then(free_port);
        let dir = tempfile::tempdir().expect("tempdir");
        let issuer = keygen(dir.path());
        let server = NatsServer::start_with_config(NatsVersion::V2_14, |port, store| {
            edit(callout_server_config(&CalloutServerConfig {
                listen: ([127, 0, 0, 1], port).into(),
                server_name: leaves.then(|| "hub".to_owned()),
                store_dir: store.to_path_buf(),
                admin_password: NATS_ADMIN_PASSWORD.to_owned(),
                callout_password: CALLOUT_PASSWORD.to_owned(),
                issuer: issuer.clone(),
                nonce_key: nonce_key(),
                cluster: None,
                leafnodes: leafnode_port.map(|p| LeafnodeListener {
                    listen: ([127, 0, 0, 1], p).into(),
                    password: LEAF_PASSWORD.to_owned(),
                }),
                protocols: fleet_common::subjects::DeviceProtocols::WithLegacy,
            }))
        });
        let config_path = write_config(dir.path(), idp, &server.url(), extra);
        let callout = spawn_callout(&config_path);
        CalloutNats {
            server,
            callout,
            issuer,
            leafnode_port,
            config_path,
            _dir: dir,
        }
    }

    /// Another instance of the callout with the same config, answering
    /// (the instances share the requests through a queue group); stopped
    /// when the guard drops.
    pub fn start_callout(&self) -> ChildGuard {
        spawn_callout(&self.config_path)
    }

    /// The server's client address.
    pub fn client_addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.server.port()).into()
    }

    /// Device `id` connecting with `token` as its NATS token (one
    /// reconnect attempt, so a refusal returns at once).
    pub fn connect_token(&self, id: &str, token: &str) -> io::Result<DeviceClient> {
        let options = self
            .server
            .client_options(nats::Options::with_token(token))
            .max_reconnects(1);
        DeviceClient::connect(options, &self.server.url(), id)
    }

    /// Device `id` connecting with its own user nkey `seed` (the signed
    /// nonce), `id` as the user and `token` (an enrollment token) beside
    /// them, as the agent's `enrollment` method does; one reconnect attempt.
    pub fn connect_nkey(
        &self,
        id: &str,
        seed: &fleet_common::nkey::NkeySeed,
        token: Option<&str>,
    ) -> io::Result<DeviceClient> {
        let public = seed.public_key().encode();
        let pair = nkeys::KeyPair::from_seed(&seed.encode()).map_err(io::Error::other)?;
        let options =
            nats::Options::with_nkey(&public, move |nonce| pair.sign(nonce).unwrap_or_default())
                .nkey_extras(Some(id), token);
        let options = self.server.client_options(options).max_reconnects(1);
        DeviceClient::connect(options, &self.server.url(), id)
    }

    /// Like [`connect_token`](Self::connect_token), panicking with both
    /// logs when the device is refused.
    pub fn device(&self, id: &str, token: &str) -> DeviceClient {
        self.connect_token(id, token)
            .unwrap_or_else(|e| panic!("{id} not authorized: {e}\n{}", self.logs()))
    }

    /// The callout's log line containing `needle` (waits for it).
    pub fn logged(&self, needle: &str) -> String {
        self.callout.wait_for_line(needle, CALLOUT_WAIT)
    }

    /// Both logs, for a failure message.
    pub fn logs(&self) -> String {
        format!(
            "--- callout log:\n{}\n--- server log:\n{}",
            self.callout.log(),
            self.server.log()
        )
    }
}

/// `fleet-auth-callout keygen` into `dir/issuer.nk`: the issuer's public key.
fn keygen(dir: &Path) -> PublicNkey {
    let out = Command::new(bin_path("fleet-auth-callout"))
        .arg("keygen")
        .arg(dir.join(ISSUER_SEED))
        .output()
        .expect("run keygen");
    assert!(out.status.success(), "keygen: {out:?}");
    let public = String::from_utf8(out.stdout).expect("utf8");
    PublicNkey::parse_kind(public.trim(), NkeyKind::Account).expect("account key")
}

/// A user nkey nothing holds the seed of (the layout's nonce user).
fn nonce_key() -> PublicNkey {
    fleet_common::nkey::NkeySeed::generate(NkeyKind::User)
        .expect("user key")
        .public_key()
}

/// The callout's config in `dir` (issuer seed from [`keygen`]), talking
/// to `nats_url` (comma-separated for a cluster), `extra` merged in (a
/// `null` removes the key: `{"issuer": null, ...}` for a callout without
/// the identity provider).
fn write_config(dir: &Path, idp: &Idp, nats_url: &str, extra: Value) -> PathBuf {
    let password = dir.join("nats-password");
    write_private(&password, &format!("{CALLOUT_PASSWORD}\n"));
    let mut config = json!({
        "issuer": IDP_ISSUER,
        "audience": IDP_AUDIENCE,
        "jwks_url": idp.jwks_url(),
        "https_ca_file": idp.ca.ca_path(),
        "nats_url": nats_url,
        "nats_password_file": password,
        "issuer_seed_file": dir.join(ISSUER_SEED),
    });
    let o = config.as_object_mut().expect("object");
    for (k, v) in extra.as_object().expect("object") {
        if v.is_null() {
            o.remove(k);
        } else {
            o.insert(k.clone(), v.clone());
        }
    }
    let config_path = dir.join("auth-callout.json");
    std::fs::write(&config_path, config.to_string()).expect("write config");
    config_path
}

/// The issuer's seed in a callout's dir.
const ISSUER_SEED: &str = "issuer.nk";

/// A 3-node JetStream cluster (2.14) with the auth-callout layout and the
/// buckets at R3, and `instances` callouts in one queue group, each given
/// every node's URL; dropping it stops them all. A node loss moves that
/// node's devices to the others, where the surviving callouts admit them.
#[derive(Debug)]
pub struct CalloutCluster {
    pub cluster: NatsCluster,
    /// The running callout instances.
    pub callouts: Vec<ChildGuard>,
    /// The callouts' issuer: a callout-layout leaf's config names it.
    pub issuer: PublicNkey,
    config_path: PathBuf,
    _dir: TempDir,
}

impl CalloutCluster {
    /// `options.callout` is filled in here; `extra` is merged into the
    /// callouts' config as in [`CalloutNats::start`].
    pub fn start(idp: &Idp, extra: Value, instances: usize, options: ClusterOptions) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let issuer = keygen(dir.path());
        let options = ClusterOptions {
            callout: Some(CalloutLayout {
                issuer: issuer.clone(),
                nonce_key: nonce_key(),
                callout_password: CALLOUT_PASSWORD.to_owned(),
            }),
            ..options
        };
        let cluster = NatsCluster::start_fleet_with(NatsVersion::V2_14, &[], &options);
        let config_path = write_config(dir.path(), idp, &cluster.urls().join(","), extra);
        let callouts = (0..instances)
            .map(|_| spawn_callout(&config_path))
            .collect();
        CalloutCluster {
            cluster,
            callouts,
            issuer,
            config_path,
            _dir: dir,
        }
    }

    /// Another instance with the same config.
    pub fn start_callout(&self) -> ChildGuard {
        spawn_callout(&self.config_path)
    }

    /// Another instance connected to `nats_url` only (one node), its config
    /// otherwise the same.
    pub fn start_callout_to(&self, nats_url: &str) -> ChildGuard {
        let text = std::fs::read_to_string(&self.config_path).expect("read callout config");
        let mut config: Value = serde_json::from_str(&text).expect("callout config");
        config["nats_url"] = json!(nats_url);
        let path = self.config_path.with_file_name(format!(
            "auth-callout-{}.json",
            nats_url.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        ));
        std::fs::write(&path, config.to_string()).expect("write callout config");
        spawn_callout(&path)
    }

    /// Every running callout's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.callouts.iter().enumerate() {
            out.push_str(&format!("--- callout {i} log:\n{}\n", c.log()));
        }
        out
    }
}
