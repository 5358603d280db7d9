//! `fleetctl workload apply|rm|ls`: one device's desired workloads, or
//! those of every device a selector matches.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{Failure, Output, Select};
use crate::connect::{ConnFlags, Reconnect};
use crate::group::{self, GroupOutcome};
use crate::workload;

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
