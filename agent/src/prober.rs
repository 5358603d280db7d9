//! Workload health probes, off the reconcile thread: `agent-probe` keeps
//! the schedule, and each probe runs on a short-lived thread of its own
//! (`agent-probe-run`), at most one per workload at a time.
//!
//! The reconciler sends the set of containers to probe ([`ProbeTarget`],
//! whole, whenever it changes); each is probed at once and then every
//! `interval` after the start of the previous probe; each result goes back
//! through the callback given to [`Prober::spawn`] (a message to the
//! reconciler). A result for a container no longer in the set is dropped.
//!
//! Every probe has its deadline (`timeout`):
//! - `exec`: `podman exec <container id> <command>` through
//!   [`fleet_common::process::run_bounded_split`]: at most
//!   [`MAX_PROBE_OUTPUT_BYTES`] of each of stdout and stderr kept, the
//!   process group killed at the deadline. Podman does not stop what the
//!   command started inside the container when its `podman exec` dies
//!   (podman #19486): that runs until it ends or the container stops;
//!   `docs/design/workload-health.md` says more.
//! - `http`: `GET <path>` on `127.0.0.1:<port>` with connect, write and
//!   read bounded by what is left of the deadline; healthy on 2xx or 3xx;
//!   at most [`MAX_HTTP_PROBE_READ_BYTES`] read; redirects are answers,
//!   never followed.
//! - `tcp`: a connect to `127.0.0.1:<port>` within the deadline.
//!
//! What a probe said reaches a report only through
//! [`fleet_common::process::bounded_text`] (escaped, cut). Nothing here
//! waits for a probe to end: stopping joins `agent-probe` only; a probe
//! still running is left to its deadline, and the daemon's exit kills its
//! process group ([`fleet_common::process::kill_live_groups`]).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet_common::contracts::{Probe, ProbeResult};
use fleet_common::limits::{MAX_HTTP_PROBE_READ_BYTES, MAX_PROBE_OUTPUT_BYTES};
use fleet_common::process::{bounded_text, describe_status, ProcessError};
use fleet_common::validate::{BoundedText, Sha256Hex, WorkloadName};
use fleet_common::Timestamp;

use crate::podman::Podman;
use crate::threads;

/// Characters of what a probe printed kept in its report detail.
const MAX_DETAIL_BYTES: usize = 256;
/// How long stopping waits for `agent-probe` (it never waits for a probe).
const JOIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest the schedule sleeps with nothing due: it wakes on every message
/// anyway; this only bounds a lost wake-up.
const IDLE_WAKE: Duration = Duration::from_secs(60);

/// One container to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub workload: WorkloadName,
    pub spec_hash: Sha256Hex,
    pub container_id: String,
    pub probe: Probe,
    pub interval: Duration,
    pub timeout: Duration,
}

/// A probe's result, for the container it ran against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub workload: WorkloadName,
    pub spec_hash: Sha256Hex,
    pub container_id: String,
    pub result: ProbeResult,
}

enum ProberMsg {
    Targets(Vec<ProbeTarget>),
    Done(ProbeOutcome),
    Stop,
}

/// Where results go; false when nobody listens any more.
pub type OutcomeSink = Box<dyn FnMut(ProbeOutcome) -> bool + Send>;

/// The running `agent-probe`.
#[derive(Debug)]
pub struct ProberHandle {
    tx: Sender<ProberMsg>,
    thread: JoinHandle<()>,
}

impl std::fmt::Debug for ProberMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Targets(t) => write!(f, "Targets({})", t.len()),
            Self::Done(o) => write!(f, "Done({})", o.workload),
            Self::Stop => f.write_str("Stop"),
        }
    }
}

impl ProberHandle {
    /// Replaces the set of containers probed.
    pub fn set_targets(&self, targets: Vec<ProbeTarget>) {
        let _ = self.tx.send(ProberMsg::Targets(targets));
    }

    /// Stops the schedule; probes in flight are not waited for.
    pub fn stop(self) {
        let _ = self.tx.send(ProberMsg::Stop);
        threads::join_within(self.thread, JOIN_TIMEOUT, "agent-probe");
    }
}

/// One workload's place in the schedule.
#[derive(Debug)]
struct Slot {
    target: ProbeTarget,
    next_at: Instant,
    in_flight: bool,
}

/// The probe schedule; moved onto its thread by [`Prober::spawn`].
pub struct Prober {
    podman: Podman,
    sink: OutcomeSink,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober").finish_non_exhaustive()
    }
}

