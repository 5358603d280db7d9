//! The worker processes of a simulation split over processes, without a
//! cluster: a worker that fails is an error naming it with its stderr, and
//! every worker is stopped and reaped when the coordinator lets go.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use fleet_harness::device_password;
use fleet_sim::scenario::device_ids;
use fleet_sim::{Generation, MultiSim, SimConfig};
use rustix::process::{kill_process, Pid, Signal};

fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_worker_that_fails_to_start_is_an_error_naming_it_with_its_stderr() {
    let cfg = SimConfig::new(
        Vec::new(),
        device_ids(Generation::Two, 4),
        device_password,
        Generation::Two,
    );
    let e = MultiSim::start(&cfg, 2).expect_err("no servers: the workers fail");
    assert!(
        e.contains("fleet-sim worker 0 (pid ") && e.contains("devices 0..2"),
        "{e}"
    );
    assert!(e.contains("exit status: 1"), "{e}");
    assert!(
        e.contains("fleet-sim-worker: starting the simulator: no servers"),
        "{e}"
    );
}

#[test]
fn records_come_from_every_worker_a_killed_one_is_named_and_drop_reaps_them() {
    // A server that accepts TCP connections and never speaks: the devices
    // stay connecting.
    let silent = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let devices = device_ids(Generation::Two, 5);
    let cfg = SimConfig::new(
        vec![silent.local_addr().expect("its address")],
        devices,
        device_password,
        Generation::Two,
    );
    let sim = MultiSim::start(&cfg, 2).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sim.processes(), 2);
    let workers = sim.workers();
    let ranges: Vec<_> = workers.iter().map(|(_, r)| r.clone()).collect();
    assert_eq!(ranges, [0..2, 2..5]);
    let recs = sim.records().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(recs.len(), 5);
    assert!(recs.iter().all(|d| d.connects.is_empty()), "{recs:?}");
    let t = Instant::now();
    assert!(!sim.wait_until(Duration::from_millis(600), |_| false));
    assert!(t.elapsed() >= Duration::from_millis(600));
    // Worker 1 killed: the next exchange names it and how it ended.
    let (pid1, _) = workers[1];
    let pid = Pid::from_raw(i32::try_from(pid1).expect("a pid")).expect("a pid is not 0");
    kill_process(pid, Signal::KILL).expect("killing worker 1");
    let e = sim.records().expect_err("worker 1 is dead");
    assert!(
        e.contains(&format!("fleet-sim worker 1 (pid {pid1}, devices 2..5)")),
        "{e}"
    );
    assert!(e.contains("signal: 9"), "{e}");
    assert!(!sim.wait_until(Duration::from_secs(5), |_| true));
    drop(sim);
    for (pid, _) in &workers {
        assert!(gone(*pid), "worker {pid} left behind");
    }
}

#[test]
fn stop_gives_every_workers_result_and_ends_them() {
    let silent = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let cfg = SimConfig::new(
        vec![silent.local_addr().expect("its address")],
        device_ids(Generation::One, 3),
        device_password,
        Generation::One,
    );
    let sim = MultiSim::start(&cfg, 3).unwrap_or_else(|e| panic!("{e}"));
    let pids: Vec<u32> = sim.workers().iter().map(|(p, _)| *p).collect();
    let results = sim.stop();
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for pid in pids {
        assert!(gone(pid), "worker {pid} left behind");
    }
}
