//! `fleet-common`: everything the Harmony fleet daemons and tools share —
//! wire contracts, validation, limits, durable file I/O, the local socket
//! protocol, NATS names and the device path layout. The daemons depend on
//! this crate and never on each other.

pub mod b64;
pub mod callout;
pub mod contracts;
pub mod durable;
#[cfg(feature = "https")]
pub mod https;
pub mod jetstream;
pub mod layout;
pub mod limits;
pub mod logging;
pub mod nats_config;
pub mod nkey;
pub mod presence;
pub mod process;
pub mod selector;
pub mod signals;
pub mod socket;
pub mod subjects;
pub mod time;
pub mod users;
pub mod validate;

pub use layout::Layout;
pub use time::Timestamp;
