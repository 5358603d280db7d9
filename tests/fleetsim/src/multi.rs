//! The simulator across processes: one process holds at most as many
//! device connections as its open-file limit allows (about 19,000 here),
//! so a larger fleet is split over worker processes (`fleet-sim-worker`),
//! each a [`Sim`] over a contiguous range of the devices on the same
//! servers. [`MultiSim`] starts and speaks to them; [`run_worker`] is the
//! worker's side.
//!
//! The protocol, one JSON value or word per line: the coordinator writes
//! the worker's whole configuration ([`WorkerConfig`]) on its stdin; the
//! worker raises its open-file limit, starts its `Sim` and prints `ready`;
//! then each `records` line is answered with one [`RecordsReply`] line and
//! `stop` with one [`StopReply`] line, after which the worker exits. The
//! end of its stdin stops it too, so a coordinator that dies leaves no
//! worker behind. Times cross as CLOCK_MONOTONIC nanoseconds
//! ([`crate::clock`]).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::{DeviceRecord, Generation, Sim, SimAuth, SimConfig, StatusWrites};

/// The worker binary's name (built beside the test binaries and the bench).
pub const WORKER_BIN: &str = "fleet-sim-worker";
/// Bound on a worker's `ready` (its open-file limit raised, its loop started).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one `records` answer (tens of thousands of records as JSON).
const RECORDS_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on a worker's stop: every connection closed, the loop joined.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a worker whose stdin was closed has to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// The last lines of a worker's stderr kept for an error message.
const STDERR_LINES: usize = 50;

/// Everything a worker's [`Sim`] runs, as it crosses to the worker (the
/// password function does not cross: the worker uses
/// [`fleet_harness::device_password`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    pub servers: Vec<SocketAddr>,
    pub devices: Vec<String>,
    pub generation: Generation,
    #[serde(default)]
    pub auth: SimAuth,
    pub status: StatusWrites,
    pub ping: Duration,
    pub idle_heartbeat: Duration,
    pub backstop: Duration,
    pub request_timeout: Duration,
    pub start_rate: u32,
    pub per_source_address: usize,
    pub trace: bool,
    pub first_index: usize,
}

impl WorkerConfig {
    /// The part of `cfg` for its devices `range` (indices into `cfg.devices`).
    pub fn of(cfg: &SimConfig, range: Range<usize>) -> WorkerConfig {
        WorkerConfig {
            servers: cfg.servers.clone(),
            first_index: cfg.first_index + range.start,
            devices: cfg.devices[range].to_vec(),
            generation: cfg.generation,
            auth: cfg.auth.clone(),
            status: cfg.status,
            ping: cfg.ping,
            idle_heartbeat: cfg.idle_heartbeat,
            backstop: cfg.backstop,
            request_timeout: cfg.request_timeout,
            start_rate: cfg.start_rate,
            per_source_address: cfg.per_source_address,
            trace: cfg.trace,
        }
    }

    /// The worker's [`SimConfig`], its devices logging in with `password`.
    pub fn into_sim_config(self, password: fn(&str) -> String) -> SimConfig {
        SimConfig {
            servers: self.servers,
            devices: self.devices,
            password,
            auth: self.auth,
            generation: self.generation,
            status: self.status,
            ping: self.ping,
            idle_heartbeat: self.idle_heartbeat,
            backstop: self.backstop,
            request_timeout: self.request_timeout,
            start_rate: self.start_rate,
            per_source_address: self.per_source_address,
            trace: self.trace,
            first_index: self.first_index,
        }
    }
}

/// A [`DeviceRecord`] as it crosses: every time as CLOCK_MONOTONIC
/// nanoseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireRecord {
    pub connects: Vec<u64>,
    pub disconnects: Vec<u64>,
    pub lost_sync: Vec<u64>,
    pub snapshots: Vec<u64>,
    pub applied: Vec<(u64, u64)>,
    pub api_requests: u64,
    pub status_puts: u64,
    pub status_acked: u64,
    pub errors: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub server: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<String>,
    /// Nanoseconds each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handshakes: Vec<u64>,
    #[serde(default)]
    pub enroll_asks: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<u64>,
}

impl WireRecord {
    pub fn from_record(d: &DeviceRecord, clock: &Clock) -> WireRecord {
        let ns = |v: &[Instant]| v.iter().map(|t| clock.to_ns(*t)).collect();
        WireRecord {
            connects: ns(&d.connects),
            disconnects: ns(&d.disconnects),
            lost_sync: ns(&d.lost_sync),
            snapshots: ns(&d.snapshots),
            applied: d
                .applied
                .iter()
                .map(|(t, s)| (clock.to_ns(*t), *s))
                .collect(),
            api_requests: d.api_requests,
            status_puts: d.status_puts,
            status_acked: d.status_acked,
            errors: d.errors,
            last_error: d.last_error.clone(),
            server: d.server,
            trace: d.trace.clone(),
            handshakes: d
                .handshakes
                .iter()
                .map(|h| u64::try_from(h.as_nanos()).unwrap_or(u64::MAX))
                .collect(),
            enroll_asks: d.enroll_asks,
            approved: d.approved.map(|t| clock.to_ns(t)),
        }
    }

