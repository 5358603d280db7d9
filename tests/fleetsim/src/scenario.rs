//! The steps the fleet-scale bench and the correctness test share: device
//! ids, simulated fleets started on a [`NatsCluster`] or any list of
//! servers (leaf nodes), first snapshots, a
//! fan-out of one change per device, and a node loss with its recovery.
//! A fleet runs in this process ([`Fleet::start`]) or split over worker
//! processes ([`Fleet::start_processes`]); the steps and their results are
//! the same.

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use fleet_harness::{device_password, NatsCluster};

use crate::admin::put_desired_all;
use crate::{percentile, DeviceRecord, Generation, MultiSim, Sim, SimConfig};

/// `sim-<gen>-000123`: generation and index.
pub fn device_ids(generation: Generation, n: usize) -> Vec<String> {
    let g = match generation {
        Generation::One => 1,
        Generation::Two => 2,
    };
    (0..n).map(|i| format!("sim{g}-{i:06}")).collect()
}

/// Where a fleet's devices run.
#[derive(Debug)]
pub enum Simulator {
    /// In this process.
    One(Sim),
    /// Split over worker processes.
    Processes(MultiSim),
}

/// Every device's record: the one-process simulator's, locked, or merged
/// from the workers.
#[derive(Debug)]
pub enum Records<'a> {
    Local(MutexGuard<'a, Vec<DeviceRecord>>),
    Merged(Vec<DeviceRecord>),
}

impl Deref for Records<'_> {
    type Target = [DeviceRecord];

    fn deref(&self) -> &[DeviceRecord] {
        match self {
            Records::Local(g) => g,
            Records::Merged(v) => v,
        }
    }
}

impl Simulator {
    /// Every device's record, in device order (a worker that failed is an
    /// error naming it, with its stderr).
    pub fn records(&self) -> Result<Records<'_>, String> {
        match self {
            Simulator::One(s) => Ok(Records::Local(s.records())),
            Simulator::Processes(m) => m.records().map(Records::Merged),
        }
    }

    /// Polls `done` on the records until it holds or `timeout` passes.
    pub fn wait_until(&self, timeout: Duration, done: impl FnMut(&[DeviceRecord]) -> bool) -> bool {
        match self {
            Simulator::One(s) => s.wait_until(timeout, done),
            Simulator::Processes(m) => m.wait_until(timeout, done),
        }
    }

    /// How many processes hold the devices (1 in this process).
    pub fn processes(&self) -> usize {
        match self {
            Simulator::One(_) => 1,
            Simulator::Processes(m) => m.processes(),
        }
    }

    /// Stops every device; the errors of the loops that failed.
    pub fn stop(self) -> Result<(), String> {
        match self {
            Simulator::One(s) => s.stop(),
            Simulator::Processes(m) => {
                let errors: Vec<String> = m.stop().into_iter().filter_map(Result::err).collect();
                if errors.is_empty() {
                    Ok(())
                } else {
                    Err(errors.join("\n"))
                }
            }
        }
    }
}

/// A simulated fleet of one generation.
#[derive(Debug)]
pub struct Fleet {
    pub generation: Generation,
    pub devices: Vec<String>,
    pub sim: Simulator,
    /// The desired sequence each device should hold (after fan-outs).
    pub seqs: Vec<u64>,
    /// Each device's error count at the last [`mark_errors`](Self::mark_errors):
    /// a disturbance's errors are those counted after it.
    error_mark: Vec<u64>,
}

/// p50, p99 and max of some durations, and how many.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Spread {
    pub fn of(mut v: Vec<Duration>) -> Spread {
        v.sort();
        Spread {
            n: v.len(),
            p50: percentile(&v, 50.0),
            p99: percentile(&v, 99.0),
            max: v.last().copied().unwrap_or_default(),
        }
    }

    /// `0.12 / 0.35 / 0.40 s`.
    pub fn cell(&self) -> String {
        format!(
            "{:.2} / {:.2} / {:.2} s",
            self.p50.as_secs_f64(),
            self.p99.as_secs_f64(),
            self.max.as_secs_f64()
        )
    }
}

impl Fleet {
    /// Starts `devices` of `generation` on every node of `cluster`.
    pub fn start(
        cluster: &NatsCluster,
        generation: Generation,
        devices: Vec<String>,
        tune: impl FnOnce(&mut SimConfig),
    ) -> Fleet {
        Self::start_on(cluster.client_addrs(), generation, devices, tune)
    }

