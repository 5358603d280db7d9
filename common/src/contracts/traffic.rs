//! A device's own NATS traffic, counted by its agent from the kernel's view
//! of its TCP connection (`TCP_INFO`), reported at a slow cadence at
//! `fleet-status` `<device>.traffic` ([`TrafficReport`]).
//!
//! Read by operators' tools, which must keep reading the reports of newer
//! agents: unknown fields are taken without an error, so a later agent can
//! extend the report in place.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// IPv4 + TCP header bytes of one segment with the timestamp option, as
/// Linux sends them (20 + 20 + 12): what a segment costs on the wire beyond
/// its TCP payload. IPv6 adds 20.
pub const TCP_IPV4_HEADER_BYTES: u64 = 52;

/// Counters of the agent's NATS connections over some span: TCP payload
/// (every NATS protocol byte, TLS records included) and segments, each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TrafficCounters {
    /// TCP payload bytes the server acknowledged (`tcpi_bytes_acked`).
    pub bytes_sent: u64,
    /// TCP payload bytes received (`tcpi_bytes_received`).
    pub bytes_received: u64,
    /// Segments sent (`tcpi_segs_out`), retransmissions and pure ACKs included.
    pub segments_sent: u64,
    /// Segments received (`tcpi_segs_in`).
    pub segments_received: u64,
    /// New connections after the first (reconnects, re-connections with a
    /// fresh token).
    pub reconnects: u32,
}

impl TrafficCounters {
    /// Bytes on the wire both ways: TCP payload plus IPv4/TCP headers
    /// counted from the segments (link-layer framing not included).
    pub fn wire_bytes(&self) -> u64 {
        self.bytes_sent
            .saturating_add(self.bytes_received)
            .saturating_add(
                self.segments_sent
                    .saturating_add(self.segments_received)
                    .saturating_mul(TCP_IPV4_HEADER_BYTES),
            )
    }

    /// Adds `other` (saturating).
    pub fn add(&mut self, other: &TrafficCounters) {
        self.bytes_sent = self.bytes_sent.saturating_add(other.bytes_sent);
        self.bytes_received = self.bytes_received.saturating_add(other.bytes_received);
        self.segments_sent = self.segments_sent.saturating_add(other.segments_sent);
        self.segments_received = self
            .segments_received
            .saturating_add(other.segments_received);
        self.reconnects = self.reconnects.saturating_add(other.reconnects);
    }
}

/// The counters of one UTC day (`2026-12-02`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TrafficDay {
    /// The UTC date, `YYYY-MM-DD`.
    pub day: String,
    #[serde(flatten)]
    pub counters: TrafficCounters,
}

/// `fleet-status` `<device>.traffic`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TrafficReport {
    /// When this agent process started counting.
    pub since: Timestamp,
    /// Everything since `since`.
    pub total: TrafficCounters,
    /// The current UTC day so far (counted since `since` if it started today).
    pub today: TrafficDay,
    /// The previous UTC day, when the agent ran through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yesterday: Option<TrafficDay>,
    pub observed_at: Timestamp,
}
