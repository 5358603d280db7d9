//! The traffic account: the kernel's per-connection counters turned into
//! totals since the agent started and per UTC day ([`TrafficBook`]).
//!
//! Each reading of a connection (by its socket cookie) adds what grew since
//! the last reading of that connection; a connection seen for the first
//! time adds all it has (its TLS handshake and connect included). A
//! connection that closed keeps what its last reading added: the traffic
//! of its last moments before that reading is the only part not counted
//! (the sampler reads every few seconds, and once more while the kernel
//! still finishes a closed socket).

use std::collections::HashMap;

use fleet_common::contracts::{TrafficCounters, TrafficDay, TrafficReport};
use fleet_common::Timestamp;

use super::diag::TcpReading;

/// Readings after which a connection not seen any more is forgotten.
const FORGET_AFTER_READINGS: u64 = 16;

/// What one connection had at its last reading.
#[derive(Debug, Clone, Copy)]
struct Last {
    reading: TcpReading,
    /// The book's reading count when it was last seen.
    seen: u64,
}

/// Totals since the start and per UTC day.
#[derive(Debug)]
pub struct TrafficBook {
    since: Timestamp,
    total: TrafficCounters,
    today: TrafficDay,
    yesterday: Option<TrafficDay>,
    connections: HashMap<u64, Last>,
    readings: u64,
    /// The connection generation at the last reading.
    generation: u64,
}

impl TrafficBook {
    /// An empty book starting at `now`, when the connection generation is
    /// `generation` (later generations are reconnects).
    pub fn new(now: Timestamp, generation: u64) -> Self {
        Self {
            since: now,
            total: TrafficCounters::default(),
            today: TrafficDay {
                day: now.utc_date(),
                counters: TrafficCounters::default(),
            },
            yesterday: None,
            connections: HashMap::new(),
            readings: 0,
            generation,
        }
    }

    /// Whether `cookie` is a connection this book follows (a closed socket
    /// the kernel still finishes has no inode: only its cookie says it was
    /// ours).
    pub fn knows(&self, cookie: u64) -> bool {
        self.connections.contains_key(&cookie)
    }

    /// Adds what grew since the last reading, at `now`, with the
    /// connection generation `generation`.
    pub fn record(&mut self, now: Timestamp, readings: &[TcpReading], generation: u64) {
        self.roll_day(now);
        self.readings += 1;
        let mut grew = TrafficCounters {
            reconnects: u32::try_from(generation.saturating_sub(self.generation))
                .unwrap_or(u32::MAX),
            ..TrafficCounters::default()
        };
        self.generation = self.generation.max(generation);
        for r in readings {
            let before = self.connections.get(&r.cookie).map(|l| l.reading);
            grew.add(&growth(before.as_ref(), r));
            self.connections.insert(
                r.cookie,
                Last {
                    reading: *r,
                    seen: self.readings,
                },
            );
        }
        let now_count = self.readings;
        self.connections
            .retain(|_, l| now_count - l.seen < FORGET_AFTER_READINGS);
        self.total.add(&grew);
        self.today.counters.add(&grew);
    }

    fn roll_day(&mut self, now: Timestamp) {
        let day = now.utc_date();
        if day != self.today.day {
            let ended = std::mem::replace(
                &mut self.today,
                TrafficDay {
                    day,
                    counters: TrafficCounters::default(),
                },
            );
            self.yesterday = Some(ended);
        }
    }

    /// The report as of `now`.
    pub fn report(&mut self, now: Timestamp) -> TrafficReport {
        self.roll_day(now);
        TrafficReport {
            since: self.since,
            total: self.total,
            today: self.today.clone(),
            yesterday: self.yesterday.clone(),
            observed_at: now,
        }
    }
}

