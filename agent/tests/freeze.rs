//! The change freeze end to end: the real agent, a real nats-server with
//! the fleet layout, an isolated Podman, and `fleet-agent node ...` as the
//! caller. Every refusal reason is produced for real: a start without a
//! snapshot, a lost server, a SIGTERM drain, a replace in flight, a pull
//! from a stalled registry, and the real updater preparing an upgrade from
//! a stalled artifact server.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use fleet_common::contracts::{
    AgentStatusReply, AgentUpgradeAttempt, ConfigState, ConfigStateReply, DeviceInfo, ErrorBody,
    ErrorCode, FreezeFile, Heartbeat, MutationAdmission, NatsView, Refusal, Response, UpdaterReply,
    UpdaterRequest, UpdaterView, UpgradePhase, WorkloadState, WorkloadsReport,
};
use fleet_common::validate::{
    Arch, ArtifactUrl, AttemptUuid, DeviceId, MaxBytes, Sha256Hex, Version,
};
use fleet_common::{socket, Layout};
use fleet_harness::{
    bin_path, poll_until, Behavior, ChildGuard, HttpsServer, NatsServer, NatsVersion, Podman,
    TestCa,
};
use rustix::process::Signal;

/// What one `fleet-agent node ...` printed.
#[derive(Debug)]
struct Node {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn node_as(dev: &Device, args: &[&str], uid: Option<u32>) -> Node {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet-agent"));
    cmd.arg("node")
        .args(args)
        .arg("--config")
        .arg(&dev.config)
        .env_remove("NOTIFY_SOCKET");
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().expect("fleet-agent node runs");
    Node {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn node(dev: &Device, args: &[&str]) -> Node {
    node_as(dev, args, None)
}

fn parse<T: serde::de::DeserializeOwned>(n: &Node) -> Response<T> {
    Response::from_slice(n.stdout.trim().as_bytes())
        .unwrap_or_else(|e| panic!("not a response ({e}): {n:?}"))
}

/// `node status --json`, answered.
fn agent_status(dev: &Device) -> AgentStatusReply {
    let n = node(dev, &["status", "--json"]);
    assert_eq!(n.code, Some(0), "{n:?}");
    match parse::<AgentStatusReply>(&n) {
        Response::Ok(s) => s,
        Response::Err(e) => panic!("status refused: {e}"),
    }
}

/// `node freeze --json` that must succeed.
fn freeze_ok(dev: &Device, reason: &str) -> ConfigStateReply {
    let n = node(dev, &["freeze", "--reason", reason, "--json"]);
    assert_eq!(n.code, Some(0), "{n:?}");
    match parse::<ConfigStateReply>(&n) {
        Response::Ok(r) => r,
        Response::Err(e) => panic!("freeze refused: {e}"),
    }
}

/// `node freeze --json` that must be refused (exit 3); the error body.
fn freeze_refused(dev: &Device) -> ErrorBody {
    let n = node(dev, &["freeze", "--json"]);
    assert_eq!(n.code, Some(3), "{n:?}");
    match parse::<ConfigStateReply>(&n) {
        Response::Err(e) => {
            assert_eq!(e.code, ErrorCode::Refused, "{e}");
            e
        }
        Response::Ok(r) => panic!("frozen unexpectedly: {r:?}"),
    }
}

/// Polls `node freeze` until it is refused with exactly `want` (the agent
/// may not answer yet; it must never accept).
fn wait_refused_with(dev: &Device, want: &[Refusal]) -> ErrorBody {
    poll_until(&format!("a freeze refused with {want:?}"), CONVERGE, || {
        let n = node(dev, &["freeze", "--json"]);
        assert_ne!(n.code, Some(0), "frozen unexpectedly: {n:?}");
        if n.code != Some(3) {
            return None;
        }
        match parse::<ConfigStateReply>(&n) {
            Response::Err(e) if e.reasons == want => Some(e),
            _ => None,
        }
    })
}

fn unfreeze_ok(dev: &Device) -> ConfigStateReply {
    let n = node(dev, &["unfreeze", "--json"]);
    assert_eq!(n.code, Some(0), "{n:?}");
    match parse::<ConfigStateReply>(&n) {
        Response::Ok(r) => r,
        Response::Err(e) => panic!("unfreeze failed: {e}"),
    }
}

/// Waits until the agent says a freeze would be accepted (converged).
fn wait_freezable(dev: &Device) {
    poll_until("a freeze would be accepted", CONVERGE, || {
        agent_status(dev).freeze_blockers.is_empty().then_some(())
    });
}

fn heartbeat(admin: &nats::Connection) -> Option<Heartbeat> {
    status(admin, "dev1", "heartbeat")
}

/// A workload Podman itself never restarts (so a restore is the agent's)
/// and that stops at once on SIGTERM.
fn no_restart(image: &str, tag: &str) -> String {
    format!(
        r#"{{"image":"{image}","command":["sh","-c","trap 'exit 0' TERM; while true; do sleep 1; done"],"env":{{"TAG":"{tag}"}},"restart":"no"}}"#
    )
}

fn freeze_file(dev: &Device) -> FreezeFile {
    let path = Layout::with_root(dev.root.path()).freeze_state();
    let bytes = std::fs::read(&path).expect("freeze.json");
    serde_json::from_slice(&bytes).expect("freeze.json parses")
}

/// Starts the agent of `dev` once more and waits for this run's READY=1
/// (the notify socket keeps the earlier runs' messages).
fn start_again(dev: &Device, podman: &Podman) -> ChildGuard {
    let readies = || {
        dev.notify
            .all()
            .iter()
            .filter(|m| m.contains("READY=1"))
            .count()
    };
    let before = readies();
    let mut agent = dev.spawn(Some(podman));
    poll_until("READY=1 of the new run", CONVERGE, || {
        if let Some(status) = agent.try_wait() {
            panic!("the agent exited ({status}):\n{}", agent.log());
        }
        (readies() > before).then_some(())
    });
    agent
}

fn podman_device(id: &str, nats: &NatsServer, podman: &Podman) -> Device {
    Device::new(id, &Settings::new(vec![nats.url()]), Some(podman))
}

fn bare_device(servers: Vec<String>) -> Device {
    Device::new(
        "dev1",
        &Settings {
            podman: false,
            ..Settings::new(servers)
        },
        None,
    )
}

/// Freeze, desired changes while frozen (recorded, counted, not applied),
/// containers killed and removed while frozen (restored from the applied
/// spec, local images only), the agent SIGKILLed while frozen (it comes
/// back frozen and applies nothing newer), then the unfreeze (a new
/// snapshot is read and every waiting change applied).
#[test]
fn a_frozen_agent_holds_changes_restores_locally_survives_a_kill_and_applies_after_unfreeze() {
    let podman = Podman::new();
    let image = podman.busybox_image();
    // A second name for the image: untagged during the freeze to show a
    // restore never pulls.
    podman.run(&["tag", &image, "localhost/fleet-test/cam:1"]);
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let admin = nats.admin();
    let web_v1 = no_restart(&image, "v1");
    let cam = no_restart("localhost/fleet-test/cam:1", "cam");
    put_workload(&admin, "dev1", "web", &web_v1);
    put_workload(&admin, "dev1", "cam", &cam);
    let dev = podman_device("dev1", &nats, &podman);
    let mut agent = dev.start(Some(&podman));
    let web = wait_running(&podman, "fleet-web", "web running", |c| {
        c.spec_hash.as_deref() == Some(hash_of(&web_v1).as_str())
    });
    wait_running(&podman, "fleet-cam", "cam running", |_| true);
    wait_freezable(&dev);

    // Freeze: acknowledged only once durable.
    let reply = freeze_ok(&dev, "vehicle in motion");
    let since = match &reply.config_state.state {
        ConfigState::Changefreeze(f) => {
            assert_eq!(f.caller_uid, 0, "the caller's uid (root)");
            assert_eq!(
                f.reason.as_ref().map(|r| r.as_str()),
                Some("vehicle in motion")
            );
            f.since
        }
        other => panic!("{other:?}"),
    };
    let path = Layout::with_root(dev.root.path()).freeze_state();
    let mode = std::fs::metadata(&path)
        .expect("freeze.json")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644, "the root updater reads it");
    assert_eq!(freeze_file(&dev).config_state, reply.config_state.state);
    // Asking again changes nothing.
    assert_eq!(freeze_ok(&dev, "again").config_state, reply.config_state);
    // Heartbeat and device info carry it.
    poll_until("a frozen heartbeat", CONVERGE, || {
        heartbeat(&admin).filter(|h| h.config_state.state == reply.config_state.state)
    });
    poll_until("frozen device info", CONVERGE, || {
        status::<DeviceInfo>(&admin, "dev1", "info")
            .filter(|i| i.config_state.state == reply.config_state.state)
    });

    // Desired changes while frozen: recorded and counted, not applied.
    let web_v2 = no_restart(&image, "v2");
    put_workload(&admin, "dev1", "web", &web_v2);
    put_workload(&admin, "dev1", "api", &no_restart(&image, "api"));
    let hb = poll_until("two waiting changes in the heartbeat", CONVERGE, || {
        heartbeat(&admin).filter(|h| h.config_state.waiting_changes == 2)
    });
    assert!(hb.config_state.state.is_frozen());
    let s = agent_status(&dev);
    assert_eq!(s.config_state.waiting_changes, 2);
    assert_eq!(s.mutations.admission, MutationAdmission::Frozen);
    assert!(s.freeze_blockers.is_empty());
    let human = node(&dev, &["status"]);
    assert!(
        human.stdout.contains("waiting: 2 desired changes")
            && human.stdout.contains("frozen (local restores only)"),
        "{human:?}"
    );
    // A moment more: still nothing applied.
    std::thread::sleep(Duration::from_secs(2 * RESYNC_SECS));
    let now = container(&podman, "fleet-web").expect("web");
    assert_eq!(now.id, web.id, "web replaced during the freeze");
    assert!(container(&podman, "fleet-api").is_none(), "api created");

    // Killed while frozen: started again by the agent (restart: no).
    podman.run(&["kill", "fleet-web"]);
    let report = poll_until("web restored and reported", CONVERGE, || {
        status::<WorkloadsReport>(&admin, "dev1", "workloads").filter(|r| {
            r.workloads.iter().any(|(w, s)| {
                w.as_str() == "web" && s.restarts >= 1 && s.state == WorkloadState::Running
            })
        })
    });
    let reported_web = &report
        .workloads
        .iter()
        .find(|(w, _)| w.as_str() == "web")
        .expect("web")
        .1;
    assert_eq!(
        reported_web.spec_hash.as_str(),
        hash_of(&web_v1),
        "the report shows what runs"
    );
    // Removed while frozen: recreated from the applied spec.
    podman.run(&["rm", "-f", "-t", "0", "fleet-web"]);
    let again = wait_running(&podman, "fleet-web", "web recreated", |c| c.id != web.id);
    assert_eq!(again.spec_hash.as_deref(), Some(hash_of(&web_v1).as_str()));

    // Local images only: cam's image gone, cam is not restored and says why.
    // The tag goes first: removed first, the container could be restored
    // from the still-tagged image before the untag (seen in CI).
    podman.run(&[
        "untag",
        "localhost/fleet-test/cam:1",
        "localhost/fleet-test/cam:1",
    ]);
    podman.run(&["rm", "-f", "-t", "0", "fleet-cam"]);
    let r = poll_until("cam's restore refused", CONVERGE, || {
        status::<WorkloadsReport>(&admin, "dev1", "workloads").filter(|r| {
            r.workloads.iter().any(|(w, s)| {
                w.as_str() == "cam"
                    && s.last_error
                        .as_ref()
                        .is_some_and(|e| e.as_str().contains("local images only"))
            })
        })
    });
    assert!(container(&podman, "fleet-cam").is_none(), "{r:?}");
    assert!(
        !agent.log().contains("pull localhost/fleet-test/cam:1"),
        "a pull was tried during the freeze:\n{}",
        agent.log()
    );
    podman.run(&["tag", &image, "localhost/fleet-test/cam:1"]);
    wait_running(&podman, "fleet-cam", "cam restored once local", |_| true);

    // SIGKILL while frozen, a change meanwhile: it comes back frozen and
    // applies nothing newer than its last applied specs.
    agent.kill();
    let web_v3 = no_restart(&image, "v3");
    put_workload(&admin, "dev1", "web", &web_v3);
    let mut agent = start_again(&dev, &podman);
    let s = agent_status(&dev);
    match &s.config_state.state {
        ConfigState::Changefreeze(f) => assert_eq!(f.since, since, "the same freeze"),
        other => panic!("not frozen after a restart: {other:?}"),
    }
    assert!(agent.log().contains("starting in a change freeze"));
    poll_until("two waiting changes after the restart", CONVERGE, || {
        (agent_status(&dev).config_state.waiting_changes == 2).then_some(())
    });
    poll_until("a frozen heartbeat after the restart", CONVERGE, || {
        heartbeat(&admin).filter(|h| h.config_state.state.is_frozen() && h.uptime_secs < 30)
    });
    let still = container(&podman, "fleet-web").expect("web");
    assert_eq!(still.id, again.id);
    assert_eq!(still.spec_hash.as_deref(), Some(hash_of(&web_v1).as_str()));
    assert!(container(&podman, "fleet-api").is_none());

    // Unfreeze: a new snapshot is read, every waiting change applied.
    let from = agent.line_count();
    let r = unfreeze_ok(&dev);
    assert_eq!(r.config_state.state, ConfigState::Configured);
    agent.wait_for_line_after(from, "a new snapshot was asked for", CONVERGE);
    wait_running(&podman, "fleet-web", "web v3 after the unfreeze", |c| {
        c.spec_hash.as_deref() == Some(hash_of(&web_v3).as_str())
    });
    wait_running(&podman, "fleet-api", "api after the unfreeze", |_| true);
    poll_until("a configured heartbeat", CONVERGE, || {
        heartbeat(&admin).filter(|h| {
            h.config_state.state == ConfigState::Configured && h.config_state.waiting_changes == 0
        })
    });
    assert_eq!(freeze_file(&dev).config_state, ConfigState::Configured);
    // Unfreezing again is a no-op.
    assert_eq!(
        unfreeze_ok(&dev).config_state.state,
        ConfigState::Configured
    );
    agent.signal(Signal::TERM);
    assert!(agent.wait_exit(CONVERGE).success(), "{}", agent.log());
}

/// A replace in flight refuses (`reconciler-busy`); after SIGTERM, while
/// it finishes, `draining` too. Nothing is frozen.
#[test]
fn a_mutation_in_flight_and_a_drain_refuse_the_freeze() {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let admin = nats.admin();
    // Its PID 1 ignores SIGTERM: removing it takes podman's 10 s stop timeout.
    put_workload(&admin, "dev1", "web", &sleeper(&podman, "v1"));
    let dev = podman_device("dev1", &nats, &podman);
    let mut agent = dev.start(Some(&podman));
    wait_running(&podman, "fleet-web", "web running", |_| true);
    wait_freezable(&dev);

    let from = agent.line_count();
    put_workload(&admin, "dev1", "web", &sleeper(&podman, "v2"));
    agent.wait_for_line_after(from, "replace web", CONVERGE);
    let e = freeze_refused(&dev);
    assert_eq!(e.reasons, vec![Refusal::ReconcilerBusy], "{e}");
    assert!(
        e.message.as_str().contains("replace web is in flight"),
        "{e}"
    );
    assert_eq!(e.retry_after_secs, Some(5));
    let human = node(&dev, &["freeze"]);
    assert_eq!(human.code, Some(3));
    assert!(
        human.stderr.contains("reasons: reconciler-busy") && human.stderr.contains("retry in 5 s"),
        "{human:?}"
    );
    let s = agent_status(&dev);
    assert_eq!(
        s.mutations.in_flight.as_ref().map(|w| w.as_str()),
        Some("replace web")
    );
    assert_eq!(s.freeze_blockers, vec![Refusal::ReconcilerBusy]);

    agent.signal(Signal::TERM);
    agent.wait_for_line("waiting for the mutation in flight", CONVERGE);
    let e = freeze_refused(&dev);
    assert_eq!(
        e.reasons,
        vec![Refusal::Draining, Refusal::ReconcilerBusy],
        "{e}"
    );
    assert_eq!(e.retry_after_secs, Some(60));
    assert_eq!(
        agent_status(&dev).mutations.admission,
        MutationAdmission::Draining
    );
    assert!(agent.wait_exit(CONVERGE).success(), "{}", agent.log());
    assert!(
        !Layout::with_root(dev.root.path()).freeze_state().exists(),
        "a refused freeze wrote the freeze file"
    );
}

/// An image pull from a registry that stalls after the TLS handshake:
/// `reconciler-busy` and `download-in-progress`. Once the pull has failed
/// and backs off, the freeze is accepted (a back-off is not pending), and
/// the retry then waits for the unfreeze.
#[test]
fn a_stalled_image_pull_refuses_the_freeze() {
    let podman = Podman::new();
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let admin = nats.admin();
    let registry = HttpsServer::start_untrusted();
    registry.route("/v2/", Behavior::Status(200));
    registry.route_prefix("/v2/cam/", Behavior::StallBeforeHeaders);
    let host = format!("127.0.0.1:{}", registry.port());
    // Podman talks TLS to it without verifying (a per-test registries.conf).
    let registries = podman.dir().join("registries.conf");
    std::fs::write(
        &registries,
        format!("[[registry]]\nlocation = \"{host}\"\ninsecure = true\n"),
    )
    .expect("registries.conf");
    let dev = podman_device("dev1", &nats, &podman);
    let mut cmd = dev.command(&["run"], Some(&podman));
    cmd.env("CONTAINERS_REGISTRIES_CONF", &registries);
    let mut agent = ChildGuard::spawn(cmd, "agent-dev1");
    dev.wait_ready(&mut agent);
    wait_freezable(&dev);

    let image = format!("{host}/cam:1");
    put_workload(&admin, "dev1", "cam", &format!(r#"{{"image":"{image}"}}"#));
    poll_until("podman asking for the manifest", CONVERGE, || {
        registry
            .requests()
            .iter()
            .any(|r| r.path.starts_with("/v2/cam/manifests/"))
            .then_some(())
    });
    let e = freeze_refused(&dev);
    assert_eq!(
        e.reasons,
        vec![Refusal::ReconcilerBusy, Refusal::DownloadInProgress],
        "{e}"
    );
    assert!(
        e.message
            .as_str()
            .contains(&format!("image {image} is being pulled")),
        "{e}"
    );
    assert_eq!(e.retry_after_secs, Some(30));
    assert_eq!(
        agent_status(&dev)
            .mutations
            .pulling
            .as_ref()
            .map(|p| p.as_str()),
        Some(image.as_str())
    );

    // The registry goes away: the pull fails and backs off.
    drop(registry);
    poll_until("cam backing off", CONVERGE, || {
        status::<WorkloadsReport>(&admin, "dev1", "workloads").filter(|r| {
            r.workloads
                .iter()
                .any(|(w, s)| w.as_str() == "cam" && s.state == WorkloadState::BackOff)
        })
    });
    // (Polled: the back-off's retry is briefly in flight every few seconds.)
    poll_until("a freeze accepted during the back-off", CONVERGE, || {
        (node(&dev, &["freeze"]).code == Some(0)).then_some(())
    });
    let from = agent.line_count();
    // Past the first back-off (5 s): the retry is not admitted.
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        !agent.lines()[from..]
            .iter()
            .any(|l| l.contains("create cam")),
        "a pull was retried during the freeze:\n{}",
        agent.log()
    );
    unfreeze_ok(&dev);
    agent.wait_for_line_after(from, "create cam", CONVERGE);
}

/// Connected without a snapshot (the desired bucket is missing): only
/// `no-snapshot`, and the socket answers before READY. Then the server
/// stops: `disconnected` once past the heartbeat window (1 s here). After
/// it is back, the freeze is accepted.
#[test]
fn no_snapshot_and_a_lost_server_refuse_the_freeze() {
    use fleet_common::nats_config::{kv_stream_config, stream_create_subject, FLEET_BUCKETS};
    let mut nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let admin = nats.admin();
    let deleted = admin
        .request_timeout(
            "$JS.API.STREAM.DELETE.KV_fleet-workloads",
            "",
            Duration::from_secs(10),
        )
        .expect("stream delete answered");
    assert!(
        String::from_utf8_lossy(&deleted.data).contains("\"success\":true"),
        "{deleted:?}"
    );
    let dev = bare_device(vec![nats.url()]);
    let mut agent = dev.spawn(None);
    poll_until("connected, without a snapshot", CONVERGE, || {
        let n = node(&dev, &["status", "--json"]);
        (n.code == Some(0)).then_some(())?;
        let Response::Ok(s) = parse::<AgentStatusReply>(&n) else {
            return None;
        };
        (s.nats == NatsView::Connected {} && !s.snapshot_complete).then_some(())
    });
    let e = wait_refused_with(&dev, &[Refusal::NoSnapshot]);
    assert!(
        e.message
            .as_str()
            .contains("no complete desired-state snapshot has been read yet"),
        "{e}"
    );
    assert!(dev.notify.find("READY=1").is_none());

    // The bucket is back: READY, and a freeze would be accepted.
    let desired = FLEET_BUCKETS
        .iter()
        .find(|b| b.bucket == "fleet-workloads")
        .expect("the desired-workloads bucket");
    admin
        .request_timeout(
            &stream_create_subject(desired.bucket),
            kv_stream_config(desired, 1).to_string(),
            Duration::from_secs(10),
        )
        .expect("stream create answered");
    dev.wait_ready(&mut agent);
    wait_freezable(&dev);

    // The server stops: disconnected (and no snapshot either, until the
    // keys are read again after the reconnect).
    // (Within the window a freeze would still be accepted: wait past it.)
    nats.stop();
    poll_until("disconnected past the window", CONVERGE, || {
        matches!(agent_status(&dev).nats, NatsView::Disconnected { for_secs } if for_secs >= 2)
            .then_some(())
    });
    let e = freeze_refused(&dev);
    assert!(e.reasons.contains(&Refusal::Disconnected), "{e}");
    assert!(
        e.reasons
            .iter()
            .all(|r| matches!(r, Refusal::Disconnected | Refusal::NoSnapshot)),
        "{e}"
    );
    assert!(
        e.message.as_str().contains("NATS has been unreachable for"),
        "{e}"
    );

    nats.restart();
    poll_until("a freeze accepted after the reconnect", CONVERGE, || {
        (node(&dev, &["freeze"]).code == Some(0)).then_some(())
    });
    assert!(freeze_file(&dev).config_state.is_frozen());
}

/// NATS unreachable from the start: the socket answers while the agent
/// keeps trying; `no-snapshot`, and `disconnected` past the window.
#[test]
fn an_agent_that_never_reached_nats_refuses_the_freeze() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "nats://127.0.0.1:{}",
        unused.local_addr().expect("addr").port()
    );
    drop(unused);
    let dev = bare_device(vec![url]);
    let _agent = dev.spawn(None);
    wait_refused_with(&dev, &[Refusal::NoSnapshot, Refusal::Disconnected]);
    let human = node(&dev, &["freeze"]);
    assert_eq!(human.code, Some(3));
    assert!(
        human.stderr.contains("reasons: no-snapshot, disconnected"),
        "{human:?}"
    );
    let s = agent_status(&dev);
    assert!(matches!(s.nats, NatsView::Disconnected { for_secs } if for_secs >= 1));
    assert_eq!(
        s.freeze_blockers,
        vec![Refusal::NoSnapshot, Refusal::Disconnected]
    );
    assert!(dev.notify.find("READY=1").is_none());
}

/// The updater under the test's control, with the device's root.
struct UpdaterRun {
    guard: ChildGuard,
    layout: Layout,
}

impl UpdaterRun {
    /// Installs a stand-in active agent (the real one runs beside, started
    /// by the test) and starts `fleet-updater run` with the supervisor.
    fn start(dev: &Device, ca: &TestCa) -> UpdaterRun {
        let layout = Layout::with_root(dev.root.path());
        std::fs::create_dir_all(layout.versions_dir()).expect("versions dir");
        let bin_dir = layout.active_agent_link();
        std::fs::create_dir_all(bin_dir.parent().expect("bin dir")).expect("bin dir");
        let installed = layout.versioned_agent(&Version::parse("0.0.1").expect("version"));
        std::fs::write(&installed, "#!/bin/sh\nexit 1\n").expect("stand-in");
        std::fs::set_permissions(&installed, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::os::unix::fs::symlink(&installed, layout.active_agent_link()).expect("link");
        let config = dev.root.path().join("updater.json");
        std::fs::write(
            &config,
            serde_json::json!({"ca-file": ca.ca_path(), "probe-user": "nobody"}).to_string(),
        )
        .expect("updater config");
        let mut cmd = Command::new(bin_path("fleet-updater"));
        cmd.arg("run")
            .arg("--root")
            .arg(dev.root.path())
            .arg("--config")
            .arg(&config)
            .args(["--service-manager", "supervisor"])
            .env_remove("NOTIFY_SOCKET");
        let guard = ChildGuard::spawn(cmd, "fleet-updater");
        guard.wait_for_line("recovery complete", CONVERGE);
        UpdaterRun { guard, layout }
    }

    fn upgrade(&self, attempt: &AgentUpgradeAttempt) -> Response<UpdaterReply> {
        socket::call(
            &self.layout.updater_socket(),
            &UpdaterRequest::Upgrade {
                attempt: attempt.clone(),
            },
            Duration::from_secs(120),
        )
        .expect("the updater answers")
    }

    fn phase(&self) -> Option<UpgradePhase> {
        match socket::call::<_, UpdaterReply>(
            &self.layout.updater_socket(),
            &UpdaterRequest::Status {},
            Duration::from_secs(15),
        ) {
            Ok(Response::Ok(r)) => r.status.map(|s| s.phase),
            _ => None,
        }
    }
}

fn attempt(url: &str) -> AgentUpgradeAttempt {
    AgentUpgradeAttempt {
        uuid: AttemptUuid::new_random(),
        device_id: DeviceId::parse("dev1").expect("device"),
        target_version: Version::parse("0.0.2").expect("version"),
        arch: Arch::current().expect("a supported architecture"),
        artifact_url: ArtifactUrl::parse(url).expect("url"),
        max_bytes: MaxBytes::new(1024 * 1024).expect("max"),
        sha256: Sha256Hex::of(b"the candidate"),
    }
}

/// The real updater: it refuses `upgrade` while the agent's freeze file
/// says frozen; and while it prepares an upgrade (its artifact download
/// stalls), the agent refuses the freeze with `upgrade-in-progress` and
/// `download-in-progress`. Once the transaction has failed, the freeze is
/// accepted.
#[test]
fn an_upgrade_in_progress_refuses_the_freeze_and_a_freeze_refuses_upgrades() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &["dev1"]);
    let dev = bare_device(vec![nats.url()]);
    let ca = TestCa::new();
    let updater = UpdaterRun::start(&dev, &ca);
    let _agent = dev.start(None);
    wait_freezable(&dev);
    assert_eq!(agent_status(&dev).upgrade.updater, UpdaterView::Idle {});

