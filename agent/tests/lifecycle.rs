//! The agent's process lifecycle: readiness, the one-mutator lock, and the
//! SIGTERM drain with a mutation in flight.

mod common;

use std::time::{Duration, Instant};

use common::*;
use fleet_common::contracts::{Heartbeat, WorkloadSpec, WorkloadState, WorkloadsReport};
use fleet_harness::{poll_until, NatsServer, NatsVersion, Podman};
use rustix::process::Signal;

fn second_instance_is_refused(v: NatsVersion) {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(v, &["dev1"]);
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let first = dev.start(Some(&podman));
    let mut second = dev.spawn(Some(&podman));
    let status = second.wait_exit(CONVERGE);
    assert_eq!(status.code(), Some(20), "{}", second.log());
    let expected = format!(
        "another fleet-agent (pid {}) holds {}",
        first.pid(),
        dev.path("run/harmony-fleet/agent.lock").display()
    );
    assert!(second.log().contains(&expected), "{}", second.log());
    assert!(
        dev.notify
            .all()
            .iter()
            .filter(|m| m.contains("READY=1"))
            .count()
            == 1
    );
}

#[test]
fn second_instance_is_refused_2_9() {
    second_instance_is_refused(NatsVersion::V2_9);
}

#[test]
fn second_instance_is_refused_2_14() {
    second_instance_is_refused(NatsVersion::V2_14);
}

/// SIGTERM while a replacement is removing a container that ignores
/// SIGTERM (podman waits its 10 s stop timeout): the agent finishes the
/// replacement, publishes an acknowledged `stopping` heartbeat with the
/// drain duration, then STOPPING=1, and exits 0 well within 60 s.
fn sigterm_during_a_long_mutation(v: NatsVersion) {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(v, &["dev1"]);
    let admin = nats.admin();
    put_workload(&admin, "dev1", "web", &sleeper(&podman, "v1"));
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let mut agent = dev.start(Some(&podman));
    let old = wait_running(&podman, "fleet-web", "web running", |_| true);

    let v2 = sleeper(&podman, "v2");
    let from = agent.line_count();
    put_workload(&admin, "dev1", "web", &v2);
    agent.wait_for_line_after(from, "replace web", CONVERGE);
    let sent = Instant::now();
    agent.signal(Signal::TERM);
    let status = agent.wait_exit(Duration::from_secs(60));
    let took = sent.elapsed();
    assert!(status.success(), "{status}: {}", agent.log());
    assert!(took < Duration::from_secs(55), "drain took {took:?}");
    assert!(
        agent
            .log()
            .contains("waiting for the mutation in flight: replace web"),
        "{}",
        agent.log()
    );

    // The mutation finished: the new container runs.
    let new = container(&podman, "fleet-web").expect("web exists");
    assert_ne!(new.id, old.id);
    assert_eq!(new.state, "running");
    let v2_hash = WorkloadSpec::from_json(v2.as_bytes())
        .expect("spec")
        .spec_hash();
    assert_eq!(new.spec_hash.as_deref(), Some(v2_hash.as_str()));

    // STOPPING=1 came last, after the acknowledged stopping heartbeat.
    let notes = dev.notify.all();
    assert!(
        notes.last().is_some_and(|m| m.contains("STOPPING=1")),
        "{notes:?}"
    );
    let hb: Heartbeat = status_of(&admin);
    let stopping = hb.stopping.expect("the last heartbeat says stopping");
    // Removing the old container alone takes podman's 10 s stop timeout.
    assert!(stopping.drain_duration_ms >= 5_000, "{stopping:?}");
    assert!(
        u128::from(stopping.drain_duration_ms) <= took.as_millis(),
        "{stopping:?} {took:?}"
    );
}

fn status_of(admin: &nats::Connection) -> Heartbeat {
    status(admin, "dev1", "heartbeat").expect("heartbeat")
}

#[test]
fn sigterm_during_a_long_mutation_2_9() {
    sigterm_during_a_long_mutation(NatsVersion::V2_9);
}

#[test]
fn sigterm_during_a_long_mutation_2_14() {
    sigterm_during_a_long_mutation(NatsVersion::V2_14);
}

