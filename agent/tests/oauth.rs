//! The agent with `nats.auth.method: oauth2-client-credentials` against real
//! parts: the harness identity provider (HTTPS token endpoint and JWKS, test
//! CA), nats-server 2.14 in the auth-callout layout and the real
//! `fleet-auth-callout` binary. Tokens live [`TTL`] (the callout's user
//! expires with them, no clock skew allowed), so a run of a few tokens'
//! lifetimes crosses several expiries.
//!
//! Checked: the agent connects through the callout, becomes READY,
//! reconciles and publishes status; renews its connection before each
//! expiry without a gap in heartbeats and without restarting healthy
//! containers; retries a failing identity provider with a growing delay
//! and comes back with a fresh token after the server cut it off; fails at
//! once (exit 12) when the provider refuses its client; probe mode gets its
//! own fresh token; and neither the secret nor any token reaches a log.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use fleet_common::contracts::{Heartbeat, SelfTestReport};
use fleet_common::Timestamp;
use fleet_harness::{poll_until, CalloutNats, ChildGuard, Idp, Podman};
use rustix::process::Signal;
use serde_json::json;
use tempfile::TempDir;

/// Lifetime of every token the provider issues in these tests.
const TTL: Duration = Duration::from_secs(6);
/// The heartbeat interval is 1 s; a renewal may add a request bound.
const MAX_HEARTBEAT_GAP: Duration = Duration::from_millis(3500);

fn client_id(device: &str) -> String {
    format!("{device}-client")
}

fn client_secret(device: &str) -> String {
    format!("s3cr3t-{device}-Qx7")
}

/// Provider, server and callout, with clients for `dev1` and `dev2`.
struct Fleet {
    idp: Idp,
    nats: CalloutNats,
    secrets: TempDir,
}

impl Fleet {
    fn start() -> Fleet {
        Fleet::start_with_ttl(TTL)
    }

