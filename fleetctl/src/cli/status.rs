//! `fleetctl status`: the fleet at a glance.

use clap::Args;

use super::{parse_label_key, Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::status;

/// The fleet's devices: agent, upgrade, workloads, heartbeat
#[derive(Debug, Args)]
pub struct Status {
    #[command(flatten)]
    select: Select,
    /// A summary line per value of this label
    #[arg(long, value_name = "LABEL", value_parser = parse_label_key)]
    group_by: Option<String>,
    /// As JSON
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: ConnFlags,
}

impl Status {
    pub fn run(self) -> Result<Output, Failure> {
        let c = self.conn.connect(Reconnect::Once)?;
        Ok(Output::text(status::run(
            &c,
            self.json,
            self.select.selector.as_ref(),
            self.group_by.as_deref(),
        )?))
    }
}
