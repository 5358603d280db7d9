//! `fleetctl rollout`: a release over the fleet, at once or staged, and
//! `rollout status|resume|abort|ls` of staged rollouts.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::{parse_label_key, Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::rollout;
use crate::staged::{self, parse_batches, parse_duration, parse_percent, Display, Policy};
use crate::workload_rollout;
use fleet_common::contracts::{is_rollout_id, RolloutPhase};

/// The release file's form, for the help of upgrade and rollout.
pub const RELEASE_HELP: &str = "RELEASE.json:
  {\"version\": \"1.4.0\", \"artifacts\": {\"x86_64\": {\"artifact-url\": \"https://...\",
   \"sha256\": \"<64 hex>\", \"max-bytes\": <bytes>}, \"aarch64\": {...}}}";

/// Roll a release out over the fleet (at once, or staged with --batches)
#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    override_usage = "fleetctl rollout [OPTIONS] --release RELEASE.json [--retry] [-l SELECTOR]
       fleetctl rollout [OPTIONS] --release RELEASE.json [-l SELECTOR] --batches 1,5%,25%,100%
           [--success-threshold 95%] [--batch-timeout 30m]
           [--max-unavailable N [--group-by LABEL]] [--json]
       fleetctl rollout status|resume|abort ID [--json]
       fleetctl rollout undo ID
       fleetctl rollout ls",
    long_about = "Roll a release out over the fleet.

Without --batches: issue an upgrade attempt to every device (of SELECTOR) \
whose agent version differs, skipping frozen devices, devices in \
rollback-failed and attempts of this release under way, one line per \
device. A release whose attempt failed on a device is issued again only \
with --retry.

With --batches the rollout is staged: batch after batch (each entry the \
number or percentage of the devices reached by its end), the next batch \
only when the success rate of the last one meets --success-threshold; \
below it the rollout halts and says which devices failed and why. A batch \
ends when each device is complete, failed or frozen, or after \
--batch-timeout. --max-unavailable N: never more than N devices (of one \
--group-by label value) upgrading or without a fresh heartbeat at once. \
Its state lives in NATS: status, resume and abort work from any operator's \
machine; a resumed rollout issues nothing twice. Frozen devices are \
skipped and reported, and issued once unfrozen.",
    after_long_help = RELEASE_HELP
)]
pub struct Rollout {
    #[command(subcommand)]
    command: Option<RolloutCommand>,
    #[command(flatten)]
    start: Start,
    #[command(flatten)]
    conn: ConnFlags,
}

/// Starting a rollout.
#[derive(Debug, Args)]
struct Start {
    /// The release to roll out
    #[arg(long, value_name = "RELEASE.json", required = true)]
    release: Option<PathBuf>,
    /// Issue again a release whose attempt failed (not with --batches)
    #[arg(long, conflicts_with = "batches")]
    retry: bool,
    #[command(flatten)]
    select: Select,
    /// Stage the rollout: each entry the number or percentage of the devices
    /// reached by the end of its batch, the last 100%
    #[arg(long, value_name = "LIST", value_parser = parse_batches_arg)]
    batches: Option<Batches>,
    /// The success rate a batch needs for the next to start
    #[arg(long, value_name = "PERCENT", default_value = "100%", value_parser = parse_percent, requires = "batches")]
    success_threshold: u8,
    /// A batch ends after this long at the latest (90s, 30m, 2h)
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = parse_duration, requires = "batches")]
    batch_timeout: Duration,
    /// Never more than N devices upgrading or without a fresh heartbeat at once
    #[arg(long, value_name = "N", value_parser = parse_max_unavailable, requires = "batches")]
    max_unavailable: Option<u32>,
    /// Count --max-unavailable per value of this label
    #[arg(long, value_name = "LABEL", value_parser = parse_label_key, requires = "max_unavailable")]
    group_by: Option<String>,
    /// Events as JSON lines (with --batches)
    #[arg(long, requires = "batches")]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum RolloutCommand {
    /// A staged rollout's batches and devices
    Status {
        #[arg(value_parser = parse_rollout_id)]
        id: String,
        /// As JSON
        #[arg(long)]
        json: bool,
    },
    /// Drive a staged rollout on from where it is
    Resume {
        #[arg(value_parser = parse_rollout_id)]
        id: String,
        /// Events as JSON lines
        #[arg(long)]
        json: bool,
    },
    /// Stop a staged rollout: nothing more is issued
    Abort {
        #[arg(value_parser = parse_rollout_id)]
        id: String,
    },
    /// The staged rollouts (agent and workload)
    Ls,
    /// Put back, by compare-and-set, the spec each device of a workload
    /// rollout had before it (for every device still holding the
    /// rollout's spec); a running rollout is aborted first
    Undo {
        #[arg(value_parser = parse_rollout_id)]
        id: String,
    },
}

