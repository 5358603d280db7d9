//! Back-off: how long a workload (or a removal) waits after a failure
//! before it is tried again, and when the reconciler must wake for one.

use std::time::{Duration, Instant};

/// First back-off after a failure; doubles per consecutive failure.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(5);
/// Longest back-off.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// A restored container that runs this long ends its back-off; one that
/// needs restoring again sooner counts as failing.
pub const CRASH_LOOP_WINDOW: Duration = Duration::from_secs(60);

/// The back-off after `failures` consecutive failures (1 → 5 s).
pub fn backoff_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (BACKOFF_FIRST * 2u32.pow(doublings)).min(BACKOFF_MAX)
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Backoff {
    pub(super) failures: u32,
    pub(super) not_before: Option<Instant>,
}

impl Backoff {
    pub(super) fn fail(&mut self, now: Instant) -> Duration {
        self.failures += 1;
        let d = backoff_delay(self.failures);
        self.not_before = Some(now + d);
        d
    }
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }
    pub(super) fn blocks(&self, now: Instant) -> bool {
        self.not_before.is_some_and(|t| t > now)
    }
}

/// The earliest back-off still to end after `now`. One that already ended
/// is not a reason to wake: its pass ran when it ended, and a back-off kept
/// after a restore (a crash loop, cleared only once the container has run
/// a minute) would otherwise wake the loop at once, again and again, each
/// wake a `podman ps`.
pub(super) fn next_backoff_end<'a>(
    backoffs: impl Iterator<Item = &'a Backoff>,
    now: Instant,
) -> Option<Instant> {
    backoffs
        .filter_map(|b| b.not_before)
        .filter(|t| *t > now)
        .min()
}

/// Whether a container up for `up_secs` has outlived the crash-loop window.
pub(super) fn up_long_enough(up_secs: i64) -> bool {
    u64::try_from(up_secs).is_ok_and(|s| s >= CRASH_LOOP_WINDOW.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_minutes() {
        assert_eq!(backoff_delay(1), Duration::from_secs(5));
        assert_eq!(backoff_delay(2), Duration::from_secs(10));
        assert_eq!(backoff_delay(3), Duration::from_secs(20));
        assert_eq!(backoff_delay(7), Duration::from_secs(300));
        assert_eq!(backoff_delay(1000), Duration::from_secs(300));
        let now = Instant::now();
        let mut b = Backoff::default();
        assert!(!b.blocks(now));
        b.fail(now);
        assert!(b.blocks(now));
        assert!(!b.blocks(now + Duration::from_secs(6)));
        b.clear();
        assert_eq!(b, Backoff::default());
    }

    #[test]
    fn an_ended_backoff_never_wakes_the_loop_again() {
        let now = Instant::now();
        let mut crash_loop = Backoff::default();
        crash_loop.fail(now);
        let mut removal = Backoff::default();
        removal.fail(now);
        removal.fail(now);
        let ends = crash_loop.not_before.expect("set");
        let all = [crash_loop.clone(), removal.clone(), Backoff::default()];
        assert_eq!(next_backoff_end(all.iter(), now), Some(ends));
        // After the first has ended (and is kept: the container runs but
        // not yet a minute), only the later one is a reason to wake.
        let later = removal.not_before.expect("set");
        let after = ends + Duration::from_millis(1);
        assert_eq!(next_backoff_end(all.iter(), after), Some(later));
        assert_eq!(next_backoff_end(all.iter(), later), None);
    }
}