/// An empty device is ready too (the create response says nothing is
/// pending); an idle SIGTERM drains at once.
#[test]
fn empty_device_becomes_ready_and_stops_at_once() {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = nats.admin();
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let mut agent = dev.start(Some(&podman));
    assert!(dev
        .notify
        .find("READY=1")
        .expect("ready")
        .contains("0 workloads desired"));
    agent.signal(Signal::INT);
    let status = agent.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{}", agent.log());
    let hb = status_of(&admin);
    assert!(hb.stopping.expect("stopping").drain_duration_ms < 5_000);
}

/// Without a server the agent keeps retrying within its window, and a
/// SIGTERM then ends it cleanly without READY.
#[test]
fn sigterm_while_connecting_exits_cleanly() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "nats://127.0.0.1:{}",
        unused.local_addr().expect("addr").port()
    );
    drop(unused);
    let dev = Device::new(
        "dev1",
        &Settings {
            podman: false,
            ..Settings::new(vec![url])
        },
        None,
    );
    let mut agent = dev.spawn(None);
    agent.wait_for_line("connecting to NATS at", CONVERGE);
    agent.signal(Signal::TERM);
    let status = agent.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{}", agent.log());
    assert!(dev.notify.find("READY=1").is_none());
    poll_until("STOPPING=1", Duration::from_secs(5), || {
        dev.notify.find("STOPPING=1")
    });
}

/// A start-up that stalls names the step it waits on,
/// with how long, at least every 10 s: here NATS, unreachable.
#[test]
fn a_stalled_start_up_names_the_step_every_10_s() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "nats://127.0.0.1:{}",
        unused.local_addr().expect("addr").port()
    );
    drop(unused);
    let dev = Device::new(
        "dev1",
        &Settings {
            podman: false,
            ..Settings::new(vec![url.clone()])
        },
        None,
    );
    let started = Instant::now();
    let mut agent = dev.spawn(None);
    let needle = format!("start-up: still waiting for the NATS connection ({url}) after ");
    let first = agent.wait_for_line(&needle, Duration::from_secs(20));
    let first_at = started.elapsed();
    assert!(
        first_at < Duration::from_secs(13),
        "first waiting line after {first_at:?}: {first}"
    );
    // The step's whole seconds when the report was due (a second more
    // when the machine is slow to wake the reporter).
    let within_a_second = |line: &str, secs: u64| {
        [secs, secs + 1]
            .iter()
            .any(|s| line.contains(&format!("{needle}{s} s")))
    };
    assert!(within_a_second(&first, 10), "{first}");
    let from = agent.line_count();
    let second = agent.wait_for_line_after(from, &needle, Duration::from_secs(15));
    assert!(within_a_second(&second, 20), "{second}");
    let status = ["10", "11"].iter().find_map(|secs| {
        dev.notify.find(&format!(
            "STATUS=waiting for the NATS connection ({url}) ({secs} s)"
        ))
    });
    assert!(status.is_some(), "{:?}", dev.notify.all());
    assert!(
        started.elapsed() - first_at < Duration::from_secs(13),
        "repeated within ~10 s: {}",
        agent.log()
    );
    agent.signal(Signal::TERM);
    let status = agent.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{}", agent.log());
}

/// Deletes bucket `bucket`'s stream, as the admin.
fn delete_bucket(admin: &nats::Connection, bucket: &str) {
    let subject = format!(
        "$JS.API.STREAM.DELETE.{}",
        fleet_common::subjects::stream_name(bucket)
    );
    let reply = admin
        .request_timeout(&subject, "", Duration::from_secs(10))
        .expect("delete stream");
    assert!(
        !String::from_utf8_lossy(&reply.data).contains("\"error\""),
        "{}",
        String::from_utf8_lossy(&reply.data)
    );
}

/// Creates bucket `bucket` again, as `fleetctl buckets create` would.
fn create_bucket(admin: &nats::Connection, bucket: &str) {
    use fleet_common::nats_config::{kv_stream_config, stream_create_subject, FLEET_BUCKETS};
    let spec = FLEET_BUCKETS
        .iter()
        .find(|s| s.bucket == bucket)
        .expect("a fleet bucket");
    let reply = admin
        .request_timeout(
            &stream_create_subject(bucket),
            kv_stream_config(spec, 1).to_string(),
            Duration::from_secs(10),
        )
        .expect("create stream");
    assert!(
        !String::from_utf8_lossy(&reply.data).contains("\"error\""),
        "{}",
        String::from_utf8_lossy(&reply.data)
    );
}