    /// Starts `devices` of `generation` on `servers` (any servers the
    /// devices log in to: a cluster's nodes, leaf nodes): device `i`
    /// starts on `servers[i % len]` and moves to another one at random
    /// when it loses it; [`per_node`](Self::per_node) counts by index in
    /// `servers`.
    pub fn start_on(
        servers: Vec<SocketAddr>,
        generation: Generation,
        devices: Vec<String>,
        tune: impl FnOnce(&mut SimConfig),
    ) -> Fleet {
        let cfg = Self::config(servers, generation, &devices, tune);
        let sim = Sim::start(cfg).unwrap_or_else(|e| panic!("starting the simulator: {e}"));
        Self::on(generation, devices, Simulator::One(sim))
    }

    /// Starts `devices` of `generation` on every node of `cluster`, split
    /// over `processes` worker processes (contiguous ranges of the devices;
    /// each device starts on the server, source address and start time it
    /// would have in one process).
    pub fn start_processes(
        cluster: &NatsCluster,
        generation: Generation,
        devices: Vec<String>,
        processes: usize,
        tune: impl FnOnce(&mut SimConfig),
    ) -> Fleet {
        Self::start_processes_on(cluster.client_addrs(), generation, devices, processes, tune)
    }

    /// [`start_processes`](Self::start_processes) on `servers`, as
    /// [`start_on`](Self::start_on).
    pub fn start_processes_on(
        servers: Vec<SocketAddr>,
        generation: Generation,
        devices: Vec<String>,
        processes: usize,
        tune: impl FnOnce(&mut SimConfig),
    ) -> Fleet {
        let cfg = Self::config(servers, generation, &devices, tune);
        let sim = MultiSim::start(&cfg, processes)
            .unwrap_or_else(|e| panic!("starting the simulator's worker processes: {e}"));
        Self::on(generation, devices, Simulator::Processes(sim))
    }

    fn config(
        servers: Vec<SocketAddr>,
        generation: Generation,
        devices: &[String],
        tune: impl FnOnce(&mut SimConfig),
    ) -> SimConfig {
        let mut cfg = SimConfig::new(servers, devices.to_vec(), device_password, generation);
        tune(&mut cfg);
        cfg
    }

    fn on(generation: Generation, devices: Vec<String>, sim: Simulator) -> Fleet {
        let seqs = vec![0; devices.len()];
        let error_mark = vec![0; devices.len()];
        Fleet {
            generation,
            devices,
            sim,
            seqs,
            error_mark,
        }
    }

    /// Waits until every device has a complete snapshot; the spread of
    /// the times from `since`.
    pub fn wait_snapshots(&self, since: Instant, timeout: Duration) -> Result<Spread, String> {
        let ok = self
            .sim
            .wait_until(timeout, |r| r.iter().all(|d| !d.snapshots.is_empty()));
        let recs = self.sim.records()?;
        if !ok {
            return Err(self.missing(&recs, "no complete snapshot", |d| d.snapshots.is_empty()));
        }
        Ok(Spread::of(
            recs.iter()
                .filter_map(|d| d.snapshots.first())
                .map(|t| t.saturating_duration_since(since))
                .collect(),
        ))
    }

    fn missing(
        &self,
        recs: &[DeviceRecord],
        what: &str,
        mut bad: impl FnMut(&DeviceRecord) -> bool,
    ) -> String {
        let bad: Vec<(usize, &DeviceRecord)> =
            recs.iter().enumerate().filter(|(_, d)| bad(d)).collect();
        let first = bad.first().map(|(i, d)| {
            format!(
                "{} (connects {}, errors {}, last error {:?})",
                self.devices[*i],
                d.connects.len(),
                d.errors,
                d.last_error
            )
        });
        let mut by_server: std::collections::BTreeMap<String, usize> = Default::default();
        for (_, d) in &bad {
            let at = d.server.map_or("none".to_owned(), |s| s.to_string());
            *by_server.entry(at).or_default() += 1;
        }
        let by_server: Vec<String> = by_server
            .iter()
            .map(|(s, c)| format!("{c} on server {s}"))
            .collect();
        format!(
            "{}: {} of {} devices with {what} ({}); first: {}",
            self.generation.label(),
            bad.len(),
            recs.len(),
            by_server.join(", "),
            first.unwrap_or_default()
        )
    }