/// `--batches`, validated.
#[derive(Debug, Clone)]
pub struct Batches(pub Vec<String>);

pub fn parse_batches_arg(s: &str) -> Result<Batches, String> {
    parse_batches(s).map(Batches)
}

pub fn parse_max_unavailable(n: &str) -> Result<u32, String> {
    n.parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("--max-unavailable {n:?}: give 1 or more"))
}

fn parse_rollout_id(id: &str) -> Result<String, String> {
    if is_rollout_id(id) {
        Ok(id.to_owned())
    } else {
        Err(format!(
            "{id:?} is not a rollout id (as printed when it started, e.g. r-1a2b3c4d; fleetctl rollout ls)"
        ))
    }
}

/// The exit code of a rollout at once: 7 when a compare-and-set was lost,
/// 5 when a write failed.
pub fn rollout_output(r: rollout::Rollout) -> Output {
    Output {
        stdout: r.lines,
        stderr: r.summary,
        code: if r.lost > 0 {
            7
        } else if r.failed > 0 {
            5
        } else {
            0
        },
    }
}

/// The exit code of a staged rollout: 8 halted, 9 aborted.
pub fn staged_output(e: staged::Ended) -> Output {
    Output {
        stdout: String::new(),
        stderr: String::new(),
        code: match e.0 {
            RolloutPhase::Complete | RolloutPhase::Running => 0,
            RolloutPhase::Halted => 8,
            RolloutPhase::Aborted => 9,
        },
    }
}

impl Rollout {
    pub fn run(self) -> Result<Output, Failure> {
        let c = self.conn.connect(Reconnect::Once)?;
        let s = self.start;
        Ok(match self.command {
            Some(RolloutCommand::Status { id, json }) => {
                Output::text(crate::rollout_run::status(&c, &id, json)?)
            }
            Some(RolloutCommand::Resume { id, json }) => {
                staged_output(crate::rollout_run::resume(&c, &id, Display::pick(json))?)
            }
            Some(RolloutCommand::Abort { id }) => Output::text(staged::abort(&c, &id)?),
            Some(RolloutCommand::Ls) => Output::text(staged::ls(&c)?),
            Some(RolloutCommand::Undo { id }) => {
                let u = workload_rollout::undo(&c, &id)?;
                Output {
                    stdout: u.lines,
                    stderr: u.summary,
                    code: if u.failed > 0 { 5 } else { 0 },
                }
            }
            None => {
                // clap requires --release without a subcommand.
                let release = s.release.unwrap_or_default();
                match s.batches {
                    None => rollout_output(rollout::run(
                        &c,
                        &release,
                        s.retry,
                        s.select.selector.as_ref(),
                    )?),
                    Some(Batches(batches)) => {
                        let policy = Policy {
                            batches,
                            success_threshold_pct: s.success_threshold,
                            batch_timeout: s.batch_timeout,
                            max_unavailable: s.max_unavailable,
                            group_by: s.group_by,
                        };
                        staged_output(crate::rollout_run::start(
                            &c,
                            &release,
                            s.select.selector.as_ref(),
                            &policy,
                            Display::pick(s.json),
                        )?)
                    }
                }
            }
        })
    }
}
