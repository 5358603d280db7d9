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