    pub fn into_record(self, clock: &Clock) -> DeviceRecord {
        let at = |v: Vec<u64>| v.into_iter().map(|t| clock.to_instant(t)).collect();
        DeviceRecord {
            connects: at(self.connects),
            disconnects: at(self.disconnects),
            lost_sync: at(self.lost_sync),
            snapshots: at(self.snapshots),
            applied: self
                .applied
                .into_iter()
                .map(|(t, s)| (clock.to_instant(t), s))
                .collect(),
            api_requests: self.api_requests,
            status_puts: self.status_puts,
            status_acked: self.status_acked,
            errors: self.errors,
            last_error: self.last_error,
            server: self.server,
            trace: self.trace,
            handshakes: self
                .handshakes
                .into_iter()
                .map(Duration::from_nanos)
                .collect(),
            enroll_asks: self.enroll_asks,
            approved: self.approved.map(|t| clock.to_instant(t)),
        }
    }
}

/// A worker's answer to `records`: one record per device of its range, in order.
#[derive(Debug, Serialize, Deserialize)]
pub struct RecordsReply {
    pub records: Vec<WireRecord>,
}

/// A worker's answer to `stop`: its loop's error, if it failed.
#[derive(Debug, Serialize, Deserialize)]
pub struct StopReply {
    pub error: Option<String>,
}

/// The worker's side of the protocol over `input` and `out` (its stdin
/// and stdout); returns when told to stop or at the end of `input`.
pub fn run_worker(
    input: impl BufRead,
    mut out: impl Write,
    password: fn(&str) -> String,
) -> Result<(), String> {
    let mut lines = input.lines();
    let first = lines
        .next()
        .ok_or("no configuration on stdin: the coordinator writes a WorkerConfig as one JSON line first")?
        .map_err(|e| format!("reading the configuration from stdin: {e}"))?;
    let wc: WorkerConfig = serde_json::from_str(&first)
        .map_err(|e| format!("the configuration line is not a WorkerConfig: {e}"))?;
    let cfg = wc.into_sim_config(password);
    let n = cfg.devices.len();
    let want = n as u64 + 1_024;
    let nofile = crate::raise_nofile(want);
    if nofile < want {
        return Err(format!(
            "open-file limit {nofile}, below the {want} that {n} devices need: give each worker fewer devices (more processes) or raise `ulimit -Hn`"
        ));
    }
    let clock = Clock::new();
    let sim = Sim::start(cfg).map_err(|e| format!("starting the simulator: {e}"))?;
    let send = |out: &mut dyn Write, line: &str| -> Result<(), String> {
        out.write_all(line.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing to stdout (the coordinator gone?): {e}"))
    };
    send(&mut out, "ready")?;
    for line in lines {
        let line = line.map_err(|e| format!("reading a command from stdin: {e}"))?;
        match line.trim() {
            "records" => {
                if !sim.is_running() {
                    let why = sim.stop().err().unwrap_or_else(|| "no error given".into());
                    return Err(format!("the simulator's event loop ended: {why}"));
                }
                // Copied under the lock, encoded after it: the loop waits
                // only for the copy.
                let recs = sim.records().clone();
                let reply = RecordsReply {
                    records: recs
                        .iter()
                        .map(|d| WireRecord::from_record(d, &clock))
                        .collect(),
                };
                let json = serde_json::to_string(&reply)
                    .map_err(|e| format!("encoding the records: {e}"))?;
                send(&mut out, &json)?;
            }
            "stop" => {
                let reply = StopReply {
                    error: sim.stop().err(),
                };
                let json = serde_json::to_string(&reply)
                    .map_err(|e| format!("encoding the stop reply: {e}"))?;
                return send(&mut out, &json);
            }
            "" => {}
            other => {
                return Err(format!(
                    "unknown command {other:?} on stdin (the commands are `records` and `stop`)"
                ))
            }
        }
    }
    // The coordinator closed stdin (or died): stop.
    sim.stop()
        .map_err(|e| format!("the simulator's event loop failed: {e}"))
}

/// Where the worker binary is: beside the running program (the bench in
/// `<target>/release`), or one up from a test binary in
/// `<target>/<profile>/deps`.
pub fn worker_path() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| {
        format!("finding the running program (to find {WORKER_BIN} beside it): {e}")
    })?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    let mut candidates = vec![dir.join(WORKER_BIN)];
    if dir.file_name().is_some_and(|n| n == "deps") {
        if let Some(profile) = dir.parent() {
            candidates.push(profile.join(WORKER_BIN));
        }
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "missing {WORKER_BIN} beside {}: build it (cargo build -p fleet-sim --bins, with --release for the bench)",
            exe.display()
        )
    })
}

