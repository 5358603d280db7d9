//! `fleetctl workload apply|rm|ls`: one device's desired workloads, or
//! those of every device a selector matches.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::rollout::{parse_batches_arg, parse_max_unavailable, staged_output, Batches};
use super::{parse_label_key, Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::group::{self, GroupOutcome};
use crate::staged::{parse_duration, parse_percent, Display, Policy};
use crate::workload;
use crate::workload_rollout;

/// A device's desired workloads (or every selected device's)
#[derive(Debug, Args)]
pub struct Workload {
    #[command(subcommand)]
    command: WorkloadCommand,
    #[command(flatten)]
    conn: ConnFlags,
}

#[derive(Debug, Subcommand)]
enum WorkloadCommand {
    Apply(Apply),
    Rollout(RolloutArgs),
    Rm(Rm),
    Ls(Ls),
}

/// Write a workload's spec to a device, or to every device SELECTOR matches
#[derive(Debug, Args)]
#[command(
    override_usage = "fleetctl workload apply [OPTIONS] DEVICE WORKLOAD SPEC.json
       fleetctl workload apply [OPTIONS] -l SELECTOR WORKLOAD SPEC.json [--dry-run]"
)]
struct Apply {
    #[command(flatten)]
    select: Select,
    /// With -l: print what would be written, write nothing
    #[arg(long, requires = "selector")]
    dry_run: bool,
    /// DEVICE WORKLOAD SPEC.json (without -l) or WORKLOAD SPEC.json (with
    /// -l); SPEC.json - reads the spec from stdin
    #[arg(value_name = "ARGS", num_args = 1.., required = true)]
    args: Vec<String>,
}

/// Roll a workload's spec out in batches, gated by the devices' health
#[derive(Debug, Args)]
#[command(
    override_usage = "fleetctl workload rollout [-l SELECTOR] WORKLOAD SPEC.json --batches 1,25%,100%
           [--success-threshold 100%] [--batch-timeout 30m]
           [--max-unavailable N [--group-by LABEL]] [--json] [--dry-run]",
    long_about = "Roll a workload's spec out over the devices (of SELECTOR), batch by batch.

The spec is validated first: a spec that fails is refused and nothing is \
written. Devices whose agent is older than a field of the spec needs \
(health, update-strategy: agent 0.3.0) are left out and say so. Each \
device's desired document is written by compare-and-set. A device \
succeeds once it reports the workload healthy on the new spec; it fails \
when it reports the spec reverted, unhealthy or invalid, or at the batch \
timeout. Below --success-threshold the rollout halts and writes nothing \
more. The state lives in NATS: fleetctl rollout status|resume|abort|ls \
ID work as for agent rollouts, and fleetctl rollout undo ID writes back \
each device's previous spec. Exit codes: 0 complete, 8 halted, 9 aborted."
)]
struct RolloutArgs {
    #[command(flatten)]
    select: Select,
    /// The workload
    workload: String,
    /// The new spec (- reads it from stdin)
    spec: PathBuf,
    /// Each entry the number or percentage of the devices reached by the
    /// end of its batch, the last 100%
    #[arg(long, value_name = "LIST", value_parser = parse_batches_arg, required = true)]
    batches: Batches,
    /// The success rate a batch needs for the next to start
    #[arg(long, value_name = "PERCENT", default_value = "100%", value_parser = parse_percent)]
    success_threshold: u8,
    /// A batch ends after this long at the latest (90s, 30m, 2h)
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    batch_timeout: Duration,
    /// Never more than N devices changing or without a fresh heartbeat at once
    #[arg(long, value_name = "N", value_parser = parse_max_unavailable)]
    max_unavailable: Option<u32>,
    /// Count --max-unavailable per value of this label
    #[arg(long, value_name = "LABEL", value_parser = parse_label_key, requires = "max_unavailable")]
    group_by: Option<String>,
    /// Events as JSON lines
    #[arg(long)]
    json: bool,
    /// Print the batches and the devices left out; write nothing
    #[arg(long)]
    dry_run: bool,
}

/// Delete a workload from a device, or from every device SELECTOR matches
#[derive(Debug, Args)]
#[command(
    visible_alias = "delete",
    override_usage = "fleetctl workload rm [OPTIONS] DEVICE WORKLOAD
       fleetctl workload rm [OPTIONS] -l SELECTOR WORKLOAD"
)]
struct Rm {
    #[command(flatten)]
    select: Select,
    /// DEVICE WORKLOAD (without -l) or WORKLOAD (with -l)
    #[arg(value_name = "ARGS", num_args = 1.., required = true)]
    args: Vec<String>,
}