    let artifacts = HttpsServer::start(&ca);
    artifacts.route("/fleet-agent", Behavior::Stall);
    let url = artifacts.url("/fleet-agent");

    // Frozen: the updater refuses, reading the freeze file the agent wrote.
    freeze_ok(&dev, "service visit");
    match updater.upgrade(&attempt(&url)) {
        Response::Err(e) => {
            assert_eq!(e.code, ErrorCode::Frozen, "{e}");
            assert!(
                e.message.as_str().contains("service visit")
                    && e.message.as_str().contains("uid 0"),
                "{e}"
            );
        }
        Response::Ok(r) => panic!("an upgrade started during the freeze: {r:?}"),
    }
    assert!(artifacts.requests().is_empty(), "nothing was downloaded");
    unfreeze_ok(&dev);

    // Preparing, its download stalled: the freeze is refused.
    let a = attempt(&url);
    let uuid = a.uuid.to_string();
    let waiter = {
        let layout = updater.layout.clone();
        std::thread::spawn(move || {
            socket::call::<_, UpdaterReply>(
                &layout.updater_socket(),
                &UpdaterRequest::Upgrade { attempt: a },
                Duration::from_secs(300),
            )
        })
    };
    poll_until("the artifact requested", CONVERGE, || {
        (!artifacts.requests().is_empty()).then_some(())
    });
    assert_eq!(updater.phase(), Some(UpgradePhase::Preparing));
    let e = freeze_refused(&dev);
    assert_eq!(
        e.reasons,
        vec![Refusal::UpgradeInProgress, Refusal::DownloadInProgress],
        "{e}"
    );
    assert!(
        e.message.as_str().contains(&format!(
            "upgrade attempt {uuid} to 0.0.2 is in phase preparing"
        )),
        "{e}"
    );
    match agent_status(&dev).upgrade.updater {
        UpdaterView::Transaction { phase, .. } => assert_eq!(phase, UpgradePhase::Preparing),
        other => panic!("{other:?}"),
    }

