//! Jitter for periodic work, so a fleet does not act in step: xorshift
//! seeded from the OS (through a v4 UUID).

use std::time::Duration;

#[derive(Debug)]
pub struct Jitter(u64);

impl Jitter {
    pub fn new() -> Self {
        let seed = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
        Self(seed)
    }

    /// A duration uniformly in `0..=max`.
    pub fn up_to(&mut self, max: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.0 % max_ms.saturating_add(1))
    }

    /// `interval` ± a fifth of it.
    pub fn around(&mut self, interval: Duration) -> Duration {
        let spread = interval / 5;
        interval - spread + self.up_to(spread * 2)
    }
}

impl Default for Jitter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn around_stays_within_a_fifth() {
        let mut j = Jitter::new();
        for _ in 0..1000 {
            let d = j.around(Duration::from_secs(300));
            assert!(
                d >= Duration::from_secs(240) && d <= Duration::from_secs(360),
                "{d:?}"
            );
        }
    }
}