/// List a device's workloads, or those of every device SELECTOR matches
#[derive(Debug, Args)]
struct Ls {
    #[command(flatten)]
    select: Select,
    /// The device
    #[arg(required_unless_present = "selector", conflicts_with = "selector")]
    device: Option<String>,
}

/// `args` split by whether a selector names the devices: the device (None
/// with a selector) and the rest, which must be `rest` words.
fn split<'a>(
    command: &str,
    select: &Select,
    args: &'a [String],
    rest: &str,
) -> Result<(Option<&'a str>, &'a [String]), Failure> {
    let words = rest.split(' ').count();
    match (&select.selector, args) {
        (Some(_), a) if a.len() == words => Ok((None, a)),
        (None, [device, a @ ..]) if a.len() == words => Ok((Some(device.as_str()), a)),
        (Some(_), _) => Err(Failure::usage(
            &["workload", command],
            format!("with -l, give {rest}"),
        )),
        (None, _) => Err(Failure::usage(
            &["workload", command],
            format!("give DEVICE {rest}, or -l SELECTOR {rest}"),
        )),
    }
}

fn group_output(g: GroupOutcome) -> Output {
    Output {
        stdout: g.lines,
        stderr: g.summary,
        code: if g.failed > 0 { 5 } else { 0 },
    }
}

impl Workload {
    pub fn run(self) -> Result<Output, Failure> {
        match self.command {
            WorkloadCommand::Apply(a) => {
                let (device, rest) = split("apply", &a.select, &a.args, "WORKLOAD SPEC.json")?;
                let (name, spec) = (&rest[0], PathBuf::from(&rest[1]));
                let c = self.conn.connect(Reconnect::Once)?;
                match (device, &a.select.selector) {
                    (Some(device), _) => {
                        let (rev, hash) = workload::apply(&c, device, name, &spec)?;
                        Ok(Output::text(format!(
                            "applied {device}.{name} (revision {rev}, spec hash {hash})\n"
                        )))
                    }
                    (None, sel) => Ok(group_output(group::apply(
                        &c,
                        &sel.clone().unwrap_or_default(),
                        name,
                        &spec,
                        a.dry_run,
                    )?)),
                }
            }
            WorkloadCommand::Rollout(r) => {
                let target = workload_rollout::read_target(&r.workload, &r.spec)?;
                let c = self.conn.connect(Reconnect::Once)?;
                let policy = Policy {
                    batches: r.batches.0,
                    success_threshold_pct: r.success_threshold,
                    batch_timeout: r.batch_timeout,
                    max_unavailable: r.max_unavailable,
                    group_by: r.group_by,
                };
                let display = Display::pick(r.json);
                let ended = match workload_rollout::plan(
                    &c,
                    target,
                    r.select.selector.as_ref(),
                    &policy,
                    r.dry_run,
                )? {
                    workload_rollout::Planned::DryRun => {
                        crate::staged::Ended(fleet_common::contracts::RolloutPhase::Complete)
                    }
                    workload_rollout::Planned::Launch {
                        state,
                        left_out,
                        selected,
                    } => crate::rollout_run::launch(&c, *state, &left_out, selected, display)?,
                };
                Ok(staged_output(ended))
            }
            WorkloadCommand::Rm(r) => {
                let (device, rest) = split("rm", &r.select, &r.args, "WORKLOAD")?;
                let name = &rest[0];
                let c = self.conn.connect(Reconnect::Once)?;
                match (device, &r.select.selector) {
                    (Some(device), _) => {
                        workload::rm(&c, device, name)?;
                        Ok(Output::text(format!("deleted {device}.{name}\n")))
                    }
                    (None, sel) => Ok(group_output(group::rm(
                        &c,
                        &sel.clone().unwrap_or_default(),
                        name,
                    )?)),
                }
            }
            WorkloadCommand::Ls(l) => {
                let c = self.conn.connect(Reconnect::Once)?;
                match (l.device, l.select.selector) {
                    (Some(device), _) => Ok(Output::text(workload::ls(&c, &device)?)),
                    // clap requires DEVICE or -l.
                    (None, sel) => Ok(Output::text(group::ls(&c, &sel.unwrap_or_default())?)),
                }
            }
        }
    }
}
