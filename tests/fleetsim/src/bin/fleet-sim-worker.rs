//! One worker of a simulation split over processes
//! ([`fleet_sim::MultiSim`]): its configuration as one JSON line on stdin,
//! `ready` on stdout once its devices start, then `records` and `stop`
//! answered one line each; the end of stdin stops it. Its devices log in
//! with the test harness's passwords.

use std::io::{stdin, stdout};
use std::process::ExitCode;

fn main() -> ExitCode {
    match fleet_sim::multi::run_worker(
        stdin().lock(),
        stdout().lock(),
        fleet_harness::device_password,
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-sim-worker: {e}");
            ExitCode::FAILURE
        }
    }
}
