//! A simulated fleet: N real `fleet-agent` processes (release build,
//! `podman.enabled: false`, production intervals), each with its own temp
//! root, config and NATS user, on one fleet-layout nats-server (Debian's
//! 2.9, the oldest supported).
//!
//! The change: desired-state keys exist only per device
//! (`<device>.<workload>`), so one fleet-wide change is N puts, one per
//! device, pipelined by the admin (every put published before any ack is
//! awaited). Converged: every agent has published its `<device>.workloads`
//! report (a KV put the agent has JetStream acknowledge) naming the new workload with
//! the put's spec hash (with Podman disabled the agent reports a desired
//! workload `pending`, "not run: Podman is disabled"), seen by the admin on
//! the status subjects.
//! Baseline, same run: the time for the same N puts to be acknowledged
//! (nothing can converge before the change is stored).

use std::collections::HashSet;

use fleet_common::contracts::{WorkloadSpec, WorkloadsReport};
use std::fs::File;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fleet_harness::{NatsServer, NatsVersion};

use crate::agent::AgentDevice;
use crate::bins::Build;
use crate::notify::Notify;
use crate::procfs;
use crate::report::{mib, Row, Verdict};

/// Every agent started and ready (1,000 agents connect, publish their info
/// and read a snapshot; ~1 min on 2 cores).
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// Acks of the N puts, and convergence.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);
/// The workload every device is given.
const WORKLOAD: &str = "web";
const SPEC: &str = r#"{"image":"localhost/fleet-bench/app:2","command":["sleep","1000"]}"#;

/// The agents of one fleet; SIGKILLed and reaped on drop.
#[derive(Debug)]
struct Agents {
    devices: Vec<AgentDevice>,
    children: Vec<Child>,
}

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

impl Agents {
    fn live(&mut self) -> usize {
        self.children
            .iter_mut()
            .map(|c| c.try_wait())
            .filter(|w| matches!(w, Ok(None)))
            .count()
    }

    /// The log of the first agent that exited, for a panic message.
    fn first_dead_log(&mut self) -> String {
        for (c, d) in self.children.iter_mut().zip(&self.devices) {
            if let Ok(Some(status)) = c.try_wait() {
                let log =
                    std::fs::read_to_string(d.root.path().join("agent.log")).unwrap_or_default();
                return format!("{} exited ({status}):\n{log}", d.id);
            }
        }
        "(none exited)".to_owned()
    }
}

/// Soft `RLIMIT_NOFILE` raised to the hard limit: nats-server holds one
/// socket per agent, and inherits the limit.
fn raise_nofile(need: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current.is_some_and(|c| c >= need) {
        return;
    }
    lim.current = lim.maximum;
    if let Err(e) = setrlimit(Resource::Nofile, lim) {
        panic!("cannot raise the open-file limit to {need}: {e}; run `ulimit -n {need}` first");
    }
    let now = getrlimit(Resource::Nofile).current;
    assert!(
        now.is_none_or(|c| c >= need),
        "the open-file limit is {now:?}, below the {need} a fleet of this size needs: raise the hard limit (ulimit -Hn)"
    );
}

