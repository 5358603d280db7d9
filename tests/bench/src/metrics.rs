//! The metrics exporter (`fleetctl metrics serve`) over N seeded devices:
//! one fleet-layout nats-server 2.14, each device's `info`, `heartbeat`,
//! `workloads` (two workloads) and a `site` label (20 sites) seeded as
//! admin, then the release exporter started with `--group-by site`: the
//! time to its first complete view (from its own log line), five scrapes,
//! its RSS and CPU.
//!
//! Baseline, same run: `fleetctl status` over the same fleet, one read of
//! every key, which an exporter reading periodically instead of following
//! would pay every period.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_harness::{ChildGuard, NatsServer, NatsVersion, NATS_ADMIN_PASSWORD};

use crate::bins::release_bin;
use crate::fleet::pipelined_puts;
use crate::procfs;
use crate::report::{mib, Row, Verdict};
use crate::rollout::fleetctl_at;

/// A first view of 100,000 devices not complete by then is broken.
const FIRST_VIEW_TIMEOUT: Duration = Duration::from_secs(600);
/// One scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(30);
const SCRAPES: usize = 5;

fn seed(admin: &nats::Connection, n: usize) {
    let now = fleet_common::Timestamp::now();
    let state = r#"{"state":"configured","waiting-changes":0,"intent-waiting":false}"#;
    let hash = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef";
    let workloads = format!(
        r#"{{"workloads":{{"web":{{"state":"running","image":"registry.example.com/web:1","spec-hash":"{hash}","restarts":0,"since":"{now}"}},"cam":{{"state":"back-off","image":"registry.example.com/cam:2","spec-hash":"{hash}","restarts":3,"since":"{now}"}}}},"observed-at":"{now}"}}"#
    );
    // In slices: every put of a slice is held until acknowledged.
    let per = 10_000;
    for start in (0..n).step_by(per) {
        let mut puts: Vec<(String, Vec<u8>)> = Vec::new();
        for i in start..(start + per).min(n) {
            let id = format!("dev-{i:06}");
            let version = if i % 3 == 0 { "0.2.0" } else { "0.3.0" };
            puts.push((
                format!("$KV.fleet-status.{id}.info"),
                format!(
                    r#"{{"device-id":"{id}","agent-version":"{version}","arch":"x86_64","os":"Debian GNU/Linux 12 (bookworm)","kernel":"6.1.0-28-amd64","boot-id":"b","config-state":{state},"agent-started-at":"{now}","updated-at":"{now}"}}"#
                )
                .into_bytes(),
            ));
            puts.push((
                format!("$KV.fleet-status.{id}.heartbeat"),
                format!(r#"{{"at":"{now}","uptime-secs":10,"agent-version":"{version}","config-state":{state}}}"#)
                    .into_bytes(),
            ));
            puts.push((
                format!("$KV.fleet-status.{id}.workloads"),
                workloads.clone().into_bytes(),
            ));
            puts.push((
                format!("$KV.fleet-operator.labels.{id}"),
                format!(r#"{{"labels":{{"site":"site{}"}}}}"#, i % 20).into_bytes(),
            ));
        }
        pipelined_puts(admin, &puts);
    }
}

/// One `GET /metrics` over a fresh connection, as Prometheus makes it:
/// how long it took and the page's bytes.
fn scrape(addr: &str) -> Option<(Duration, usize)> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut page = Vec::new();
    s.read_to_end(&mut page).ok()?;
    let body = page.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some((t.elapsed(), page.len() - body))
}

/// The rows of the metrics section for `n` devices.
pub fn metrics_rows(n: usize) -> Vec<Row> {
    let server = NatsServer::start_fleet(NatsVersion::V2_14, &[]);
    let admin = server.admin();
    seed(&admin, n);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let pw = dir.path().join("admin-password");
    std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n"))
        .unwrap_or_else(|e| panic!("writing the password: {e}"));
    let (out, status_took) = fleetctl_at(&[server.url()], &pw, &["status", "--json"]);
    assert!(out.status.success(), "fleetctl status: {out:?}");

    let started = Instant::now();
    let mut cmd = Command::new(release_bin("fleetctl"));
    cmd.args([
        "metrics",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--group-by",
        "site",
        "--server",
        &server.url(),
        "--password-file",
    ])
    .arg(&pw);
    let exporter = ChildGuard::spawn(cmd, "exporter");
    let line = exporter.wait_for_line("serving http://", FIRST_VIEW_TIMEOUT);
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .trim()
        .to_owned();
    exporter.wait_for_line("first complete view", FIRST_VIEW_TIMEOUT);
    let first_view = started.elapsed();
    let pid = exporter.pid();
    let cpu_first = procfs::cpu(pid);
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..SCRAPES {
        let (t, b) = scrape(&addr).unwrap_or_else(|| panic!("scraping {addr}"));
        times.push(t);
        bytes = b;
    }
    let cpu_scrapes = procfs::cpu(pid).since(cpu_first);
    let rss = procfs::rss(pid);
    times.sort();
    let median = times[SCRAPES / 2];
    vec![
        Row::new(format!("exporter: first complete view of {n} devices"))
            .ours(format!(
                "{:.1} s ({:.1} s CPU)",
                first_view.as_secs_f64(),
                cpu_first.own.as_secs_f64()
            ))
            .baseline(format!(
                "{:.1} s (one `fleetctl status` read of every key)",
                status_took.as_secs_f64()
            ))
            .ratio(format!(
                "{:.1}×",
                first_view.as_secs_f64() / status_took.as_secs_f64().max(1e-3)
            ))
            .target("—", Verdict::Info)
            .note(format!(
                "Release `fleetctl metrics serve --group-by site` against one nats-server 2.14 on loopback holding {n} devices' info, heartbeat, workloads (two each) and a site label (20 sites): from spawn to its log line \"first complete view\" (one consumer replaying the last value of every key). Baseline: `fleetctl status --json` over the same fleet, one read of every key."
            )),
        Row::new(format!("exporter: one scrape, {n} devices"))
            .ours(format!(
                "{:.0} ms median, {:.0} ms max; {bytes} bytes; {:.0} ms CPU each",
                median.as_secs_f64() * 1e3,
                times[SCRAPES - 1].as_secs_f64() * 1e3,
                cpu_scrapes.own.as_secs_f64() * 1e3 / SCRAPES as f64
            ))
            .target("—", Verdict::Info)
            .note("Five scrapes after the first complete view, each a fresh connection; CPU is the exporter's utime+stime over the five."),
        Row::new(format!("exporter RSS, {n} devices"))
            .ours(mib(rss))
            .target("—", Verdict::Info),
    ]
}
