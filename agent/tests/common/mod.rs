//! Shared pieces of the agent's integration tests: a device root with its
//! config, the real `fleet-agent` binary under a [`ChildGuard`], a
//! `NOTIFY_SOCKET` that records what the agent tells systemd, and admin
//! helpers to write desired state and read status back from NATS.

#![allow(dead_code)]

use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_harness::{device_password, poll_until, ChildGuard, Podman};
use serde::de::DeserializeOwned;
use tempfile::TempDir;

/// Generous bound for anything the agent does at once (start, converge).
pub const CONVERGE: Duration = Duration::from_secs(60);

/// Tests run with short intervals so they poll seconds, not minutes.
pub const HEARTBEAT_SECS: u64 = 1;
pub const RESYNC_SECS: u64 = 2;
/// The periodic backstop read, long by default so that a test of the
/// republished path cannot pass through it.
pub const CHECK_SECS: u64 = 3600;

/// A device's temp root: config, password file, run and state dirs.
#[derive(Debug)]
pub struct Device {
    pub id: String,
    pub root: TempDir,
    pub config: PathBuf,
    pub notify: Notify,
    /// READY=1 datagrams a [`Device::wait_ready`] already took (one per
    /// agent run: a later run's wait needs a READY=1 of its own).
    readies_taken: std::sync::atomic::AtomicUsize,
}

/// What the agent config says beyond the defaults.
#[derive(Debug, Clone)]
pub struct Settings {
    pub servers: Vec<String>,
    pub podman: bool,
    pub pull_timeout_secs: u64,
    pub password: Option<String>,
    /// `nats.auth` instead of the device's user and password.
    pub auth: Option<serde_json::Value>,
    /// `intervals.check-secs`.
    pub check_secs: u64,
    /// `intervals.heartbeat-secs`.
    pub heartbeat_secs: u64,
    /// `intervals.keepalive-secs`: the heartbeat as often as agents before
    /// 0.3.0 wrote it, unless a test asks otherwise.
    pub keepalive_secs: u64,
    /// `intervals.traffic-secs`.
    pub traffic_secs: u64,
    /// `intervals.ping-secs`.
    pub ping_secs: u64,
}

impl Settings {
    pub fn new(servers: Vec<String>) -> Self {
        Self {
            servers,
            podman: true,
            pull_timeout_secs: 60,
            password: None,
            auth: None,
            check_secs: CHECK_SECS,
            heartbeat_secs: HEARTBEAT_SECS,
            keepalive_secs: HEARTBEAT_SECS,
            traffic_secs: 3600,
            ping_secs: 200,
        }
    }
}

