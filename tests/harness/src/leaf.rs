//! Leaf nodes of the fleet layout (docs/design/leafnodes.md): a real
//! nats-server without JetStream whose `DEVICES` and system accounts are
//! bound to a hub's ([`NatsServer::start_fleet_hub`], or a
//! [`NatsCluster`](crate::NatsCluster) with
//! [`ClusterOptions::leafnodes`](crate::ClusterOptions::leafnodes)), with
//! the same device users (`<id>` / `<id>-pw`).
//!
//! Steps of a start: pick a free loopback port, write the config from
//! `fleet_common::nats_config::leaf_server_config`, start the server, wait
//! for both leafnode connections to the hub, then until a device's Direct
//! Get through the leaf is answered (interest crosses the link a moment
//! after it is up). `restart` and `restart_lame_duck` come back on the
//! same port.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fleet_common::nats_config::{leaf_server_config, LeafCallout, LeafServerConfig};
use fleet_common::subjects::{
    desired_doc_key, device_direct_get_subject, DeviceProtocols, ACCOUNT_AUTH, ACCOUNT_DEVICES,
    ACCOUNT_ENROLL, ACCOUNT_SYSTEM, BUCKET_WORKLOADS,
};
use fleet_common::validate::DeviceId;
use rustix::process::Signal;
use tempfile::TempDir;

use crate::nats::{
    device_password, fleet_devices, free_port, lame_duck_exit, lame_duck_lines, quick,
    server_command, server_dir, spawn_server, write_file, NatsVersion, StartError, LEAF_PASSWORD,
    PORT_ATTEMPTS,
};
use crate::proc::ChildGuard;

/// Both leafnode connections are up within this after "Server is ready".
const LINK_TIMEOUT: Duration = Duration::from_secs(20);
/// A device's request crosses the leaf within this after the links are up.
const PATH_TIMEOUT: Duration = Duration::from_secs(20);
/// One probe request through the leaf.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// SIGTERM to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A leaf node, killed on drop.
#[derive(Debug)]
pub struct NatsLeaf {
    version: NatsVersion,
    name: String,
    port: u16,
    config: PathBuf,
    /// A device whose Direct Get probes the path to the hub after a start.
    probe: Option<String>,
    /// The accounts bound to the hub: a start waits for each link.
    links: Vec<&'static str>,
    child: Option<ChildGuard>,
    dir: TempDir,
}

impl NatsLeaf {
    /// Starts leaf `name` (its `server_name`: unique among the hub's nodes
    /// and leaves) bound to `hubs` (the hub's
    /// [`leafnode_hubs`](crate::NatsServer::leafnode_hubs)), with a user
    /// per device. Returns once a device's request is answered through it.
    pub fn start(v: NatsVersion, name: &str, hubs: &[String], devices: &[&str]) -> NatsLeaf {
        Self::start_devices(v, name, hubs, devices, None)
    }

    /// [`start`](Self::start) with `lame_duck_duration` and
    /// `lame_duck_grace_period` (`lame_duck`), for
    /// [`restart_lame_duck`](Self::restart_lame_duck).
    pub fn start_with_lame_duck(
        v: NatsVersion,
        name: &str,
        hubs: &[String],
        devices: &[&str],
        lame_duck: (Duration, Duration),
    ) -> NatsLeaf {
        Self::start_devices(v, name, hubs, devices, Some(lame_duck))
    }

