//! The shared "stop now" flag every loop checks, with an interruptible
//! sleep so no thread waits out a back-off after a SIGTERM.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Set once, never cleared.
#[derive(Debug, Default)]
pub struct Shutdown {
    requested: Mutex<bool>,
    wake: Condvar,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every loop to stop, and wakes every sleeper.
    pub fn request(&self) {
        let mut r = self.requested.lock().unwrap_or_else(|p| p.into_inner());
        *r = true;
        self.wake.notify_all();
    }

    pub fn is_requested(&self) -> bool {
        *self.requested.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps for `d` or until shutdown is requested; true when it was.
    pub fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut r = self.requested.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if *r {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            r = self
                .wake
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn request_wakes_a_sleeper_at_once() {
        let s = Arc::new(Shutdown::new());
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            (s2.sleep(Duration::from_secs(60)), start.elapsed())
        });
        // Poll until the sleeper has certainly started, then request.
        std::thread::sleep(Duration::from_millis(50));
        s.request();
        let (woken, took) = t.join().expect("join");
        assert!(woken);
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(s.is_requested());
        assert!(s.sleep(Duration::from_secs(60)), "set flags return at once");
        assert!(!Shutdown::new().sleep(Duration::from_millis(1)));
    }
}
