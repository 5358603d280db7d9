//! `fleetctl watch`: status changes as they happen.

use clap::Args;

use super::{Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::watch;

/// Print devices' status changes as they happen (Ctrl-C stops)
#[derive(Debug, Args)]
pub struct Watch {
    /// Also every heartbeat
    #[arg(long)]
    heartbeats: bool,
    /// Leave out the lines of device connections opened and closed
    #[arg(long)]
    no_connections: bool,
    #[command(flatten)]
    select: Select,
    #[command(flatten)]
    conn: ConnFlags,
}

impl Watch {
    pub fn run(self) -> Result<Output, Failure> {
        // watch reconnects until interrupted.
        let c = self.conn.connect(Reconnect::Forever)?;
        watch::run(
            &c,
            self.heartbeats,
            !self.no_connections,
            self.select.selector.as_ref(),
        )?;
        Ok(Output::text(String::new()))
    }
}
