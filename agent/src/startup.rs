//! Start-up steps that name themselves while they are waited on:
//! a stalled start-up logs what it waits for and for how long, at least
//! every [`STEP_REPORT_INTERVAL`], instead of staying silent until a
//! window ends.
//!
//! The main thread marks each step it blocks on ([`StartupSteps::begin`],
//! ended when the returned [`Step`] drops); a step that ends on its own
//! after readiness (the first intent snapshot) is watched with a probe
//! ([`StartupSteps::until`]). The `agent-startup` thread wakes every
//! [`TICK`], ends watched steps whose probe says done, and logs each step
//! pending for another interval (before readiness, also as systemd
//! `STATUS=`). It exits once [`StartupSteps::close`] was called and nothing
//! is pending, or at shutdown.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::notify;
use crate::shutdown::Shutdown;
use crate::threads;

/// How often a step still waited on is logged: a stall names itself
/// within this (at least every 10 s).
pub const STEP_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// How often the reporter checks shutdown and watched steps' probes.
const TICK: Duration = Duration::from_secs(1);
/// Bound on joining the reporter once woken to exit: it only has to take
/// its lock and return (the drain budget keeps a second for closing).
const JOIN_TIMEOUT: Duration = Duration::from_millis(200);

/// A probe telling whether a watched step is done.
type Probe = Box<dyn Fn() -> bool + Send>;

struct Pending {
    id: u64,
    what: String,
    since: Instant,
    next_report: Instant,
    probe: Option<Probe>,
}

#[derive(Default)]
struct State {
    pending: Vec<Pending>,
    next_id: u64,
    closed: bool,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    changed: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(self: &Arc<Self>, what: &str, probe: Option<Probe>) -> u64 {
        let now = Instant::now();
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        s.pending.push(Pending {
            id,
            what: what.to_owned(),
            since: now,
            next_report: now + STEP_REPORT_INTERVAL,
            probe,
        });
        id
    }

    fn end(&self, id: u64) {
        let mut s = self.lock();
        if let Some(i) = s.pending.iter().position(|p| p.id == id) {
            let p = s.pending.remove(i);
            log_done(&p);
        }
        self.changed.notify_all();
    }
}

/// A step that took long enough to have been reported says when it ended
/// (done or failed: a failure is logged by the caller).
fn log_done(p: &Pending) {
    let took = p.since.elapsed();
    if took >= STEP_REPORT_INTERVAL {
        log::info!(step = p.what.as_str(); "start-up: no longer waiting for {} after {} s", p.what, took.as_secs());
    }
}

/// The reporter and the steps it knows of.
pub struct StartupSteps {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StartupSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.inner.lock();
        let what: Vec<&str> = s.pending.iter().map(|p| p.what.as_str()).collect();
        f.debug_struct("StartupSteps")
            .field("pending", &what)
            .finish()
    }
}

/// A step under way; it ends when dropped.
#[must_use = "the step ends when this is dropped"]
pub struct Step {
    inner: Arc<Inner>,
    id: u64,
}

impl Drop for Step {
    fn drop(&mut self) {
        self.inner.end(self.id);
    }
}

impl StartupSteps {
    /// Starts `agent-startup`.
    pub fn spawn(shutdown: Arc<Shutdown>) -> io::Result<Self> {
        let inner = Arc::new(Inner::default());
        let i = Arc::clone(&inner);
        let thread = threads::spawn("agent-startup", move || report(&i, &shutdown))?;
        Ok(Self {
            inner,
            thread: Some(thread),
        })
    }

    /// Marks `what` as waited on from now until the returned step drops.
    pub fn begin(&self, what: &str) -> Step {
        Step {
            inner: Arc::clone(&self.inner),
            id: self.inner.add(what, None),
        }
    }

    /// Marks `what` as waited on until `done` returns true (checked every
    /// [`TICK`] by the reporter).
    pub fn until(&self, what: &str, done: impl Fn() -> bool + Send + 'static) {
        self.inner.add(what, Some(Box::new(done)));
    }

    /// No step will begin any more: the reporter exits once the watched
    /// ones are done.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.inner.changed.notify_all();
    }
}

impl Drop for StartupSteps {
    /// Start-up returned early, or the agent is stopping: the reporter,
    /// woken, drops what is pending and exits.
    fn drop(&mut self) {
        {
            let mut s = self.inner.lock();
            s.closed = true;
            s.pending.clear();
            self.inner.changed.notify_all();
        }
        if let Some(t) = self.thread.take() {
            threads::join_within(t, JOIN_TIMEOUT, "agent-startup");
        }
    }
}

/// The `agent-startup` loop.
fn report(inner: &Inner, shutdown: &Shutdown) {
    let mut s = inner.lock();
    loop {
        if shutdown.is_requested() || (s.closed && s.pending.is_empty()) {
            return;
        }
        let now = Instant::now();
        s.pending.retain(|p| {
            let done = p.probe.as_ref().is_some_and(|done| done());
            if done {
                log_done(p);
            }
            !done
        });
        let before_ready = !s.closed;
        for p in s.pending.iter_mut().filter(|p| now >= p.next_report) {
            let secs = now.duration_since(p.since).as_secs();
            log::warn!(step = p.what.as_str(); "start-up: still waiting for {} after {secs} s", p.what);
            // Under the lock: the step cannot end (and the main thread
            // cannot move STATUS on) before this is sent.
            if before_ready {
                notify::status(&format!("waiting for {} ({secs} s)", p.what));
            }
            p.next_report = now + STEP_REPORT_INTERVAL;
        }
        // Woken for the next report when it is due, not up to a tick
        // after: the figure logged is then the step's whole seconds.
        let wait = s
            .pending
            .iter()
            .map(|p| p.next_report.saturating_duration_since(Instant::now()))
            .fold(TICK, Duration::min);
        s = inner
            .changed
            .wait_timeout(s, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn the_reporter_exits_when_closed_and_every_step_is_done() {
        let shutdown = Arc::new(Shutdown::new());
        let steps = StartupSteps::spawn(Arc::clone(&shutdown)).expect("spawn");
        let step = steps.begin("NATS connect");
        let flag = Arc::new(AtomicBool::new(false));
        let f = Arc::clone(&flag);
        steps.until("intent snapshot", move || f.load(Ordering::SeqCst));
        assert_eq!(
            format!("{steps:?}"),
            r#"StartupSteps { pending: ["NATS connect", "intent snapshot"] }"#
        );
        drop(step);
        steps.close();
        flag.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !steps.thread.as_ref().is_some_and(|t| t.is_finished()) {
            assert!(Instant::now() < deadline, "the reporter did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(format!("{steps:?}"), r#"StartupSteps { pending: [] }"#);
    }
}
