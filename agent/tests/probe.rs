//! Probe mode, `fleet-agent --self-test`: every step against real parts,
//! beside a running agent, and proof that it changes nothing — not in
//! Podman, not in NATS, not on disk. Each failing step has its exit code.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;
use fleet_common::contracts::SelfTestReport;
use fleet_harness::{NatsServer, NatsVersion, Podman};
use rustix::process::Signal;

const VERSION: &str = match option_env!("FLEET_AGENT_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// Runs the probe; returns its exit code and report.
fn probe(dev: &Device, podman: Option<&Podman>) -> (i32, SelfTestReport, String) {
    let mut p = fleet_harness::ChildGuard::spawn(dev.command(&["--self-test"], podman), "probe");
    let status = p.wait_exit(Duration::from_secs(240));
    let out = p.log();
    let line = out
        .lines()
        .find(|l| l.starts_with("{\"version\""))
        .unwrap_or_else(|| panic!("no report line:\n{out}"));
    let report: SelfTestReport =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    (status.code().expect("exit code"), report, out)
}

fn names(r: &SelfTestReport) -> Vec<String> {
    r.checks.iter().map(|c| c.name.to_string()).collect()
}

/// Last sequence of each bucket's stream.
fn stream_seqs(admin: &nats::Connection) -> BTreeMap<&'static str, u64> {
    [
        "fleet-workloads",
        "fleet-desired",
        "fleet-control",
        "fleet-status",
    ]
    .into_iter()
    .map(|b| {
        let r = admin
            .request_timeout(
                &format!("$JS.API.STREAM.INFO.KV_{b}"),
                "",
                Duration::from_secs(5),
            )
            .expect("stream info");
        let v: serde_json::Value = serde_json::from_slice(&r.data).expect("json");
        (b, v["state"]["last_seq"].as_u64().expect("last_seq"))
    })
    .collect()
}

/// Every file under `root` with its size and modification time.
fn files(root: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let m = e.metadata().expect("metadata");
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(
                    e.path().display().to_string(),
                    (m.len(), m.modified().expect("mtime")),
                );
            }
        }
    }
    out
}

fn probe_changes_nothing(v: NatsVersion) {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(v, &["dev1"]);
    let admin = nats.admin();
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "v1"));
    put_workload(&admin, "dev1", "bad", r#"{"image":"x","colour":1}"#);
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let _updater = dev.fake_updater_socket();

    // Beside a running agent: no lock conflict, every step passes.
    let mut agent = dev.start(Some(&podman));
    wait_running(&podman, "fleet-web", "web running", |_| true);
    let (code, report, out) = probe(&dev, Some(&podman));
    assert_eq!(code, 0, "{out}");
    assert_eq!(report.version.as_str(), VERSION);
    assert_eq!(
        names(&report),
        vec![
            "config",
            "podman",
            "nats-auth",
            "buckets",
            "device-keys",
            "desired-read",
            "updater-socket",
            "snapshot"
        ]
    );
    assert!(report.checks.iter().all(|c| c.ok), "{report:?}");
    let snapshot = report
        .checks
        .iter()
        .last()
        .and_then(|c| c.detail.clone())
        .expect("detail");
    assert!(
        snapshot.as_str().contains(": 2 workloads (1 invalid)"),
        "{snapshot}"
    );

    // With the agent stopped, nothing else writes: the probe must not either.
    agent.signal(Signal::TERM);
    assert!(agent.wait_exit(CONVERGE).success());
    let containers_before = containers(&podman);
    let seqs_before = stream_seqs(&admin);
    let files_before = files(dev.root.path());
    let (code, report, out) = probe(&dev, Some(&podman));
    assert_eq!(code, 0, "{out}");
    assert_eq!(report.checks.len(), 8);
    assert_eq!(
        containers(&podman),
        containers_before,
        "the probe changed containers"
    );
    assert_eq!(
        stream_seqs(&admin),
        seqs_before,
        "the probe wrote to a bucket"
    );
    assert_eq!(
        files(dev.root.path()),
        files_before,
        "the probe wrote files"
    );
    assert!(!out.contains("heartbeat"), "{out}");
}

#[test]
fn probe_changes_nothing_2_9() {
    probe_changes_nothing(NatsVersion::V2_9);
}

#[test]
fn probe_changes_nothing_2_14() {
    probe_changes_nothing(NatsVersion::V2_14);
}

/// Each failing step exits with its own code, and the report names it.
#[test]
fn each_failing_step_has_its_exit_code() {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = nats.admin();
    let failed = |r: &SelfTestReport| r.checks.iter().last().map(|c| (c.name.to_string(), c.ok));

    // updater-socket: nothing listens.
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let (code, report, out) = probe(&dev, Some(&podman));
    assert_eq!(code, 16, "{out}");
    assert_eq!(failed(&report), Some(("updater-socket".into(), false)));
    assert_eq!(report.failures().len(), 1);

    // podman: a binary that is not there.
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&dev.config).expect("read")).expect("json");
    cfg["podman"]["binary"] = "/nonexistent/podman".into();
    std::fs::write(&dev.config, cfg.to_string()).expect("write");
    let (code, report, _) = probe(&dev, Some(&podman));
    assert_eq!(code, 11);
    assert_eq!(failed(&report), Some(("podman".into(), false)));

    // config: an unknown key.
    cfg["podman"]["colour"] = "red".into();
    std::fs::write(&dev.config, cfg.to_string()).expect("write");
    let (code, report, _) = probe(&dev, Some(&podman));
    assert_eq!(code, 10);
    assert!(
        report.failures()[0].contains("podman.colour: unknown key"),
        "{report:?}"
    );

    // nats-auth: a wrong password.
    let mut settings = Settings::new(vec![nats.url()]);
    settings.password = Some("wrong".into());
    let dev = Device::new("dev1", &settings, Some(&podman));
    let _updater = dev.fake_updater_socket();
    let (code, _, out) = probe(&dev, Some(&podman));
    assert_eq!(code, 12, "{out}");

    // desired-read, then buckets: the streams are gone.
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let _updater = dev.fake_updater_socket();
    let delete = |b: &str| {
        admin
            .request_timeout(
                &format!("$JS.API.STREAM.DELETE.KV_{b}"),
                "",
                Duration::from_secs(5),
            )
            .expect("delete stream");
    };
    delete("fleet-workloads");
    let (code, report, out) = probe(&dev, Some(&podman));
    assert_eq!(code, 15, "{out}");
    assert_eq!(failed(&report), Some(("desired-read".into(), false)));
    delete("fleet-control");
    let (code, _, out) = probe(&dev, Some(&podman));
    assert_eq!(code, 13, "{out}");
}
