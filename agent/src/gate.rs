//! The mutation gate: the one place that says whether the reconciler may
//! start a runtime mutation, and what is in flight, pending or pulling.
//! Admission and the in-flight mark change together under one lock, so
//! changing the admission (SIGTERM, a change freeze) and starting a
//! mutation never race: after [`MutationGate::close`] or a successful
//! [`MutationGate::freeze`] returns, no mutation the new admission refuses
//! starts, and [`MutationGate::wait_idle`] waits for the one already running.
//!
//! Admissions: `Open` admits everything; `Frozen` (a change freeze) admits
//! only [`MutationKind::LocalRestore`]; `Closed` (draining) admits nothing
//! and is never left.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why the gate is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedBy {
    /// SIGTERM: the agent is draining.
    Shutdown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Open,
    /// A change freeze: only local restores.
    Frozen,
    Closed(ClosedBy),
}

/// What a mutation does, for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MutationKind {
    /// Anything the desired state calls for: create, replace, remove, pull.
    Change,
    /// Restart or recreate a container from its last applied spec with a
    /// local image: admitted during a change freeze.
    LocalRestore,
}

/// What the gate knows, at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateView {
    pub admission: Admission,
    /// The mutation running now, described ("replace web").
    pub in_flight: Option<String>,
    /// Mutations the last reconcile pass planned and has not done yet.
    pub pending: usize,
    /// The image the mutation in flight is pulling now.
    pub pulling: Option<String>,
}

#[derive(Debug)]
pub struct MutationGate {
    state: Mutex<GateView>,
    idle: Condvar,
}

impl Default for MutationGate {
    fn default() -> Self {
        Self {
            state: Mutex::new(GateView {
                admission: Admission::Open,
                in_flight: None,
                pending: 0,
                pulling: None,
            }),
            idle: Condvar::new(),
        }
    }
}

/// A mutation admitted by the gate; dropping it marks it finished.
#[derive(Debug)]
pub struct Permit<'a> {
    gate: &'a MutationGate,
    started: Instant,
}

impl Permit<'_> {
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Marks `image` as being pulled until the returned mark is dropped.
    pub fn pulling(&self, image: &str) -> Pulling<'_> {
        self.gate.lock().pulling = Some(image.to_owned());
        Pulling { gate: self.gate }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.in_flight = None;
        s.pulling = None;
        self.gate.idle.notify_all();
    }
}

/// An image pull in progress; dropping it clears the mark.
#[derive(Debug)]
pub struct Pulling<'a> {
    gate: &'a MutationGate,
}

impl Drop for Pulling<'_> {
    fn drop(&mut self) {
        self.gate.lock().pulling = None;
    }
}

/// What [`MutationGate::freeze`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Froze {
    /// The gate went from open to frozen.
    Now,
    /// It was frozen already; nothing changed.
    Already,
}

