//! `fleetctl metrics serve` and the alert rules shipped with it, against
//! real parts: a nats-server with the fleet layout (devices write their
//! status keys with their own credentials, as the agent does), Debian's
//! promtool, Prometheus and Alertmanager, and a webhook receiver.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_common::contracts::{ConfigState, ConfigStateReport, DeviceInfo, Freeze, Heartbeat};
use fleet_common::subjects::{inbox_prefix, kv_subject};
use fleet_common::validate::{Arch, BoundedText, DeviceId, Version};
use fleet_common::Timestamp;
use fleet_harness::{
    bin_path, device_password, poll_until, promtool_ok, workspace_root, Alertmanager, ChildGuard,
    NatsServer, NatsVersion, Prometheus, WebhookReceiver, NATS_ADMIN_PASSWORD,
};
use rustix::process::Signal;
use tempfile::TempDir;

/// The exporter's first complete view of a handful of devices, and a
/// Prometheus evaluation after a change: seconds, on a loaded machine.
const VIEW: Duration = Duration::from_secs(30);
/// Scrape, evaluation, Alertmanager's group wait and its webhook post.
const ALERT: Duration = Duration::from_secs(90);
/// fleetctl's judgement of a device gone quiet (`STALE_HEARTBEAT`: three
/// missed 30 s heartbeats) and a margin.
const STALE_HEARTBEAT_BOUND: Duration = Duration::from_secs(100);

fn rules_dir() -> PathBuf {
    workspace_root().join("packaging/prometheus")
}

#[test]
fn the_alert_rules_pass_promtool_and_every_alert_has_a_test_case() {
    let dir = rules_dir();
    let out = promtool_ok(&dir, &["check", "rules", "harmony-fleet.rules.yml"], None);
    assert!(out.contains("SUCCESS"), "{out}");
    let out = promtool_ok(
        &dir.join("tests"),
        &["test", "rules", "harmony-fleet.rules.test.yml"],
        None,
    );
    assert!(out.contains("SUCCESS"), "{out}");
    let rules = std::fs::read_to_string(dir.join("harmony-fleet.rules.yml")).expect("rules");
    let tests =
        std::fs::read_to_string(dir.join("tests/harmony-fleet.rules.test.yml")).expect("tests");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    for a in alerts {
        // Some case expects the alert to fire: exp_labels before the next case.
        let case = format!("alertname: {a}\n");
        let fires = tests.match_indices(&case).any(|(i, _)| {
            let rest = &tests[i + case.len()..];
            let end = rest.find("alertname:").unwrap_or(rest.len());
            rest[..end].contains("exp_labels")
        });
        assert!(fires, "no promtool test case expects {a} to fire");
    }
}

/// Every PromQL expression of the shipped Grafana dashboard.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(rules_dir().join("harmony-fleet.dashboard.json"))
        .expect("dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let exprs: Vec<String> = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(exprs.len() > 20, "{exprs:?}");
    exprs
}

/// The `harmony_fleet_` metric families `expr` reads.
fn families(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("harmony_fleet_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_owned();
        out.push(family);
    }
    out
}

#[test]
fn the_dashboard_queries_pass_promtool() {
    // Each query as a recording rule: promtool parses it as Prometheus would.
    let rules = serde_json::json!({"groups": [{
        "name": "dashboard",
        "rules": dashboard_exprs().iter().enumerate().map(|(i, e)| {
            serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": e})
        }).collect::<Vec<_>>(),
    }]});
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("dashboard.rules.yml"), rules.to_string()).expect("write");
    let out = promtool_ok(dir.path(), &["check", "rules", "dashboard.rules.yml"], None);
    assert!(out.contains("SUCCESS"), "{out}");
}

struct Fleet {
    server: NatsServer,
    _dir: TempDir,
    pw: PathBuf,
    /// A connection held open as each simulated device: the cluster's
    /// presence finds it connected, as it would a real one.
    present: std::sync::Mutex<Vec<nats::Connection>>,
}

