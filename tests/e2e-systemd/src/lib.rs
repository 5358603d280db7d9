//! Agent upgrades end to end under real systemd: this build's
//! device package in the harness's booted Debian 12 container, its agent
//! on a nats-server on the host, artifacts over HTTPS and OCI from the
//! host, every upgrade written by `fleetctl upgrade` as an operator does.
//! Each test asserts the updater journal, the active link, the agent
//! systemd runs (and how many agent processes exist), and `<device>.upgrade`
//! in NATS.
//!
//! | piece | what |
//! |---|---|
//! | [`Fleet`] | the host: nats-server, HTTPS, `fleetctl` (release files, `upgrade`, `artifact push`, `watch`) |
//! | [`Device`] | the container: package, fault-injection updater, short bounds, agent READY |
//! | [`StandIn`] | candidates that misbehave on cue (perl: the image has no python3) |
//! | [`matrix`] | the fault point × outcome table `make test` prints last |
//!
//! What the tests shorten (drop-ins written by [`Device::install`]):
//! the agent unit's `TimeoutStartSec` 4 min → [`AGENT_START_TIMEOUT_SECS`],
//! its `RestartSec` 5 s → [`AGENT_RESTART_SEC`]; the updater's start bound
//! 4 min 15 s → 25 s ([`UPDATER_TEST_BOUNDS`]) and its `RestartSec` 2 s →
//! [`UPDATER_RESTART_SEC`]. Everything else runs with the shipped units
//! and the binding bounds (`docs/design/limits.md`).

mod device;
mod fleet;
pub mod matrix;
mod standin;

pub use device::{
    Device, AGENT_RESTART_SEC, AGENT_START_TIMEOUT_SECS, AGENT_UNIT, BOOTSTRAP, JOURNAL, LINK,
    READY_TIMEOUT, SETTLE, UPDATER, UPDATER_RESTART_SEC, UPDATER_TEST_BOUNDS, UPDATER_UNIT,
    VERSIONS_DIR,
};
pub use fleet::{assert_in_order, phase_text, Fleet, ReleaseFile};
pub use standin::{Run, SelfTest, StandIn, CRASHED_ONCE_MARKER};

/// The agent built as another version by `make test-agents`.
pub use fleet_harness::UPGRADE_TEST_VERSION;