    /// With tokens living `ttl`.
    fn start_with_ttl(ttl: Duration) -> Fleet {
        let idp = Idp::start();
        for d in ["dev1", "dev2"] {
            idp.add_client(&client_id(d), &client_secret(d), d, ttl);
        }
        let nats = CalloutNats::start(&idp, json!({"clock_skew_secs": 0}));
        Fleet {
            idp,
            nats,
            secrets: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The agent settings of `device`: OAuth2 with its client, secret in a
    /// file, the provider's CA.
    fn settings(&self, device: &str, podman: bool, secret: &str) -> Settings {
        static FILES: AtomicUsize = AtomicUsize::new(0);
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let path = self.secrets.path().join(format!("{device}-secret-{n}"));
        std::fs::write(&path, format!("{secret}\n")).expect("write secret");
        let mut s = Settings::new(vec![self.nats.server.url()]);
        s.podman = podman;
        s.auth = Some(json!({
            "method": "oauth2-client-credentials",
            "token-url": self.idp.token_url(),
            "client-id": client_id(device),
            "client-secret-file": path,
            "scope": "openid urn:zitadel:iam:org:project:id:fleet-project:aud",
            "ca-file": self.idp.ca.ca_path(),
        }));
        s
    }

    /// No token issued to `device`, nor its secret, appears in `log`.
    fn assert_no_secrets(&self, device: &str, log: &str) {
        let tokens = self.idp.issued_tokens(&client_id(device));
        assert!(!tokens.is_empty(), "no token was issued to {device}");
        for t in &tokens {
            for part in t.split('.').skip(1) {
                assert!(!log.contains(part), "a token of {device} is in the log");
            }
        }
        assert!(
            !log.contains(&client_secret(device)),
            "{device}'s secret is in the log"
        );
    }
}

fn heartbeat(admin: &nats::Connection) -> Option<Heartbeat> {
    status(admin, "dev1", "heartbeat")
}

/// Watches dev1's heartbeat for `span`; returns the longest time between
/// two changes of its timestamp (and from the start to the first change).
fn longest_heartbeat_gap(admin: &nats::Connection, span: Duration) -> Duration {
    let start = Instant::now();
    let mut last: Option<Timestamp> = None;
    let mut last_change = start;
    let mut longest = Duration::ZERO;
    while start.elapsed() < span {
        let now = Instant::now();
        let at = heartbeat(admin).map(|h| h.at);
        if at.is_some() && at != last {
            longest = longest.max(now - last_change);
            last_change = now;
            last = at;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    longest.max(Instant::now() - last_change)
}

/// A heartbeat written after `after`, within `timeout`.
fn heartbeat_after(admin: &nats::Connection, after: Timestamp, timeout: Duration) -> Heartbeat {
    poll_until("a new heartbeat", timeout, || {
        heartbeat(admin).filter(|h| h.at > after)
    })
}

/// Lines of `agent`'s log from `from` containing `needle`.
fn lines_with(agent: &ChildGuard, from: usize, needle: &str) -> Vec<String> {
    agent
        .lines()
        .into_iter()
        .skip(from)
        .filter(|l| l.contains(needle))
        .collect()
}

/// The delay of a "retrying in <n> ms" line.
fn retry_ms(line: &str) -> u64 {
    line.split("retrying in ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no delay in {line:?}"))
}

#[test]
fn the_agent_stays_connected_through_the_callout_across_token_renewals() {
    let podman = Podman::new();
    let fleet = Fleet::start();
    let admin = fleet.nats.server.admin();
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "v1"));
    let dev = Device::new(
        "dev1",
        &fleet.settings("dev1", true, &client_secret("dev1")),
        Some(&podman),
    );
    let mut agent = dev.start(Some(&podman));
    let web = wait_running(&podman, "fleet-web", "web running", |_| true);
    fleet.nats.logged("authorized device dev1");
    assert!(
        dev.notify
            .find("READY=1")
            .expect("ready")
            .contains("1 workloads desired"),
        "{:?}",
        dev.notify.all()
    );

    // Four token lifetimes: heartbeats never stop.
    let started = Instant::now();
    let gap = longest_heartbeat_gap(&admin, 4 * TTL);
    assert!(
        gap <= MAX_HEARTBEAT_GAP,
        "heartbeats stopped for {gap:?}:\n{}\n{}",
        agent.log(),
        fleet.nats.logs()
    );
    // Each token was renewed ahead of its expiry, on a new connection the
    // callout authorized; the server never cut the agent off.
    let renewed = lines_with(&agent, 0, "NATS connection renewed (token due for renewal)").len();
    let lifetimes = (started.elapsed().as_secs() / TTL.as_secs()) as usize;
    assert!(
        renewed >= lifetimes,
        "{renewed} renewals in {lifetimes} lifetimes:\n{}",
        agent.log()
    );
    assert!(fleet.idp.issued(&client_id("dev1")) > renewed);
    let callout_log = fleet.nats.callout.log();
    assert!(
        callout_log.matches("authorized device dev1").count() > renewed,
        "{callout_log}"
    );
    let log = agent.log();
    for unwanted in ["NATS connection lost", "refused", "NATS server error"] {
        assert!(!log.contains(unwanted), "{unwanted:?} in:\n{log}");
    }
    assert!(
        !fleet.nats.server.log().to_lowercase().contains("expired"),
        "{}",
        fleet.nats.server.log()
    );

    // The healthy container was left alone while the consumers started
    // over on each new connection, and a change still applies.
    assert_eq!(
        container(&podman, "fleet-web").expect("web").id,
        web.id,
        "the container was restarted"
    );
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "v2"));
    wait_running(&podman, "fleet-web", "web replaced", |c| c.id != web.id);
    poll_until("the workloads report", CONVERGE, || {
        status::<serde_json::Value>(&admin, "dev1", "workloads")
    });

    agent.signal(Signal::TERM);
    let exit = agent.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "{exit}: {}", agent.log());
    assert!(heartbeat(&admin).expect("heartbeat").stopping.is_some());
    fleet.assert_no_secrets("dev1", &agent.log());
}

/// A server restart under an agent with a long-lived token: it connects
/// again with the token it has (the crate's reconnect, or the renewer's new
/// connection once the crate gives up), its reads and subscriptions start
/// over, and a change made after the restart applies.
#[test]
fn a_server_restart_is_survived_with_the_kept_token() {
    let podman = Podman::new();
    let mut fleet = Fleet::start_with_ttl(Duration::from_secs(600));
    put_workload(
        &fleet.nats.server.admin(),
        "dev1",
        "web",
        &quick_sleeper(&podman, "v1"),
    );
    let dev = Device::new(
        "dev1",
        &fleet.settings("dev1", true, &client_secret("dev1")),
        Some(&podman),
    );
    let agent = dev.start(Some(&podman));
    let web = wait_running(&podman, "fleet-web", "web running", |_| true);
    let issued = fleet.idp.issued(&client_id("dev1"));

    let from = agent.line_count();
    fleet.nats.server.restart();
    poll_until("a new connection", CONVERGE, || {
        (!lines_with(&agent, from, "NATS reconnected").is_empty()
            || !lines_with(&agent, from, "NATS connection renewed (connection closed)").is_empty())
        .then_some(())
    });
    agent.wait_for_line_after(from, "snapshot complete", CONVERGE);
    let admin = fleet.nats.server.admin();
    put_workload(&admin, "dev1", "api", &quick_sleeper(&podman, "api"));
    wait_running(
        &podman,
        "fleet-api",
        "api running after the restart",
        |_| true,
    );
    assert_eq!(
        container(&podman, "fleet-web"),
        Some(web),
        "the healthy container was restarted"
    );
    let before = heartbeat(&admin).expect("heartbeat").at;
    heartbeat_after(&admin, before, Duration::from_secs(10));
    assert_eq!(
        fleet.idp.issued(&client_id("dev1")),
        issued,
        "a valid token was replaced"
    );
    fleet.assert_no_secrets("dev1", &agent.log());
}

