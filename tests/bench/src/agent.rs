//! The agent on one device: a release `fleet-agent` (the shipped static
//! musl build, then the glibc build, each on its own nats-server and
//! Podman) against a fleet-layout nats-server and an isolated Podman, with
//! production intervals (heartbeat 30 s, resync 30 s).
//!
//! Figures: resident memory idle with 0 and with 20 running workloads
//! (baseline: an idle coreutils `sleep`, the floor of any dynamically linked
//! process); idle CPU over a window, its own and its podman calls'
//! (baseline: the mean `conmon`, which Podman keeps beside every container,
//! over the same window); desired-state put → container running (baseline:
//! a raw `podman run -d` of the same container with the same global
//! arguments), interleaved runs.
//!
//! "Running" is the container's main process existing with its command
//! line (each run sleeps a unique number of seconds, found in /proc): the
//! exact instant runc starts it, seen within ~2 ms, and the same probe for
//! both paths.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_harness::{device_password, poll_until, ChildGuard, NatsServer, Podman};
use tempfile::TempDir;

use crate::bins::Build;
use crate::notify::Notify;
use crate::procfs::{self, CpuTime};
use crate::report::{mib, Row, Verdict};

/// The device every single-device figure uses.
pub const DEVICE: &str = "bench-dev";
/// Workloads of the "20 workloads" figures.
pub const WORKLOADS: usize = 20;
/// Starting, converging on 20 workloads, one container run.
const CONVERGE: Duration = Duration::from_secs(180);
/// Settling after a change before memory is read (the reconciler's
/// re-read and the status write are done within a second).
const SETTLE: Duration = Duration::from_secs(5);
/// How often /proc is scanned for a container's process.
const PROC_POLL: Duration = Duration::from_millis(2);

/// A device root with the agent's config.
#[derive(Debug)]
pub struct AgentDevice {
    pub id: String,
    pub root: TempDir,
    pub config: PathBuf,
}

impl AgentDevice {
    /// Writes the config of device `id`: `podman` is `None` for a device
    /// without containers (`podman.enabled: false`).
    pub fn new(id: &str, nats_url: &str, podman: Option<&Podman>) -> AgentDevice {
        let root = tempfile::Builder::new()
            .prefix("fleet-bench-agent-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let pw = root.path().join("nats-password");
        write(&pw, &format!("{}\n", device_password(id)));
        let podman_json = match podman {
            Some(p) => serde_json::json!({
                "enabled": true,
                "binary": p.binary(),
                "global-args": p.global_args(),
                "containers-conf": p.env().iter().find(|(k, _)| k == "CONTAINERS_CONF").map(|(_, v)| v.clone()),
            }),
            None => serde_json::json!({"enabled": false}),
        };
        let config = serde_json::json!({
            "device-id": id,
            "nats": {
                "servers": [nats_url],
                "auth": {"method": "user-password", "user": id, "password-file": pw},
            },
            "podman": podman_json,
            "root": root.path(),
        });
        let path = root.path().join("agent.json");
        write(&path, &config.to_string());
        AgentDevice {
            id: id.to_owned(),
            root,
            config: path,
        }
    }

    /// `fleet-agent run --config <config>` of `build` with `NOTIFY_SOCKET`.
    pub fn command(&self, build: Build, notify: &Notify, podman: Option<&Podman>) -> Command {
        self.command_of(&build.bin("fleet-agent"), notify, podman)
    }

    /// [`command`](Self::command) of the agent binary `binary`.
    pub fn command_of(
        &self,
        binary: &std::path::Path,
        notify: &Notify,
        podman: Option<&Podman>,
    ) -> Command {
        let mut cmd = Command::new(binary);
        cmd.arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("NOTIFY_SOCKET", notify.path())
            .env_remove("FLEET_LOG")
            .env_remove("INVOCATION_ID")
            .env_remove("JOURNAL_STREAM");
        if let Some(p) = podman {
            cmd.envs(p.env());
        }
        cmd
    }
}

fn write(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// The running single-device agent and what it needs.
#[derive(Debug)]
pub struct AgentBench<'a> {
    nats: &'a NatsServer,
    podman: &'a Podman,
    image: String,
    build: Build,
    device: AgentDevice,
    _notify: Notify,
    agent: ChildGuard,
    admin: nats::Connection,
}

impl<'a> AgentBench<'a> {
    /// Starts the agent of `build` and waits for `READY=1`.
    pub fn start(nats: &'a NatsServer, podman: &'a Podman, build: Build) -> AgentBench<'a> {
        let image = podman.busybox_image();
        let device = AgentDevice::new(DEVICE, &nats.url(), Some(podman));
        let notify = Notify::bind(&device.root.path().join("notify.sock"));
        let agent = ChildGuard::spawn(device.command(build, &notify, Some(podman)), "fleet-agent");
        if !notify.wait_ready(1, CONVERGE) {
            panic!(
                "fleet-agent not ready within {CONVERGE:?}; log:\n{}",
                agent.log()
            );
        }
        let admin = nats.admin();
        AgentBench {
            nats,
            podman,
            image,
            build,
            device,
            _notify: notify,
            agent,
            admin,
        }
    }