/// One worker process.
#[derive(Debug)]
struct Worker {
    index: usize,
    range: Range<usize>,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Its stdout, line by line (closed when it exits).
    lines: Receiver<String>,
    /// The last lines of its stderr.
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn(
        index: usize,
        range: Range<usize>,
        cfg: WorkerConfig,
        path: &PathBuf,
    ) -> Result<Worker, String> {
        let mut child = Command::new(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", path.display()))?;
        let stdout = child.stdout.take();
        let stderr_pipe = child.stderr.take();
        let (tx, lines) = mpsc::channel();
        if let Some(out) = stdout {
            std::thread::Builder::new()
                .name(format!("fleet-sim-w{index}-out"))
                .spawn(move || {
                    for line in BufReader::new(out).lines() {
                        let Ok(line) = line else { break };
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| format!("starting the reader of worker {index}: {e}"))?;
        }
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_thread = match stderr_pipe {
            Some(err) => {
                let keep = Arc::clone(&stderr);
                Some(
                    std::thread::Builder::new()
                        .name(format!("fleet-sim-w{index}-err"))
                        .spawn(move || {
                            for line in BufReader::new(err).lines() {
                                let Ok(line) = line else { break };
                                eprintln!("fleet-sim worker {index}: {line}");
                                let mut k = keep.lock().unwrap_or_else(|p| p.into_inner());
                                if k.len() == STDERR_LINES {
                                    k.pop_front();
                                }
                                k.push_back(line);
                            }
                        })
                        .map_err(|e| {
                            format!("starting the stderr reader of worker {index}: {e}")
                        })?,
                )
            }
            None => None,
        };
        let mut w = Worker {
            index,
            range,
            child,
            stdin: None,
            lines,
            stderr,
            stderr_thread,
        };
        w.stdin = w.child.stdin.take();
        let json = serde_json::to_string(&cfg)
            .map_err(|e| format!("encoding worker {index}'s configuration: {e}"))?;
        w.send(&json, "its configuration")?;
        Ok(w)
    }

    fn name(&self) -> String {
        format!(
            "fleet-sim worker {} (pid {}, devices {}..{})",
            self.index,
            self.child.id(),
            self.range.start,
            self.range.end
        )
    }

    fn send(&mut self, line: &str, what: &str) -> Result<(), String> {
        let r = match self.stdin.as_mut() {
            Some(s) => s
                .write_all(line.as_bytes())
                .and_then(|()| s.write_all(b"\n"))
                .and_then(|()| s.flush())
                .map_err(|e| e.to_string()),
            None => Err("its stdin is closed".into()),
        };
        r.map_err(|e| self.failure(&format!("sending {what} ({e})")))
    }

    /// Its next stdout line within `timeout`.
    fn recv(&mut self, timeout: Duration, what: &str) -> Result<String, String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "{} did not answer {what} within {timeout:?}; its stderr:\n{}",
                self.name(),
                self.stderr_text()
            )),
            Err(RecvTimeoutError::Disconnected) => Err(self.failure(&format!("answering {what}"))),
        }
    }

    /// The error of a worker that stopped speaking: how it exited and its stderr.
    fn failure(&mut self, doing: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s.to_string(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(None) => break "still running, its stdout closed".to_owned(),
                Err(e) => break format!("unknown ({e})"),
            }
        };
        if let Some(t) = self.stderr_thread.take() {
            if self.child.try_wait().is_ok_and(|s| s.is_some()) {
                let _ = t.join();
            } else {
                self.stderr_thread = Some(t);
            }
        }
        format!(
            "{} failed while {doing}: it exited ({status}); its stderr:\n{}",
            self.name(),
            self.stderr_text()
        )
    }

    fn stderr_text(&self) -> String {
        let k = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        if k.is_empty() {
            "(empty)".to_owned()
        } else {
            k.iter().cloned().collect::<Vec<_>>().join("\n")
        }
    }

    /// Closes its stdin (the worker stops), waits up to `grace` for it to
    /// exit, kills it past that, and reaps it.
    fn reap(&mut self, grace: Duration) {
        self.stdin = None;
        let deadline = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
    }
}