    // The download fails: the transaction ends, the freeze is accepted.
    drop(artifacts);
    let answer = waiter.join().expect("join").expect("the upgrade answered");
    match answer {
        Response::Ok(r) => assert_eq!(
            r.status.map(|s| s.phase),
            Some(UpgradePhase::Failed),
            "{}",
            updater.guard.log()
        ),
        Response::Err(e) => panic!("{e}"),
    }
    freeze_ok(&dev, "after the failed upgrade");
}

/// Callers other than root, the agent's user and `fleet-control` are
/// refused: by the socket's mode, and (socket opened to everyone) by the
/// peer-credential check.
#[test]
fn unauthorised_callers_are_refused() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "nats://127.0.0.1:{}",
        unused.local_addr().expect("addr").port()
    );
    drop(unused);
    let dev = bare_device(vec![url]);
    let agent = dev.spawn(None);
    let sock = Layout::with_root(dev.root.path()).agent_socket();
    poll_until("the agent socket answers", CONVERGE, || {
        (node(&dev, &["status"]).code == Some(0)).then_some(())
    });
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660);
    // `nobody` may read the config (only its root key is used).
    for p in [dev.root.path(), dev.config.as_path()] {
        let m = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    }
    traversable(Path::new(env!("CARGO_BIN_EXE_fleet-agent")));
    const NOBODY: u32 = 65534;
    let n = node_as(&dev, &["freeze"], Some(NOBODY));
    assert_eq!(n.code, Some(4), "{n:?}");
    assert!(n.stderr.contains("Permission denied"), "{n:?}");

    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let n = node_as(&dev, &["freeze", "--json"], Some(NOBODY));
    assert_eq!(n.code, Some(4), "{n:?}");
    match parse::<ConfigStateReply>(&n) {
        Response::Err(e) => {
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(
                e.message
                    .as_str()
                    .contains("uid 65534 with gid 65534 is not allowed"),
                "{e}"
            );
        }
        Response::Ok(r) => panic!("{r:?}"),
    }
    agent.wait_for_line("refused a local client: uid 65534", CONVERGE);
    assert!(!Layout::with_root(dev.root.path()).freeze_state().exists());
    assert_eq!(node(&dev, &["status"]).code, Some(0), "root may");
}

