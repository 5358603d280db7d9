//! `fleetctl device status|label|ls`, and the enrollment registry's
//! `pending|registry|approve|reject|preauthorize|revoke|decommission`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use fleet_common::validate::DeviceId;
use fleet_common::Timestamp;

use super::{Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::labels::{self, parse_change, LabelChange};
use crate::registry::{self, Approval, Drain, Reason};
use crate::staged::parse_duration;
use crate::status;

fn parse_device(s: &str) -> Result<DeviceId, String> {
    DeviceId::parse(s).map_err(|e| e.to_string())
}

fn parse_reason(s: &str) -> Result<Reason, String> {
    Reason::parse(s)
}

const DECOMMISSION_HELP: &str =
    "Retire a device: its workloads stop, its access ends, its data goes; its record stays.

Steps, in order: (1) its desired workloads become an empty document, so that the agent stops \
and removes them through its reconciler (a device in change freeze keeps them until it is \
unfrozen); (2) wait, at most --wait, until the device reports no workloads (not with \
--force: an offline or broken device); if the wait runs out nothing further changes; \
(3) its registry record becomes decommissioned (it is refused at its next connect); \
(4) its live connections are closed; (5) its keys are deleted from fleet-workloads, \
fleet-control, fleet-desired, fleet-status, and its labels and last-seen from fleet-operator.

The registry record stays as the archive: state decommissioned, its key and facts kept. \
The device may enroll again only after an explicit fleetctl device approve. Needs the \
auth-callout layout (nats-server 2.10 or later).";

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
    /// Enrollment requests waiting for a decision, and requests that named
    /// a recorded device with another key (CONFLICT)
    #[command(
        long_about = "Enrollment requests waiting for a decision, and requests that named a \
recorded device with another key (CONFLICT). The last line is the lobby (fleet-lobby): the \
places taken of the most devices that may wait at once (10,000); the command frees the places \
of devices decided meanwhile."
    )]
    Pending {
        /// The records as JSON
        #[arg(long)]
        json: bool,
    },
    /// Every device the enrollment registry records, with its state
    #[command(
        long_about = "Every device the enrollment registry (fleet-registry) records, with its state. \
-l selects over the record's facts (arch, os, serial, ...), device and state (pending, \
approved, rejected, revoked, decommissioned)."
    )]
    Registry {
        #[command(flatten)]
        select: Select,
        /// The records as JSON
        #[arg(long)]
        json: bool,
    },
    /// Let devices join: their recorded requests, or the pending ones
    /// matching -l
    #[command(
        long_about = "Let devices join. DEVICE...: their records (pending, or rejected, revoked or \
decommissioned: this is the explicit approval re-enrollment needs); a device that never \
asked is refused (use fleetctl device preauthorize). -l SELECTOR: the pending records whose \
facts match (arch=arm64). --id-only DEVICE...: new records approved without a key, for \
devices that authenticate with an identity-provider token and have not asked. Each write is \
a compare-and-set on the record read: one that changed meanwhile is not written (exit 7)."
    )]
    Approve {
        /// The devices
        #[arg(value_name = "DEVICE", value_parser = parse_device,
              required_unless_present = "selector", conflicts_with = "selector")]
        devices: Vec<DeviceId>,
        #[command(flatten)]
        select: Select,
        /// Create approved records without a key for devices with no record
        #[arg(long, requires = "devices", conflicts_with = "selector")]
        id_only: bool,
    },
    /// Refuse devices' enrollment requests
    Reject {
        /// The devices
        #[arg(value_name = "DEVICE", value_parser = parse_device, required = true)]
        devices: Vec<DeviceId>,
        /// Why (one line; kept in the record as `operator: REASON`)
        #[arg(long, value_name = "TEXT", value_parser = parse_reason)]
        reason: Option<Reason>,
    },
    /// Approve factory-provisioned devices before they ask
    #[command(
        long_about = "Approve factory-provisioned devices before they ask. FILE: one JSON object per \
line, {\"device-id\": ID, \"public-key\": USER-NKEY}. The whole file is checked first \
(line numbers in the errors); a device recorded with another key refuses the whole file \
and nothing is written. A device approved with the same key already is left as it is."
    )]
    Preauthorize {
        /// The JSON-lines file
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
    },
    /// Stop devices from connecting and close their connections
    #[command(
        long_about = "Stop devices from connecting (registry state revoked) and close their live \
connections. A device whose server does not answer is refused at its next connect; its \
current connection ends when its callout-issued user expires (the callout's \
max_user_lifetime_secs). Its data stays (fleetctl device decommission removes it). Needs \
the auth-callout layout (nats-server 2.10 or later)."
    )]
    Revoke {
        /// The devices
        #[arg(value_name = "DEVICE", value_parser = parse_device, required = true)]
        devices: Vec<DeviceId>,
    },
    /// Retire a device: workloads stopped, access ended, data deleted, record kept
    #[command(long_about = DECOMMISSION_HELP)]
    Decommission {
        /// The device
        #[arg(value_name = "DEVICE", value_parser = parse_device)]
        device: DeviceId,
        /// How long to wait for the device to remove its workloads
        #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
        wait: Duration,
        /// Do not wait for the device (offline, broken): decommission at once
        #[arg(long, conflicts_with = "wait")]
        force: bool,
    },
}

impl Device {
    pub fn run(self) -> Result<Output, Failure> {
        let c = self.conn.connect(Reconnect::Once)?;
        let out = match self.command {
            DeviceCommand::Status { device } => status::device(&c, &device)?,
            DeviceCommand::Label { device, changes } => labels::label(&c, &device, &changes)?,
            DeviceCommand::Ls { select, json } => labels::ls(&c, select.selector.as_ref(), json)?,
            DeviceCommand::Pending { json } => registry::pending(&c, json)?,
            DeviceCommand::Registry { select, json } => {
                registry::registry(&c, select.selector.as_ref(), json)?
            }
            DeviceCommand::Approve {
                devices,
                select,
                id_only,
            } => {
                let which = match (select.selector, id_only) {
                    (Some(sel), _) => Approval::Selector(sel),
                    (None, true) => Approval::IdOnly(devices),
                    (None, false) => Approval::Ids(devices),
                };
                registry::approve(&c, &which, Timestamp::now())?
            }
            DeviceCommand::Reject { devices, reason } => {
                registry::reject(&c, &devices, reason, Timestamp::now())?
            }
            DeviceCommand::Preauthorize { file } => {
                registry::preauthorize(&c, &file, Timestamp::now())?
            }
            DeviceCommand::Revoke { devices } => registry::revoke(&c, &devices, Timestamp::now())?,
            DeviceCommand::Decommission {
                device,
                wait,
                force,
            } => {
                let drain = if force {
                    Drain::Force
                } else {
                    Drain::Wait(wait)
                };
                registry::decommission(&c, &device, drain, Timestamp::now)?
            }
        };
        Ok(Output::text(out))
    }
}