    pub fn pid(&self) -> u32 {
        self.agent.pid()
    }

    fn put(&self, workload: &str, command: &[&str]) {
        // The device's document, by compare-and-set, as fleetctl writes it.
        let spec = serde_json::json!({"image": self.image, "command": command});
        fleet_harness::desired::edit_document(&self.admin, &self.device.id, |w| {
            w.insert(workload.to_owned(), spec.clone());
        });
    }

    /// Workloads the device reports running.
    fn running_reported(&self, status: &nats::kv::Store) -> usize {
        status
            .get(&format!("{}.workloads", self.device.id))
            .ok()
            .flatten()
            .and_then(|raw| {
                serde_json::from_slice::<fleet_common::contracts::WorkloadsReport>(&raw).ok()
            })
            .map_or(0, |r| r.ready().0)
    }

    /// Puts [`WORKLOADS`] sleeping busybox workloads and waits until the
    /// device reports every one running.
    pub fn converge_on_workloads(&self) -> Duration {
        let status = nats::jetstream::new(self.nats.admin())
            .key_value("fleet-status")
            .unwrap_or_else(|e| panic!("bucket fleet-status: {e}"));
        let started = Instant::now();
        for i in 0..WORKLOADS {
            self.put(&format!("w{i:02}"), &["sleep", "3000000"]);
        }
        poll_until(
            &format!("{WORKLOADS} workloads reported running"),
            CONVERGE,
            || (self.running_reported(&status) >= WORKLOADS).then_some(()),
        );
        started.elapsed()
    }

    /// Memory rows: idle with no workload (call first), then with 20.
    pub fn rss_rows(&self) -> Vec<Row> {
        std::thread::sleep(SETTLE);
        let idle0 = procfs::rss(self.pid());
        let floor = sleep_rss();
        let took = self.converge_on_workloads();
        std::thread::sleep(SETTLE);
        let idle20 = procfs::rss(self.pid());
        let (anon, file) = procfs::rss_parts(self.pid());
        let running = self.podman.ps_all().len();
        let ratio = |v: u64| format!("{:.1}×", v as f64 / floor as f64);
        let b = self.build;
        vec![
            b.row(
                Row::new("agent RSS, idle, 0 workloads")
                    .ours(mib(idle0))
                    .baseline(format!("{} (idle `sleep`)", mib(floor)))
                    .ratio(ratio(idle0))
                    .target("— (20 workloads: ≤ 3.5 MiB)", Verdict::Info),
            ),
            b.row(
                Row::new("agent RSS, idle, 20 workloads")
                    .ours(mib(idle20))
                    .baseline(format!("{} (idle `sleep`)", mib(floor)))
                    .ratio(ratio(idle20))
                    .target(
                        "≤ 3.5 MiB",
                        Verdict::from_ok(idle20 * 2 <= 7 * 1024 * 1024),
                    )
                    .note(format!(
                        "VmRSS of the release agent ({}) {} s after the device reported {WORKLOADS} workloads running ({running} containers; converged in {:.1} s from the first put, one mutation at a time): {} anonymous + {} file-backed (the binary's pages touched, and for the glibc build glibc and the loader; shared with the page cache).",
                        b.label(),
                        SETTLE.as_secs(),
                        took.as_secs_f64(),
                        mib(anon),
                        mib(file)
                    )),
            ),
        ]
    }