    /// One desired change per device, written by `admin` as fleetctl
    /// writes them (pipelined); how long each device took to apply it.
    pub fn fan_out(
        &mut self,
        admin: &nats::Connection,
        marker: &str,
        timeout: Duration,
    ) -> Result<FanOut, String> {
        let expected = if self.generation == Generation::Two {
            self.seqs.clone()
        } else {
            Vec::new()
        };
        let w = put_desired_all(admin, self.generation, &self.devices, &expected, marker)?;
        self.seqs = w.seqs.clone();
        let seqs = &self.seqs;
        let ok = self.sim.wait_until(timeout, |r| {
            r.iter()
                .zip(seqs)
                .all(|(d, s)| d.applied_at_least(*s).is_some())
        });
        let recs = self.sim.records()?;
        if !ok {
            let seqs = &self.seqs;
            let bad: Vec<bool> = recs
                .iter()
                .zip(seqs)
                .map(|(d, s)| d.applied_at_least(*s).is_none())
                .collect();
            let mut it = bad.iter();
            return Err(self.missing(&recs, "the change not applied", |_| {
                *it.next().unwrap_or(&false)
            }));
        }
        let applied: Vec<Instant> = recs
            .iter()
            .zip(&self.seqs)
            .filter_map(|(d, s)| d.applied_at_least(*s))
            .collect();
        Ok(FanOut {
            each: Spread::of(
                applied
                    .iter()
                    .zip(&w.sent)
                    .map(|(a, s)| a.saturating_duration_since(*s))
                    .collect(),
            ),
            whole: Spread::of(
                applied
                    .iter()
                    .map(|a| a.saturating_duration_since(w.started))
                    .collect(),
            ),
            acked: w.acked.saturating_duration_since(w.started),
        })
    }

    /// Remembers each device's error count now: [`recovery`](Self::recovery)
    /// and [`outages`](Self::outages) count the errors after it.
    pub fn mark_errors(&mut self) {
        let mark = self.records().iter().map(|d| d.errors).collect();
        self.error_mark = mark;
    }

