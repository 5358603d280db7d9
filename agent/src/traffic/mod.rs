//! The agent's own NATS traffic, counted from the kernel and reported at
//! `fleet-status` `<device>.traffic` (docs/operator/traffic.md).
//!
//! The thread `agent-traffic` reads, every [`SAMPLE_INTERVAL`], the TCP
//! counters of this process's connections to the configured NATS servers'
//! ports ([`diag`]: netlink `sock_diag`, the TCP payload bytes and segments
//! each way, TLS records included), adds them up since the start and per
//! UTC day with the reconnects ([`book`]), and every report interval
//! (`intervals.traffic-secs`) hands the report to the status thread, which
//! writes it. Reading is local: it costs no traffic. When the kernel's
//! counters cannot be read (no `sock_diag`, a kernel older than 4.2) the
//! agent says so once and writes no report, rather than one of zeros.

pub mod book;
pub mod diag;

use std::io;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet_common::Timestamp;

use crate::nats::Nats;
use crate::shutdown::Shutdown;
use crate::status::StatusMsg;
use crate::threads;
use book::TrafficBook;

/// How often the counters are read. A connection that closes loses at most
/// what it carried since its last reading (the kernel keeps a closed
/// socket's counters while it finishes it, and those are read too); for an
/// idle device that is one PING at most.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// How long stopping waits for the thread.
const JOIN_TIMEOUT: Duration = Duration::from_secs(1);
/// The NATS client port when a server URL names none.
const DEFAULT_NATS_PORT: u16 = 4222;

/// The client ports of `servers` (`nats://host:port`, `tls://host`,
/// `host:port`, `[::1]:4222`), each once.
pub fn server_ports(servers: &[String]) -> Vec<u16> {
    let mut ports: Vec<u16> = servers.iter().map(|s| server_port(s)).collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

fn server_port(url: &str) -> u16 {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host_port = rest.split('/').next().unwrap_or(rest);
    let host_port = host_port.rsplit_once('@').map_or(host_port, |(_, h)| h);
    let port = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once("]:").map(|(_, p)| p),
        None => host_port.rsplit_once(':').map(|(_, p)| p),
    };
    port.and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_NATS_PORT)
}

/// The traffic counter's settings; moved onto its thread by [`Self::spawn`].
#[derive(Debug)]
pub struct TrafficCounter {
    pub nats: Arc<Nats>,
    /// The NATS servers' client ports ([`server_ports`]).
    pub ports: Vec<u16>,
    /// `intervals.traffic-secs`.
    pub report_every: Duration,
    pub to_status: Sender<StatusMsg>,
    pub shutdown: Arc<Shutdown>,
}

/// The running counter.
#[derive(Debug)]
pub struct TrafficHandle {
    thread: JoinHandle<()>,
}

impl TrafficHandle {
    /// Joins the thread (shutdown must have been requested).
    pub fn join(self) {
        threads::join_within(self.thread, JOIN_TIMEOUT, "agent-traffic");
    }
}

impl TrafficCounter {
    pub fn spawn(self) -> io::Result<TrafficHandle> {
        let thread = threads::spawn("agent-traffic", move || self.run())?;
        Ok(TrafficHandle { thread })
    }

    fn run(self) {
        let mut book = TrafficBook::new(Timestamp::now(), self.nats.generation());
        let mut next_report = Instant::now() + self.report_every;
        // Whether the last reading failed (said once, not at every reading).
        let mut failing = false;
        let mut ever_read = false;
        loop {
            let wait = SAMPLE_INTERVAL.min(next_report.saturating_duration_since(Instant::now()));
            if self.shutdown.sleep(wait) {
                return;
            }
            match diag::tcp_connections(&self.ports) {
                Ok(all) => {
                    let ours: Vec<_> = all
                        .into_iter()
                        .filter(|r| r.inode != 0 || book.knows(r.cookie))
                        .collect();
                    book.record(Timestamp::now(), &ours, self.nats.generation());
                    if failing {
                        log::info!("traffic counters read again");
                    }
                    failing = false;
                    ever_read = true;
                }
                Err(e) if !failing => {
                    log::warn!("traffic counters not read: {e}; no traffic report until they are");
                    failing = true;
                }
                Err(_) => {}
            }
            if Instant::now() >= next_report {
                next_report = Instant::now() + self.report_every;
                if ever_read && !failing {
                    let report = book.report(Timestamp::now());
                    if self.to_status.send(StatusMsg::Traffic(report)).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ports_come_from_every_url_form() {
        let servers: Vec<String> = [
            "tls://nats1.example.com:4443",
            "nats://user:pw@10.0.0.1:4222",
            "nats2.example.com",
            "[::1]:7422",
            "tls://[fd00::1]",
            "nats://h:4222/",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(server_ports(&servers), vec![4222, 4443, 7422]);
    }
}