/// An agent running as an unprivileged user: that user may call its
/// socket (so can root); another user may not.
#[test]
fn the_agents_own_user_may_call_it() {
    const NOBODY: u32 = 65534;
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "nats://127.0.0.1:{}",
        unused.local_addr().expect("addr").port()
    );
    drop(unused);
    let dev = bare_device(vec![url]);
    traversable(Path::new(env!("CARGO_BIN_EXE_fleet-agent")));
    for entry in ["", "agent.json", "nats-password", "notify.sock"] {
        let p = dev.root.path().join(entry);
        std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    let mut cmd = dev.command(&["run"], None);
    cmd.uid(NOBODY).gid(NOBODY);
    let agent = ChildGuard::spawn(cmd, "agent-dev1");
    poll_until("the agent socket answers its own user", CONVERGE, || {
        (node_as(&dev, &["status"], Some(NOBODY)).code == Some(0)).then_some(())
    });
    let sock = Layout::with_root(dev.root.path()).agent_socket();
    let meta = std::fs::metadata(&sock).expect("socket");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.uid(), NOBODY, "owned by the agent's user");
    let refused = node_as(&dev, &["freeze"], Some(NOBODY));
    assert_eq!(refused.code, Some(3), "{refused:?}");
    assert_eq!(node(&dev, &["status"]).code, Some(0), "root may");
    let other = node_as(&dev, &["status"], Some(1));
    assert_eq!(other.code, Some(4), "{other:?}");
    drop(agent);
}