    /// Desired-state put → container running, against a raw `podman run`,
    /// `runs` of each, interleaved.
    pub fn put_to_running_rows(&self, runs: usize) -> Vec<Row> {
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        for i in 0..runs {
            let token = (7_100_000 + i).to_string();
            let started = Instant::now();
            self.put(&format!("lat{i}"), &["sleep", &token]);
            ours.push(wait_for_process(&token, started, &self.agent));

            let token = (7_200_000 + i).to_string();
            let mut cmd = self.podman.command();
            cmd.args(raw_run_args(&format!("raw{i}"), &self.image, &token));
            let started = Instant::now();
            let mut child = cmd
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawning podman run: {e}"));
            raw.push(wait_for_process(&token, started, &self.agent));
            let status = child
                .wait()
                .unwrap_or_else(|e| panic!("waiting for podman run: {e}"));
            assert!(status.success(), "raw podman run raw{i} failed: {status}");
        }
        let med_ours = median(&ours);
        let med_raw = median(&raw);
        let delta = med_ours.as_secs_f64() - med_raw.as_secs_f64();
        vec![self.build.row(Row::new("desired-state put → container running")
            .ours(format!("{:.0} ms", med_ours.as_secs_f64() * 1e3))
            .baseline(format!("{:.0} ms (raw `podman run -d`)", med_raw.as_secs_f64() * 1e3))
            .ratio(format!("{:+.0} ms", delta * 1e3))
            .target("≤ raw + 100 ms", Verdict::from_ok(delta <= 0.100))
            .note(format!(
                "Median of {runs} interleaved runs, {WORKLOADS} other workloads running. Put: admin KV put of a new workload → the container's process exists (/proc). Ours {} ms; raw {} ms. Raw runs `podman run -d` with the agent's global arguments, labels and restart policy.",
                list_ms(&ours),
                list_ms(&raw)
            )))]
    }
}