/// The fleet rows for `n` agents.
pub fn fleet_rows(n: usize) -> Vec<Row> {
    raise_nofile(n as u64 * 2 + 256);
    let ids: Vec<String> = (1..=n).map(|i| format!("sim-{i:05}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let server = NatsServer::start_fleet(NatsVersion::V2_9, &id_refs);
    let notify_dir = tempfile::Builder::new()
        .prefix("fleet-bench-fleet-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let notify = Notify::bind(&notify_dir.path().join("notify.sock"));

    let started = Instant::now();
    let mut agents = Agents {
        devices: Vec::with_capacity(n),
        children: Vec::with_capacity(n),
    };
    for id in &ids {
        let device = AgentDevice::new(id, &server.url(), None);
        let log = File::create(device.root.path().join("agent.log"))
            .unwrap_or_else(|e| panic!("agent log: {e}"));
        let err = log.try_clone().unwrap_or_else(|e| panic!("agent log: {e}"));
        let child = device
            .command(Build::Shipped, &notify, None)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning agent {id}: {e}"));
        agents.devices.push(device);
        agents.children.push(child);
    }
    if !notify.wait_ready(n, START_TIMEOUT) {
        panic!(
            "only {} of {n} agents ready within {START_TIMEOUT:?}; {} alive; {}",
            notify.ready_count(),
            agents.live(),
            agents.first_dead_log()
        );
    }
    let ready_in = started.elapsed();
    let rss: Vec<u64> = agents
        .children
        .iter()
        .map(|c| procfs::rss(c.id()))
        .collect();
    let mean_rss = rss.iter().sum::<u64>() / n as u64;
    let server_rss = server_pid(&server).map(procfs::rss);

    let admin = server.admin();
    let reports = admin
        .subscribe("$KV.fleet-status.*.workloads")
        .unwrap_or_else(|e| panic!("subscribing to the workload reports: {e}"));
    let (acked, _) = put_all(&admin, &ids);
    let converged = wait_converged(&reports, &ids, acked.0);
    let live = agents.live();
    assert_eq!(
        live,
        n,
        "agents died during the change: {}",
        agents.first_dead_log()
    );
    let target_ok = converged <= Duration::from_secs(5);
    let judged = n >= 1000;
    vec![Row::new(format!("fleet: {n} simulated agents converge on one change"))
        .ours(format!("{:.0} ms", converged.as_secs_f64() * 1e3))
        .baseline(format!(
            "{:.0} ms ({n} puts acknowledged)",
            acked.1.as_secs_f64() * 1e3
        ))
        .ratio(format!(
            "{:+.0} ms",
            (converged.as_secs_f64() - acked.1.as_secs_f64()) * 1e3
        ))
        .target(
            if judged { "≤ 5 s (1,000 agents)" } else { "— (1,000 agents: ≤ 5 s)" },
            if judged { Verdict::from_ok(target_ok) } else { Verdict::Info },
        )
        .note(format!(
            "{n} release agents (Podman disabled) on one nats-server 2.9; all ready {:.1} s after the first spawn; mean agent RSS {}, nats-server RSS {}. Change: one put per device, pipelined; converged = every agent has published its `<device>.workloads` report (a KV put it has JetStream acknowledge) naming the new workload with the put's spec hash (Podman disabled: reported `pending`, not run).",
            ready_in.as_secs_f64(),
            mib(mean_rss),
            server_rss.map_or("?".to_owned(), mib),
        ))]
}

/// The pid of `server`'s process: the nats-server listening on its port.
pub fn server_pid(server: &NatsServer) -> Option<u32> {
    let needle = server.port().to_string();
    procfs::pids_named("nats-server").into_iter().find(|pid| {
        // The fleet layout starts it with `-c <dir>/nats.conf`; its config
        // names the port.
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .and_then(|c| {
                let args: Vec<String> = c
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let conf = args.iter().position(|a| a == "-c")?;
                std::fs::read_to_string(args.get(conf + 1)?).ok()
            })
            .is_some_and(|conf| conf.contains(&format!(":{needle}")))
    })
}

/// Puts every device's desired document (`fleet-workloads`
/// `<device>.desired`, [`WORKLOAD`] alone), all published before any ack is
/// read. Returns (the instant the first was published, the time until the
/// last ack) and each device's stream sequence.
fn put_all(admin: &nats::Connection, ids: &[String]) -> ((Instant, Duration), Vec<u64>) {
    let doc = format!(r#"{{"workloads":{{"{WORKLOAD}":{SPEC}}}}}"#);
    let puts: Vec<(String, Vec<u8>)> = ids
        .iter()
        .map(|id| {
            (
                format!("$KV.fleet-workloads.{id}.desired"),
                doc.as_bytes().to_vec(),
            )
        })
        .collect();
    pipelined_puts(admin, &puts)
}

/// Publishes every `(subject, value)` to JetStream, all before any ack is
/// read, then waits for every ack. Returns (the instant the first was
/// published, the time until the last ack) and each one's stream sequence.
pub fn pipelined_puts(
    admin: &nats::Connection,
    puts: &[(String, Vec<u8>)],
) -> ((Instant, Duration), Vec<u64>) {
    let inbox = admin.new_inbox();
    let acks = admin
        .subscribe(&format!("{inbox}.*"))
        .unwrap_or_else(|e| panic!("subscribing to acks: {e}"));
    let started = Instant::now();
    for (i, (subject, value)) in puts.iter().enumerate() {
        admin
            .publish_request(subject, &format!("{inbox}.{i}"), value)
            .unwrap_or_else(|e| panic!("publishing {subject}: {e}"));
    }
    let mut seqs = vec![0u64; puts.len()];
    let mut got = 0;
    let deadline = started + CONVERGE_TIMEOUT;
    while got < puts.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = acks
            .next_timeout(left)
            .unwrap_or_else(|e| panic!("{got} of {} puts acknowledged: {e}", puts.len()));
        let i: usize = m
            .subject
            .rsplit('.')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("ack on {}", m.subject));
        let v: serde_json::Value =
            serde_json::from_slice(&m.data).unwrap_or_else(|e| panic!("ack is not JSON ({e})"));
        let seq = v["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("put on {} refused: {v}", puts[i].0));
        if seqs[i] == 0 {
            got += 1;
        }
        seqs[i] = seq;
    }
    ((started, started.elapsed()), seqs)
}

/// Reads the devices' workload reports until every device has reported
/// [`WORKLOAD`] with the spec hash of [`SPEC`]; returns the time since
/// `started`.
fn wait_converged(reports: &nats::Subscription, ids: &[String], started: Instant) -> Duration {
    let hash = WorkloadSpec::from_json(SPEC.as_bytes())
        .unwrap_or_else(|e| panic!("the bench's spec: {e}"))
        .spec_hash();
    let mut pending: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let deadline = started + CONVERGE_TIMEOUT;
    while !pending.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = reports.next_timeout(left).unwrap_or_else(|e| {
            panic!(
                "{} of {} devices did not report the change within {CONVERGE_TIMEOUT:?}: {e}",
                pending.len(),
                ids.len()
            )
        });
        let Some(id) = m
            .subject
            .strip_prefix("$KV.fleet-status.")
            .and_then(|s| s.strip_suffix(".workloads"))
        else {
            continue;
        };
        let Ok(report) = serde_json::from_slice::<WorkloadsReport>(&m.data) else {
            panic!("{id}: a workloads report that is not one: {:?}", m.data);
        };
        if report
            .workloads
            .iter()
            .any(|(w, s)| w.as_str() == WORKLOAD && s.spec_hash == hash)
        {
            pending.remove(id);
        }
    }
    started.elapsed()
}