/// The snapshots name themselves too while they stall:
/// the desired snapshot before READY, the first intent snapshot after it,
/// each with a line when it is no longer waited on.
#[test]
fn stalled_snapshots_name_themselves() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = nats.admin();
    delete_bucket(&admin, "fleet-workloads");
    delete_bucket(&admin, "fleet-control");
    let mut settings = Settings::new(vec![nats.url()]);
    settings.podman = false;
    let dev = Device::new("dev1", &settings, None);
    let mut agent = dev.spawn(None);
    agent.wait_for_line(
        "start-up: still waiting for the desired-state snapshot (fleet-workloads) after 10 s",
        Duration::from_secs(30),
    );
    assert!(dev.notify.find("READY=1").is_none());
    create_bucket(&admin, "fleet-workloads");
    agent.wait_for_line(
        "start-up: no longer waiting for the desired-state snapshot (fleet-workloads) after",
        Duration::from_secs(60),
    );
    poll_until("READY=1", Duration::from_secs(10), || {
        dev.notify.find("READY=1")
    });
    agent.wait_for_line(
        "start-up: still waiting for the first upgrade intent snapshot (fleet-control) after 10 s",
        Duration::from_secs(30),
    );
    create_bucket(&admin, "fleet-control");
    agent.wait_for_line(
        "start-up: no longer waiting for the first upgrade intent snapshot (fleet-control) after",
        Duration::from_secs(60),
    );
    agent.signal(Signal::TERM);
    let status = agent.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{}", agent.log());
}

/// Wrong credentials fail at once (no 3-minute retry) with the NATS exit code.
#[test]
fn refused_credentials_exit_12() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let mut settings = Settings::new(vec![nats.url()]);
    settings.podman = false;
    settings.password = Some("wrong".into());
    let dev = Device::new("dev1", &settings, None);
    let mut agent = dev.spawn(None);
    let status = agent.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(12), "{}", agent.log());
    assert!(
        agent.log().contains("refused the agent's credentials"),
        "{}",
        agent.log()
    );
}

/// A bad config exits 10 naming the key.
#[test]
fn bad_config_exits_10_naming_the_key() {
    let dev = Device::new(
        "dev1",
        &Settings {
            podman: false,
            ..Settings::new(vec!["nats://127.0.0.1:1".into()])
        },
        None,
    );
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&dev.config).expect("read")).expect("json");
    cfg["nats"]["auth"]["colour"] = "red".into();
    std::fs::write(&dev.config, cfg.to_string()).expect("write");
    let mut agent = dev.spawn(None);
    let status = agent.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(10));
    assert!(
        agent.log().contains("nats.auth.colour: unknown key"),
        "{}",
        agent.log()
    );
}

/// With Podman disabled nothing is run, but every desired workload is
/// reported `pending` with the reason, so the operator sees the device read
/// the change; a deleted one leaves the report.
#[test]
fn podman_disabled_reports_desired_workloads_as_not_run() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let admin = nats.admin();
    let settings = Settings {
        podman: false,
        ..Settings::new(vec![nats.url()])
    };
    let dev = Device::new("dev1", &settings, None);
    let _agent = dev.start(None);
    let spec = r#"{"image":"localhost/fleet-test/sleeper:1"}"#;
    put_workload(&admin, "dev1", "web", spec);
    let hash = WorkloadSpec::from_json(spec.as_bytes())
        .expect("spec")
        .spec_hash();
    let report = poll_until("web reported", CONVERGE, || {
        status::<WorkloadsReport>(&admin, "dev1", "workloads")
            .filter(|r| r.workloads.keys().any(|w| w.as_str() == "web"))
    });
    let web = report.workloads.values().next().expect("web");
    assert_eq!(web.state, WorkloadState::Pending);
    assert_eq!(web.spec_hash, hash);
    assert!(
        web.last_error
            .as_ref()
            .is_some_and(|e| e.as_str().contains("Podman is disabled")),
        "{web:?}"
    );
    delete_workload(&admin, "dev1", "web");
    poll_until("web gone from the report", CONVERGE, || {
        status::<WorkloadsReport>(&admin, "dev1", "workloads").filter(|r| r.workloads.is_empty())
    });
}
