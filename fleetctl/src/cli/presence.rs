//! `fleetctl presence record`: the last-seen recorder.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use fleet_common::signals::TerminationSignals;

use super::{Failure, Output};
use crate::connect::{ConnFlags, Reconnect};
use crate::recorder;

/// Presence from the cluster: keep devices' last-seen
#[derive(Debug, Args)]
pub struct Presence {
    #[command(subcommand)]
    command: PresenceCommand,
}

#[derive(Debug, Subcommand)]
enum PresenceCommand {
    /// Record each device's disconnect time into fleet-operator
    /// (presence.<device>), batched, until SIGTERM or Ctrl-C
    Record {
        /// Seconds between writes (each device written once per batch)
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
        batch_secs: u64,
        #[command(flatten)]
        conn: ConnFlags,
    },
}

impl Presence {
    pub fn run(self) -> Result<Output, Failure> {
        match self.command {
            PresenceCommand::Record { batch_secs, conn } => {
                // Before any thread (the NATS client's): they inherit the mask.
                let signals = TerminationSignals::block()
                    .map_err(|e| Failure::Other(format!("presence record: {e}")))?;
                let stop = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&stop);
                signals
                    .spawn_waiter("fleetctl-signals", move |_| {
                        flag.store(true, Ordering::SeqCst)
                    })
                    .map_err(|e| Failure::Other(format!("presence record: {e}")))?;
                let c = conn.connect(Reconnect::Forever)?;
                let n = recorder::run(&c, Duration::from_secs(batch_secs), &stop)?;
                Ok(Output::text(format!("recorded {n} last-seen writes\n")))
            }
        }
    }
}
