//! Termination signals, handled synchronously: no signal handler runs
//! arbitrary code; one thread waits for the signal with `sigwait`.
//!
//! Steps: [`TerminationSignals::block`] blocks SIGTERM and SIGINT in the
//! calling thread. Call it first in `main`, before any thread is spawned
//! (libraries spawn threads too), so every thread inherits the mask and the
//! kernel can deliver the signal only to the waiter. Then
//! [`TerminationSignals::spawn_waiter`] starts the named thread that calls
//! `sigwait` in a loop and reports each signal.
//!
//! Child processes start with an empty mask: the standard library resets
//! it before `exec`, so a `podman` or `systemctl` child still dies on
//! SIGTERM.

use std::fmt;
use std::io;
use std::thread::{self, JoinHandle};

use nix::sys::signal::{SigSet, Signal};

/// Stack of the waiter thread: it only calls `sigwait` and a callback.
const WAITER_STACK_BYTES: usize = 64 * 1024;

/// A termination request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermSignal {
    /// SIGTERM: systemd stopping the unit, or the updater through systemd.
    Term,
    /// SIGINT: Ctrl-C in a terminal.
    Int,
}

impl TermSignal {
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "SIGTERM",
            Self::Int => "SIGINT",
        }
    }
}

impl fmt::Display for TermSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Blocking or waiting for signals failed.
#[derive(Debug)]
pub enum SignalError {
    Block(nix::Error),
    Wait(nix::Error),
    Spawn(io::Error),
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Block(e) => write!(f, "blocking SIGTERM and SIGINT: {e}"),
            Self::Wait(e) => write!(f, "waiting for SIGTERM or SIGINT: {e}"),
            Self::Spawn(e) => write!(f, "starting the signal thread: {e}"),
        }
    }
}

impl std::error::Error for SignalError {}

/// SIGTERM and SIGINT, blocked in the thread that called [`Self::block`]
/// (and every thread it spawns afterwards).
#[derive(Debug)]
pub struct TerminationSignals {
    set: SigSet,
}

impl TerminationSignals {
    /// Blocks SIGTERM and SIGINT in the calling thread. Call before spawning
    /// any thread.
    pub fn block() -> Result<Self, SignalError> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        set.thread_block().map_err(SignalError::Block)?;
        Ok(Self { set })
    }

    /// Waits until SIGTERM or SIGINT is pending, and takes it.
    pub fn wait(&self) -> Result<TermSignal, SignalError> {
        loop {
            match self.set.wait() {
                Ok(Signal::SIGTERM) => return Ok(TermSignal::Term),
                Ok(Signal::SIGINT) => return Ok(TermSignal::Int),
                // INVARIANT: the set holds only the two signals above.
                Ok(_) => continue,
                Err(nix::Error::EINTR) => continue,
                Err(e) => return Err(SignalError::Wait(e)),
            }
        }
    }

    /// Starts the thread `name` that calls `on_signal` for every SIGTERM or
    /// SIGINT, for the life of the process. It is never joined: it blocks
    /// in `sigwait`, holds no state, and ends with the process.
    pub fn spawn_waiter(
        self,
        name: &str,
        on_signal: impl Fn(TermSignal) + Send + 'static,
    ) -> Result<JoinHandle<()>, SignalError> {
        thread::Builder::new()
            .name(name.to_owned())
            .stack_size(WAITER_STACK_BYTES)
            .spawn(move || loop {
                match self.wait() {
                    Ok(sig) => on_signal(sig),
                    Err(e) => {
                        log::error!(
                            "{e}; the process can no longer be stopped cleanly by a signal"
                        );
                        return;
                    }
                }
            })
            .map_err(SignalError::Spawn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_sigterm_is_taken_by_wait() {
        // Directed at this thread only, so the test runner's other threads
        // (which do not block it) never see it.
        let signals = TerminationSignals::block().expect("block");
        nix::sys::pthread::pthread_kill(nix::sys::pthread::pthread_self(), Signal::SIGTERM)
            .expect("pthread_kill");
        assert_eq!(signals.wait().expect("wait"), TermSignal::Term);
        nix::sys::pthread::pthread_kill(nix::sys::pthread::pthread_self(), Signal::SIGINT)
            .expect("pthread_kill");
        assert_eq!(signals.wait().expect("wait"), TermSignal::Int);
        assert_eq!(TermSignal::Term.to_string(), "SIGTERM");
    }
}