impl Device {
    /// Writes the config of device `id` in a fresh root.
    pub fn new(id: &str, settings: &Settings, podman: Option<&Podman>) -> Device {
        let root = tempfile::Builder::new()
            .prefix("fleet-agent-test-")
            .tempdir()
            .expect("tempdir");
        let pw = root.path().join("nats-password");
        let password = settings
            .password
            .clone()
            .unwrap_or_else(|| device_password(id));
        std::fs::write(&pw, format!("{password}\n")).expect("write password");
        let podman_json = match (settings.podman, podman) {
            (true, Some(p)) => serde_json::json!({
                "enabled": true,
                "binary": p.binary(),
                "global-args": p.global_args(),
                "containers-conf": p.env().iter().find(|(k, _)| k == "CONTAINERS_CONF").map(|(_, v)| v.clone()),
                "pull-timeout-secs": settings.pull_timeout_secs,
                "command-timeout-secs": 60,
            }),
            (true, None) => panic!("a Podman-enabled device needs a Podman"),
            (false, _) => serde_json::json!({"enabled": false}),
        };
        let config = serde_json::json!({
            "device-id": id,
            "nats": {
                "servers": settings.servers,
                "auth": settings.auth.clone().unwrap_or_else(|| {
                    serde_json::json!({"method": "user-password", "user": id, "password-file": pw})
                }),
            },
            "podman": podman_json,
            "intervals": {
                "heartbeat-secs": settings.heartbeat_secs,
                "keepalive-secs": settings.keepalive_secs,
                "resync-secs": RESYNC_SECS,
                "check-secs": settings.check_secs,
                "traffic-secs": settings.traffic_secs,
                "ping-secs": settings.ping_secs,
            },
            "root": root.path(),
        });
        let path = root.path().join("agent.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("json"))
            .expect("write config");
        let notify = Notify::bind(&root.path().join("notify.sock"));
        Device {
            id: id.to_owned(),
            root,
            config: path,
            notify,
            readies_taken: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// Rewrites the config with only the intervals an agent 0.2 knows
    /// (it refuses a config naming a key it does not know; an agent 0.3
    /// takes the others' defaults).
    pub fn keep_only_0_2_intervals(&self) {
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&self.config).expect("read config"))
                .expect("config json");
        let intervals = cfg["intervals"].take();
        cfg["intervals"] = serde_json::json!({
            "heartbeat-secs": intervals["heartbeat-secs"],
            "resync-secs": intervals["resync-secs"],
            "check-secs": intervals["check-secs"],
        });
        std::fs::write(&self.config, cfg.to_string()).expect("write config");
    }

    /// `fleet-agent <args> --config <config>`, with Podman's environment
    /// and the notify socket.
    pub fn command(&self, args: &[&str], podman: Option<&Podman>) -> Command {
        self.command_of(Path::new(env!("CARGO_BIN_EXE_fleet-agent")), args, podman)
    }

    /// [`Self::command`] for another agent binary (a released one).
    pub fn command_of(&self, binary: &Path, args: &[&str], podman: Option<&Podman>) -> Command {
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .arg("--config")
            .arg(&self.config)
            .env("NOTIFY_SOCKET", self.notify.path())
            .env("FLEET_LOG", "debug")
            .env_remove("INVOCATION_ID")
            .env_remove("JOURNAL_STREAM");
        if let Some(p) = podman {
            cmd.envs(p.env());
        }
        cmd
    }

    /// Starts `fleet-agent run` and waits for READY=1.
    pub fn start(&self, podman: Option<&Podman>) -> ChildGuard {
        let mut agent = self.spawn(podman);
        self.wait_ready(&mut agent);
        agent
    }

    /// Starts `fleet-agent run` without waiting.
    pub fn spawn(&self, podman: Option<&Podman>) -> ChildGuard {
        ChildGuard::spawn(
            self.command(&["run"], podman),
            &format!("agent-{}", self.id),
        )
    }

    /// Waits for READY=1; fails at once with the log if the agent exits.
    pub fn wait_ready(&self, agent: &mut ChildGuard) {
        poll_until("READY=1", CONVERGE, || {
            if let Some(status) = agent.try_wait() {
                panic!(
                    "the agent exited ({status}) before readiness:\n{}",
                    agent.log()
                );
            }
            let readies = self
                .notify
                .all()
                .iter()
                .filter(|m| m.contains("READY=1"))
                .count();
            (readies > self.readies_taken.load(std::sync::atomic::Ordering::SeqCst))
                .then_some(readies)
        });
        self.readies_taken
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A listening socket where the updater's would be (probe mode checks
    /// it accepts connections).
    pub fn fake_updater_socket(&self) -> UnixListener {
        let dir = self.path("run/harmony-fleet");
        std::fs::create_dir_all(&dir).expect("run dir");
        UnixListener::bind(dir.join("updater.sock")).expect("bind updater socket")
    }
}

/// A `NOTIFY_SOCKET` recording every datagram the agent sends.
#[derive(Debug)]
pub struct Notify {
    path: PathBuf,
    messages: Arc<Mutex<Vec<String>>>,
}

impl Notify {
    fn bind(path: &Path) -> Notify {
        let sock = UnixDatagram::bind(path).expect("bind notify socket");
        let messages: Arc<Mutex<Vec<String>>> = Arc::default();
        let m = Arc::clone(&messages);
        std::thread::Builder::new()
            .name("test-notify".into())
            .spawn(move || {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = sock.recv(&mut buf) {
                    m.lock()
                        .expect("lock")
                        .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
            })
            .expect("spawn notify reader");
        Notify {
            path: path.to_owned(),
            messages,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every datagram so far, in order.
    pub fn all(&self) -> Vec<String> {
        self.messages.lock().expect("lock").clone()
    }

    /// The first datagram containing `needle`.
    pub fn find(&self, needle: &str) -> Option<String> {
        self.all().into_iter().find(|m| m.contains(needle))
    }

    /// The index of the first datagram containing `needle`.
    pub fn position(&self, needle: &str) -> Option<usize> {
        self.all().iter().position(|m| m.contains(needle))
    }
}

/// A KV bucket as the admin sees it.
pub fn bucket(admin: &nats::Connection, name: &str) -> nats::kv::Store {
    nats::jetstream::new(admin.clone())
        .key_value(name)
        .unwrap_or_else(|e| panic!("bucket {name}: {e}"))
}

/// The spec hash the agent labels a workload's container with.
pub fn hash_of(spec: &str) -> String {
    fleet_common::contracts::WorkloadSpec::from_json(spec.as_bytes())
        .expect("valid spec")
        .spec_hash()
        .as_str()
        .to_owned()
}

/// Puts a workload spec (JSON text) for `device`.
pub fn put_workload(admin: &nats::Connection, device: &str, workload: &str, spec: &str) -> u64 {
    fleet_harness::desired::put_workload(admin, device, workload, spec)
}

/// Deletes a workload of `device`.
pub fn delete_workload(admin: &nats::Connection, device: &str, workload: &str) {
    fleet_harness::desired::delete_workload(admin, device, workload)
}

/// A status value of `device`, parsed; `None` when absent.
pub fn status<T: DeserializeOwned>(admin: &nats::Connection, device: &str, key: &str) -> Option<T> {
    let raw = bucket(admin, "fleet-status")
        .get(&format!("{device}.{key}"))
        .unwrap_or_else(|e| panic!("get {device}.{key}: {e}"))?;
    Some(serde_json::from_slice(&raw).unwrap_or_else(|e| {
        panic!(
            "{device}.{key} is not valid: {e}: {}",
            String::from_utf8_lossy(&raw)
        )
    }))
}

/// A busybox workload that sleeps (PID 1 ignores SIGTERM, so removing it
/// takes podman's 10 s stop timeout).
pub fn sleeper(podman: &Podman, tag: &str) -> String {
    format!(
        r#"{{"image":"{}","command":["sleep","100000"],"env":{{"TAG":"{tag}"}}}}"#,
        podman.busybox_image()
    )
}

/// A busybox workload that stops on SIGTERM at once (a shell trap), so
/// replacing it is quick.
pub fn quick_sleeper(podman: &Podman, tag: &str) -> String {
    format!(
        r#"{{"image":"{}","command":["sh","-c","trap 'exit 0' TERM; while true; do sleep 1; done"],"env":{{"TAG":"{tag}"}}}}"#,
        podman.busybox_image()
    )
}

/// One container as `podman ps -a` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub id: String,
    pub name: String,
    pub state: String,
    pub started_at: i64,
    pub spec_hash: Option<String>,
}

/// Every container of `podman`, by name.
pub fn containers(podman: &Podman) -> Vec<Seen> {
    let mut v: Vec<Seen> = podman
        .ps_all()
        .into_iter()
        .map(|c| Seen {
            id: c["Id"].as_str().unwrap_or_default().to_owned(),
            name: c["Names"][0].as_str().unwrap_or_default().to_owned(),
            state: c["State"].as_str().unwrap_or_default().to_owned(),
            started_at: c["StartedAt"].as_i64().unwrap_or_default(),
            spec_hash: c["Labels"]["io.harmony.fleet.spec-hash"]
                .as_str()
                .map(str::to_owned),
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// The container named `name`, if any.
pub fn container(podman: &Podman, name: &str) -> Option<Seen> {
    containers(podman).into_iter().find(|c| c.name == name)
}

/// Waits until `name` runs and `pred` holds for it.
pub fn wait_running(podman: &Podman, name: &str, what: &str, pred: impl Fn(&Seen) -> bool) -> Seen {
    poll_until(what, CONVERGE, || {
        container(podman, name).filter(|c| c.state == "running" && pred(c))
    })
}

/// Waits until no container is named `name`.
pub fn wait_gone(podman: &Podman, name: &str) {
    poll_until(&format!("{name} removed"), CONVERGE, || {
        container(podman, name).is_none().then_some(())
    })
}

/// GET of a nats-server monitoring endpoint (HTTP/1.0), its body as JSON.
pub fn monitor_json(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(5);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).expect("monitor connect");
    s.set_read_timeout(Some(timeout)).expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("monitor request");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("monitor answer");
    let at = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP body");
    serde_json::from_slice(&buf[at + 4..]).expect("monitor JSON")
}

/// The local TCP ports of `pid`'s established connections to `remote_port`
/// (from procfs).
pub fn tcp_local_ports(pid: u32, remote_port: u16) -> Vec<u16> {
    let inodes = socket_inodes(pid);
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let port_of = |col: &str| {
        col.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            (cols.len() > 9
                && cols[3] == "01"
                && inodes.iter().any(|i| i == cols[9])
                && port_of(cols[2]) == Some(remote_port))
            .then(|| port_of(cols[1]))
            .flatten()
        })
        .collect()
}

fn socket_inodes(pid: u32) -> Vec<String> {
    let mut inodes = Vec::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy().into_owned();
                if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.push(inode.to_owned());
                }
            }
        }
    }
    inodes
}

/// The remote TCP ports of `pid`'s established connections (from procfs).
pub fn tcp_peers(pid: u32) -> Vec<u16> {
    let inodes = socket_inodes(pid);
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let mut ports = Vec::new();
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // sl local remote st ... inode(9)
        if cols.len() > 9 && cols[3] == "01" && inodes.iter().any(|i| i == cols[9]) {
            if let Some(port) = cols[2]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    ports
}
