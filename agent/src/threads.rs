//! Small helpers for the agent's long-lived threads: spawning with a name
//! and a small stack, and joining with a time limit.

use std::io;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Stack of the agent's own threads. They parse bounded JSON and run
/// podman through `run_bounded`; nothing recurses deeply.
pub const STACK_BYTES: usize = 256 * 1024;

/// Spawns the named thread `name` with [`STACK_BYTES`] of stack.
pub fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<T>> {
    thread::Builder::new()
        .name(name.to_owned())
        .stack_size(STACK_BYTES)
        .spawn(f)
}

/// Joins `h` if it finishes within `timeout`; otherwise logs that thread
/// `name` did not exit and leaves it (the process is about to exit).
/// Returns the thread's result when it joined.
pub fn join_within<T>(h: JoinHandle<T>, timeout: Duration, name: &str) -> Option<T> {
    let deadline = Instant::now() + timeout;
    while !h.is_finished() {
        if Instant::now() >= deadline {
            log::error!(
                "thread {name} did not exit within {} ms",
                timeout.as_millis()
            );
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
    match h.join() {
        Ok(v) => Some(v),
        Err(_) => {
            log::error!("thread {name} panicked");
            None
        }
    }
}

/// Stack of a helper thread running one bounded call.
const CALL_STACK_BYTES: usize = 128 * 1024;

/// Runs `f` on a helper thread named `name` and waits at most `timeout`
/// for its result; `None` on timeout (the helper is left to finish on its
/// own). For library calls that can block without a bound, such as the
/// NATS crate's flush and close while it is reconnecting.
pub fn call_within<T: Send + 'static>(
    name: &str,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = thread::Builder::new()
        .name(name.to_owned())
        .stack_size(CALL_STACK_BYTES)
        .spawn(move || {
            let _ = tx.send(f());
        });
    match spawned {
        Ok(_) => rx.recv_timeout(timeout).ok(),
        Err(e) => {
            log::error!("starting thread {name}: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_within_returns_the_result_or_gives_up() {
        assert_eq!(call_within("t-fast", Duration::from_secs(5), || 7), Some(7));
        let start = Instant::now();
        let r = call_within("t-slow", Duration::from_millis(50), || {
            thread::sleep(Duration::from_secs(2));
            7
        });
        assert_eq!(r, None);
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
