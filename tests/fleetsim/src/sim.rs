//! The event loop: every device's socket in one epoll set, a timer heap,
//! and each device's protocol as a state machine driven by what the
//! server sends and by its timers.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_common::contracts::{
    AnswerState, EnrollAnswer, EnrollRequest, FACT_AGENT_VERSION, FACT_ARCH, FACT_MACHINE_ID,
    FACT_OS,
};
use fleet_common::jetstream::{
    nanos, AckInfo, ConsumerCreateResponse, KeyTracker, KeyVersion, PubAckResponse, Verdict,
};
use fleet_common::subjects::{
    deliver_prefix, desired_doc_key, device_consumer_create_subject, device_direct_get_subject,
    device_filter, enroll_inbox_prefix, enroll_subject, inbox_prefix, kv_subject,
    republish_subject, status_key, stream_name, StatusKey, BUCKET_CONTROL, BUCKET_DESIRED,
    BUCKET_STATUS, BUCKET_WORKLOADS,
};
use fleet_common::validate::DeviceId;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, Timespec};
use rustix::fd::OwnedFd;
use rustix::net::{AddressFamily, SocketFlags, SocketType};

use crate::proto::{self, Msg, Op};
use crate::{reconnect_delay, DeviceRecord, Generation, SimAuth, SimConfig, StatusWrites};

/// Inactive threshold of a generation-1 consumer (agent: 30 s).
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(30);
/// Heartbeats missed before a consumer is replaced (agent: 3).
const MISSED_HEARTBEATS: u32 = 3;
/// A watcher's retry delays after a failed create or read (agent: 1 s doubling to 30 s).
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);
/// Device info retried after a failure (agent: `STARTUP_RETRY_DELAY`).
const INFO_RETRY_DELAY: Duration = Duration::from_secs(2);
/// Longest epoll wait, so a stop is seen.
const MAX_WAIT: Duration = Duration::from_millis(50);
const READ_CHUNK: usize = 16 * 1024;
/// How long one enrollment attempt waits for its answer (agent/src/enroll.rs).
const ENROLL_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// The subscription of an enrollment attempt's second probe (a Direct Get
/// of the device's own desired document, answered only in `DEVICES`).
const PROBE_SID: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    Connect,
    Heartbeat,
    /// The client's PING, when the server has been silent for the interval.
    Ping,
    /// Generation 2: the periodic check of read `.0`, if `.1` is still its token.
    Check(u8, u64),
    ReqTimeout(u64),
    ConsumerCheck(u8),
    Retry(u8),
    RetryInfo,
    /// The enrollment request of this connection was not answered.
    EnrollTimeout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    dev: u32,
    /// The connection epoch it belongs to (0: any).
    epoch: u64,
    kind: TimerKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conn {
    Down,
    Connecting,
    WaitInfo,
    WaitPong,
    Up,
}

#[derive(Debug)]
enum Req {
    Info,
    Status,
    Create {
        read: u8,
        sid: u64,
    },
    /// `check`: a re-read on the open subscription (periodic, or after a
    /// gap), not a snapshot after (re)subscribing.
    Get {
        read: u8,
        check: bool,
    },
}

#[derive(Debug)]
struct Consumer {
    sid: u64,
    deliver: String,
    created: bool,
    last_activity: Instant,
    cseq: u64,
}

#[derive(Debug, Default)]
struct ReadState {
    started: bool,
    complete: bool,
    delay: Option<Duration>,
    // Generation 1.
    consumer: Option<Consumer>,
    // Generation 2.
    sub: Option<u64>,
    tracker: KeyTracker,
    /// The current periodic check (older timers are ignored) and its retry delay.
    check_token: u64,
    check_delay: Option<Duration>,
}

#[derive(Debug)]
struct Dev {
    id: DeviceId,
    idx: u32,
    rng: u64,
    sock: Option<TcpStream>,
    conn: Conn,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    want_out: bool,
    dirty: bool,
    epoch: u64,
    server: usize,
    attempts: usize,
    ever_up: bool,
    inbox: String,
    inbox_sid: u64,
    next_sid: u64,
    next_req: u64,
    reqs: Vec<(u64, Req)>,
    info_acked: bool,
    heartbeats: bool,
    /// When the server last sent anything (for the client's PINGs).
    last_in: Instant,
    reads: [ReadState; 2],
    /// The desired sequence last reported in `workloads` (the agent
    /// reports when what it holds changed, and after its first snapshot).
    reported: Option<u64>,
    /// [`SimAuth::Enrollment`]: the device's own key, and whether it still
    /// has to ask to join (then its connections are enrollment attempts).
    key: Option<nkeys::KeyPair>,
    enrolling: bool,
    /// The pause after the next unsuccessful enrollment attempt.
    enroll_wait: Duration,
    /// When the current connection's socket was opened.
    dialed: Instant,
}

/// The keys of each read: (bucket read by gen 1, gen-2 bucket, gen-2 key).
fn read_keys(dev: &DeviceId) -> [(&'static str, &'static str, String); 2] {
    let [(b0, k0), (b1, k1)] = fleet_common::subjects::device_read_keys(dev);
    [(BUCKET_DESIRED, b0, k0), (BUCKET_CONTROL, b1, k1)]
}