    /// The records, for the steps whose results have no room for an error:
    /// a worker process that failed panics, naming it, with its stderr.
    fn records(&self) -> Records<'_> {
        self.sim.records().unwrap_or_else(|e| {
            panic!(
                "{}: reading the device records: {e}",
                self.generation.label()
            )
        })
    }

    fn errors_since_mark(&self, i: usize, d: &DeviceRecord) -> u64 {
        d.errors
            .saturating_sub(self.error_mark.get(i).copied().unwrap_or(0))
    }

    /// Devices connected to each of `nodes` servers now.
    pub fn per_node(&self, nodes: usize) -> Vec<usize> {
        let mut v = vec![0; nodes];
        for d in self.records().iter() {
            if let Some(s) = d.server {
                if s < nodes {
                    v[s] += 1;
                }
            }
        }
        v
    }

    /// After a node was lost at `at`: waits until every device that lost
    /// sync since then has a complete snapshot again (or `timeout`). A
    /// cluster node's loss can reach devices on the other nodes late
    /// (generation 1: a consumer whose leader was on it goes quiet and is
    /// found stale after missed heartbeats), so "every affected device
    /// recovered" counts only from 20 s after `at`; the times are each
    /// device's own, from `at` to its snapshot, whenever the wait ends.
    pub fn recovery(&self, at: Instant, timeout: Duration) -> Recovery {
        self.recovery_when(at, timeout, |_| at.elapsed() > Duration::from_secs(20))
    }

    /// After a server whose loss reaches only its own devices (a leaf
    /// node) was lost at `at`, holding `lost` of this fleet's connections:
    /// waits until at least `lost` devices lost sync since then and every
    /// one that did has a complete snapshot again (or `timeout`), with no
    /// settling delay, so the wait ends when the last of them recovers.
    pub fn recovery_of_connections(&self, at: Instant, lost: usize, timeout: Duration) -> Recovery {
        self.recovery_when(at, timeout, |r| {
            r.iter()
                .filter(|d| d.lost_sync.iter().any(|t| *t >= at))
                .count()
                >= lost
        })
    }

    fn recovery_when(
        &self,
        at: Instant,
        timeout: Duration,
        mut settled: impl FnMut(&[DeviceRecord]) -> bool,
    ) -> Recovery {
        let affected = |d: &DeviceRecord| d.lost_sync.iter().any(|t| *t >= at);
        let recovered = |d: &DeviceRecord| {
            d.lost_sync
                .iter()
                .rev()
                .find(|t| **t >= at)
                .is_some_and(|lost| d.snapshot_after(*lost).is_some())
        };
        self.sim.wait_until(timeout, |r| {
            settled(r) && r.iter().all(|d| !affected(d) || recovered(d))
        });
        let recs = self.records();
        let mut times = Vec::new();
        let mut never = 0;
        let mut affected_n = 0;
        let mut errors = 0;
        let mut first_never = None;
        for (i, d) in recs.iter().enumerate() {
            if !affected(d) {
                continue;
            }
            affected_n += 1;
            errors += self.errors_since_mark(i, d);
            match d.snapshots.iter().rev().find(|s| **s >= at) {
                Some(t) if recovered(d) => times.push(t.saturating_duration_since(at)),
                _ => {
                    never += 1;
                    if first_never.is_none() {
                        first_never = Some(format!(
                            "{}: lost sync {:?} s after the kill, {} connects, {} snapshots, last error {:?}",
                            self.devices[i],
                            d.lost_sync
                                .iter()
                                .filter(|t| **t >= at)
                                .map(|t| t.duration_since(at).as_secs_f32())
                                .collect::<Vec<_>>(),
                            d.connects.len(),
                            d.snapshots.len(),
                            d.last_error
                        ));
                    }
                }
            }
        }
        Recovery {
            affected: affected_n,
            spread: Spread::of(times),
            never,
            errors,
            first_never,
        }
    }

    /// After a disturbance that began at `from` and lasted until `until`
    /// (a rolling restart: each device may lose its connection more than
    /// once): waits until every device that lost sync since `from` has a
    /// complete snapshot after its last loss (or `timeout` after `until`).
    /// The spread is over every outage: from a loss to the next complete
    /// snapshot.
    pub fn outages(&self, from: Instant, until: Instant, timeout: Duration) -> Recovery {
        let lost = |d: &DeviceRecord| {
            d.lost_sync
                .iter()
                .copied()
                .filter(|t| *t >= from)
                .collect::<Vec<_>>()
        };
        let recovered = |d: &DeviceRecord| {
            lost(d)
                .last()
                .is_none_or(|last| d.snapshot_after(*last).is_some())
        };
        let deadline = until + timeout;
        self.sim
            .wait_until(deadline.saturating_duration_since(Instant::now()), |r| {
                r.iter().all(recovered)
            });
        let recs = self.records();
        let mut times = Vec::new();
        let mut out = Recovery::default();
        for (i, d) in recs.iter().enumerate() {
            let losses = lost(d);
            if losses.is_empty() {
                continue;
            }
            out.affected += 1;
            out.errors += self.errors_since_mark(i, d);
            for t in &losses {
                if let Some(s) = d.snapshot_after(*t) {
                    times.push(s.saturating_duration_since(*t));
                }
            }
            if !recovered(d) {
                out.never += 1;
                if out.first_never.is_none() {
                    out.first_never = Some(format!(
                        "{}: lost sync {} times, {} connects, last error {:?}",
                        self.devices[i],
                        losses.len(),
                        d.connects.len(),
                        d.last_error
                    ));
                }
            }
        }
        out.spread = Spread::of(times);
        out
    }

    /// Errors every device counted since the last
    /// [`mark_errors`](Self::mark_errors).
    pub fn errors_after_mark(&self) -> u64 {
        self.records()
            .iter()
            .enumerate()
            .map(|(i, d)| self.errors_since_mark(i, d))
            .sum()
    }

    /// The last errors of the devices that counted one since the last
    /// [`mark_errors`](Self::mark_errors), digits folded to `N` (ports,
    /// times), most frequent first, with how many devices each.
    pub fn last_errors_after_mark(&self) -> Vec<(String, usize)> {
        let mut tally: std::collections::BTreeMap<String, usize> = Default::default();
        for (i, d) in self.records().iter().enumerate() {
            if self.errors_since_mark(i, d) == 0 {
                continue;
            }
            let e = d.last_error.as_deref().unwrap_or("none recorded");
            let mut folded = String::with_capacity(e.len());
            for c in e.chars() {
                if c.is_ascii_digit() {
                    if !folded.ends_with('N') {
                        folded.push('N');
                    }
                } else {
                    folded.push(c);
                }
            }
            *tally.entry(folded).or_default() += 1;
        }
        let mut v: Vec<(String, usize)> = tally.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// JetStream API requests the devices sent so far.
    pub fn api_requests(&self) -> u64 {
        self.records().iter().map(|d| d.api_requests).sum()
    }

    /// Status puts sent and acknowledged so far.
    pub fn status_puts(&self) -> (u64, u64) {
        let r = self.records();
        (
            r.iter().map(|d| d.status_puts).sum(),
            r.iter().map(|d| d.status_acked).sum(),
        )
    }
}

/// What a fan-out took.
#[derive(Debug, Clone, Copy, Default)]
pub struct FanOut {
    /// Per device, from its own put being sent to the device applying it:
    /// the latency of a change.
    pub each: Spread,
    /// Per device, from the first put of all: the whole fleet's, which
    /// includes writing N values (the puts' own throughput).
    pub whole: Spread,
    /// From the first put to the last acknowledgment.
    pub acked: Duration,
}

/// What a node loss did to one fleet.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Devices that lost sync (their connection, or a consumer).
    pub affected: usize,
    /// From the kill to a complete snapshot again.
    pub spread: Spread,
    pub never: usize,
    /// Errors the affected devices counted (failed requests, refusals).
    pub errors: u64,
    /// The first device never recovered, and why.
    pub first_never: Option<String>,
}
