//! `fleetctl upgrade`: one device's agent upgrade attempt, or every
//! selected device's.

use std::path::PathBuf;

use clap::Args;

use super::rollout::{rollout_output, RELEASE_HELP};
use super::{Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::{rollout, upgrade};

/// Write a device's agent upgrade intent (or every selected device's)
#[derive(Debug, Args)]
#[command(
    override_usage = "fleetctl upgrade [OPTIONS] DEVICE --release RELEASE.json [--retry]
       fleetctl upgrade [OPTIONS] -l SELECTOR --release RELEASE.json [--retry]",
    long_about = "Write DEVICE's agent upgrade intent with a new attempt \
(compare-and-set: of two writers racing, one wins and the other is told), \
or, with -l, that of every device SELECTOR matches whose agent version \
differs, one line per device, as fleetctl rollout does. A release whose \
attempt failed on a device is issued again only with --retry. A device in \
rollback-failed gets a new attempt only with --retry, once it has been \
repaired on the device (REPAIR.md).",
    after_long_help = RELEASE_HELP
)]
pub struct Upgrade {
    #[command(flatten)]
    select: Select,
    /// The device
    #[arg(required_unless_present = "selector", conflicts_with = "selector")]
    device: Option<String>,
    /// The release to upgrade to
    #[arg(long, value_name = "RELEASE.json", required = true)]
    release: PathBuf,
    /// Issue again a release whose attempt failed
    #[arg(long)]
    retry: bool,
    #[command(flatten)]
    conn: ConnFlags,
}

impl Upgrade {
    pub fn run(self) -> Result<Output, Failure> {
        let c = self.conn.connect(Reconnect::Once)?;
        match self.device {
            Some(device) => Ok(Output::text(upgrade::run(
                &c,
                &device,
                &self.release,
                self.retry,
            )?)),
            // clap requires DEVICE or -l.
            None => Ok(rollout_output(rollout::run(
                &c,
                &self.release,
                self.retry,
                Some(&self.select.selector.unwrap_or_default()),
            )?)),
        }
    }
}
