//! The reconciler end to end: the real agent, a real nats-server (2.9 and
//! 2.14) with the fleet layout, and an isolated Podman. Desired state is
//! written as the admin; containers are read back from Podman and the
//! status from NATS.

mod common;

use common::*;
use fleet_common::contracts::{
    AppliedSpecs, DeviceInfo, Heartbeat, WorkloadState, WorkloadsReport,
};
use fleet_harness::{poll_until, NatsServer, NatsVersion, Podman};

fn report(admin: &nats::Connection) -> Option<WorkloadsReport> {
    status(admin, "dev1", "workloads")
}

/// Waits until the reported workload `w` satisfies `pred`.
fn wait_reported(
    admin: &nats::Connection,
    w: &str,
    what: &str,
    pred: impl Fn(&fleet_common::contracts::WorkloadStatus) -> bool,
) -> WorkloadsReport {
    poll_until(what, CONVERGE, || {
        report(admin).filter(|r| r.workloads.iter().any(|(k, s)| k.as_str() == w && pred(s)))
    })
}

fn snapshot_then_deltas(v: NatsVersion) {
    let podman = Podman::new();
    let image = podman.busybox_image();
    let nats = NatsServer::start_fleet(v, &["dev1", "dev2"]);
    let admin = nats.admin();

    // Containers the agent must never touch: an unmanaged one, and one
    // labelled for another device.
    podman.run(&["run", "-d", "--name", "mine", &image, "sleep", "100000"]);
    podman.run(&[
        "run",
        "-d",
        "--name",
        "fleet-other",
        "--label",
        "io.harmony.fleet.managed-by=fleet-agent",
        "--label",
        "io.harmony.fleet.device=dev2",
        "--label",
        "io.harmony.fleet.workload=other",
        &image,
        "sleep",
        "100000",
    ]);
    let untouched = |p: &Podman| {
        let mut v: Vec<Seen> = containers(p)
            .into_iter()
            .filter(|c| c.name == "mine" || c.name == "fleet-other")
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    let before = untouched(&podman);
    assert_eq!(before.len(), 2);

    // The snapshot: one workload of dev1, one of dev2, written before start.
    let web_v1 = quick_sleeper(&podman, "v1");
    put_workload(&admin, "dev1", "web", &web_v1);
    put_workload(&admin, "dev2", "db", &quick_sleeper(&podman, "db"));
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let agent = dev.start(Some(&podman));

    // Device info was acknowledged before READY=1.
    let info: DeviceInfo =
        status(&admin, "dev1", "info").expect("device info published before READY");
    assert_eq!(info.device_id.as_str(), "dev1");
    assert_eq!(
        info.podman_version.as_ref().map(|v| v.as_str()),
        Some("4.3.1")
    );
    assert_eq!(info.config_state.state.name(), "configured");
    let notes = dev.notify.all();
    let ready = dev.notify.position("READY=1").expect("ready");
    for step in [
        "config read, lock taken",
        "reachable",
        "connected to NATS",
        "device info published",
    ] {
        let at = notes
            .iter()
            .position(|m| m.contains(step))
            .unwrap_or_else(|| panic!("no STATUS with {step:?}: {notes:?}"));
        assert!(at < ready, "{step:?} after READY: {notes:?}");
    }
    assert!(
        notes[ready].contains("STATUS=device dev1, 1 workloads desired"),
        "{notes:?}"
    );

    let web = wait_running(&podman, "fleet-web", "web running", |c| {
        c.spec_hash.as_deref() == Some(hash_of(&web_v1).as_str())
    });
    let r = wait_reported(&admin, "web", "web reported running", |s| {
        s.state == WorkloadState::Running && s.container_id.as_deref() == Some(&web.id[..12])
    });
    assert_eq!(r.workloads.len(), 1, "dev2's workload is not dev1's: {r:?}");
    assert!(
        container(&podman, "fleet-db").is_none(),
        "dev1 ran dev2's workload"
    );
    let hb: Heartbeat = poll_until("a heartbeat", CONVERGE, || {
        status(&admin, "dev1", "heartbeat")
    });
    assert_eq!(hb.stopping, None);

    // Delta: a workload added.
    let api = quick_sleeper(&podman, "api");
    put_workload(&admin, "dev1", "api", &api);
    wait_running(&podman, "fleet-api", "api running", |_| true);

    // Delta: web's spec changed: the container is replaced.
    let web_v2 = quick_sleeper(&podman, "v2");
    put_workload(&admin, "dev1", "web", &web_v2);
    let web2 = wait_running(&podman, "fleet-web", "web replaced", |c| c.id != web.id);
    assert_eq!(web2.spec_hash.as_deref(), Some(hash_of(&web_v2).as_str()));
    wait_reported(&admin, "web", "web v2 reported", |s| {
        s.spec_hash.as_str() == hash_of(&web_v2) && s.state == WorkloadState::Running
    });

    // Delta: an invalid value keeps the running container and is reported.
    put_workload(
        &admin,
        "dev1",
        "web",
        r#"{"image":"localhost/x:1","colour":"red"}"#,
    );
    let r = wait_reported(&admin, "web", "web reported invalid", |s| {
        s.state == WorkloadState::Invalid
    });
    let w = &r
        .workloads
        .iter()
        .find(|(k, _)| k.as_str() == "web")
        .expect("web")
        .1;
    assert!(
        w.last_error
            .as_ref()
            .is_some_and(|e| e.as_str().contains("unknown field `colour`")),
        "{w:?}"
    );
    assert_eq!(
        container(&podman, "fleet-web").map(|c| c.id),
        Some(web2.id.clone()),
        "the invalid spec replaced the container"
    );

    // Delta: web deleted, api deleted: both removed.
    delete_workload(&admin, "dev1", "web");
    delete_workload(&admin, "dev1", "api");
    wait_gone(&podman, "fleet-web");
    wait_gone(&podman, "fleet-api");
    poll_until("an empty report", CONVERGE, || {
        report(&admin).filter(|r| r.workloads.is_empty())
    });

    // Back to one workload: the applied record follows.
    put_workload(&admin, "dev1", "web", &web_v1);
    wait_running(&podman, "fleet-web", "web back", |_| true);
    let applied: AppliedSpecs = poll_until("applied.json with web", CONVERGE, || {
        let bytes = std::fs::read(dev.path("var/lib/harmony-fleet/agent/applied.json")).ok()?;
        let a: AppliedSpecs = serde_json::from_slice(&bytes).expect("applied.json parses");
        (a.workloads.len() == 1).then_some(a)
    });
    assert_eq!(
        applied
            .workloads
            .keys()
            .map(|k| k.as_str())
            .collect::<Vec<_>>(),
        vec!["web"]
    );

    // Nothing of anyone else's was touched.
    assert_eq!(untouched(&podman), before);
    drop(agent);
}

#[test]
fn snapshot_then_deltas_2_9() {
    snapshot_then_deltas(NatsVersion::V2_9);
}

#[test]
fn snapshot_then_deltas_2_14() {
    snapshot_then_deltas(NatsVersion::V2_14);
}

fn removed_and_exited_containers_are_restored(v: NatsVersion) {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(v, &["dev1"]);
    let admin = nats.admin();
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "v1"));
    let dev = Device::new("dev1", &Settings::new(vec![nats.url()]), Some(&podman));
    let _agent = dev.start(Some(&podman));
    let first = wait_running(&podman, "fleet-web", "web running", |_| true);

    // Removed by hand: recreated from the same spec.
    podman.run(&["rm", "-f", "-t", "0", "fleet-web"]);
    let second = wait_running(&podman, "fleet-web", "web recreated", |c| c.id != first.id);
    assert_eq!(second.spec_hash, first.spec_hash);
    // (`rm -f` is not atomic: a pass may see the container exited first,
    // start it, then see it gone and create it: two restores.)
    let r = wait_reported(&admin, "web", "a restart reported", |s| {
        s.restarts >= 1 && s.state == WorkloadState::Running
    });
    let restarts = r.workloads.values().next().expect("web").restarts;

    // Stopped by hand: started again (the same container). Podman's
    // StartedAt has whole seconds, so the report is the sync point.
    podman.run(&["stop", "-t", "0", "fleet-web"]);
    wait_reported(&admin, "web", "one more restart reported", |s| {
        s.restarts == restarts + 1 && s.state == WorkloadState::Running
    });
    let third = wait_running(&podman, "fleet-web", "web running again", |_| true);
    assert_eq!(
        third.id, second.id,
        "an exited container is started, not recreated"
    );
}