impl AgentBench<'_> {
    /// Whether the device reports `workload` healthy.
    fn healthy_reported(&self, status: &nats::kv::Store, workload: &str) -> bool {
        status
            .get(&format!("{}.health", self.device.id))
            .ok()
            .flatten()
            .and_then(|raw| {
                serde_json::from_slice::<fleet_common::contracts::HealthReport>(&raw).ok()
            })
            .and_then(|r| {
                r.workloads
                    .into_iter()
                    .find(|(w, _)| w.as_str() == workload)
                    .map(|(_, h)| h.health == fleet_common::contracts::HealthState::Healthy)
            })
            .unwrap_or(false)
    }

    /// Desired-state put → reported healthy (an exec probe `true`),
    /// against a raw `podman run -d` followed by the same probe by hand
    /// (`podman exec <name> true`, again until it passes), `runs` of each,
    /// interleaved.
    pub fn put_to_healthy_rows(&self, runs: usize) -> Vec<Row> {
        let status = nats::jetstream::new(self.nats.admin())
            .key_value("fleet-status")
            .unwrap_or_else(|e| panic!("bucket fleet-status: {e}"));
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        for i in 0..runs {
            let name = format!("hl{i}");
            let token = (7_300_000 + i).to_string();
            let spec = serde_json::json!({
                "image": self.image,
                "command": ["sleep", token],
                // The first probe runs as soon as the container does; a
                // generous timeout, as `podman exec` is slow on a loaded
                // machine.
                "health": {"probe": {"kind": "exec", "command": ["true"]},
                           "interval-secs": 10, "timeout-secs": 10},
            });
            let started = Instant::now();
            fleet_harness::desired::edit_document(&self.admin, &self.device.id, |w| {
                w.insert(name.clone(), spec.clone());
            });
            poll_until(&format!("{name} reported healthy"), CONVERGE, || {
                self.healthy_reported(&status, &name).then_some(())
            });
            ours.push(started.elapsed());

            let name = format!("rawhl{i}");
            let token = (7_400_000 + i).to_string();
            let started = Instant::now();
            self.podman.run(
                &raw_run_args(&name, &self.image, &token)
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            );
            loop {
                let out = self
                    .podman
                    .command()
                    .args(["exec", &name, "true"])
                    .output()
                    .unwrap_or_else(|e| panic!("podman exec: {e}"));
                if out.status.success() {
                    break;
                }
                assert!(
                    started.elapsed() < CONVERGE,
                    "podman exec {name} true never passed"
                );
            }
            raw.push(started.elapsed());
        }
        let med_ours = median(&ours);
        let med_raw = median(&raw);
        let delta = med_ours.as_secs_f64() - med_raw.as_secs_f64();
        vec![self.build.row(Row::new("workload put → healthy")
            .ours(format!("{:.0} ms", med_ours.as_secs_f64() * 1e3))
            .baseline(format!(
                "{:.0} ms (raw `podman run -d` + `podman exec … true`)",
                med_raw.as_secs_f64() * 1e3
            ))
            .ratio(format!("{:+.0} ms", delta * 1e3))
            .target("≤ raw + probe + 100 ms", Verdict::from_ok(delta <= 0.100))
            .note(format!(
                "Median of {runs} interleaved runs, {WORKLOADS} other workloads running. Put: the device's document by compare-and-set with a new workload whose health is an exec probe `true` (run at once, then every 10 s) → `<device>.health` says it is healthy (admin KV get every ~2 ms). Raw: `podman run -d` with the agent's global arguments, then `podman exec <name> true` by hand until it passes. Ours {} ms; raw {} ms.",
                list_ms(&ours),
                list_ms(&raw)
            )))]
    }
}

/// The arguments the agent gives `podman run` for a workload (after the
/// global arguments), for container `name`.
fn raw_run_args(name: &str, image: &str, token: &str) -> Vec<String> {
    vec![
        "run".into(),
        "--detach".into(),
        "--pull=never".into(),
        format!("--name={name}"),
        "--label=io.harmony.fleet.managed-by=bench-raw".into(),
        format!("--label=io.harmony.fleet.workload={name}"),
        "--restart=always".into(),
        image.into(),
        "sleep".into(),
        token.into(),
    ]
}

/// Time from `started` until a process with argument `token` exists.
fn wait_for_process(token: &str, started: Instant, agent: &ChildGuard) -> Duration {
    let deadline = started + CONVERGE;
    loop {
        if !procfs::pids_with_cmdline(&["sleep", token]).is_empty() {
            return started.elapsed();
        }
        if Instant::now() >= deadline {
            panic!(
                "no container process `sleep {token}` within {CONVERGE:?}; agent log:\n{}",
                agent.log()
            );
        }
        std::thread::sleep(PROC_POLL);
    }
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s.get(s.len() / 2).copied().unwrap_or_default()
}

fn list_ms(v: &[Duration]) -> String {
    v.iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
        .collect::<Vec<_>>()
        .join(", ")
}

/// VmRSS of an idle coreutils `sleep`: read once it sleeps (state `S`
/// after its exec and dynamic linking are done).
pub fn sleep_rss() -> u64 {
    let mut child = Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap_or_else(|e| panic!("spawning sleep (coreutils): {e}"));
    let pid = child.id();
    poll_until("sleep is asleep", Duration::from_secs(5), || {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .next()?
            .to_owned();
        (comm.trim() == "sleep" && state == "S").then_some(())
    });
    let rss = procfs::rss(pid);
    let _ = child.kill();
    let _ = child.wait();
    rss
}

/// CPU use of a process over a window, as a share of one core.
pub fn share(t: CpuTime, window: Duration) -> (f64, f64) {
    let w = window.as_secs_f64();
    (
        t.own.as_secs_f64() / w * 100.0,
        (t.own + t.children).as_secs_f64() / w * 100.0,
    )
}
