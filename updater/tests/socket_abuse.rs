//! Against the real `fleet-updater` process: a group
//! member abusing the socket (connections held open, one byte a second;
//! 200 concurrent 1 MiB requests) does not make `status` busy, and the
//! updater's resident memory returns close to idle within a minute.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_common::limits::MAX_SOCKET_MESSAGE_BYTES;
use fleet_harness::{poll_until, TestCa};
use support::{Device, StandIn};

/// Resident memory of `pid` in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// `status` answers, not `busy`, and quickly.
fn status_answers(device: &Device) {
    let started = Instant::now();
    let r = device.try_status();
    assert!(r.is_ok(), "status: {r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "status took {:?}",
        started.elapsed()
    );
}

#[test]
fn status_stays_answerable_and_memory_returns_under_socket_abuse() {
    let ca = TestCa::new();
    let device = Device::new(&ca, &StandIn::good("1.0"));
    let updater = device.start_updater();
    let pid = updater.guard.pid();
    let socket = device.layout.updater_socket();
    for _ in 0..5 {
        status_answers(&device);
    }
    let idle = rss_kib(pid);

    // 200 connections held open, half of them sending a byte a second.
    let stop = Arc::new(AtomicBool::new(false));
    let mut held: Vec<UnixStream> = (0..200)
        .map(|_| UnixStream::connect(&socket).expect("connect"))
        .collect();
    let drip = {
        let stop = Arc::clone(&stop);
        let mut dripping = held.split_off(100);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for s in &mut dripping {
                    let _ = s.write_all(b" ");
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        status_answers(&device);
        std::thread::sleep(Duration::from_millis(200));
    }

    // Meanwhile 200 concurrent 1 MiB requests.
    let senders: Vec<_> = (0..200)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut big = format!("{{\"request\":\"status\",\"pad\":\"{i}").into_bytes();
                big.resize(MAX_SOCKET_MESSAGE_BYTES - 3, b'x');
                big.extend_from_slice(b"\"}\n");
                let mut s = UnixStream::connect(&socket).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                let _ = s.write_all(&big);
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                out
            })
        })
        .collect();
    let mut peak = 0;
    while senders.iter().any(|s| !s.is_finished()) {
        status_answers(&device);
        peak = peak.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let answered = senders
        .into_iter()
        .map(|s| s.join().expect("sender"))
        .filter(|a| a.contains("\"ok\":false"))
        .count();
    assert_eq!(answered, 200, "every large request gets an answer");
    stop.store(true, Ordering::Relaxed);
    drip.join().expect("drip");
    drop(held);
    status_answers(&device);

    let after = poll_until(
        "resident memory close to idle",
        Duration::from_secs(60),
        || {
            let now = rss_kib(pid);
            // glibc keeps some of what was freed: after a 1 MiB buffer is
            // freed its dynamic thresholds let up to 2 MiB stay at the top
            // of the heap, and the reads' reallocations fragment below it
            // (measured: 2 to 5 MiB over idle on a loaded 2-core machine).
            // The bound on what is held at once is the peak's, below.
            (now <= idle + 6 * 1024).then_some(now)
        },
    );
    eprintln!("updater RSS: idle {idle} KiB, peak {peak} KiB, after {after} KiB");
    assert!(
        peak <= idle + 16 * 1024,
        "peak {peak} KiB over idle {idle} KiB: buffers are not bounded"
    );
}