#[test]
fn removed_and_exited_containers_are_restored_2_9() {
    removed_and_exited_containers_are_restored(NatsVersion::V2_9);
}

#[test]
fn removed_and_exited_containers_are_restored_2_14() {
    removed_and_exited_containers_are_restored(NatsVersion::V2_14);
}

/// A failing workload backs off and says why; the others are not held up.
#[test]
fn a_failing_pull_backs_off_and_reports_the_error() {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let admin = nats.admin();
    // A registry that accepts connections and never answers: the pull is
    // bounded by the pull timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    put_workload(
        &admin,
        "dev1",
        "cam",
        &format!(r#"{{"image":"127.0.0.1:{port}/cam:1"}}"#),
    );
    put_workload(&admin, "dev1", "web", &quick_sleeper(&podman, "v1"));
    let mut settings = Settings::new(vec![nats.url()]);
    settings.pull_timeout_secs = 2;
    let dev = Device::new("dev1", &settings, Some(&podman));
    let agent = dev.start(Some(&podman));
    wait_running(
        &podman,
        "fleet-web",
        "web running beside the failing one",
        |_| true,
    );
    let r = wait_reported(&admin, "cam", "cam backing off", |s| {
        s.state == WorkloadState::BackOff
    });
    let cam = &r
        .workloads
        .iter()
        .find(|(k, _)| k.as_str() == "cam")
        .expect("cam")
        .1;
    let err = cam
        .last_error
        .as_ref()
        .expect("an error")
        .as_str()
        .to_owned();
    assert!(err.contains("did not finish within 2 s"), "{err}");
    assert!(
        agent.log().contains("attempt=1"),
        "structured attempt field:\n{}",
        agent.log()
    );
    drop(silent);
}