    fn start_devices(
        v: NatsVersion,
        name: &str,
        hubs: &[String],
        devices: &[&str],
        lame_duck: Option<(Duration, Duration)>,
    ) -> NatsLeaf {
        let users = fleet_devices(devices);
        let probe = devices.first().map(|d| (*d).to_owned());
        Self::start_inner(v, name, probe, |port| {
            let mut config = leaf_server_config(&LeafServerConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], port)),
                server_name: name.to_owned(),
                hubs: hubs.to_vec(),
                leaf_password: LEAF_PASSWORD.to_owned(),
                devices: users.clone(),
                callout: None,
                protocols: DeviceProtocols::WithLegacy,
            });
            if let Some(lame_duck) = lame_duck {
                if !config.ends_with('\n') {
                    config.push('\n');
                }
                config.push_str(&lame_duck_lines(lame_duck));
            }
            config
        })
    }

    /// A leaf of the callout layout (nats-server 2.14): no device users;
    /// its clients are handed to the `fleet-auth-callout` of `hub`
    /// (a [`CalloutNats::start_hub`](crate::CalloutNats::start_hub)) through
    /// the bound `AUTH` account.
    pub fn start_callout(name: &str, hub: &crate::CalloutNats) -> NatsLeaf {
        Self::start_callout_on(name, &hub.leafnode_hubs(), &hub.issuer, None)
    }

    /// A leaf of the callout layout bound to `hubs` (a
    /// [`CalloutCluster`](crate::CalloutCluster)'s
    /// [`leafnode_hubs`](crate::NatsCluster::leafnode_hubs)), its clients
    /// handed to the callout signing as `issuer`; with `lame_duck`, for
    /// [`restart_lame_duck`](Self::restart_lame_duck).
    pub fn start_callout_on(
        name: &str,
        hubs: &[String],
        issuer: &fleet_common::nkey::PublicNkey,
        lame_duck: Option<(Duration, Duration)>,
    ) -> NatsLeaf {
        Self::start_inner_with(NatsVersion::V2_14, name, None, true, |port| {
            let mut config = leaf_server_config(&LeafServerConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], port)),
                server_name: name.to_owned(),
                hubs: hubs.to_vec(),
                leaf_password: LEAF_PASSWORD.to_owned(),
                devices: Vec::new(),
                callout: Some(LeafCallout {
                    issuer: issuer.clone(),
                    local_password: format!("{name}-unused-local-callout-pw"),
                    nonce_key: fleet_common::nkey::NkeySeed::generate(
                        fleet_common::nkey::NkeyKind::User,
                    )
                    .expect("a user nkey")
                    .public_key(),
                }),
                protocols: DeviceProtocols::WithLegacy,
            });
            if let Some(lame_duck) = lame_duck {
                if !config.ends_with('\n') {
                    config.push('\n');
                }
                config.push_str(&lame_duck_lines(lame_duck));
            }
            config
        })
    }

    /// A leaf from a config the test writes: `config(port)` is the text
    /// for 127.0.0.1:`port` (for example `fleetctl nats-config --leaf-of`'s
    /// output), whose `server_name` is `name`. Returns once both links to
    /// the hub are up (the path through them is the test's to poll).
    pub fn start_with_config(
        v: NatsVersion,
        name: &str,
        config: impl Fn(u16) -> String,
    ) -> NatsLeaf {
        Self::start_inner(v, name, None, config)
    }

    fn start_inner(
        v: NatsVersion,
        name: &str,
        probe: Option<String>,
        config: impl Fn(u16) -> String,
    ) -> NatsLeaf {
        Self::start_inner_with(v, name, probe, false, config)
    }

    fn start_inner_with(
        v: NatsVersion,
        name: &str,
        probe: Option<String>,
        auth_link: bool,
        config: impl Fn(u16) -> String,
    ) -> NatsLeaf {
        let dir = server_dir("fleet-nats-leaf-");
        let mut leaf = NatsLeaf {
            version: v,
            name: name.to_owned(),
            port: 0,
            config: dir.path().join("leaf.conf"),
            probe,
            links: if auth_link {
                vec![
                    ACCOUNT_DEVICES,
                    ACCOUNT_SYSTEM,
                    ACCOUNT_AUTH,
                    ACCOUNT_ENROLL,
                ]
            } else {
                vec![ACCOUNT_DEVICES, ACCOUNT_SYSTEM]
            },
            child: None,
            dir,
        };
        for _ in 0..PORT_ATTEMPTS {
            leaf.port = free_port();
            write_file(&leaf.config, &config(leaf.port));
            match leaf.spawn() {
                Ok(()) => return leaf,
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(log)) => panic!("leaf {name} ({v:?}) failed:\n{log}"),
            }
        }
        panic!("leaf {name} ({v:?}): every picked port was taken ({PORT_ATTEMPTS} attempts)");
    }

    fn spawn(&mut self) -> Result<(), StartError> {
        let cmd = server_command(self.version, &["-c", &self.config.to_string_lossy()]);
        let (child, got) = spawn_server(cmd, &format!("leaf-{}", self.name), false)?;
        assert_eq!(got, self.port, "the leaf listens where its config says");
        for account in self.links.clone() {
            let line = format!("Leafnode connection created for account: {account}");
            if child.try_wait_for_line(0, &line, LINK_TIMEOUT).is_none() {
                return Err(StartError::Failed(format!(
                    "no {line:?} within {LINK_TIMEOUT:?}:\n{}",
                    child.log()
                )));
            }
        }
        self.child = Some(child);
        self.wait_for_path();
        Ok(())
    }

    /// Polls a Direct Get of the probe device's desired state through the
    /// leaf until the hub's answer (the document or "no message") comes.
    fn wait_for_path(&self) {
        let Some(id) = &self.probe else { return };
        let conn = self
            .device_options(id)
            .connect(self.url().as_str())
            .unwrap_or_else(|e| panic!("leaf {}: device {id} cannot connect: {e}", self.name));
        let device = DeviceId::parse(id).unwrap_or_else(|e| panic!("{e}"));
        let subject = device_direct_get_subject(BUCKET_WORKLOADS, &desired_doc_key(&device));
        // The device may listen on its own inbox only.
        let inbox = format!("_INBOX.{id}.leaf-probe");
        let sub = conn
            .subscribe(&inbox)
            .unwrap_or_else(|e| panic!("leaf {}: {id} cannot subscribe: {e}", self.name));
        let deadline = Instant::now() + PATH_TIMEOUT;
        while Instant::now() < deadline {
            if conn.publish_request(&subject, &inbox, "").is_ok()
                && sub.next_timeout(PROBE_TIMEOUT).is_ok()
            {
                return;
            }
        }
        panic!(
            "leaf {}: no answer to {subject} through it within {PATH_TIMEOUT:?}; log:\n{}",
            self.name,
            self.child.as_ref().map(ChildGuard::log).unwrap_or_default()
        );
    }

    /// Its `server_name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Options of device `id` (`<id>` / `<id>-pw`), to add callbacks.
    pub fn device_options(&self, id: &str) -> nats::Options {
        quick(
            nats::Options::with_user_pass(id, &device_password(id)).with_name(id),
            self.dir.path(),
        )
    }

    /// Device `id`, connected to this leaf.
    pub fn device(&self, id: &str) -> nats::Connection {
        self.device_options(id)
            .connect(self.url().as_str())
            .unwrap_or_else(|e| panic!("device {id} cannot connect to leaf {}: {e}", self.name))
    }

    /// Its process id while it runs (for its memory and CPU).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildGuard::pid)
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.child.as_ref().map(ChildGuard::log).unwrap_or_default()
    }

    /// SIGKILL: its devices lose their connection at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Graceful stop (SIGTERM).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.signal(Signal::TERM);
            child.wait_exit(STOP_TIMEOUT);
        }
    }

    /// A restart in lame-duck mode: no new clients, its clients closed over
    /// its `lame_duck_duration` (2 min unless started
    /// [`with_lame_duck`](Self::start_with_lame_duck)), its exit within
    /// `timeout`; then started again on the same port, its links up.
    pub fn restart_lame_duck(&mut self, timeout: Duration) -> Result<(), String> {
        if let Some(child) = self.child.take() {
            lame_duck_exit(child, timeout).map_err(|e| format!("leaf {} {e}", self.name))?;
        }
        self.spawn().map_err(|e| match e {
            StartError::PortTaken => format!(
                "leaf {}: port {} was taken while it restarted",
                self.name, self.port
            ),
            StartError::Failed(log) => format!("leaf {} failed to restart:\n{log}", self.name),
        })
    }

    /// Starts it again on the same port (after [`kill`](Self::kill) or
    /// [`stop`](Self::stop)), its links to the hub up.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn() {
            match e {
                StartError::PortTaken => {
                    panic!(
                        "leaf {}: port {} was taken while it was down",
                        self.name, self.port
                    )
                }
                StartError::Failed(log) => panic!("leaf {} failed to restart:\n{log}", self.name),
            }
        }
    }
}
