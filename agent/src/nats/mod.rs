//! The agent's NATS client: the `nats` crate for the core protocol
//! (connect, TLS, auth, reconnect, publish, subscribe, headers) and a thin
//! JetStream layer of our own that stays inside the per-device permissions
//! of `docs/design/protocol.md` ("Permissions"):
//!
//! - [`connection`]: connecting (15 s per attempt, retried over a window),
//!   reconnect tracking, and the [`Nats`] handle every thread shares;
//!   below it `renew` replaces bearer-token links, `link` opens and closes
//!   one link, `options` builds the client's options and callbacks, and
//!   `state` holds what a connection is made of and what its callbacks
//!   report.
//! - [`inbox`]: request/reply over one `_INBOX.<device>.<random>.*`
//!   subscription, with a dispatcher thread routing replies to callers.
//! - [`direct`]: reading one key of this device with Direct Get in the
//!   subject-appended form (no consumer).
//! - [`watch`]: the thread that keeps one key current: its republished
//!   changes, a Direct Get after a subscribe, a reconnect, a gap or a
//!   resync, and a jittered periodic check. Generic over the key.
//! - [`kv`]: publishing a KV value and waiting for the JetStream ack.

pub mod connection;
pub mod direct;
pub mod inbox;
pub mod kv;
mod link;
mod options;
pub use options::enrollment_options;
mod renew;
mod state;
pub mod watch;

pub use connection::{connect, Denial, Nats, NatsError};
pub use direct::{read_key, KeyRead};
pub use kv::PublishError;
pub use state::{Pings, Reconnect};
pub use watch::{WatchEvent, WatchHandle, Watcher};
