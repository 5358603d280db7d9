//! `fleet-updater`: the root daemon that replaces the fleet agent binary
//! through a durable, crash-safe transaction with rollback
//! (`docs/design/upgrade.md`).
//!
//! | module | owns |
//! |---|---|
//! | `daemon` | start-up order: journal, recovery, socket, `READY=1` |
//! | `transaction` | prepare, probe, cutover, rollback, the recovery table |
//! | `journal` | loading and writing the durable journal |
//! | `published` | the copy of the state that `status` reads |
//! | `state` | keeping the published copy current; the one mutator token |
//! | `server` | the socket handler: admission of `upgrade`, `status` |
//! | `fetch` | artifact download: HTTPS, or dispatch to OCI |
//! | `stream` | the streaming path of every download: limit, hash, write |
//! | `oci` | OCI pull: manifest checks, anonymous token, blob redirects |
//! | `probe` | the candidate's `--self-test` |
//! | `service` | stop/start of the agent: systemctl or the supervisor |
//! | `runas` | how agent processes are spawned (user, env, death signal) |
//! | `status` | the public status and its rendering |
//! | `freeze` | the agent's persisted change freeze |
//! | `config` | the config file and the time bounds |
//! | `fault` | fault injection points (feature `fault-injection`) |
//! | `cli` | argument parsing, `status` command |
//! | `setup` | device setup and the root repair of `rollback-failed` |

pub mod cli;
mod config;
mod daemon;
mod fault;
mod fetch;
mod freeze;
mod journal;
mod oci;
mod probe;
#[cfg(test)]
mod prop_tests;
mod published;
mod reclaim;
mod runas;
mod seen;
mod server;
mod service;
pub mod setup;
mod state;
mod status;
mod stream;
mod transaction;

pub use config::TEST_BOUNDS_ENV;
pub use daemon::{run, DaemonError, RunArgs};
pub use fault::{Fault, FaultAction, FaultPoint, FAULT_ENV};
pub use service::ManagerKind;