/// A simulation split over worker processes: what a [`Sim`] offers, over
/// every worker's devices in device order. Every worker is stopped (or
/// killed) and reaped on drop.
#[derive(Debug)]
pub struct MultiSim {
    /// Locked for one exchange with every worker at a time.
    workers: Mutex<Vec<Worker>>,
    devices: usize,
    clock: Clock,
}

impl MultiSim {
    /// Starts `processes` workers (at most one per device), each with a
    /// contiguous range of `cfg.devices` and every server; returns when
    /// each has said `ready`. The devices log in with
    /// [`fleet_harness::device_password`] whatever `cfg.password` is.
    pub fn start(cfg: &SimConfig, processes: usize) -> Result<MultiSim, String> {
        let path = worker_path()?;
        let n = cfg.devices.len();
        let p = processes.clamp(1, n.max(1));
        let m = MultiSim {
            workers: Mutex::new(Vec::with_capacity(p)),
            devices: n,
            clock: Clock::new(),
        };
        // Every worker spawned first, then every `ready` awaited: they
        // start side by side. A failure drops `m`: the workers started
        // so far are reaped.
        for k in 0..p {
            let range = (k * n / p)..((k + 1) * n / p);
            let wc = WorkerConfig::of(cfg, range.clone());
            let w = Worker::spawn(k, range, wc, &path)?;
            m.lock().push(w);
        }
        for w in m.lock().iter_mut() {
            let line = w.recv(READY_TIMEOUT, "ready")?;
            if line.trim() != "ready" {
                return Err(format!("{} said {line:?} instead of `ready`", w.name()));
            }
        }
        Ok(m)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Worker>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many worker processes.
    pub fn processes(&self) -> usize {
        self.lock().len()
    }

    /// Each worker's pid and its range of the devices.
    pub fn workers(&self) -> Vec<(u32, Range<usize>)> {
        self.lock()
            .iter()
            .map(|w| (w.child.id(), w.range.clone()))
            .collect()
    }

    /// Every device's record, in device order, merged from every worker now.
    pub fn records(&self) -> Result<Vec<DeviceRecord>, String> {
        let mut workers = self.lock();
        for w in workers.iter_mut() {
            w.send("records", "`records`")?;
        }
        let mut out = Vec::with_capacity(self.devices);
        for w in workers.iter_mut() {
            let line = w.recv(RECORDS_TIMEOUT, "`records`")?;
            let reply: RecordsReply = serde_json::from_str(&line)
                .map_err(|e| format!("{}: its records are not a RecordsReply: {e}", w.name()))?;
            if reply.records.len() != w.range.len() {
                return Err(format!(
                    "{} sent {} records for its {} devices",
                    w.name(),
                    reply.records.len(),
                    w.range.len()
                ));
            }
            out.extend(
                reply
                    .records
                    .into_iter()
                    .map(|r| r.into_record(&self.clock)),
            );
        }
        Ok(out)
    }

    /// Polls `done` on the merged records until it holds or `timeout`
    /// passes (every 250 ms, 500 ms past 20,000 devices, since each poll
    /// merges every record); whether it held. A worker failing ends the
    /// wait as not held: [`records`](Self::records) then says why.
    pub fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[DeviceRecord]) -> bool,
    ) -> bool {
        let every = if self.devices > 20_000 {
            Duration::from_millis(500)
        } else {
            Duration::from_millis(250)
        };
        let deadline = Instant::now() + timeout;
        loop {
            match self.records() {
                Ok(r) if done(&r) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(every);
        }
    }

    /// Stops every worker (each closes its connections); each worker's
    /// result, in worker order: its loop's error, or how it failed.
    pub fn stop(self) -> Vec<Result<(), String>> {
        let mut workers = self.lock();
        let mut sent = Vec::with_capacity(workers.len());
        for w in workers.iter_mut() {
            sent.push(w.send("stop", "`stop`"));
        }
        let mut out = Vec::with_capacity(workers.len());
        for (w, sent) in workers.iter_mut().zip(sent) {
            let r = sent.and_then(|()| {
                let line = w.recv(STOP_TIMEOUT, "`stop`")?;
                let reply: StopReply = serde_json::from_str(&line)
                    .map_err(|e| format!("{}: its stop reply is not a StopReply: {e}", w.name()))?;
                match reply.error {
                    None => Ok(()),
                    Some(e) => Err(format!("{}: its event loop failed: {e}", w.name())),
                }
            });
            w.reap(EXIT_GRACE);
            out.push(r);
        }
        workers.clear();
        drop(workers);
        out
    }
}

impl Drop for MultiSim {
    fn drop(&mut self) {
        // Every stdin closed first: the workers stop side by side.
        let mut workers = self.lock();
        for w in workers.iter_mut() {
            w.stdin = None;
        }
        for w in workers.iter_mut() {
            w.reap(EXIT_GRACE);
        }
    }
}