/// Panics unless every directory above `bin` lets others through.
fn traversable(bin: &Path) {
    for dir in bin.ancestors().skip(1) {
        let mode = std::fs::metadata(dir).expect("dir").permissions().mode();
        assert!(
            mode & 0o001 != 0,
            "{} is not traversable by other users; the unauthorised-caller test runs the CLI as nobody",
            dir.display()
        );
    }
}

/// The operator's view of a real fleet, through the real `fleetctl`.
struct Operator {
    work: tempfile::TempDir,
    server: String,
}

impl Operator {
    fn new(nats: &NatsServer) -> Operator {
        let work = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            work.path().join("admin-password"),
            format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD),
        )
        .expect("write");
        Operator {
            work,
            server: nats.url(),
        }
    }

    /// `fleetctl <args>`: exit code, stdout, stderr.
    fn run(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = Command::new(bin_path("fleetctl"))
            .args(args)
            .args(["--server", &self.server, "--password-file"])
            .arg(self.work.path().join("admin-password"))
            .env_remove("FLEET_NATS_URL")
            .env_remove("FLEET_NATS_PASSWORD_FILE")
            .output()
            .expect("fleetctl runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A release of `version` whose artifact is at `url` (its SHA-256 is
    /// of other bytes: a download that completes fails the checksum).
    fn release(&self, version: &str, url: &str) -> String {
        let arch = Arch::current().expect("a supported architecture");
        let release = serde_json::json!({
            "version": version,
            "artifacts": { arch.as_str(): {
                "artifact-url": url,
                "sha256": Sha256Hex::of(b"the real candidate"),
                "max-bytes": 1024 * 1024,
            }},
        });
        let file = self.work.path().join(format!("release-{version}.json"));
        std::fs::write(&file, release.to_string()).expect("write");
        file.to_string_lossy().into_owned()
    }
}

/// The real fleet around a frozen agent: `fleetctl status` shows it
/// frozen and `rollout` skips it (and writes for the other device); an
/// intent written for it during the freeze waits (reported, not
/// forwarded) and is forwarded after the unfreeze; an accepted intent
/// whose transaction is preparing refuses the freeze with
/// `upgrade-in-progress`, `intent-pending` and `download-in-progress`.
#[test]
fn intents_wait_for_the_unfreeze_and_fleetctl_shows_and_skips_frozen_devices() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1", "dev2"]);
    let admin = nats.admin();
    let op = Operator::new(&nats);
    let ca = TestCa::new();
    let dev = bare_device(vec![nats.url()]);
    let updater = UpdaterRun::start(&dev, &ca);
    let _agent = dev.start(None);
    let dev2 = Device::new(
        "dev2",
        &Settings {
            podman: false,
            ..Settings::new(vec![nats.url()])
        },
        None,
    );
    let _agent2 = dev2.start(None);
    wait_freezable(&dev);
    let artifacts = HttpsServer::start(&ca);
    artifacts.route("/a", Behavior::Bytes(b"not the candidate".to_vec()));
    artifacts.route("/b", Behavior::Stall);

    freeze_ok(&dev, "on the road");
    poll_until("frozen device info", CONVERGE, || {
        status::<DeviceInfo>(&admin, "dev1", "info").filter(|i| i.config_state.state.is_frozen())
    });
    let (code, out, err) = op.run(&["status"]);
    assert_eq!(code, Some(0), "{err}");
    let row = |d: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{d} ")))
            .unwrap_or_else(|| panic!("no {d} row: {out}"))
            .to_owned()
    };
    assert!(row("dev1").contains(" changefreeze "), "{out}");
    assert!(row("dev2").contains(" configured "), "{out}");
    let (code, out, _) = op.run(&["status", "--json"]);
    assert_eq!(code, Some(0));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json");
    let state_of = |d: &str| {
        rows.iter()
            .find(|r| r["device"] == d)
            .map(|r| r["config-state"].clone())
    };
    assert_eq!(state_of("dev1"), Some("changefreeze".into()));
    assert_eq!(state_of("dev2"), Some("configured".into()));

    // rollout skips the frozen device and says so.
    let rel_a = op.release("9.9.9", &artifacts.url("/a"));
    let (code, out, err) = op.run(&["rollout", "--release", &rel_a]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("dev1: skipped: frozen (changefreeze)")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("dev2: wrote attempt ")),
        "{out}"
    );

    // An intent written anyway waits for the unfreeze: reported, not forwarded.
    let (code, out, err) = op.run(&["upgrade", "dev1", "--release", &rel_a]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("the device is frozen: its agent forwards it after the unfreeze"),
        "{out}"
    );
    let uuid_a = out
        .trim()
        .strip_prefix("dev1: wrote attempt ")
        .and_then(|r| r.split(' ').next())
        .map(|u| AttemptUuid::parse(u).expect("uuid"))
        .unwrap_or_else(|| panic!("{out}"));
    poll_until("the intent waiting in the heartbeat", CONVERGE, || {
        heartbeat(&admin)
            .filter(|h| h.config_state.state.is_frozen() && h.config_state.intent_waiting)
    });
    assert!(agent_status(&dev).config_state.intent_waiting);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        artifacts.requests().is_empty(),
        "forwarded during the freeze"
    );
    assert_eq!(updater.phase(), None, "the updater saw no attempt");

    // Unfreeze: the waiting intent is forwarded (and fails its checksum).
    unfreeze_ok(&dev);
    let failed = poll_until("attempt a failed", CONVERGE, || {
        status::<fleet_common::contracts::UpgradeStatus>(&admin, "dev1", "upgrade")
            .filter(|s| s.attempt_uuid == uuid_a && s.phase == UpgradePhase::Failed)
    });
    assert_eq!(
        failed.reason,
        Some(fleet_common::contracts::UpgradeReason::Checksum),
        "{failed:?}"
    );
    assert!(artifacts.requests().iter().any(|r| r.path == "/a"));
    wait_freezable(&dev);

    // An accepted intent preparing, its download stalled: refused.
    let rel_b = op.release("9.9.8", &artifacts.url("/b"));
    let (code, _, err) = op.run(&["upgrade", "dev1", "--release", &rel_b]);
    assert_eq!(code, Some(0), "{err}");
    poll_until("the stalled artifact requested", CONVERGE, || {
        artifacts
            .requests()
            .iter()
            .any(|r| r.path == "/b")
            .then_some(())
    });
    let e = wait_refused_with(
        &dev,
        &[
            Refusal::UpgradeInProgress,
            Refusal::IntentPending,
            Refusal::DownloadInProgress,
        ],
    );
    assert!(
        e.message
            .as_str()
            .contains("an upgrade intent was accepted and has not completed"),
        "{e}"
    );
    assert!(agent_status(&dev).upgrade.intent_pending);

    // The download fails: nothing pending any more, the freeze is accepted.
    drop(artifacts);
    poll_until(
        "a freeze accepted after the failed attempt",
        CONVERGE,
        || (node(&dev, &["freeze"]).code == Some(0)).then_some(()),
    );
}

