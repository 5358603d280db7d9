//! `fleetctl`: the operator's CLI for a Harmony fleet.
//!
//! | module | owns |
//! |---|---|
//! | `cli` | the command line (clap): one file per command group, dispatch, exit codes, man pages and completion |
//! | `connect` | connection options (like the agent's) and the bounded connection |
//! | `js` | snapshot reads and pipelined compare-and-set writes on JetStream |
//! | `fleet` | devices as their keys describe them |
//! | `admin` | `buckets create` |
//! | `workload` | `workload apply|rm|ls` |
//! | `upgrade` | `upgrade`, and the rule for whether a device gets an attempt |
//! | `rollout` | `rollout` and `upgrade -l` (every device at once) |
//! | `staged` | staged rollouts: batches, threshold, budget, state in NATS |
//! | `selector` | label selectors (Kubernetes syntax) |
//! | `registry` | `device pending|registry|approve|reject|preauthorize|revoke|decommission`: the enrollment registry |
//! | `labels` | `device label`, `device ls`, selecting devices |
//! | `group` | `workload apply|rm|ls -l SELECTOR` |
//! | `status` | `status`, `device status` |
//! | `watch` | `watch` |
//! | `metrics` | `metrics serve`: the Prometheus exporter |
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
mod lobby;
mod metrics;
mod nats_config;
mod presence;
mod recorder;
mod registry;
mod rollout;
mod rollout_run;
use fleet_common::selector;
mod staged;
mod status;
mod upgrade;
mod watch;
mod workload;
mod workload_rollout;

fn main() -> std::process::ExitCode {
    cli::main()
}
