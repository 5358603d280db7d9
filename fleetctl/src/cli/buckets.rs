//! `fleetctl buckets create`.

use clap::{Args, Subcommand};

use super::{Failure, Output};
use crate::admin::{self, BucketOutcome};
use crate::connect::{ConnFlags, Reconnect};

/// Create or update the KV buckets of the fleet
#[derive(Debug, Args)]
pub struct Buckets {
    #[command(subcommand)]
    command: BucketsCommand,
    #[command(flatten)]
    conn: ConnFlags,
}

#[derive(Debug, Subcommand)]
enum BucketsCommand {
    /// Create the KV buckets, or update them in place to this release's config
    Create(Create),
}

#[derive(Debug, Args)]
struct Create {
    /// Replicas of each bucket (1 to 5)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    replicas: u8,
    /// Recreate (keeping every key's last value) a bucket the server cannot
    /// update in place
    #[arg(long)]
    recreate: bool,
}

impl Buckets {
    pub fn run(self) -> Result<Output, Failure> {
        let BucketsCommand::Create(create) = self.command;
        let c = self.conn.connect(Reconnect::Once)?;
        let mut out = String::new();
        for (bucket, outcome) in admin::create_buckets(&c, create.replicas, create.recreate)? {
            out.push_str(&match outcome {
                BucketOutcome::Ready => format!("{bucket}: ready\n"),
                BucketOutcome::Updated => {
                    format!("{bucket}: updated in place to this release's config\n")
                }
                BucketOutcome::Recreated { keys } => {
                    format!("{bucket}: recreated with this release's config, {keys} keys copied\n")
                }
            });
        }
        Ok(Output::text(out))
    }
}
