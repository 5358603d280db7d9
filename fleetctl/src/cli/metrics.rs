//! `fleetctl metrics serve`: the fleet's Prometheus exporter.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Subcommand};
use fleet_common::limits::TRAFFIC_BUDGET_BYTES_PER_30_DAYS;

use super::{parse_label_key, Failure, Output};
use crate::connect::{ConnFlags, Reconnect};
use crate::metrics::{self, Bounds, Options};
use crate::staged::parse_duration;

/// Export the fleet's state to Prometheus
#[derive(Debug, Args)]
pub struct Metrics {
    #[command(subcommand)]
    command: MetricsCommand,
}

#[derive(Debug, Subcommand)]
enum MetricsCommand {
    Serve(Serve),
}

/// Serve /metrics (Prometheus text format) from a view of the fleet kept
/// from NATS, until stopped
#[derive(Debug, Args)]
#[command(long_about = "Serve /metrics in the Prometheus text format from a \
view of the fleet kept by one consumer of fleet-status (and of the labels in \
fleet-operator), with the rollouts listed every 10 s. Series are aggregates by \
agent version, arch, config state, connection, upgrade phase, workload; a \
device has series of its own only when a person must act: rollback-failed, \
offline longer than --offline-after, over the traffic budget. While NATS does \
not answer, /metrics answers from the last view with \
harmony_fleet_exporter_view_stale 1. docs/operator/metrics.md lists the series.")]
struct Serve {
    /// The address to serve on (port 0: any free one, printed on stderr)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9731")]
    listen: SocketAddr,
    /// Add this device label to every series, as label_<LABEL> (repeatable;
    /// each label's values multiply the series)
    #[arg(long, value_name = "LABEL", value_parser = parse_label_key, action = clap::ArgAction::Append)]
    group_by: Vec<String>,
    /// A device not connected longer than this gets its own
    /// harmony_fleet_device_offline_seconds series
    #[arg(long, value_name = "DURATION", default_value = "2h", value_parser = parse_duration)]
    offline_after: Duration,
    /// Bytes a day (sent and received) above which a device gets its own
    /// harmony_fleet_device_traffic_over_budget_bytes series [default: 5 MiB / 30 days]
    #[arg(long, value_name = "BYTES")]
    traffic_budget_per_day: Option<u64>,
    #[command(flatten)]
    conn: ConnFlags,
}

impl Metrics {
    pub fn run(self) -> Result<Output, Failure> {
        match self.command {
            MetricsCommand::Serve(s) => s.run(),
        }
    }
}

impl Serve {
    fn run(self) -> Result<Output, Failure> {
        let opts = Options {
            listen: self.listen,
            group_by: self.group_by,
            bounds: Bounds {
                offline_after: self.offline_after,
                traffic_budget_per_day: self
                    .traffic_budget_per_day
                    .unwrap_or(TRAFFIC_BUDGET_BYTES_PER_30_DAYS / 30),
            },
        };
        let c = self.conn.connect(Reconnect::Forever)?;
        metrics::serve(c, &opts)?;
        Ok(Output::text(String::new()))
    }
}