/// What a connection's counters grew by since `before` (all of them for a
/// connection not seen before).
fn growth(before: Option<&TcpReading>, now: &TcpReading) -> TrafficCounters {
    let b = before.copied();
    let sub64 = |n: u64, f: fn(&TcpReading) -> u64| n.saturating_sub(b.as_ref().map_or(0, f));
    let sub32 =
        |n: u32, f: fn(&TcpReading) -> u32| u64::from(n.saturating_sub(b.as_ref().map_or(0, f)));
    TrafficCounters {
        bytes_sent: sub64(now.bytes_acked, |r| r.bytes_acked),
        bytes_received: sub64(now.bytes_received, |r| r.bytes_received),
        segments_sent: sub32(now.segs_out, |r| r.segs_out),
        segments_received: sub32(now.segs_in, |r| r.segs_in),
        reconnects: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse(s).expect("timestamp")
    }

    fn conn(cookie: u64, sent: u64, received: u64, segs: u32) -> TcpReading {
        TcpReading {
            cookie,
            inode: 1,
            remote_port: 4222,
            bytes_acked: sent,
            bytes_received: received,
            segs_out: segs,
            segs_in: segs,
        }
    }

    #[test]
    fn readings_add_what_grew_and_a_closed_connection_keeps_its_count() {
        let mut b = TrafficBook::new(at("2026-12-02T10:00:00Z"), 1);
        b.record(at("2026-12-02T10:00:10Z"), &[conn(1, 5000, 4000, 10)], 1);
        b.record(at("2026-12-02T10:00:20Z"), &[conn(1, 5200, 4100, 12)], 1);
        // The first connection closed; a reconnect made the second.
        b.record(at("2026-12-02T10:00:30Z"), &[conn(2, 3000, 2000, 8)], 2);
        let r = b.report(at("2026-12-02T10:00:31Z"));
        assert_eq!(r.total.bytes_sent, 8200);
        assert_eq!(r.total.bytes_received, 6100);
        assert_eq!(r.total.segments_sent, 20);
        assert_eq!(r.total.segments_received, 20);
        assert_eq!(r.total.reconnects, 1);
        assert_eq!(r.today.day, "2026-12-02");
        assert_eq!(r.today.counters, r.total);
        assert_eq!(r.yesterday, None);
        assert!(b.knows(2) && b.knows(1));
    }

    #[test]
    fn a_new_utc_day_starts_from_zero_and_keeps_yesterday() {
        let mut b = TrafficBook::new(at("2026-12-02T23:59:00Z"), 1);
        b.record(at("2026-12-02T23:59:50Z"), &[conn(1, 1000, 1000, 4)], 1);
        b.record(at("2026-12-03T00:00:10Z"), &[conn(1, 1500, 1200, 6)], 1);
        let r = b.report(at("2026-12-03T00:00:11Z"));
        assert_eq!(r.total.bytes_sent, 1500);
        let y = r.yesterday.expect("yesterday");
        assert_eq!(y.day, "2026-12-02");
        assert_eq!(y.counters.bytes_sent, 1000);
        assert_eq!(r.today.day, "2026-12-03");
        assert_eq!(r.today.counters.bytes_sent, 500);
        assert_eq!(r.today.counters.bytes_received, 200);
        // A report on a later day with no reading rolls the day too.
        let r = b.report(at("2026-12-04T08:00:00Z"));
        assert_eq!(r.today.counters, TrafficCounters::default());
        assert_eq!(r.yesterday.expect("yesterday").day, "2026-12-03");
    }

    #[test]
    fn a_connection_gone_for_many_readings_is_forgotten() {
        let mut b = TrafficBook::new(at("2026-12-02T10:00:00Z"), 1);
        b.record(at("2026-12-02T10:00:01Z"), &[conn(1, 10, 10, 1)], 1);
        for _ in 0..FORGET_AFTER_READINGS {
            b.record(at("2026-12-02T10:00:02Z"), &[], 1);
        }
        assert!(!b.knows(1));
        assert_eq!(b.report(at("2026-12-02T10:00:03Z")).total.bytes_sent, 10);
    }
}
