//! `fleetctl device status|label|ls`.

use clap::{Args, Subcommand};

use super::{Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::labels::{self, parse_change, LabelChange};
use crate::status;

/// Devices: their status, labels and facts
#[derive(Debug, Args)]
pub struct Device {
    #[command(subcommand)]
    command: DeviceCommand,
    #[command(flatten)]
    conn: ConnFlags,
}

#[derive(Debug, Subcommand)]
enum DeviceCommand {
    /// A device's status, read back from NATS
    Status {
        /// The device
        device: String,
    },
    /// Set (key=value) or remove (key-) a device's labels
    Label {
        /// The device
        device: String,
        /// key=value sets a label, key- removes it
        #[arg(value_name = "CHANGE", required = true, value_parser = parse_change)]
        changes: Vec<LabelChange>,
    },
    /// Devices, their facts and labels
    Ls {
        #[command(flatten)]
        select: Select,
        /// One JSON object per device
        #[arg(long)]
        json: bool,
    },
}

impl Device {
    pub fn run(self) -> Result<Output, Failure> {
        let c = self.conn.connect(Reconnect::Once)?;
        let out = match self.command {
            DeviceCommand::Status { device } => status::device(&c, &device)?,
            DeviceCommand::Label { device, changes } => labels::label(&c, &device, &changes)?,
            DeviceCommand::Ls { select, json } => labels::ls(&c, select.selector.as_ref(), json)?,
        };
        Ok(Output::text(out))
    }
}