/// A tmpfs of `kib` KiB on `dir`, unmounted on drop (declare it after the
/// device, so it goes first). Needs root and `mount` (Debian package
/// `mount`).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, kib: u64) -> Self {
        std::fs::create_dir_all(dir).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={kib}k,mode=0750"))
            .arg("tmpfs")
            .arg(dir)
            .output()
            .expect("mount runs: install the Debian package mount");
        assert!(
            out.status.success(),
            "mount: {} (this test needs root)",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with `dir/filler` until a write fails.
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    while f.write_all(&[0u8; 4096]).is_ok() {}
    while f.write_all(&[0]).is_ok() {}
    path
}

/// The agent's state directory on a full tmpfs. A freeze that
/// cannot be written is refused with its own reason, `not-persisted`, and
/// changes nothing (answered only once written: `docs/design/freeze.md`
/// "Entering"); once space is freed the freeze is accepted and on disk.
#[test]
fn a_freeze_that_cannot_be_written_is_refused_as_not_persisted() {
    let nats = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let dev = bare_device(vec![nats.url()]);
    let layout = Layout::with_root(dev.root.path());
    let _tmpfs = Tmpfs::mount(&layout.agent_state_dir(), 256);
    let _agent = dev.start(None);
    wait_freezable(&dev);
    let filler = fill(&layout.agent_state_dir());

    let e = freeze_refused(&dev);
    assert_eq!(e.reasons, vec![Refusal::NotPersisted], "{e}");
    assert!(
        e.message.as_str().contains("No space left on device"),
        "{e}"
    );
    assert!(e.retry_after_secs.is_some(), "{e}");
    assert!(!layout.freeze_state().exists());
    let s = agent_status(&dev);
    assert_eq!(s.config_state.state, ConfigState::Configured, "{s:?}");

    std::fs::remove_file(filler).expect("free space");
    let reply = freeze_ok(&dev, "space freed");
    assert!(matches!(
        reply.config_state.state,
        ConfigState::Changefreeze(_)
    ));
    assert_eq!(freeze_file(&dev).config_state, reply.config_state.state);
}