impl Prober {
    pub fn new(podman: Podman, sink: OutcomeSink) -> Self {
        Self { podman, sink }
    }

    /// Starts `agent-probe`.
    pub fn spawn(self) -> std::io::Result<ProberHandle> {
        let (tx, rx) = mpsc::channel();
        let back = tx.clone();
        let thread = threads::spawn("agent-probe", move || self.run(&rx, &back))?;
        Ok(ProberHandle { tx, thread })
    }

    fn run(mut self, rx: &Receiver<ProberMsg>, back: &Sender<ProberMsg>) {
        let mut slots: BTreeMap<WorkloadName, Slot> = BTreeMap::new();
        loop {
            let now = Instant::now();
            let wake = slots
                .values()
                .filter(|s| !s.in_flight)
                .map(|s| s.next_at)
                .min()
                .unwrap_or(now + IDLE_WAKE);
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(ProberMsg::Targets(targets)) => {
                    let mut next = BTreeMap::new();
                    for t in targets {
                        let slot = match slots.remove(&t.workload) {
                            Some(s) if s.target == t => s,
                            // Another container or probe: probed at once
                            // (a probe of the old one may still be in
                            // flight; its result is dropped).
                            _ => Slot {
                                target: t.clone(),
                                next_at: Instant::now(),
                                in_flight: false,
                            },
                        };
                        next.insert(t.workload.clone(), slot);
                    }
                    slots = next;
                }
                Ok(ProberMsg::Done(outcome)) => {
                    let current = slots.get_mut(&outcome.workload).filter(|s| {
                        s.target.container_id == outcome.container_id
                            && s.target.spec_hash == outcome.spec_hash
                    });
                    if let Some(slot) = current {
                        slot.in_flight = false;
                        if !(self.sink)(outcome) {
                            return;
                        }
                    }
                }
                Ok(ProberMsg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            for slot in slots.values_mut() {
                if slot.in_flight || slot.next_at > now {
                    continue;
                }
                slot.in_flight = true;
                slot.next_at = now + slot.target.interval;
                let target = slot.target.clone();
                let podman = self.podman.clone();
                let done = back.clone();
                let spawned = threads::spawn("agent-probe-run", move || {
                    let result = run_probe(&podman, &target);
                    let _ = done.send(ProberMsg::Done(ProbeOutcome {
                        workload: target.workload,
                        spec_hash: target.spec_hash,
                        container_id: target.container_id,
                        result,
                    }));
                });
                if let Err(e) = spawned {
                    log::warn!(workload = slot.target.workload.as_str(); "starting a probe thread: {e}; trying again in {} s", slot.target.interval.as_secs());
                    slot.in_flight = false;
                }
            }
        }
    }
}

/// Runs one probe to its end or its deadline.
pub fn run_probe(podman: &Podman, target: &ProbeTarget) -> ProbeResult {
    let at = Timestamp::now();
    let started = Instant::now();
    let (ok, detail) = match &target.probe {
        Probe::Exec { command } => {
            exec_probe(podman, &target.container_id, command, target.timeout)
        }
        Probe::Http { port, path } => http_probe(*port, path, target.timeout),
        Probe::Tcp { port } => tcp_probe(*port, target.timeout),
    };
    ProbeResult {
        at,
        ok,
        took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        detail: Some(BoundedText::truncate(detail)),
    }
}

fn exec_probe(
    podman: &Podman,
    container_id: &str,
    command: &[String],
    timeout: Duration,
) -> (bool, String) {
    match podman.exec_probe(container_id, command, timeout, MAX_PROBE_OUTPUT_BYTES) {
        Ok(out) => {
            let said = if out.stdout.is_empty() {
                &out.stderr
            } else {
                &out.stdout
            };
            let mut detail = describe_status(out.status);
            if !said.is_empty() {
                detail.push_str(": ");
                detail.push_str(&bounded_text(said.trim_ascii(), MAX_DETAIL_BYTES));
            }
            let cut = out.stdout_cut + out.stderr_cut;
            if cut > 0 {
                detail.push_str(&format!(" ({cut} bytes of output not kept)"));
            }
            (out.success(), detail)
        }
        Err(ProcessError::Timeout { after, .. }) => (
            false,
            format!("timed out after {} s and was killed", after.as_secs()),
        ),
        Err(e) => (
            false,
            bounded_text(e.to_string().as_bytes(), MAX_DETAIL_BYTES),
        ),
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// What is left of a deadline, at least a millisecond (a zero timeout
/// means "none" to the socket calls).
fn left(deadline: Instant) -> Option<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    (!d.is_zero()).then_some(d.max(Duration::from_millis(1)))
}

fn tcp_probe(port: u16, timeout: Duration) -> (bool, String) {
    match TcpStream::connect_timeout(&loopback(port), timeout) {
        Ok(_) => (true, format!("connected to 127.0.0.1:{port}")),
        Err(e) => (false, format!("connecting to 127.0.0.1:{port}: {e}")),
    }
}

fn http_probe(port: u16, path: &str, timeout: Duration) -> (bool, String) {
    let deadline = Instant::now() + timeout;
    let timed_out = || (false, format!("timed out after {} s", timeout.as_secs()));
    let mut s = match TcpStream::connect_timeout(&loopback(port), timeout) {
        Ok(s) => s,
        Err(e) => return (false, format!("connecting to 127.0.0.1:{port}: {e}")),
    };
    // The path is printable ASCII without spaces (HealthCheck::validate).
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nUser-Agent: fleet-agent-probe\r\n\r\n");
    let Some(t) = left(deadline) else {
        return timed_out();
    };
    if let Err(e) = s
        .set_write_timeout(Some(t))
        .and_then(|()| s.write_all(request.as_bytes()))
    {
        return (false, format!("sending the request: {e}"));
    }
    let mut buf = vec![0u8; MAX_HTTP_PROBE_READ_BYTES];
    let mut got = 0;
    // Read until the status line is complete, the bound, EOF or the deadline.
    while got < buf.len() && !buf[..got].contains(&b'\n') {
        let Some(t) = left(deadline) else {
            return timed_out();
        };
        if let Err(e) = s.set_read_timeout(Some(t)) {
            return (false, format!("reading the answer: {e}"));
        }
        match s.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return timed_out()
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (false, format!("reading the answer: {e}")),
        }
    }
    let line_end = buf[..got].iter().position(|&b| b == b'\n').unwrap_or(got);
    let line = buf[..line_end].trim_ascii();
    match parse_status(line) {
        Some(code) => (
            (200..400).contains(&code),
            format!("HTTP {code}: {}", bounded_text(line, MAX_DETAIL_BYTES)),
        ),
        None => (
            false,
            format!(
                "not an HTTP answer: {:?}",
                bounded_text(line, MAX_DETAIL_BYTES)
            ),
        ),
    }
}

/// The status code of `HTTP/x.y NNN ...`.
fn parse_status(line: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.split(' ');
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let code = parts.next()?;
    (code.len() == 3).then(|| code.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn serve_once(answer: &'static [u8]) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let mut req = [0u8; 1024];
                let _ = c.read(&mut req);
                let _ = c.write_all(answer);
            }
        });
        port
    }

    #[test]
    fn an_http_probe_is_healthy_on_2xx_and_3xx_only_and_follows_no_redirect() {
        let t = Duration::from_secs(2);
        let p = serve_once(b"HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(
            http_probe(p, "/", t),
            (true, "HTTP 204: HTTP/1.1 204 No Content".into())
        );
        let p = serve_once(b"HTTP/1.0 302 Found\r\nLocation: http://example.invalid/\r\n\r\n");
        assert!(http_probe(p, "/", t).0, "a redirect is an answer");
        let p = serve_once(b"HTTP/1.1 503 Service Unavailable\r\n\r\n");
        assert_eq!(
            http_probe(p, "/health", t),
            (false, "HTTP 503: HTTP/1.1 503 Service Unavailable".into())
        );
        let p = serve_once(b"\x1b[31mgarbage\r\n");
        assert_eq!(
            http_probe(p, "/", t),
            (false, r#"not an HTTP answer: "\\u{1b}[31mgarbage""#.into())
        );
    }

    #[test]
    fn an_http_probe_that_gets_no_answer_times_out_at_its_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let started = Instant::now();
        let (ok, detail) = http_probe(port, "/", Duration::from_millis(300));
        assert!(!ok);
        assert_eq!(detail, "timed out after 0 s");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        drop(l);
    }

    #[test]
    fn a_tcp_probe_connects_or_says_why_not() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert!(tcp_probe(port, Duration::from_secs(1)).0);
        drop(l);
        let (ok, detail) = tcp_probe(port, Duration::from_secs(1));
        assert!(!ok);
        assert!(
            detail.starts_with(&format!("connecting to 127.0.0.1:{port}: ")),
            "{detail}"
        );
    }

    #[test]
    fn status_lines_are_read_strictly() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.1 2000 OK"), None);
        assert_eq!(parse_status(b"SSH-2.0-OpenSSH"), None);
        assert_eq!(parse_status(b""), None);
    }
}