/// The running agent's callout user is confined like a static device user:
/// another device, with its own token, cannot hear the agent's replies or
/// deliveries, read its desired state or overwrite its status, while the
/// agent keeps reading and writing, across a renewal.
#[test]
fn the_agents_callout_user_is_isolated_from_another_device() {
    let fleet = Fleet::start();
    let admin = fleet.nats.server.admin();
    put_workload(&admin, "dev1", "web", r#"{"image":"localhost/web:1"}"#);
    let dev = Device::new(
        "dev1",
        &fleet.settings("dev1", false, &client_secret("dev1")),
        None,
    );
    let mut agent = dev.start(None);
    let token = fleet
        .idp
        .fetch_token(&client_id("dev2"), &client_secret("dev2"))
        .expect("dev2's token");
    let spy = fleet.nats.device("dev2", &token);
    let violation = |kind: &str, subject: &str| {
        let err = spy
            .next_error(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no {kind} violation for {subject}"));
        assert!(
            err.contains(&format!("Permissions Violation for {kind}")) && err.contains(subject),
            "{err}"
        );
    };
    let inbox_spy = spy.conn.subscribe("_INBOX.dev1.>").expect("sent");
    violation("Subscription", "_INBOX.dev1.>");
    let deliver_spy = spy.conn.subscribe("deliver.dev1.>").expect("sent");
    violation("Subscription", "deliver.dev1.>");
    let (response, got) = spy.read_keys("fleet-desired", "dev1", "dev1", Duration::from_secs(1));
    violation("Publish", "$KV.fleet-desired.dev1.>");
    assert!(response.is_none() && got.is_empty(), "{response:?} {got:?}");
    spy.conn
        .publish("$KV.fleet-status.dev1.heartbeat", b"forged")
        .expect("sent");
    violation("Publish", "$KV.fleet-status.dev1.heartbeat");

    // The agent goes on, on a new connection after a renewal: its
    // heartbeats land (and parse), its consumer reads a new snapshot.
    let from = agent.line_count();
    agent.wait_for_line_after(from, "NATS connection renewed", CONVERGE);
    agent.wait_for_line_after(from, "snapshot complete: 1 keys", CONVERGE);
    let before = heartbeat(&admin).expect("heartbeat").at;
    heartbeat_after(&admin, before, Duration::from_secs(5));
    spy.conn
        .flush_timeout(Duration::from_secs(5))
        .expect("flush");
    assert!(inbox_spy.try_next().is_none(), "dev2 heard dev1's replies");
    assert!(
        deliver_spy.try_next().is_none(),
        "dev2 heard dev1's deliveries"
    );
    assert!(spy.next_error(Duration::from_millis(100)).is_none());

    agent.signal(Signal::TERM);
    let exit = agent.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "{exit}: {}", agent.log());
    fleet.assert_no_secrets("dev1", &agent.log());
}

#[test]
fn a_failing_identity_provider_is_retried_with_back_off() {
    let fleet = Fleet::start();
    let admin = fleet.nats.server.admin();
    let dev = Device::new(
        "dev1",
        &fleet.settings("dev1", false, &client_secret("dev1")),
        None,
    );

    // Down at start: the agent retries within its window, with a growing
    // delay, and connects once the provider answers.
    fleet.idp.set_outage(Some(503));
    let mut agent = dev.spawn(None);
    let unavailable = format!(
        "token endpoint {} is unavailable (HTTP 503, \"temporarily_unavailable\"",
        fleet.idp.token_url()
    );
    poll_until("two failed token requests", CONVERGE, || {
        (lines_with(&agent, 0, &unavailable).len() >= 2).then_some(())
    });
    assert!(
        fleet.idp.token_requests() <= 3,
        "{} token requests: no back-off",
        fleet.idp.token_requests()
    );
    fleet.idp.set_outage(None);
    dev.wait_ready(&mut agent);

    // Down while running: the renewal fails, the token expires, the server
    // cuts the agent off; the renewer keeps asking, each time later.
    let from = agent.line_count();
    fleet.idp.set_outage(Some(503));
    agent.wait_for_line_after(
        from,
        "renewing the NATS connection (token due for renewal): token endpoint",
        CONVERGE,
    );
    let cut = "renewing the NATS connection (token refused by the server)";
    let retries = poll_until("three retries after the cut-off", CONVERGE, || {
        let l = lines_with(&agent, from, cut);
        (l.len() >= 3).then_some(l)
    });
    let delays: Vec<u64> = retries.iter().map(|l| retry_ms(l)).collect();
    assert!(
        delays.windows(2).all(|w| w[1] > w[0]),
        "delays do not grow: {delays:?}"
    );
    assert!(
        retries.iter().all(|l| l.contains(&unavailable)),
        "{retries:?}"
    );
    assert!(
        fleet.nats.server.log().to_lowercase().contains("expired"),
        "the server did not end the expired user:\n{}",
        fleet.nats.server.log()
    );
    let before = heartbeat(&admin).expect("heartbeat").at;

    // Back: a fresh token, a new connection, heartbeats again.
    fleet.idp.set_outage(None);
    agent.wait_for_line_after(
        from,
        "NATS connection renewed (token refused by the server)",
        CONVERGE,
    );
    heartbeat_after(&admin, before, Duration::from_secs(10));

    agent.signal(Signal::TERM);
    let exit = agent.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "{exit}: {}", agent.log());
    fleet.assert_no_secrets("dev1", &agent.log());
}