impl MutationGate {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, GateView> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits the mutation `what` of `kind`, or refuses it (`None`) when
    /// the admission does not allow it or another mutation is in flight.
    pub fn begin(&self, what: &str, kind: MutationKind) -> Option<Permit<'_>> {
        let mut s = self.lock();
        let admitted = match (s.admission, kind) {
            (Admission::Open, _) => true,
            (Admission::Frozen, MutationKind::LocalRestore) => true,
            (Admission::Frozen, MutationKind::Change) | (Admission::Closed(_), _) => false,
        };
        if !admitted || s.in_flight.is_some() {
            return None;
        }
        s.in_flight = Some(what.to_owned());
        Some(Permit {
            gate: self,
            started: Instant::now(),
        })
    }

    /// Refuses every mutation from now on; returns the one in flight.
    pub fn close(&self, by: ClosedBy) -> Option<String> {
        let mut s = self.lock();
        s.admission = Admission::Closed(by);
        s.in_flight.clone()
    }

    /// The persisted freeze at start: open becomes frozen (a gate already
    /// closed by a signal stays closed).
    pub fn start_frozen(&self) {
        let mut s = self.lock();
        if s.admission == Admission::Open {
            s.admission = Admission::Frozen;
        }
    }

    /// Enters the freeze if `enter` agrees. `enter` runs under the gate's
    /// lock with the gate's view, so nothing starts between its check and
    /// the change; it is not called when the gate is frozen already.
    /// `enter` decides on a closed gate too (it should refuse).
    pub fn freeze<E>(&self, enter: impl FnOnce(&GateView) -> Result<(), E>) -> Result<Froze, E> {
        let mut s = self.lock();
        if s.admission == Admission::Frozen {
            return Ok(Froze::Already);
        }
        enter(&s)?;
        if s.admission == Admission::Open {
            s.admission = Admission::Frozen;
        }
        Ok(Froze::Now)
    }

    /// Leaves the freeze once `leave` succeeds (under the lock, so the
    /// change is recorded before any mutation it admits starts). A closed
    /// gate stays closed; an open one stays open.
    pub fn thaw<E>(&self, leave: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut s = self.lock();
        leave()?;
        if s.admission == Admission::Frozen {
            s.admission = Admission::Open;
        }
        Ok(())
    }

    pub fn admission(&self) -> Admission {
        self.lock().admission
    }

    pub fn set_pending(&self, n: usize) {
        self.lock().pending = n;
    }

    pub fn view(&self) -> GateView {
        self.lock().clone()
    }

    /// Waits up to `timeout` until nothing is in flight; true when idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.in_flight.is_some() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .idle
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use MutationKind::{Change, LocalRestore};

    #[test]
    fn one_mutation_at_a_time_and_none_after_close() {
        let g = MutationGate::new();
        let p = g.begin("create web", Change).expect("admitted");
        assert!(
            g.begin("create db", Change).is_none(),
            "a second mutation in flight"
        );
        assert_eq!(g.view().in_flight.as_deref(), Some("create web"));
        {
            let _pull = p.pulling("localhost/web:1");
            assert_eq!(g.view().pulling.as_deref(), Some("localhost/web:1"));
        }
        assert_eq!(g.view().pulling, None);
        assert_eq!(g.close(ClosedBy::Shutdown).as_deref(), Some("create web"));
        assert!(!g.wait_idle(Duration::from_millis(10)));
        drop(p);
        assert!(g.wait_idle(Duration::from_millis(10)));
        assert!(g.begin("create db", Change).is_none(), "closed");
        assert!(g.begin("restore db", LocalRestore).is_none(), "closed");
        g.set_pending(3);
        assert_eq!(
            g.view(),
            GateView {
                admission: Admission::Closed(ClosedBy::Shutdown),
                in_flight: None,
                pending: 3,
                pulling: None,
            }
        );
    }

    #[test]
    fn frozen_admits_local_restores_only_and_thaws() {
        let g = MutationGate::new();
        let refused: Result<Froze, &str> = g.freeze(|v| {
            assert_eq!(v.admission, Admission::Open);
            Err("busy")
        });
        assert_eq!(refused, Err("busy"));
        assert_eq!(g.admission(), Admission::Open, "a refusal changes nothing");
        assert_eq!(g.freeze(|_| Ok::<(), ()>(())), Ok(Froze::Now));
        assert_eq!(
            g.freeze(|_| -> Result<(), ()> { panic!("not asked again") }),
            Ok(Froze::Already)
        );
        assert!(g.begin("replace web", Change).is_none());
        let p = g.begin("restore web", LocalRestore).expect("a restore");
        drop(p);
        assert_eq!(g.thaw(|| Err("disk")), Err("disk"));
        assert_eq!(g.admission(), Admission::Frozen, "a failed thaw stays");
        assert_eq!(g.thaw(|| Ok::<(), ()>(())), Ok(()));
        assert!(g.begin("replace web", Change).is_some());
    }

    #[test]
    fn a_closed_gate_stays_closed() {
        let g = MutationGate::new();
        g.close(ClosedBy::Shutdown);
        g.start_frozen();
        assert_eq!(g.admission(), Admission::Closed(ClosedBy::Shutdown));
        let r: Result<Froze, &str> = g.freeze(|v| match v.admission {
            Admission::Closed(_) => Err("draining"),
            _ => Ok(()),
        });
        assert_eq!(r, Err("draining"));
        assert_eq!(g.thaw(|| Ok::<(), ()>(())), Ok(()));
        assert_eq!(g.admission(), Admission::Closed(ClosedBy::Shutdown));
        let f = MutationGate::new();
        f.start_frozen();
        assert_eq!(f.admission(), Admission::Frozen);
        f.close(ClosedBy::Shutdown);
        assert!(f.begin("restore web", LocalRestore).is_none());
    }

    #[test]
    fn wait_idle_returns_when_the_mutation_ends_on_another_thread() {
        let g = Arc::new(MutationGate::new());
        let (tx, rx) = std::sync::mpsc::channel();
        let g2 = Arc::clone(&g);
        let t = std::thread::spawn(move || {
            let p = g2.begin("replace web", Change).expect("admitted");
            tx.send(()).expect("send");
            // Hold the permit until the main thread has closed the gate.
            while g2.view().admission == Admission::Open {
                std::thread::yield_now();
            }
            drop(p);
        });
        rx.recv().expect("started");
        g.close(ClosedBy::Shutdown);
        assert!(g.wait_idle(Duration::from_secs(10)));
        t.join().expect("join");
    }
}