impl Fleet {
    fn start(devices: &[&str]) -> Fleet {
        let server = NatsServer::start_fleet(NatsVersion::V2_14, devices);
        let dir = tempfile::tempdir().expect("tempdir");
        let pw = dir.path().join("admin-pw");
        std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("write");
        Fleet {
            server,
            _dir: dir,
            pw,
            present: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// `fleetctl metrics serve` on a free port, and its address.
    fn exporter(&self, extra: &[&str]) -> (ChildGuard, SocketAddr) {
        self.exporter_of(Path::new(env!("CARGO_BIN_EXE_fleetctl")), extra)
    }

    /// [`Self::exporter`] of another fleetctl build (a release one).
    fn exporter_of(&self, fleetctl: &Path, extra: &[&str]) -> (ChildGuard, SocketAddr) {
        let mut c = Command::new(fleetctl);
        c.args(["metrics", "serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .args(["--server", &self.server.url(), "--password-file"])
            .arg(&self.pw)
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE");
        let child = ChildGuard::spawn(c, "exporter");
        let line = child.wait_for_line("serving http://", VIEW);
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.strip_suffix("/metrics"))
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        (child, addr)
    }

    /// Writes `device`'s status `key` with the device's own credentials,
    /// as its agent does.
    fn status(&self, device: &str, key: &str, value: &[u8]) {
        let conn = self.server.device(device);
        // The device may only use inboxes of its own (the permission template).
        let id = DeviceId::parse(device).expect("id");
        let inbox = format!("{}{}", inbox_prefix(&id), uuid::Uuid::new_v4().simple());
        let sub = conn.subscribe(&inbox).expect("subscribe");
        conn.publish_request(
            &kv_subject("fleet-status", &format!("{device}.{key}")),
            &inbox,
            value,
        )
        .expect("publish");
        let ack = sub.next_timeout(Duration::from_secs(10)).expect("ack");
        let v: serde_json::Value = serde_json::from_slice(&ack.data).expect("json");
        assert!(v.get("error").is_none(), "{v}");
    }

    fn label(&self, device: &str, labels: &str) {
        let out = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
            .args(["device", "label", device])
            .args(labels.split(' '))
            .args(["--server", &self.server.url(), "--password-file"])
            .arg(&self.pw)
            .output()
            .expect("fleetctl device label");
        assert!(out.status.success(), "{out:?}");
    }

    fn device(&self, id: &str, version: &str, frozen: bool) {
        let state = ConfigStateReport {
            state: if frozen {
                ConfigState::Changefreeze(Freeze {
                    since: Timestamp::now(),
                    reason: Some(BoundedText::truncate("vehicle in motion")),
                    caller_uid: 0,
                })
            } else {
                ConfigState::Configured
            },
            waiting_changes: 0,
            intent_waiting: false,
        };
        let info = DeviceInfo {
            device_id: DeviceId::parse(id).expect("id"),
            agent_version: Version::parse(version).expect("v"),
            arch: Arch::X86_64,
            os: BoundedText::truncate("Debian 12"),
            kernel: BoundedText::truncate("6.1.0"),
            podman_version: None,
            boot_id: BoundedText::truncate("boot"),
            config_state: state.clone(),
            agent_started_at: Timestamp::now(),
            updated_at: Timestamp::now(),
        };
        let hb = Heartbeat {
            at: Timestamp::now(),
            uptime_secs: 10,
            agent_version: Version::parse(version).expect("v"),
            config_state: state,
            stopping: None,
            podman_unreachable: None,
        };
        self.status(id, "info", &serde_json::to_vec(&info).expect("json"));
        self.status(id, "heartbeat", &serde_json::to_vec(&hb).expect("json"));
        self.present
            .lock()
            .expect("lock")
            .push(self.server.device(id));
    }

    /// `device`'s info and heartbeat, written by the admin without an ack
    /// (many devices at once).
    fn device_as_admin(&self, admin: &nats::Connection, id: &str, version: &str) {
        let now = Timestamp::now();
        let state = r#"{"state":"configured","waiting-changes":0,"intent-waiting":false}"#;
        let info = format!(
            r#"{{"device-id":"{id}","agent-version":"{version}","arch":"x86_64","os":"Debian 12","kernel":"6.1.0","boot-id":"b","config-state":{state},"agent-started-at":"{now}","updated-at":"{now}"}}"#
        );
        let hb = format!(
            r#"{{"at":"{now}","uptime-secs":10,"agent-version":"{version}","config-state":{state}}}"#
        );
        for (key, v) in [("info", info), ("heartbeat", hb)] {
            admin
                .publish(&kv_subject("fleet-status", &format!("{id}.{key}")), v)
                .expect("publish");
        }
    }

    fn rollback_failed(&self, id: &str) {
        let now = Timestamp::now();
        let v = format!(
            r#"{{"phase":"rollback-failed","reason":"rollback-failed","attempt-uuid":"0b9a4f53-2f0c-4b8e-9a55-6f6f3f0f6d11","attempt-digest":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","target-version":"2.0","error":"starting the previous agent failed","attempt-started-at":"{now}","phase-changed-at":"{now}","transitions":[]}}"#
        );
        self.status(id, "upgrade", v.as_bytes());
    }
}

fn scrape(addr: SocketAddr) -> Option<String> {
    ureq::get(&format!("http://{addr}/metrics"))
        .timeout(Duration::from_secs(10))
        .call()
        .ok()?
        .into_string()
        .ok()
}

fn scrape_until(addr: SocketAddr, what: &str, f: impl Fn(&str) -> bool) -> String {
    poll_until(what, VIEW, || scrape(addr).filter(|s| f(s)))
}

#[test]
fn a_scrape_passes_promtool_counts_unreadable_values_and_says_when_its_view_is_stale() {
    let f = Fleet::start(&["dev1", "dev2", "dev3"]);
    f.device("dev1", "0.3.0", false);
    f.device("dev2", "0.2.0", true);
    f.device("dev3", "0.3.0", false);
    f.label("dev1", "site=berlin");
    f.label("dev2", "site=oslo");
    f.rollback_failed("dev2");
    f.status("dev3", "workloads", b"{not json");
    let started = Instant::now();
    let (_exporter, addr) = f.exporter(&["--group-by", "site"]);
    let page = scrape_until(addr, "a complete view", |s| {
        s.contains("\nharmony_fleet_exporter_view_complete 1\n")
    });
    eprintln!(
        "first complete view after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let out = promtool_ok(Path::new("."), &["check", "metrics"], Some(&page));
    assert!(!out.contains("error"), "{out}\n{page}");
    for want in [
        "harmony_fleet_device_rollback_failed{device=\"dev2\",target_version=\"2.0\",label_site=\"oslo\"} 1\n",
        "harmony_fleet_devices{agent_version=\"0.3.0\",arch=\"x86_64\",config_state=\"configured\",connection=\"online\",label_site=\"berlin\"} 1\n",
        "harmony_fleet_devices{agent_version=\"0.2.0\",arch=\"x86_64\",config_state=\"changefreeze\",connection=\"online\",label_site=\"oslo\"} 1\n",
        "harmony_fleet_upgrade_quarantined_devices{label_site=\"oslo\"} 1\n",
        "harmony_fleet_unreadable_values{kind=\"workloads\"} 1\n",
        "harmony_fleet_exporter_view_stale 0\n",
        "harmony_fleet_exporter_devices_known 3\n",
    ] {
        assert!(page.contains(want), "missing {want}in:\n{page}");
    }
    assert!(page.contains("harmony_fleet_changefreeze_oldest_seconds{label_site=\"oslo\"}"));
    // The dashboard reads only families the exporter serves.
    for e in dashboard_exprs() {
        for f in families(&e) {
            assert!(
                page.contains(&format!("# TYPE {f} ")),
                "the dashboard's {e:?} reads {f}, which the exporter does not serve"
            );
        }
    }

    // Only /metrics is served; anything else is refused, and the page still is.
    match ureq::get(&format!("http://{addr}/other")).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("GET /other: {other:?}"),
    }
    match ureq::post(&format!("http://{addr}/metrics")).call() {
        Err(ureq::Error::Status(405, _)) => {}
        other => panic!("POST /metrics: {other:?}"),
    }
    assert!(scrape(addr).is_some());

    // A change arrives through the consumer: the device repaired.
    f.status("dev2", "upgrade", b"");
    scrape_until(addr, "dev2 out of rollback-failed", |s| {
        !s.contains("device_rollback_failed{device=\"dev2\"")
            && s.contains("\nharmony_fleet_unreadable_values{kind=\"upgrade\"} 1\n")
    });

    // NATS gone: the last view, marked stale; back: current again.
    let mut server = f.server;
    server.stop();
    let page = scrape_until(addr, "the view marked stale", |s| {
        s.contains("\nharmony_fleet_exporter_view_stale 1\n")
    });
    assert!(
        page.contains("harmony_fleet_exporter_devices_known 3\n"),
        "{page}"
    );
    server.restart();
    scrape_until(addr, "the view current again", |s| {
        s.contains("\nharmony_fleet_exporter_view_stale 0\n")
    });
}

/// A real agent of device `id` (Podman off). `released`: the released
/// 0.2.0, which writes its heartbeat at its interval (here every second),
/// so that the exporter's heartbeat rule for it (stale past 90 s) is what
/// a frozen agent crosses; otherwise this build's agent (keep-alive every
/// second too).
fn agent(f: &Fleet, id: &str, dir: &Path, released: bool) -> ChildGuard {
    let root = dir.join(id);
    std::fs::create_dir_all(&root).expect("mkdir");
    let pw = root.join("nats-password");
    std::fs::write(&pw, format!("{}\n", device_password(id))).expect("write");
    let intervals = if released {
        serde_json::json!({"heartbeat-secs": 1, "resync-secs": 2})
    } else {
        serde_json::json!({"heartbeat-secs": 1, "keepalive-secs": 1, "resync-secs": 2})
    };
    let config = serde_json::json!({
        "device-id": id,
        "nats": {
            "servers": [f.server.url()],
            "auth": {"method": "user-password", "user": id, "password-file": pw},
        },
        "podman": {"enabled": false},
        "intervals": intervals,
        "root": root,
    });
    let path = root.join("agent.json");
    std::fs::write(&path, config.to_string()).expect("write");
    let binary = if released {
        fleet_harness::test_agent_path(fleet_harness::RELEASED_AGENT_0_2_VERSION)
    } else {
        bin_path("fleet-agent")
    };
    assert!(
        binary.is_file(),
        "{} is missing: run `make test-agents`",
        binary.display()
    );
    let mut cmd = Command::new(binary);
    cmd.args(["run", "--config"])
        .arg(&path)
        .env_remove("NOTIFY_SOCKET");
    ChildGuard::spawn(cmd, &format!("agent-{id}"))
}

#[test]
fn rollback_failed_and_offline_devices_fire_their_alerts_through_prometheus_and_alertmanager() {
    let started = Instant::now();
    let f = Fleet::start(&["dev1", "dev2", "dev3", "dev4"]);
    let work = tempfile::tempdir().expect("tempdir");
    f.device("dev1", "0.3.0", false);
    f.device("dev2", "0.3.0", false);
    f.label("dev1", "site=berlin");
    f.label("dev3", "site=oslo");
    f.label("dev4", "site=lyon");
    let real = agent(&f, "dev3", work.path(), true);
    let current = agent(&f, "dev4", work.path(), false);
    // Short bounds: a device not seen for a second past the stale bound.
    let (_exporter, addr) = f.exporter(&["--group-by", "site", "--offline-after", "1s"]);
    let hook = WebhookReceiver::start();
    let am = Alertmanager::start(&hook.url());
    let prom = Prometheus::start(
        &[addr],
        &[rules_dir().join("harmony-fleet.rules.yml")],
        Some(am.addr()),
        Duration::from_secs(1),
    );
    poll_until("Prometheus seeing the real agent online", ALERT, || {
        let v = prom.api(
            "query?query=sum(harmony_fleet_devices{connection=%22online%22,label_site=%22oslo%22})",
        )?;
        (v["data"]["result"][0]["value"][1] == "1").then_some(())
    });
    assert!(prom.firing().is_empty(), "{:?}", prom.firing());

    f.rollback_failed("dev1");
    let alert = poll_until("the rollback-failed alert at the webhook", ALERT, || {
        hook.firing()
            .into_iter()
            .find(|(name, _)| name == "HarmonyFleetDeviceRollbackFailed")
    });
    assert_eq!(alert.1["device"], "dev1", "{alert:?}");
    assert_eq!(alert.1["label_site"], "berlin", "{alert:?}");
    assert_eq!(alert.1["severity"], "critical", "{alert:?}");
    let n = hook.notifications();
    let annotations = &n
        .iter()
        .flat_map(|n| n["alerts"].as_array().cloned().unwrap_or_default())
        .find(|a| a["labels"]["alertname"] == "HarmonyFleetDeviceRollbackFailed")
        .expect("the alert")["annotations"];
    assert!(
        annotations["runbook_url"]
            .as_str()
            .is_some_and(|u| u.ends_with("updater/REPAIR.md")),
        "{annotations}"
    );
    assert!(
        hook.firing()
            .iter()
            .all(|(name, l)| name != "HarmonyFleetDeviceRollbackFailed" || l["device"] == "dev1"),
        "{:?}",
        hook.firing()
    );
    eprintln!(
        "rollback-failed alert delivered after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // This build's agent (an hourly keep-alive: its heartbeat says nothing
    // for an hour) killed: the cluster's presence says at once that it is
    // connected nowhere, and the offline alert follows on the exporter's
    // next presence read.
    poll_until("Prometheus seeing this build's agent online", ALERT, || {
        let v = prom.api(
            "query?query=sum(harmony_fleet_devices{connection=%22online%22,label_site=%22lyon%22})",
        )?;
        (v["data"]["result"][0]["value"][1] == "1").then_some(())
    });
    current.signal(Signal::KILL);
    let killed = Instant::now();
    let alert = poll_until("the offline alert of the killed agent", ALERT, || {
        hook.firing()
            .into_iter()
            .find(|(name, l)| name == "HarmonyFleetDeviceOffline" && l["device"] == "dev4")
    });
    eprintln!(
        "offline alert of a killed 0.3 agent delivered {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    assert_eq!(alert.1["label_site"], "lyon", "{alert:?}");

    // The real agent frozen in place: its connection stays open (no FIN),
    // its heartbeats stop; past the stale bound the offline alert fires.
    assert!(
        hook.firing().iter().all(|(_, l)| l["device"] != "dev3"),
        "{:?}",
        hook.firing()
    );
    real.signal(Signal::STOP);
    let stopped = Instant::now();
    let alert = poll_until(
        "the offline alert of the stopped agent",
        STALE_HEARTBEAT_BOUND + ALERT,
        || {
            hook.firing()
                .into_iter()
                .find(|(name, l)| name == "HarmonyFleetDeviceOffline" && l["device"] == "dev3")
        },
    );
    assert_eq!(alert.1["label_site"], "oslo", "{alert:?}");
    eprintln!(
        "offline alert delivered {:.1} s after the agent stopped; test took {:.1} s",
        stopped.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    real.signal(Signal::CONT);
    let _ = am.log();
}

/// utime+stime and VmRSS of a process.
fn cpu_and_rss(pid: u32) -> (Duration, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the comm.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    // USER_HZ is 100 on Linux.
    (Duration::from_millis(ticks * 10), rss_kib * 1024)
}

/// The exporter over N devices' keys (info, heartbeat, workloads with two
/// workloads each, a site label of 20), written straight into the bucket:
/// every device known in its first complete view, and a page whose size
/// does not grow with the fleet (aggregates, no per-device series for
/// healthy devices). 2,000 devices in `make test`; the figures of
/// docs/operator/metrics.md "At scale" come from `make bench` or, by hand,
/// `cargo build --release -p fleetctl && FLEET_METRICS_DEVICES=100000
/// FLEET_METRICS_FLEETCTL=target/release/fleetctl cargo test -p fleetctl
/// --test metrics exporter_at_scale -- --nocapture`.
#[test]
fn exporter_at_scale() {
    let n: usize = std::env::var("FLEET_METRICS_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let fleetctl = std::env::var_os("FLEET_METRICS_FLEETCTL")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            }
        })
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fleetctl")));
    let f = Fleet::start(&[]);
    let admin = f.server.admin();
    let now = Timestamp::now();
    let workloads = format!(
        r#"{{"workloads":{{"web":{{"state":"running","image":"registry.example.com/web:1","spec-hash":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","restarts":0,"since":"{now}"}},"cam":{{"state":"back-off","image":"registry.example.com/cam:2","spec-hash":"5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef","restarts":3,"since":"{now}"}}}},"observed-at":"{now}"}}"#
    );
    let wrote = Instant::now();
    for i in 0..n {
        let id = format!("d{i:06}");
        f.device_as_admin(&admin, &id, if i % 3 == 0 { "0.2.0" } else { "0.3.0" });
        admin
            .publish(
                &kv_subject("fleet-status", &format!("{id}.workloads")),
                &workloads,
            )
            .expect("publish");
        admin
            .publish(
                &kv_subject("fleet-operator", &format!("labels.{id}")),
                format!(r#"{{"labels":{{"site":"site{}"}}}}"#, i % 20),
            )
            .expect("publish");
        if i % 1000 == 999 {
            admin.flush().expect("flush");
        }
    }
    admin.flush().expect("flush");
    poll_until("every key stored", Duration::from_secs(300), || {
        let r = admin
            .request_timeout(
                "$JS.API.STREAM.INFO.KV_fleet-status",
                b"",
                Duration::from_secs(10),
            )
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&r.data).ok()?;
        (v["state"]["messages"].as_u64()? >= 3 * n as u64).then_some(())
    });
    eprintln!(
        "{n} devices written in {:.1} s",
        wrote.elapsed().as_secs_f64()
    );
    let start = Instant::now();
    let (exporter, addr) = f.exporter_of(&fleetctl, &["--group-by", "site"]);
    let want = format!("\nharmony_fleet_exporter_devices_known {n}\n");
    poll_until("the first complete view", Duration::from_secs(600), || {
        scrape(addr).filter(|s| {
            s.contains("\nharmony_fleet_exporter_view_complete 1\n") && s.contains(&want)
        })
    });
    let first = start.elapsed();
    let line = exporter.wait_for_line("first complete view", VIEW);
    let (cpu_start, _) = cpu_and_rss(exporter.pid());
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..5 {
        let t = Instant::now();
        bytes = scrape(addr).expect("scrape").len();
        times.push(t.elapsed());
    }
    let (cpu_end, rss) = cpu_and_rss(exporter.pid());
    times.sort();
    eprintln!(
        "exporter over {n} devices: {line}; complete view seen by a scrape {:.1} s after the start; \
CPU to it {:.1} s; scrape median {:.0} ms (max {:.0} ms), {bytes} bytes; RSS {:.1} MiB; CPU {:.0} ms for 5 scrapes",
        first.as_secs_f64(),
        cpu_start.as_secs_f64(),
        times[2].as_secs_f64() * 1e3,
        times[4].as_secs_f64() * 1e3,
        rss as f64 / (1024.0 * 1024.0),
        (cpu_end - cpu_start).as_secs_f64() * 1e3,
    );
    assert!(
        bytes < 64 * 1024,
        "{bytes} bytes for {n} devices: the page grows with the fleet"
    );
}

/// Prometheus's own graph page (no Grafana package in Debian) over 40
/// simulated devices upgrading from 0.2.0 to 0.3.0, rendered by Debian's
/// headless Chromium into a PNG (a temp file; the picture in
/// docs/operator/metrics.md is this test's, written there with
/// `FLEET_METRICS_SCREENSHOT=docs/operator/metrics-prometheus.png cargo
/// test -p fleetctl --test metrics screenshot`).
#[test]
fn screenshot_of_the_prometheus_graph_page() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = std::env::var_os("FLEET_METRICS_SCREENSHOT")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            }
        })
        .unwrap_or_else(|| tmp.path().join("metrics-prometheus.png"));
    let chromium = fleet_harness::require_tool("chromium", "chromium");
    let f = Fleet::start(&[]);
    let admin = f.server.admin();
    for i in 0..40 {
        f.device_as_admin(&admin, &format!("d{i:02}"), "0.2.0");
    }
    admin.flush().expect("flush");
    let (_exporter, addr) = f.exporter(&[]);
    let prom = Prometheus::start(&[addr], &[], None, Duration::from_secs(1));
    // Two devices a second move to 0.3.0, with Prometheus scraping.
    for i in 0..40 {
        f.device_as_admin(&admin, &format!("d{i:02}"), "0.3.0");
        admin.flush().expect("flush");
        if i % 2 == 1 {
            let want = (i + 1).to_string();
            poll_until("Prometheus seeing the upgrade", VIEW, || {
                let v =
                    prom.api("query?query=sum(harmony_fleet_devices{agent_version=%220.3.0%22})")?;
                (v["data"]["result"][0]["value"][1] == want.as_str()).then_some(())
            });
        }
    }
    let url = format!(
        "{}/graph?g0.expr={}&g0.tab=0&g0.range_input=30s",
        prom.url(),
        "sum%20by%20(agent_version)%20(harmony_fleet_devices)"
    );
    let status = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--hide-scrollbars",
            "--window-size=1280,800",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--screenshot={}", out.display()))
        .arg(&url)
        .status()
        .expect("chromium");
    assert!(status.success(), "chromium: {status}");
    let png = std::fs::read(&out).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} is not a rendered page ({} bytes)",
        out.display(),
        png.len()
    );
    eprintln!("wrote {}", out.display());
}
