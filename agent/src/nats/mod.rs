//! The agent's NATS client: the `nats` crate for the core protocol
//! (connect, TLS, auth, reconnect, publish, subscribe, headers) and a thin
//! JetStream layer of our own that stays inside the per-device permissions
//! of DESIGN.md ("How a device talks to JetStream"):
//!
//! - [`connection`]: connecting (15 s per attempt, retried over a window),
//!   reconnect tracking, and the [`Nats`] handle every thread shares.
//! - [`inbox`]: request/reply over one `_INBOX.<device>.<random>.*`
//!   subscription, with a dispatcher thread routing replies to callers.
//! - [`consumer`]: subject-scoped push consumers on a KV bucket, flow
//!   control, idle heartbeats, the own-key check and snapshot accounting.
//! - [`watch`]: the thread that keeps one consumer alive and turns it into
//!   a complete snapshot followed by deltas, recreating it after a
//!   reconnect, a gap or three missed heartbeats. Generic over the bucket.
//! - [`kv`]: publishing a KV value and waiting for the JetStream ack.

pub mod connection;
pub mod consumer;
pub mod inbox;
pub mod kv;
pub mod watch;

pub use connection::{connect, Nats, NatsError, Reconnect};
pub use consumer::KvConsumer;
pub use kv::PublishError;
pub use watch::{WatchEvent, WatchHandle, Watcher};
