//! Times across processes: an [`Instant`] means nothing outside the
//! process that took it, but on Linux it is read from CLOCK_MONOTONIC,
//! which every process on the machine shares. A worker sends its times as
//! CLOCK_MONOTONIC nanoseconds; the coordinator turns them back into its
//! own `Instant`s. Each side converts through one pair (an `Instant` and
//! the clock's reading) taken together at its start.

use std::time::{Duration, Instant};

use rustix::time::{clock_gettime, ClockId};

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// One (`Instant`, CLOCK_MONOTONIC) pair: converts between the two.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    instant: Instant,
    ns: u64,
}

impl Clock {
    /// The pair taken now.
    pub fn new() -> Clock {
        Clock {
            instant: Instant::now(),
            ns: monotonic_ns(),
        }
    }

    /// `t` as CLOCK_MONOTONIC nanoseconds.
    pub fn to_ns(&self, t: Instant) -> u64 {
        if t >= self.instant {
            self.ns
                .saturating_add(u64::try_from((t - self.instant).as_nanos()).unwrap_or(u64::MAX))
        } else {
            self.ns
                .saturating_sub(u64::try_from((self.instant - t).as_nanos()).unwrap_or(u64::MAX))
        }
    }

    /// CLOCK_MONOTONIC nanoseconds as an `Instant` of this process (one
    /// before this process's earliest representable `Instant` is clamped to
    /// the pair's own).
    pub fn to_instant(&self, ns: u64) -> Instant {
        if ns >= self.ns {
            self.instant + Duration::from_nanos(ns - self.ns)
        } else {
            self.instant
                .checked_sub(Duration::from_nanos(self.ns - ns))
                .unwrap_or(self.instant)
        }
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_round_trip_through_monotonic_nanoseconds() {
        let c = Clock::new();
        let later = Instant::now() + Duration::from_millis(1500);
        let earlier = c.instant - Duration::from_millis(20);
        for t in [c.instant, later, earlier] {
            assert_eq!(c.to_instant(c.to_ns(t)), t);
        }
        assert_eq!(
            c.to_ns(later) - c.to_ns(earlier),
            u64::try_from((later - earlier).as_nanos()).expect("1.52 s in u64 ns")
        );
    }

    #[test]
    fn an_instant_is_the_monotonic_clock_shared_by_another_pair() {
        // Two pairs taken apart (as in two processes) agree on one moment
        // to within the time it takes to read the clock twice.
        let a = Clock::new();
        std::thread::sleep(Duration::from_millis(5));
        let b = Clock::new();
        let t = Instant::now();
        let diff = a.to_ns(t).abs_diff(b.to_ns(t));
        assert!(diff < 1_000_000, "the pairs disagree by {diff} ns");
        let before = monotonic_ns();
        let now = a.to_ns(Instant::now());
        let after = monotonic_ns();
        assert!(
            before <= now + 1_000_000 && now <= after + 1_000_000,
            "{before} {now} {after}"
        );
    }
}