impl Dev {
    fn rand(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn token(&mut self) -> String {
        format!("{:016x}{:016x}", self.rand(), self.rand())
    }

    fn jitter(&mut self, up_to: Duration) -> Duration {
        let ms = u64::try_from(up_to.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.rand() % ms.saturating_add(1))
    }

    /// Closes the socket and forgets the connection's buffers and
    /// requests; the new epoch voids its pending timers.
    fn close(&mut self) {
        self.sock = None;
        self.conn = Conn::Down;
        self.rbuf = Vec::new();
        self.wbuf = Vec::new();
        self.want_out = false;
        self.epoch += 1;
        self.reqs.clear();
    }
}

/// The loop's state.
pub(crate) struct Loop {
    cfg: SimConfig,
    ep: OwnedFd,
    devs: Vec<Dev>,
    timers: BinaryHeap<Reverse<Timer>>,
    records: Arc<Mutex<Vec<DeviceRecord>>>,
    dirty: Vec<u32>,
    /// When the simulation started: the agents' `agent-started-at` and uptime.
    started: fleet_common::Timestamp,
    started_at: Instant,
}

impl Loop {
    pub(crate) fn new(cfg: SimConfig, records: Arc<Mutex<Vec<DeviceRecord>>>) -> io::Result<Loop> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let now = Instant::now();
        let seed = now.elapsed().as_nanos() as u64
            ^ u64::from(std::process::id()).rotate_left(32)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        let mut devs = Vec::with_capacity(cfg.devices.len());
        let mut timers = BinaryHeap::new();
        let enrolling = matches!(cfg.auth, SimAuth::Enrollment { .. });
        for (i, id) in cfg.devices.iter().enumerate() {
            let id = DeviceId::parse(id)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            let idx = u32::try_from(i).map_err(|_| io::Error::other("too many devices"))?;
            let key = enrolling.then(|| crate::device_key(id.as_str()));
            devs.push(Dev {
                id,
                idx,
                rng: seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d),
                sock: None,
                conn: Conn::Down,
                rbuf: Vec::new(),
                wbuf: Vec::new(),
                want_out: false,
                dirty: false,
                epoch: 1,
                server: (cfg.first_index + i) % cfg.servers.len().max(1),
                attempts: 0,
                ever_up: false,
                inbox: String::new(),
                inbox_sid: 1,
                next_sid: 2,
                next_req: 1,
                reqs: Vec::new(),
                info_acked: false,
                heartbeats: false,
                last_in: now,
                reads: Default::default(),
                reported: None,
                key,
                enrolling,
                enroll_wait: fleet_common::limits::ENROLL_RETRY_FIRST,
                dialed: now,
            });
            let at = if cfg.start_rate == 0 {
                now
            } else {
                now + Duration::from_secs_f64(
                    (cfg.first_index + i) as f64 / f64::from(cfg.start_rate),
                )
            };
            timers.push(Reverse(Timer {
                at,
                dev: idx,
                epoch: 0,
                kind: TimerKind::Connect,
            }));
        }
        if cfg.servers.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no servers"));
        }
        let started = fleet_common::Timestamp::now();
        Ok(Loop {
            cfg,
            ep,
            devs,
            timers,
            records,
            dirty: Vec::new(),
            started,
            started_at: Instant::now(),
        })
    }

    pub(crate) fn run(&mut self, stop: &AtomicBool) -> Result<(), String> {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(4096);
        while !stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            let wait = self
                .timers
                .peek()
                .map_or(MAX_WAIT, |t| t.0.at.saturating_duration_since(now))
                .min(MAX_WAIT);
            let ts = Timespec {
                tv_sec: wait.as_secs() as i64,
                tv_nsec: i64::from(wait.subsec_nanos()),
            };
            events.clear();
            match epoll::wait(&self.ep, spare_capacity(&mut events), Some(&ts)) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(format!("epoll_wait: {e}")),
            }
            let records = Arc::clone(&self.records);
            let mut recs = records.lock().unwrap_or_else(|p| p.into_inner());
            for ev in &events {
                let flags = ev.flags;
                let i = ev.data.u64() as usize;
                self.on_io(i, flags, &mut recs);
            }
            let now = Instant::now();
            while let Some(Reverse(t)) = self.timers.peek().copied() {
                if t.at > now {
                    break;
                }
                self.timers.pop();
                let d = &self.devs[t.dev as usize];
                if t.epoch != 0 && t.epoch != d.epoch {
                    continue;
                }
                self.on_timer(t, &mut recs);
            }
            self.flush(&mut recs);
        }
        for d in &mut self.devs {
            d.sock = None;
        }
        Ok(())
    }

    fn timer(&mut self, dev: u32, after: Duration, epoch: u64, kind: TimerKind) {
        self.timers.push(Reverse(Timer {
            at: Instant::now() + after,
            dev,
            epoch,
            kind,
        }));
    }

    fn mark(&mut self, i: usize) {
        if !self.devs[i].dirty {
            self.devs[i].dirty = true;
            self.dirty.push(self.devs[i].idx);
        }
    }

    // ---- connection ----

    fn connect(&mut self, i: usize, recs: &mut [DeviceRecord]) {
        let n = self.cfg.servers.len();
        let per = self.cfg.per_source_address.max(1);
        let d = &mut self.devs[i];
        let addr = self.cfg.servers[d.server % n];
        let src = u8::try_from(1 + ((self.cfg.first_index + i) / per) % 250).unwrap_or(1);
        let sock = (|| -> io::Result<TcpStream> {
            let fd = rustix::net::socket_with(
                AddressFamily::INET,
                SocketType::STREAM,
                SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
                None,
            )?;
            if src != 1 {
                let local = SocketAddr::from(([127, 0, 0, src], 0));
                rustix::net::bind(&fd, &local)?;
            }
            match rustix::net::connect(&fd, &addr) {
                Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
                Err(e) => return Err(e.into()),
            }
            rustix::net::sockopt::set_tcp_nodelay(&fd, true)?;
            epoll::add(
                &self.ep,
                &fd,
                epoll::EventData::new_u64(i as u64),
                epoll::EventFlags::IN | epoll::EventFlags::OUT,
            )?;
            Ok(TcpStream::from(fd))
        })();
        match sock {
            Ok(s) => {
                d.dialed = Instant::now();
                d.sock = Some(s);
                d.conn = Conn::Connecting;
                d.want_out = true;
            }
            Err(e) => {
                let e = format!("connecting to {addr}: {e}");
                self.lost(i, e, recs);
            }
        }
    }

    /// The connection failed or closed: count it, schedule the next attempt
    /// (the agent's backoff, another server at random).
    fn lost(&mut self, i: usize, why: String, recs: &mut [DeviceRecord]) {
        let now = Instant::now();
        let n = self.cfg.servers.len();
        let gen1 = self.cfg.generation == Generation::One;
        let d = &mut self.devs[i];
        // An enrollment connection is not the device's: its loss is a
        // failed attempt, retried after the enrollment pause.
        let was_up = d.conn == Conn::Up && !d.enrolling;
        d.close();
        let r = &mut recs[i];
        r.server = None;
        if was_up {
            r.disconnects.push(now);
            r.lost_sync.push(now);
            d.attempts = 0;
        } else {
            d.attempts += 1;
            r.errors += 1;
            r.last_error = Some(why);
        }
        for rd in &mut d.reads {
            rd.complete = false;
            if gen1 {
                if let Some(c) = &mut rd.consumer {
                    c.created = false;
                }
            }
        }
        if n > 1 {
            // The agent's NATS client tries its servers in a random order
            // (vendor/nats/src/connector.rs shuffles the list for every
            // round), so a lost server's devices spread over all the
            // others: any one but the server just lost.
            let skip = 1 + usize::try_from(d.rand() % (n as u64 - 1)).unwrap_or(0);
            d.server = (d.server + skip) % n;
        }
        let r = d.rand();
        let delay = if d.enrolling {
            let pause = d.enroll_wait;
            d.enroll_wait = (pause * 2).min(fleet_common::limits::ENROLL_RETRY_MAX);
            pause - pause / 5 + d.jitter(pause * 2 / 5)
        } else {
            reconnect_delay(d.attempts, r)
        };
        let (idx, epoch) = (d.idx, d.epoch);
        self.timer(idx, delay, epoch, TimerKind::Connect);
    }

    /// Closes the connection on purpose (an enrollment attempt done) and
    /// connects again after `after`.
    fn end_connection(&mut self, i: usize, after: Duration, recs: &mut [DeviceRecord]) {
        let d = &mut self.devs[i];
        d.close();
        recs[i].server = None;
        let (idx, epoch) = (d.idx, d.epoch);
        self.timer(idx, after, epoch, TimerKind::Connect);
    }

    fn on_io(&mut self, i: usize, flags: epoll::EventFlags, recs: &mut [DeviceRecord]) {
        if self.devs[i].sock.is_none() {
            return;
        }
        if self.devs[i].conn == Conn::Connecting {
            if flags.intersects(epoll::EventFlags::ERR | epoll::EventFlags::HUP)
                || flags.contains(epoll::EventFlags::OUT)
            {
                let err = self.devs[i]
                    .sock
                    .as_ref()
                    .map(rustix::net::sockopt::socket_error);
                match err {
                    Some(Ok(Ok(()))) => {
                        self.devs[i].conn = Conn::WaitInfo;
                        self.set_out(i, false);
                    }
                    Some(Ok(Err(e))) => return self.lost(i, format!("connect: {e}"), recs),
                    Some(Err(e)) => return self.lost(i, format!("connect: {e}"), recs),
                    None => return,
                }
            } else {
                return;
            }
        }
        if flags.contains(epoll::EventFlags::OUT) {
            self.mark(i);
        }
        if flags.intersects(epoll::EventFlags::IN | epoll::EventFlags::HUP | epoll::EventFlags::ERR)
        {
            let mut closed = None;
            {
                let d = &mut self.devs[i];
                let Some(sock) = d.sock.as_mut() else { return };
                loop {
                    let len = d.rbuf.len();
                    d.rbuf.resize(len + READ_CHUNK, 0);
                    match sock.read(&mut d.rbuf[len..]) {
                        Ok(0) => {
                            d.rbuf.truncate(len);
                            closed = Some("the server closed the connection".to_owned());
                            break;
                        }
                        Ok(n) => {
                            d.rbuf.truncate(len + n);
                            d.last_in = Instant::now();
                            if n < READ_CHUNK {
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            d.rbuf.truncate(len);
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                            d.rbuf.truncate(len);
                        }
                        Err(e) => {
                            d.rbuf.truncate(len);
                            closed = Some(format!("read: {e}"));
                            break;
                        }
                    }
                }
            }
            let epoch = self.devs[i].epoch;
            let mut pos = 0;
            loop {
                if self.devs[i].epoch != epoch {
                    return;
                }
                match proto::parse(&self.devs[i].rbuf[pos..]) {
                    Ok(Some((op, used))) => {
                        pos += used;
                        self.on_op(i, op, recs);
                    }
                    Ok(None) => break,
                    Err(e) => return self.lost(i, e.0, recs),
                }
            }
            if self.devs[i].epoch != epoch {
                return;
            }
            self.devs[i].rbuf.drain(..pos);
            if self.devs[i].rbuf.capacity() > 4 * READ_CHUNK && self.devs[i].rbuf.is_empty() {
                self.devs[i].rbuf = Vec::new();
            }
            if let Some(why) = closed {
                self.lost(i, why, recs);
            }
        }
    }

    fn set_out(&mut self, i: usize, on: bool) {
        let d = &mut self.devs[i];
        if d.want_out == on {
            return;
        }
        d.want_out = on;
        if let Some(s) = &d.sock {
            let mut f = epoll::EventFlags::IN;
            if on {
                f |= epoll::EventFlags::OUT;
            }
            let _ = epoll::modify(&self.ep, s, epoll::EventData::new_u64(i as u64), f);
        }
    }

    fn flush(&mut self, recs: &mut [DeviceRecord]) {
        let dirty = std::mem::take(&mut self.dirty);
        for idx in dirty {
            let i = idx as usize;
            self.devs[i].dirty = false;
            if self.devs[i].conn == Conn::Connecting || self.devs[i].sock.is_none() {
                continue;
            }
            let mut failed = None;
            {
                let d = &mut self.devs[i];
                let Some(sock) = d.sock.as_mut() else {
                    continue;
                };
                let mut written = 0;
                while written < d.wbuf.len() {
                    match sock.write(&d.wbuf[written..]) {
                        Ok(0) => {
                            failed = Some("write: connection closed".to_owned());
                            break;
                        }
                        Ok(n) => written += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            failed = Some(format!("write: {e}"));
                            break;
                        }
                    }
                }
                d.wbuf.drain(..written);
            }
            if let Some(why) = failed {
                self.lost(i, why, recs);
                continue;
            }
            let pending = !self.devs[i].wbuf.is_empty();
            self.set_out(i, pending);
        }
    }

    // ---- sending ----

    fn trace(&self, i: usize, what: &str, subject: &str, recs: &mut [DeviceRecord]) {
        if self.cfg.trace {
            recs[i].trace.push(format!("{what} {subject}"));
        }
    }

    fn sub(&mut self, i: usize, subject: &str, sid: u64, recs: &mut [DeviceRecord]) {
        self.trace(i, "SUB", subject, recs);
        proto::sub(&mut self.devs[i].wbuf, subject, sid);
        self.mark(i);
    }

    fn unsub(&mut self, i: usize, subject: &str, sid: u64, recs: &mut [DeviceRecord]) {
        self.trace(i, "UNSUB", subject, recs);
        proto::unsub(&mut self.devs[i].wbuf, sid);
        self.mark(i);
    }

    fn publish(&mut self, i: usize, subject: &str, payload: &[u8], recs: &mut [DeviceRecord]) {
        self.trace(i, "PUB", subject, recs);
        proto::publish(&mut self.devs[i].wbuf, subject, None, payload);
        self.mark(i);
    }

    /// Publishes with a reply on the inbox; the answer (or the timeout)
    /// comes back as `req`.
    fn request(
        &mut self,
        i: usize,
        subject: &str,
        payload: &[u8],
        req: Req,
        recs: &mut [DeviceRecord],
    ) {
        self.trace(i, "PUB", subject, recs);
        let d = &mut self.devs[i];
        let id = d.next_req;
        d.next_req += 1;
        let reply = format!("{}{id}", d.inbox);
        proto::publish(&mut d.wbuf, subject, Some(&reply), payload);
        // The agent's bounds: a Direct Get has its own, shorter one.
        let timeout = match req {
            Req::Get { .. } => fleet_common::limits::DIRECT_GET_TIMEOUT,
            _ => self.cfg.request_timeout,
        };
        d.reqs.push((id, req));
        let (idx, epoch) = (d.idx, d.epoch);
        self.timer(idx, timeout, epoch, TimerKind::ReqTimeout(id));
        self.mark(i);
    }

    fn put_status(&mut self, i: usize, key: StatusKey, body: &[u8], recs: &mut [DeviceRecord]) {
        let subject = kv_subject(BUCKET_STATUS, &status_key(&self.devs[i].id, key));
        recs[i].status_puts += 1;
        self.request(i, &subject, body, Req::Status, recs);
    }

    fn heartbeat_body(&self) -> Vec<u8> {
        crate::bodies::heartbeat(self.cfg.generation, self.started_at.elapsed().as_secs())
    }

    fn workloads_report(&mut self, i: usize, recs: &mut [DeviceRecord]) {
        let held = self.devs[i].reads[0].tracker.held();
        if self.devs[i].reported == Some(held) {
            return;
        }
        self.devs[i].reported = Some(held);
        let body = crate::bodies::workloads();
        self.put_status(i, StatusKey::Workloads, &body, recs);
    }

    // ---- protocol ----

    fn on_op(&mut self, i: usize, op: Op, recs: &mut [DeviceRecord]) {
        match op {
            Op::Info { nonce } => {
                if self.devs[i].conn == Conn::WaitInfo {
                    if let Err(why) = self.send_connect(i, nonce.as_deref()) {
                        return self.lost(i, why, recs);
                    }
                    self.devs[i].conn = Conn::WaitPong;
                    self.mark(i);
                }
            }
            Op::Ping => {
                proto::pong(&mut self.devs[i].wbuf);
                self.mark(i);
            }
            Op::Pong => {
                if self.devs[i].conn == Conn::WaitPong {
                    self.devs[i].conn = Conn::Up;
                    recs[i].handshakes.push(self.devs[i].dialed.elapsed());
                    if self.devs[i].enrolling {
                        self.ask_to_join(i, recs);
                    } else {
                        self.on_up(i, recs);
                    }
                }
            }
            Op::Ok => {}
            Op::Err(e) => {
                let denied = e.to_ascii_lowercase().contains("permissions violation");
                if self.devs[i].enrolling && self.devs[i].conn == Conn::Up && denied {
                    // One of an attempt's two probes is always refused.
                    return;
                }
                recs[i].errors += 1;
                recs[i].last_error = Some(format!("server: {e}"));
                let fatal = self.devs[i].conn != Conn::Up
                    || !e.to_ascii_lowercase().contains("permissions violation");
                if fatal {
                    self.lost(i, format!("server: {e}"), recs);
                }
            }
            Op::Msg(m) => self.on_msg(i, m, recs),
        }
    }

    /// The CONNECT of this device's authentication.
    fn send_connect(&mut self, i: usize, nonce: Option<&str>) -> Result<(), String> {
        let d = &mut self.devs[i];
        match &self.cfg.auth {
            SimAuth::Password => {
                let pass = (self.cfg.password)(d.id.as_str());
                let name = format!("fleet-agent {}", d.id);
                proto::connect(&mut d.wbuf, d.id.as_str(), &pass, &name);
            }
            SimAuth::Enrollment { token } => {
                let nonce = nonce.ok_or("the server sent no nonce to sign")?;
                let key = d.key.as_ref().ok_or("no device key")?;
                let sig = key
                    .sign(nonce.as_bytes())
                    .map_err(|e| format!("signing the nonce: {e}"))?;
                let sig = fleet_common::b64::encode_url(&sig);
                let name = if d.enrolling {
                    format!("fleet-agent {} (enrolling)", d.id)
                } else {
                    format!("fleet-agent {}", d.id)
                };
                let public = key.public_key();
                proto::connect_nkey(&mut d.wbuf, d.id.as_str(), &public, &sig, token, &name);
            }
        }
        Ok(())
    }

    /// An enrollment connection is up: the request to join on the key's
    /// subject, the answer on the key's inbox.
    fn ask_to_join(&mut self, i: usize, recs: &mut [DeviceRecord]) {
        let d = &mut self.devs[i];
        let Some(public) = d.key.as_ref().map(nkeys::KeyPair::public_key) else {
            return;
        };
        let token = d.token();
        let inbox = format!("{}{token}", enroll_inbox_prefix(&public));
        proto::sub(&mut d.wbuf, &inbox, d.inbox_sid);
        let facts = [
            (FACT_ARCH, "x86_64".to_owned()),
            (FACT_OS, "Debian GNU/Linux 12 (bookworm)".to_owned()),
            (FACT_MACHINE_ID, format!("{:032x}", u128::from(d.idx) + 1)),
            (FACT_AGENT_VERSION, env!("CARGO_PKG_VERSION").to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let request = EnrollRequest {
            device_id: d.id.clone(),
            public_key: public.clone(),
            facts,
        };
        let body = serde_json::to_vec(&request).unwrap_or_default();
        let subject = enroll_subject(&public);
        proto::publish(&mut d.wbuf, &subject, Some(&inbox), &body);
        // Beside it, as the agent does: the Direct Get only `DEVICES`
        // answers (an approval whose answer was lost, a device approved
        // before it asked). In `ENROLL` the server refuses both the
        // subscription and the publish; in `DEVICES` the request above.
        let probe_inbox = format!("{}{token}", inbox_prefix(&d.id));
        proto::sub(&mut d.wbuf, &probe_inbox, PROBE_SID);
        let get = device_direct_get_subject(BUCKET_WORKLOADS, &desired_doc_key(&d.id));
        proto::publish(&mut d.wbuf, &get, Some(&probe_inbox), b"");
        recs[i].enroll_asks += 1;
        let (idx, epoch) = (d.idx, d.epoch);
        self.trace(i, "PUB", &subject, recs);
        self.timer(idx, ENROLL_ANSWER_TIMEOUT, epoch, TimerKind::EnrollTimeout);
        self.mark(i);
    }

    /// The answer to this connection's request to join.
    fn on_enroll_answer(&mut self, i: usize, m: Msg, recs: &mut [DeviceRecord]) {
        let answer = if m.status.as_deref() == Some("503") {
            Err("no enrollment service answers".to_owned())
        } else {
            serde_json::from_slice::<EnrollAnswer>(&m.payload)
                .map_err(|e| format!("unreadable enrollment answer: {e}"))
        };
        match answer {
            Ok(a) if a.state == AnswerState::Approved => self.approved(i, recs),
            Ok(a) => {
                recs[i].last_error = Some(format!(
                    "enrollment: {:?}{}",
                    a.state,
                    a.reason.map(|r| format!(": {r}")).unwrap_or_default()
                ));
                let asked = a.retry_after_secs.map(Duration::from_secs);
                self.retry_enrollment(i, asked, recs);
            }
            Err(why) => {
                recs[i].errors += 1;
                recs[i].last_error = Some(why);
                self.retry_enrollment(i, None, recs);
            }
        }
    }

    /// Approved: connect as itself at once.
    fn approved(&mut self, i: usize, recs: &mut [DeviceRecord]) {
        recs[i].approved = Some(Instant::now());
        let d = &mut self.devs[i];
        d.enrolling = false;
        d.attempts = 0;
        self.end_connection(i, Duration::ZERO, recs);
    }

    /// The agent's pause between enrollment attempts: 5 s doubling to
    /// 5 min, each ± a fifth, at least what the answer asked.
    fn retry_enrollment(&mut self, i: usize, asked: Option<Duration>, recs: &mut [DeviceRecord]) {
        let d = &mut self.devs[i];
        let max = fleet_common::limits::ENROLL_RETRY_MAX;
        let wait = d.enroll_wait;
        let pause =
            (wait - wait / 5 + d.jitter(wait * 2 / 5)).max(asked.unwrap_or_default().min(max));
        d.enroll_wait = (d.enroll_wait * 2).min(max);
        self.end_connection(i, pause, recs);
    }

    fn on_up(&mut self, i: usize, recs: &mut [DeviceRecord]) {
        let now = Instant::now();
        recs[i].connects.push(now);
        recs[i].server = Some(self.devs[i].server);
        // The client's PINGs on this connection (the agent's patched crate).
        self.devs[i].last_in = now;
        let (idx, epoch, ping) = (self.devs[i].idx, self.devs[i].epoch, self.cfg.ping);
        self.timer(idx, ping, epoch, TimerKind::Ping);
        let reconnect = self.devs[i].ever_up;
        self.devs[i].ever_up = true;
        if !reconnect {
            let token = self.devs[i].token();
            self.devs[i].inbox = format!("{}{token}.", inbox_prefix(&self.devs[i].id));
        }
        // The client's subscriptions, first (re)sent: the inbox, then (on a
        // reconnect) every live one, as the `nats` crate replays them.
        let inbox = format!("{}*", self.devs[i].inbox);
        let sid = self.devs[i].inbox_sid;
        self.sub(i, &inbox, sid, recs);
        if reconnect {
            for r in 0..2 {
                let live = match self.cfg.generation {
                    Generation::One => self.devs[i].reads[r]
                        .consumer
                        .as_ref()
                        .map(|c| (c.deliver.clone(), c.sid)),
                    Generation::Two => self.devs[i].reads[r]
                        .sub
                        .map(|sid| (self.republish(i, r), sid)),
                };
                if let Some((s, sid)) = live {
                    self.sub(i, &s, sid, recs);
                }
            }
        }
        if !self.devs[i].info_acked {
            self.publish_info(i, recs);
            return;
        }
        // Reconnected: every read started over.
        for r in 0..2 {
            if self.devs[i].reads[r].started {
                self.start_read(i, r, recs);
            }
        }
    }

    fn publish_info(&mut self, i: usize, recs: &mut [DeviceRecord]) {
        let subject = kv_subject(
            BUCKET_STATUS,
            &status_key(&self.devs[i].id, StatusKey::Info),
        );
        let body = crate::bodies::info(&self.devs[i].id, self.cfg.generation, self.started);
        recs[i].status_puts += 1;
        self.request(i, &subject, &body, Req::Info, recs);
    }

    fn republish(&self, i: usize, r: usize) -> String {
        let (_, bucket, key) = &read_keys(&self.devs[i].id)[r];
        republish_subject(bucket, key)
    }

    /// Reads key `r` anew: a new consumer (gen 1), or a Direct Get (gen 2,
    /// after subscribing to its republished subject the first time).
    fn start_read(&mut self, i: usize, r: usize, recs: &mut [DeviceRecord]) {
        self.devs[i].reads[r].started = true;
        if self.devs[i].conn != Conn::Up {
            return;
        }
        match self.cfg.generation {
            Generation::One => self.create_consumer(i, r, recs),
            Generation::Two => {
                // A new subscription on this connection, then the read
                // (the agent drops the old one: the client had replayed it).
                let s = self.republish(i, r);
                if let Some(old) = self.devs[i].reads[r].sub.take() {
                    self.unsub(i, &s, old, recs);
                }
                self.devs[i].reads[r].complete = false;
                let sid = self.devs[i].next_sid;
                self.devs[i].next_sid += 1;
                self.devs[i].reads[r].sub = Some(sid);
                self.sub(i, &s, sid, recs);
                self.direct_get(i, r, false, recs);
            }
        }
    }

    fn direct_get(&mut self, i: usize, r: usize, check: bool, recs: &mut [DeviceRecord]) {
        let (_, bucket, key) = &read_keys(&self.devs[i].id)[r];
        let subject = device_direct_get_subject(bucket, key);
        recs[i].api_requests += 1;
        let req = Req::Get {
            read: r as u8,
            check,
        };
        self.request(i, &subject, b"", req, recs);
    }

    fn create_consumer(&mut self, i: usize, r: usize, recs: &mut [DeviceRecord]) {
        // The old consumer's subscription goes first (the agent drops it).
        if let Some(old) = self.devs[i].reads[r].consumer.take() {
            self.unsub(i, &old.deliver, old.sid, recs);
        }
        self.devs[i].reads[r].complete = false;
        let bucket = read_keys(&self.devs[i].id)[r].0;
        let name = self.devs[i].token();
        let deliver = format!("{}{name}", deliver_prefix(&self.devs[i].id));
        let sid = self.devs[i].next_sid;
        self.devs[i].next_sid += 1;
        self.sub(i, &deliver, sid, recs);
        let body = serde_json::json!({
            "stream_name": stream_name(bucket),
            "config": {
                "name": name,
                "deliver_subject": deliver,
                "deliver_policy": "last_per_subject",
                "ack_policy": "none",
                "replay_policy": "instant",
                "filter_subject": device_filter(bucket, &self.devs[i].id),
                "flow_control": true,
                "idle_heartbeat": nanos(self.cfg.idle_heartbeat),
                "inactive_threshold": nanos(INACTIVE_THRESHOLD),
                "mem_storage": true,
            }
        })
        .to_string();
        self.devs[i].reads[r].consumer = Some(Consumer {
            sid,
            deliver,
            created: false,
            last_activity: Instant::now(),
            cseq: 0,
        });
        let subject = device_consumer_create_subject(bucket, &name, &self.devs[i].id);
        recs[i].api_requests += 1;
        self.request(
            i,
            &subject,
            body.as_bytes(),
            Req::Create { read: r as u8, sid },
            recs,
        );
    }

    /// A read failed: retry it after the watcher's growing delay.
    fn read_failed(&mut self, i: usize, r: usize, why: String, recs: &mut [DeviceRecord]) {
        recs[i].errors += 1;
        recs[i].last_error = Some(why);
        let d = &mut self.devs[i];
        let delay = d.reads[r].delay.unwrap_or(FIRST_RETRY_DELAY);
        d.reads[r].delay = Some((delay * 2).min(MAX_RETRY_DELAY));
        let (idx, epoch) = (d.idx, d.epoch);
        self.timer(idx, delay, epoch, TimerKind::Retry(r as u8));
    }

    /// Generation 1: the consumer must be replaced (stale, gap, ended).
    fn restart_consumer(&mut self, i: usize, r: usize, why: String, recs: &mut [DeviceRecord]) {
        recs[i].errors += 1;
        recs[i].last_error = Some(why);
        if self.devs[i].reads.iter().all(|x| !x.started || x.complete) {
            recs[i].lost_sync.push(Instant::now());
        }
        self.create_consumer(i, r, recs);
    }

    fn read_complete(&mut self, i: usize, r: usize, recs: &mut [DeviceRecord]) {
        let d = &mut self.devs[i];
        let was = d.reads[r].complete;
        d.reads[r].complete = true;
        d.reads[r].delay = None;
        if self.cfg.generation == Generation::Two {
            self.devs[i].reads[r].check_delay = None;
            let b = self.backstop_delay(i);
            self.schedule_check(i, r, b);
        }
        if was {
            return;
        }
        if r == 0 {
            // The agent reports its workloads on each snapshot, and starts
            // following upgrade intents after the first one.
            self.workloads_report(i, recs);
            if !self.devs[i].reads[1].started {
                self.start_read(i, 1, recs);
            }
        }
        if self.devs[i].reads.iter().all(|x| x.started && x.complete) {
            recs[i].snapshots.push(Instant::now());
        }
    }

    fn applied(&mut self, i: usize, r: usize, seq: u64, recs: &mut [DeviceRecord]) {
        if r == 0 {
            recs[i].applied.push((Instant::now(), seq));
            if self.devs[i].reads[0].complete {
                self.workloads_report(i, recs);
            }
        }
    }

    fn on_msg(&mut self, i: usize, m: Msg, recs: &mut [DeviceRecord]) {
        if self.devs[i].enrolling {
            if m.sid == self.devs[i].inbox_sid {
                self.on_enroll_answer(i, m, recs);
            } else if m.sid == PROBE_SID && m.status.as_deref() != Some("503") {
                // Answered: this connection is the device's own.
                self.approved(i, recs);
            }
            return;
        }
        if m.sid == self.devs[i].inbox_sid {
            return self.on_reply(i, m, recs);
        }
        for r in 0..2 {
            match self.cfg.generation {
                Generation::One => {
                    if self.devs[i].reads[r].consumer.as_ref().map(|c| c.sid) == Some(m.sid) {
                        return self.on_delivery(i, r, m, recs);
                    }
                }
                Generation::Two => {
                    if self.devs[i].reads[r].sub == Some(m.sid) {
                        return self.on_republished(i, r, m, recs);
                    }
                }
            }
        }
    }

    fn on_reply(&mut self, i: usize, m: Msg, recs: &mut [DeviceRecord]) {
        let Some(id) = m
            .subject
            .rsplit('.')
            .next()
            .and_then(|t| t.parse::<u64>().ok())
        else {
            return;
        };
        let d = &mut self.devs[i];
        let Some(pos) = d.reqs.iter().position(|(r, _)| *r == id) else {
            return; // late
        };
        let (_, req) = d.reqs.swap_remove(pos);
        let no_responders = m.status.as_deref() == Some("503");
        match req {
            Req::Info | Req::Status => {
                let ack: Result<PubAckResponse, _> = serde_json::from_slice(&m.payload);
                let ok =
                    !no_responders && matches!(&ack, Ok(a) if a.error.is_none() && a.seq.is_some());
                if ok {
                    recs[i].status_acked += 1;
                } else {
                    recs[i].errors += 1;
                    recs[i].last_error = Some(format!(
                        "status write not acknowledged: {}",
                        String::from_utf8_lossy(&m.payload)
                    ));
                }
                if matches!(req, Req::Info) {
                    if ok {
                        self.info_acked(i, recs);
                    } else {
                        let (idx, epoch) = (d.idx, d.epoch);
                        self.timer(idx, INFO_RETRY_DELAY, epoch, TimerKind::RetryInfo);
                    }
                }
            }
            Req::Create { read, sid } => {
                let r = read as usize;
                if d.reads[r].consumer.as_ref().map(|c| c.sid) != Some(sid) {
                    return;
                }
                let resp: Result<ConsumerCreateResponse, _> = serde_json::from_slice(&m.payload);
                let failure = match (&resp, no_responders) {
                    (_, true) => Some("consumer create: no responders".to_owned()),
                    (Err(e), _) => Some(format!("consumer create: bad answer: {e}")),
                    (Ok(c), _) => match (&c.error, c.num_pending) {
                        (Some(e), _) => Some(format!(
                            "consumer create refused: {} ({})",
                            e.description,
                            e.best_code()
                        )),
                        (None, None) => Some("consumer create: no num_pending".to_owned()),
                        (None, Some(_)) => None,
                    },
                };
                if let Some(why) = failure {
                    if let Some(c) = d.reads[r].consumer.take() {
                        self.unsub(i, &c.deliver, c.sid, recs);
                    }
                    return self.read_failed(i, r, why, recs);
                }
                let pending = resp.ok().and_then(|c| c.num_pending).unwrap_or(0);
                if let Some(c) = d.reads[r].consumer.as_mut() {
                    c.created = true;
                    c.last_activity = Instant::now();
                }
                let (idx, epoch, hb) = (d.idx, d.epoch, self.cfg.idle_heartbeat);
                self.timer(idx, hb, epoch, TimerKind::ConsumerCheck(read));
                if pending == 0 {
                    self.read_complete(i, r, recs);
                }
            }
            Req::Get { read, check } => {
                let r = read as usize;
                let failed = match m.status.as_deref() {
                    Some("404") => {
                        d.reads[r].tracker.on_read(0);
                        None
                    }
                    Some(s) => Some(format!("Direct Get answered {s}")),
                    None => match KeyVersion::from_headers(|n| m.header(n)) {
                        Ok(v) => {
                            if d.reads[r].tracker.on_read(v.seq) {
                                self.applied(i, r, v.seq, recs);
                            }
                            None
                        }
                        Err(e) => Some(format!("Direct Get: {e}")),
                    },
                };
                match (failed, check) {
                    (None, _) => self.read_complete(i, r, recs),
                    (Some(why), true) => self.check_failed(i, r, why, recs),
                    (Some(why), false) => self.read_failed(i, r, why, recs),
                }
            }
        }
    }

    fn info_acked(&mut self, i: usize, recs: &mut [DeviceRecord]) {
        self.devs[i].info_acked = true;
        if !self.devs[i].heartbeats {
            self.devs[i].heartbeats = true;
            let idx = self.devs[i].idx;
            self.timer(idx, Duration::ZERO, 0, TimerKind::Heartbeat);
        }
        self.start_read(i, 0, recs);
    }

    /// The agent's `Jitter::around`: the backstop ± a fifth.
    fn backstop_delay(&mut self, i: usize) -> Duration {
        let b = self.cfg.backstop;
        b - b / 5 + self.devs[i].jitter(b * 2 / 5)
    }

    /// Generation 2: the next periodic check of read `r` in `after`.
    fn schedule_check(&mut self, i: usize, r: usize, after: Duration) {
        let d = &mut self.devs[i];
        d.reads[r].check_token += 1;
        let (idx, tok) = (d.idx, d.reads[r].check_token);
        self.timer(idx, after, 0, TimerKind::Check(r as u8, tok));
    }

    /// A periodic check failed: again after a growing delay.
    fn check_failed(&mut self, i: usize, r: usize, why: String, recs: &mut [DeviceRecord]) {
        recs[i].errors += 1;
        recs[i].last_error = Some(why);
        let delay = self.devs[i].reads[r]
            .check_delay
            .unwrap_or(FIRST_RETRY_DELAY);
        self.devs[i].reads[r].check_delay = Some((delay * 2).min(MAX_RETRY_DELAY));
        self.schedule_check(i, r, delay);
    }

    fn on_delivery(&mut self, i: usize, r: usize, m: Msg, recs: &mut [DeviceRecord]) {
        let Some(c) = self.devs[i].reads[r].consumer.as_mut() else {
            return;
        };
        c.last_activity = Instant::now();
        if let Some(status) = m.status.as_deref() {
            if status != "100" {
                let why = format!("the server ended the consumer: {status}");
                return self.restart_consumer(i, r, why, recs);
            }
            let answer = m
                .reply
                .clone()
                .or_else(|| m.header("Nats-Consumer-Stalled").map(str::to_owned));
            let last = m
                .header("Nats-Last-Consumer")
                .and_then(|v| v.parse::<u64>().ok());
            let cseq = c.cseq;
            if let Some(fc) = answer {
                self.publish(i, &fc, b"", recs);
            }
            if last.is_some_and(|l| l > cseq) {
                return self.restart_consumer(i, r, "missed deliveries".into(), recs);
            }
            return;
        }
        let Some(ack) = m.reply.as_deref().and_then(AckInfo::parse) else {
            return self.restart_consumer(i, r, "delivery without an ack subject".into(), recs);
        };
        if ack.consumer_seq != c.cseq + 1 {
            return self.restart_consumer(i, r, "gap in the consumer sequence".into(), recs);
        }
        c.cseq = ack.consumer_seq;
        self.devs[i].reads[r].tracker.on_read(ack.stream_seq);
        self.applied(i, r, ack.stream_seq, recs);
        if ack.pending == 0 && !self.devs[i].reads[r].complete {
            self.read_complete(i, r, recs);
        }
    }

    fn on_republished(&mut self, i: usize, r: usize, m: Msg, recs: &mut [DeviceRecord]) {
        let v = match KeyVersion::from_headers(|n| m.header(n)) {
            Ok(v) => v,
            Err(e) => {
                recs[i].errors += 1;
                recs[i].last_error = Some(format!("republished {}: {e}", m.subject));
                return;
            }
        };
        match self.devs[i].reads[r].tracker.on_change(&v) {
            Verdict::Apply => self.applied(i, r, v.seq, recs),
            Verdict::ApplyAfterGap { .. } => {
                self.applied(i, r, v.seq, recs);
                // The agent reads again at once, on the open subscription.
                self.schedule_check(i, r, Duration::ZERO);
            }
            Verdict::Stale => {}
        }
    }

    fn on_timer(&mut self, t: Timer, recs: &mut [DeviceRecord]) {
        let i = t.dev as usize;
        match t.kind {
            TimerKind::Connect => {
                if self.devs[i].sock.is_none() {
                    self.connect(i, recs);
                }
            }
            TimerKind::Heartbeat => {
                if self.devs[i].conn == Conn::Up {
                    let body = self.heartbeat_body();
                    self.put_status(i, StatusKey::Heartbeat, &body, recs);
                }
                let next = match self.cfg.status {
                    StatusWrites::Every(hb) => {
                        hb + self.devs[i].jitter((hb / 10).min(Duration::from_secs(3)))
                    }
                    StatusWrites::KeepAlive(k) => k + self.devs[i].jitter(k / 10),
                };
                self.timer(t.dev, next, 0, TimerKind::Heartbeat);
            }
            TimerKind::Ping => {
                let ping = self.cfg.ping;
                let silent = self.devs[i].last_in.elapsed();
                let next = if silent >= ping {
                    if self.devs[i].conn == Conn::Up {
                        proto::ping(&mut self.devs[i].wbuf);
                        self.mark(i);
                    }
                    ping
                } else {
                    ping - silent
                };
                self.timer(t.dev, next, t.epoch, TimerKind::Ping);
            }
            TimerKind::Check(read, token) => {
                let r = read as usize;
                if self.devs[i].reads[r].check_token != token {
                    return;
                }
                if self.devs[i].conn == Conn::Up && self.devs[i].reads[r].complete {
                    self.direct_get(i, r, true, recs);
                }
                // Otherwise the next snapshot schedules the next check.
            }
            TimerKind::ReqTimeout(id) => {
                let d = &mut self.devs[i];
                let Some(pos) = d.reqs.iter().position(|(r, _)| *r == id) else {
                    return;
                };
                let (_, req) = d.reqs.swap_remove(pos);
                let bound = match req {
                    Req::Get { .. } => fleet_common::limits::DIRECT_GET_TIMEOUT,
                    _ => self.cfg.request_timeout,
                };
                let why = format!("no reply within {} s", bound.as_secs());
                match req {
                    Req::Info => {
                        recs[i].errors += 1;
                        recs[i].last_error = Some(format!("device info: {why}"));
                        self.publish_info(i, recs);
                    }
                    Req::Status => {
                        recs[i].errors += 1;
                        recs[i].last_error = Some(format!("status write: {why}"));
                    }
                    Req::Create { read, sid } => {
                        let r = read as usize;
                        if d.reads[r].consumer.as_ref().map(|c| c.sid) == Some(sid) {
                            if let Some(c) = d.reads[r].consumer.take() {
                                self.unsub(i, &c.deliver, c.sid, recs);
                            }
                            self.read_failed(i, r, format!("consumer create: {why}"), recs);
                        }
                    }
                    Req::Get { read, check: true } => {
                        self.check_failed(i, read as usize, format!("Direct Get: {why}"), recs)
                    }
                    Req::Get { read, check: false } => {
                        self.read_failed(i, read as usize, format!("Direct Get: {why}"), recs)
                    }
                }
            }
            TimerKind::ConsumerCheck(read) => {
                let r = read as usize;
                let limit = self.cfg.idle_heartbeat * MISSED_HEARTBEATS;
                let Some(c) = self.devs[i].reads[r].consumer.as_ref() else {
                    return;
                };
                if !c.created {
                    return;
                }
                if c.last_activity.elapsed() > limit {
                    let why = format!(
                        "the consumer sent nothing for {} s",
                        c.last_activity.elapsed().as_secs()
                    );
                    // The new consumer schedules its own check.
                    self.restart_consumer(i, r, why, recs);
                } else {
                    let hb = self.cfg.idle_heartbeat;
                    self.timer(t.dev, hb, t.epoch, TimerKind::ConsumerCheck(read));
                }
            }
            TimerKind::Retry(read) => self.start_read(i, read as usize, recs),
            TimerKind::EnrollTimeout => {
                if self.devs[i].enrolling && self.devs[i].conn == Conn::Up {
                    recs[i].errors += 1;
                    recs[i].last_error = Some(format!(
                        "enrollment: no answer within {} s",
                        ENROLL_ANSWER_TIMEOUT.as_secs()
                    ));
                    self.retry_enrollment(i, None, recs);
                }
            }
            TimerKind::RetryInfo => {
                if self.devs[i].conn == Conn::Up && !self.devs[i].info_acked {
                    self.publish_info(i, recs);
                }
            }
        }
    }
}