/// A kill during a write of the agent's durable files
/// (freeze state, seen attempts, applied specs) leaves a temp file beside
/// it. The agent removes every such temp file in its state directory at
/// start, keeps everything else, and its freeze state is the last written.
#[test]
fn temp_files_a_kill_left_in_the_state_directory_are_removed_at_start() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "nats://127.0.0.1:{}",
        unused.local_addr().expect("addr").port()
    );
    drop(unused);
    let dev = bare_device(vec![url]);
    let layout = Layout::with_root(dev.root.path());
    let state = layout.agent_state_dir();
    std::fs::create_dir_all(&state).expect("state dir");
    let stale = [
        state.join(".freeze.json.tmp.4242.0123456789ab"),
        state.join(".seen-attempts.json.tmp.4242.abcdef012345"),
        state.join(".applied-specs.json.tmp.77.fedcba987654"),
    ];
    for p in &stale {
        std::fs::write(p, b"{\"half\":").expect("stale temp");
    }
    let kept = state.join(".not-ours.tmp");
    std::fs::write(&kept, b"x").expect("kept");

    let agent = dev.spawn(None);
    for p in &stale {
        agent.wait_for_line(
            &format!("removed the stale temp file {}", p.display()),
            CONVERGE,
        );
        assert!(!p.exists(), "{}", p.display());
    }
    assert!(kept.exists());
    // The temp files go before the agent's socket listens.
    poll_until("the agent socket answers", CONVERGE, || {
        (node(&dev, &["status"]).code == Some(0)).then_some(())
    });
    let s = agent_status(&dev);
    assert_eq!(s.config_state.state, ConfigState::Configured, "{s:?}");
}