#[test]
fn a_refused_client_exits_12_at_once_without_the_secret() {
    let fleet = Fleet::start();
    let dev = Device::new("dev1", &fleet.settings("dev1", false, "wrong-Zq9"), None);
    let started = Instant::now();
    let mut agent = dev.spawn(None);
    let exit = agent.wait_exit(Duration::from_secs(30));
    assert_eq!(exit.code(), Some(12), "{}", agent.log());
    assert!(started.elapsed() < Duration::from_secs(10));
    let log = agent.log();
    assert!(
        log.contains(&format!(
            "no bearer token for NATS: token endpoint {} refused (HTTP 401, \"invalid_client\": \"unknown client or bad secret\")",
            fleet.idp.token_url()
        )),
        "{log}"
    );
    assert!(!log.contains("wrong-Zq9"), "{log}");
    assert_eq!(fleet.idp.token_requests(), 1, "a refusal is not retried");
    assert!(dev.notify.find("READY=1").is_none());
}

/// Runs `--self-test`; its exit code and report.
fn probe(dev: &Device) -> (i32, SelfTestReport, String) {
    let mut p = ChildGuard::spawn(dev.command(&["--self-test"], None), "probe");
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

#[test]
fn probe_mode_authenticates_with_its_own_fresh_token() {
    let fleet = Fleet::start();
    let dev = Device::new(
        "dev1",
        &fleet.settings("dev1", false, &client_secret("dev1")),
        None,
    );
    let _updater = dev.fake_updater_socket();
    let mut agent = dev.start(None);
    let issued = fleet.idp.issued(&client_id("dev1"));
    let (code, report, out) = probe(&dev);
    assert_eq!(code, 0, "{out}");
    assert!(report.failures().is_empty(), "{report:?}");
    let nats_auth = report
        .checks
        .iter()
        .find(|c| c.name.to_string() == "nats-auth")
        .expect("nats-auth check");
    assert!(nats_auth.ok, "{report:?}");
    // The probe asked for its own token; the live agent kept running.
    assert!(fleet.idp.issued(&client_id("dev1")) > issued);
    assert!(agent.try_wait().is_none(), "{}", agent.log());
    fleet.assert_no_secrets("dev1", &out);

    // A refused client: the nats-auth step fails with the provider's reason.
    let bad = Device::new("dev1", &fleet.settings("dev1", false, "wrong-Zq9"), None);
    let _updater2 = bad.fake_updater_socket();
    let (code, report, out) = probe(&bad);
    assert_eq!(code, 12, "{out}");
    let failures = report.failures();
    assert!(
        failures[0].starts_with("nats-auth: no bearer token for NATS: token endpoint")
            && failures[0].contains("\"invalid_client\""),
        "{failures:?}"
    );
    assert!(!out.contains("wrong-Zq9"), "{out}");
}
