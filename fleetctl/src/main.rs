//! `fleetctl`: the operator's CLI for a Harmony fleet.
//!
//! | module | owns |
//! |---|---|
//! | `cli` | the NATS commands: arguments, dispatch, exit codes |
//! | `connect` | connection options (like the agent's) and the bounded connection |
//! | `js` | snapshot reads and pipelined compare-and-set writes on JetStream |
//! | `fleet` | devices as their keys describe them |
//! | `admin` | `buckets create` |
//! | `workload` | `workload apply|rm|ls` |
//! | `upgrade` | `upgrade`, and the rule for whether a device gets an attempt |
//! | `rollout` | `rollout` and `upgrade -l` (every device at once) |
//! | `staged` | staged rollouts: batches, threshold, budget, state in NATS |
//! | `selector` | label selectors (Kubernetes syntax) |
//! | `labels` | `device label`, `device ls`, selecting devices |
//! | `group` | `workload apply|rm|ls -l SELECTOR` |
//! | `status` | `status`, `device status` |
//! | `watch` | `watch` |
//! | `artifact` | `artifact push` (OCI) |
//! | `nats_config` | `nats-config` |

mod admin;
mod artifact;
mod cli;
mod connect;
mod error;
mod fleet;
mod group;
mod js;
mod labels;
mod nats_config;
mod rollout;
mod selector;
mod staged;
mod status;
mod upgrade;
mod watch;
mod workload;

use std::process::ExitCode;

const HELP: &str = "fleetctl: operate a Harmony fleet

Usage:
  fleetctl nats-config ...   write the nats-server config (see fleetctl nats-config --help)
  fleetctl artifact push ... publish an agent release (see fleetctl artifact --help)
  fleetctl buckets create    create the KV buckets
  fleetctl workload apply|rm|ls ...   a device's desired workloads
  fleetctl workload apply -l SELECTOR WORKLOAD SPEC.json [--dry-run]
  fleetctl device status DEVICE       a device's status read back from NATS
  fleetctl device label DEVICE key=value ... [key-]
  fleetctl device ls [-l SELECTOR]    devices, their facts and labels
  fleetctl upgrade DEVICE --release RELEASE.json [--retry]
  fleetctl upgrade -l SELECTOR --release RELEASE.json [--retry]
  fleetctl rollout --release RELEASE.json [--retry] [-l SELECTOR]
  fleetctl rollout --release RELEASE.json [-l SELECTOR] --batches 1,5%,100% ...
  fleetctl rollout status|resume|abort ID
  fleetctl status [-l SELECTOR] [--group-by LABEL] [--json]
  fleetctl watch [--heartbeats] [-l SELECTOR]
  fleetctl --help | --version

The NATS commands and their options: fleetctl status --help.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("fleetctl {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("--help") | Some("-h") | None => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Some("nats-config") => nats_config::main(&args[1..]),
        Some("artifact") => artifact::main(&args[1..]),
        Some("buckets" | "workload" | "device" | "upgrade" | "rollout" | "status" | "watch") => {
            cli::main(&args)
        }
        Some(other) => {
            eprintln!("fleetctl: unknown command {other:?}; see fleetctl --help");
            ExitCode::from(2)
        }
    }
}
