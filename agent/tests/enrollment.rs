//! Enrollment against real parts: nats-server 2.14 in the auth-callout
//! layout, the real `fleet-auth-callout` with enrollment on, the real agent
//! with `nats.auth.method: enrollment`, Podman.
//!
//! Checked: a new device makes its own key (0600), asks to join, waits
//! saying so in its log and `STATUS=`, is approved, reconnects as itself and
//! runs its workload, and restarts straight into the fleet; its candidate
//! probe connects as it; `fleetctl device revoke` closes its live connection
//! and its reconnects are refused while its workload keeps running; the
//! auto-approve rule on a callout with no identity provider (a bearer token
//! refused, saying why); `fleetctl device decommission` has the agent
//! remove its workload and deletes its keys, and the running agent learns
//! it from its denied reconnect, forgets its approval and stops (exit 24),
//! and its next start waits; a pending device reaches nothing but its own request and answer;
//! a wrong token, a forged signature, an unsafe id and another device's id
//! are refused, and the conflict is kept for the operator; a flood fills
//! the lobby and no more, a decision frees a place, and a callout without
//! a lobby falls back to its own rate, saying so.
//! (nats-server 2.9 has no auth callout: enrollment needs 2.10 or later,
//! `docs/design/enrollment.md`.)

mod common;

use std::time::Duration;

use common::*;
use fleet_common::contracts::{AnswerState, DeviceRecord, EnrollAnswer, RecordState};
use fleet_common::nkey::{NkeyKind, NkeySeed};
use fleet_common::subjects::{
    enroll_inbox_prefix, enroll_subject, kv_subject, BUCKET_LOBBY, BUCKET_REGISTRY, BUCKET_STATUS,
};
use fleet_harness::{
    poll_until, set_lobby_places, CalloutNats, ChildGuard, DeviceClient, Idp, NatsLeaf, Podman,
};
use rustix::process::Signal;
use serde_json::json;
use tempfile::TempDir;

const TOKEN: &str = "batch-2026-11-enroll-token";
const WAIT: Duration = Duration::from_secs(3);

struct Fleet {
    _idp: Idp,
    nats: CalloutNats,
    /// A callout-layout leaf of `nats`, the devices' server when present.
    leaf: Option<NatsLeaf>,
    dir: TempDir,
}

impl Fleet {
    fn start(auto_approve: Option<&str>) -> Fleet {
        Self::start_with(auto_approve, true, false)
    }

    /// With `identity_provider` false, the callout's config has no
    /// `issuer`, `audience`, `jwks_url` or `https_ca_file`: enrolled
    /// devices only. With `leaf`, the server is a hub with a callout-layout
    /// leaf, and the devices connect to the leaf.
    fn start_with(auto_approve: Option<&str>, identity_provider: bool, leaf: bool) -> Fleet {
        use std::os::unix::fs::PermissionsExt;
        let idp = Idp::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("enrollment-token");
        std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let mut enrollment = json!({"token_files": [token]});
        if let Some(rule) = auto_approve {
            enrollment["auto_approve"] = json!(rule);
        }
        let mut extra = json!({ "enrollment": enrollment });
        if !identity_provider {
            for k in ["issuer", "audience", "jwks_url", "https_ca_file"] {
                extra[k] = serde_json::Value::Null;
            }
        }
        let (nats, leaf) = if leaf {
            let hub = CalloutNats::start_hub(&idp, extra);
            let leaf = NatsLeaf::start_callout("leaf-1", &hub);
            (hub, Some(leaf))
        } else {
            (CalloutNats::start(&idp, extra), None)
        };
        Fleet {
            _idp: idp,
            nats,
            leaf,
            dir,
        }
    }

    fn settings(&self, token: &str) -> Settings {
        let path = self
            .dir
            .path()
            .join(format!("agent-token-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, format!("{token}\n")).expect("token");
        let server = match &self.leaf {
            Some(leaf) => leaf.url(),
            None => self.nats.server.url(),
        };
        let mut s = Settings::new(vec![server]);
        s.auth = Some(json!({"method": "enrollment", "token-file": path}));
        s
    }

    /// `fleetctl ARGS` as the operator: exit code and output.
    fn fleetctl(&self, args: &[&str]) -> (i32, String) {
        let pw = self.dir.path().join("admin-password");
        std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("pw");
        let out = std::process::Command::new(fleet_harness::bin_path("fleetctl"))
            .args(args)
            .args(["--server", &self.nats.server.url(), "--password-file"])
            .arg(&pw)
            .output()
            .expect("run fleetctl");
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn record(&self, id: &str) -> Option<(DeviceRecord, u64)> {
        let kv = bucket(&self.nats.server.admin(), BUCKET_REGISTRY);
        let e = kv.entry(id).expect("registry read")?;
        let r = serde_json::from_slice(&e.value).ok()?;
        Some((r, e.revision))
    }
}

fn identity_key(dev: &Device) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dev.path("var/lib/harmony-fleet/agent/identity.nk");
    let mode = std::fs::metadata(&path)
        .expect("identity key written")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the identity key is private");
    let seed = std::fs::read_to_string(&path).expect("read");
    NkeySeed::parse_kind(seed.trim(), NkeyKind::User)
        .expect("a user seed")
        .public_key()
        .encode()
}

#[test]
fn a_new_device_waits_for_approval_then_runs_its_workload() {
    let podman = Podman::new();
    let fleet = Fleet::start(None);
    let admin = fleet.nats.server.admin();
    put_workload(&admin, "dev-e1", "web", &quick_sleeper(&podman, "v1"));
    let dev = Device::new("dev-e1", &fleet.settings(TOKEN), Some(&podman));
    let mut agent = dev.spawn(Some(&podman));

    // Pending, with its own key and its facts, and saying what it waits for.
    let (record, _) = poll_until("the pending record", Duration::from_secs(20), || {
        fleet.record("dev-e1")
    });
    assert_eq!(record.state, RecordState::Pending);
    let key = identity_key(&dev);
    assert_eq!(record.public_key.as_deref(), Some(key.as_str()));
    assert_eq!(
        record.facts.get("agent-version").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(record.facts.contains_key("arch"), "{record:?}");
    agent.wait_for_line("waiting for approval of dev-e1", WAIT * 5);
    assert!(
        !agent
            .log()
            .lines()
            .any(|l| l.starts_with("Permissions Violation")),
        "the expected refusal of one of the two probes is not shouted:\n{}",
        agent.log()
    );
    poll_until("STATUS= says it waits", WAIT * 5, || {
        dev.notify.find("STATUS=waiting for approval of dev-e1")
    });
    assert!(
        status::<serde_json::Value>(&admin, "dev-e1", "info").is_none(),
        "nothing is reported before approval"
    );
    assert!(
        container(&podman, "fleet-web").is_none(),
        "no workload before approval"
    );

    // The operator sees it pending, with its key, and approves it.
    let (code, pending) = fleet.fleetctl(&["device", "pending"]);
    assert_eq!(code, 0, "{pending}");
    assert!(
        pending.contains("dev-e1") && pending.contains(&key[..12]),
        "{pending}"
    );
    let (code, out) = fleet.fleetctl(&["device", "approve", "dev-e1"]);
    assert_eq!(code, 0, "{out}");
    // Approved: it connects as itself and runs its workload.
    wait_running(&podman, "fleet-web", "web running", |_| true);
    fleet.nats.logged("authorized device dev-e1");
    poll_until("device info", CONVERGE, || {
        status::<serde_json::Value>(&admin, "dev-e1", "info")
    });
    assert!(
        !agent.log().contains(
            &std::fs::read_to_string(dev.path("var/lib/harmony-fleet/agent/identity.nk"))
                .expect("seed")
                .trim()
                .to_owned()
        ),
        "the seed never reaches the log"
    );

    // A restart goes straight in, with the same key.
    agent.signal(Signal::TERM);
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
    let mut agent = dev.start(Some(&podman));
    agent.wait_for_line(
        "approved (connected as the device): connecting as dev-e1",
        WAIT * 5,
    );
    dev.wait_ready(&mut agent);
    assert_eq!(identity_key(&dev), key);
    // The candidate probe of an upgrade connects as the enrolled device.
    let _updater = dev.fake_updater_socket();
    let mut probe =
        fleet_harness::ChildGuard::spawn(dev.command(&["--self-test"], Some(&podman)), "probe");
    let exit = probe.wait_exit(Duration::from_secs(240));
    assert!(exit.success(), "probe: {exit}\n{}", probe.log());
    assert!(probe.log().contains("connected to"), "{}", probe.log());

    // Revoked: its live connection is closed at once and it is refused
    // when it connects again; its workload keeps running.
    let before = fleet
        .nats
        .callout
        .log()
        .matches("device dev-e1 is revoked")
        .count();
    let (code, out) = fleet.fleetctl(&["device", "revoke", "dev-e1"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 connection"), "{out}");
    poll_until(
        "the agent's reconnect refused",
        Duration::from_secs(20),
        || {
            (fleet
                .nats
                .callout
                .log()
                .matches("device dev-e1 is revoked")
                .count()
                > before)
                .then_some(())
        },
    );
    assert!(
        container(&podman, "fleet-web").is_some_and(|c| c.state == "running"),
        "the workload keeps running"
    );
    let seed = NkeySeed::parse_kind(
        std::fs::read_to_string(dev.path("var/lib/harmony-fleet/agent/identity.nk"))
            .expect("seed")
            .trim(),
        NkeyKind::User,
    )
    .expect("seed");
    let refused = fleet.nats.connect_nkey("dev-e1", &seed, Some(TOKEN));
    assert!(refused.is_err(), "a revoked device connected");
    fleet.nats.logged("device dev-e1 is revoked");
    agent.signal(Signal::TERM);
    let _ = agent.wait_exit(Duration::from_secs(30));
}

#[test]
fn auto_approve_admits_a_matching_device_and_decommission_removes_its_workload() {
    let podman = Podman::new();
    let arch = fleet_common::validate::Arch::current()
        .expect("arch")
        .as_str();
    let fleet = Fleet::start_with(Some(&format!("arch={arch}")), false, false);
    fleet
        .nats
        .logged("no identity provider configured: admitting enrolled devices only");
    // No identity provider: a bearer token is refused, and the log says why.
    let token = fleet_harness::rs256(
        &fleet._idp.keys.rsa,
        fleet_harness::RSA_KID,
        &fleet_harness::claims("dev-bearer", 600),
    );
    assert!(fleet.nats.connect_token("dev-bearer", &token).is_err());
    fleet.nats.logged("this callout has no identity provider");
    let admin = fleet.nats.server.admin();
    let (dev, mut agent, record) = fleet.auto_approved("dev-e2", &podman);
    assert_eq!(
        record.decided_by.as_deref(),
        Some(format!("auto-approve arch={arch}").as_str())
    );

    // Decommissioned: the agent removes its workload through its
    // reconciler, then the device is cut off and its keys deleted.
    poll_until("the workloads report", CONVERGE, || {
        status::<serde_json::Value>(&admin, "dev-e2", "workloads")
    });
    let (code, out) = fleet.fleetctl(&["device", "decommission", "dev-e2", "--wait", "90s"]);
    assert_eq!(code, 0, "{out}\n{}", agent.log());
    wait_gone(&podman, "fleet-web");
    let (record, _) = fleet.record("dev-e2").expect("the record is kept");
    assert_eq!(record.state, RecordState::Decommissioned);
    poll_until("its status keys deleted", CONVERGE, || {
        status::<serde_json::Value>(&admin, "dev-e2", "info")
            .is_none()
            .then_some(())
    });
    // The running agent's reconnect lands in ENROLL, where its
    // subscriptions are denied: it asks, is told, forgets its approval and
    // stops with exit 24 (systemd would start it again).
    agent.wait_for_line(
        "dev-e2 was decommissioned: an operator must approve it again; stopped with the workloads left running",
        CONVERGE,
    );
    let exit = agent.wait_exit(Duration::from_secs(60));
    assert_eq!(exit.code(), Some(24), "{}", agent.log());
    assert!(!dev
        .path("var/lib/harmony-fleet/agent/enrolled.json")
        .exists());
    // At its next start it is told so again and waits; the auto-approve
    // rule does not take it back.
    let mut agent = dev.spawn(Some(&podman));
    agent.wait_for_line(
        "dev-e2 was decommissioned: an operator must approve it again",
        WAIT * 5,
    );
    assert!(!dev
        .path("var/lib/harmony-fleet/agent/enrolled.json")
        .exists());
    assert_eq!(
        fleet.record("dev-e2").expect("record").0.state,
        RecordState::Decommissioned
    );
    agent.signal(Signal::TERM);
    let _ = agent.wait_exit(Duration::from_secs(30));
}

#[test]
fn a_device_behind_a_leaf_enrolls_through_it_and_runs_its_workload() {
    // The leaf sends the device a nonce to sign (its nonce user), places a
    // pending device in its own ENROLL (bound to the hub's), and the
    // approved device in DEVICES: the whole first boot through the leaf.
    let podman = Podman::new();
    let arch = fleet_common::validate::Arch::current()
        .expect("arch")
        .as_str();
    let fleet = Fleet::start_with(Some(&format!("arch={arch}")), false, true);
    let admin = fleet.nats.server.admin();
    let (dev, mut agent, record) = fleet.auto_approved("dev-e4", &podman);
    assert_eq!(
        record.public_key.as_deref(),
        Some(identity_key(&dev).as_str())
    );
    // Its status crossed the leaf as itself.
    poll_until("dev-e4's workloads reported", CONVERGE, || {
        status::<serde_json::Value>(&admin, "dev-e4", "workloads")
    });
    agent.signal(Signal::TERM);
    let _ = agent.wait_exit(Duration::from_secs(30));
}

impl Fleet {
    /// Device `id`'s agent started with a workload to run, approved by the
    /// auto-approve rule, ready and running it: its record (approved).
    fn auto_approved(&self, id: &str, podman: &Podman) -> (Device, ChildGuard, DeviceRecord) {
        put_workload(
            &self.nats.server.admin(),
            id,
            "web",
            &quick_sleeper(podman, "v1"),
        );
        let dev = Device::new(id, &self.settings(TOKEN), Some(podman));
        let mut agent = dev.spawn(Some(podman));
        agent.wait_for_line(
            "approved (the enrollment service says so)",
            Duration::from_secs(20),
        );
        dev.wait_ready(&mut agent);
        wait_running(podman, "fleet-web", "web running", |_| true);
        let (record, _) = self.record(id).expect("record");
        assert_eq!(record.state, RecordState::Approved);
        (dev, agent, record)
    }
}

/// Sends `body` on `key`'s enrollment subject with a reply on its inbox.
fn ask(c: &DeviceClient, key: &str, body: &serde_json::Value) -> Option<EnrollAnswer> {
    let inbox = format!(
        "{}{}",
        enroll_inbox_prefix(key),
        uuid::Uuid::new_v4().simple()
    );
    let sub = c.conn.subscribe(&inbox).ok()?;
    c.conn
        .publish_with_reply_or_headers(&enroll_subject(key), Some(&inbox), None, body.to_string())
        .ok()?;
    let m = sub.next_timeout(WAIT).ok()?;
    serde_json::from_slice(&m.data).ok()
}

fn expect_violation(c: &DeviceClient, kind: &str, subject: &str) {
    let err = c
        .next_error(WAIT)
        .unwrap_or_else(|| panic!("no {kind} violation for {subject}"));
    assert!(
        err.contains(&format!("Permissions Violation for {kind}")) && err.contains(subject),
        "expected a {kind} violation on {subject}, got {err}"
    );
}

#[test]
fn a_pending_device_reaches_only_its_own_request_and_bad_ones_are_refused() {
    let fleet = Fleet::start(None);
    let admin = fleet.nats.server.admin();
    let seed = NkeySeed::generate(NkeyKind::User).expect("seed");
    let key = seed.public_key().encode();
    let other = NkeySeed::generate(NkeyKind::User).expect("seed");
    let other_key = other.public_key().encode();

    // Without the token, with a wrong one: refused outright.
    assert!(fleet.nats.connect_nkey("dev-p", &seed, None).is_err());
    assert!(fleet
        .nats
        .connect_nkey("dev-p", &seed, Some("batch-2026-11-enroll-tokeN"))
        .is_err());
    // An id unsafe for subjects: refused.
    assert!(fleet
        .nats
        .connect_nkey("dev.p", &seed, Some(TOKEN))
        .is_err());
    fleet
        .nats
        .logged("must give its device id as the user name");

    let c = fleet
        .nats
        .connect_nkey("dev-p", &seed, Some(TOKEN))
        .unwrap_or_else(|e| panic!("enrolling device refused: {e}\n{}", fleet.nats.logs()));
    let request =
        |id: &str, k: &str| json!({"device-id": id, "public-key": k, "facts": {"arch": "arm64"}});
    let a = ask(&c, &key, &request("dev-p", &key)).expect("an answer");
    assert_eq!(a.state, AnswerState::Pending, "{a:?}");

    // Nothing else: another key's subject, the registry, fleet data, a
    // wildcard subscription, another device's inbox.
    c.conn
        .publish(
            &enroll_subject(&other_key),
            request("dev-q", &other_key).to_string(),
        )
        .expect("buffered");
    expect_violation(&c, "Publish", &enroll_subject(&other_key));
    c.conn
        .publish(&kv_subject(BUCKET_REGISTRY, "dev-p"), b"{}")
        .expect("buffered");
    expect_violation(&c, "Publish", &kv_subject(BUCKET_REGISTRY, "dev-p"));
    c.conn
        .publish(&kv_subject(BUCKET_STATUS, "dev-p.info"), b"{}")
        .expect("buffered");
    expect_violation(&c, "Publish", &kv_subject(BUCKET_STATUS, "dev-p.info"));
    let _sub = c.conn.subscribe(">").expect("buffered");
    expect_violation(&c, "Subscription", ">");
    let theirs = format!("{}>", enroll_inbox_prefix(&other_key));
    let _sub = c.conn.subscribe(&theirs).expect("buffered");
    expect_violation(&c, "Subscription", &theirs);
    let (r, _) = fleet.record("dev-p").expect("record");
    assert_eq!(r.state, RecordState::Pending);

    // Bad requests: answered with the reason, nothing written.
    std::thread::sleep(fleet_common::limits::ENROLL_MIN_REQUEST_INTERVAL);
    let a = ask(&c, &key, &request("dev-p", &other_key)).expect("an answer");
    assert_eq!(a.state, AnswerState::Rejected, "{a:?}");
    assert!(
        a.reason.as_deref().unwrap_or("").contains("not the key"),
        "{a:?}"
    );
    // Asking again at once: slow down.
    let a = ask(&c, &key, &request("dev-p", &key)).expect("an answer");
    assert_eq!(a.state, AnswerState::SlowDown, "{a:?}");
    drop(c);

    // Another key naming dev-p: refused, and the operator sees it.
    let c2 = fleet
        .nats
        .connect_nkey("dev-p", &other, Some(TOKEN))
        .expect("admitted to ENROLL");
    let a = ask(&c2, &other_key, &request("dev-p", &other_key)).expect("an answer");
    assert_eq!(a.state, AnswerState::Rejected, "{a:?}");
    let (r, _) = fleet.record("dev-p").expect("record");
    assert_eq!(
        r.public_key.as_deref(),
        Some(key.as_str()),
        "the key is unchanged"
    );
    assert_eq!(
        r.conflict.as_ref().map(|c| c.public_key.as_str()),
        Some(other_key.as_str())
    );
    drop(c2);

    // A forged signature (dev-p's key, signed by another) is refused.
    let forger = nkeys::KeyPair::from_seed(&other.encode()).expect("pair");
    let forged =
        nats::Options::with_nkey(&key, move |nonce| forger.sign(nonce).unwrap_or_default())
            .nkey_extras(Some("dev-p"), Some(TOKEN));
    let forged = fleet.nats.server.client_options(forged).max_reconnects(1);
    assert!(forged.connect(fleet.nats.server.url().as_str()).is_err());
    fleet
        .nats
        .logged("nkey signature of the nonce: does not verify");
    let _ = admin;
}

#[test]
fn a_flood_of_new_devices_fills_the_lobby_and_a_decision_frees_a_place() {
    let fleet = Fleet::start(None);
    let admin = fleet.nats.server.admin();
    set_lobby_places(&admin, 2);
    let lobby = bucket(&admin, BUCKET_LOBBY);
    let devices: Vec<(String, NkeySeed)> = (0..3)
        .map(|i| {
            (
                format!("dev-f{i}"),
                NkeySeed::generate(NkeyKind::User).expect("seed"),
            )
        })
        .collect();
    let ask_as = |(id, seed): &(String, NkeySeed)| {
        let key = seed.public_key().encode();
        let c = fleet
            .nats
            .connect_nkey(id, seed, Some(TOKEN))
            .unwrap_or_else(|e| panic!("{id} refused: {e}\n{}", fleet.nats.logs()));
        let body = json!({"device-id": id, "public-key": key, "facts": {"arch": "arm64"}});
        ask(&c, &key, &body).expect("an answer")
    };

    // Two places: two devices wait, the third is turned away unrecorded.
    for d in &devices[..2] {
        let a = ask_as(d);
        assert_eq!(a.state, AnswerState::Pending, "{a:?}");
        assert!(lobby.entry(&d.0).expect("lobby read").is_some(), "ticket");
    }
    let a = ask_as(&devices[2]);
    assert_eq!(a.state, AnswerState::SlowDown, "{a:?}");
    assert!(
        a.reason
            .as_deref()
            .unwrap_or("")
            .contains("the lobby is full"),
        "{a:?}"
    );
    assert!(fleet.record("dev-f2").is_none(), "nothing written");
    let (code, out) = fleet.fleetctl(&["device", "pending"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("lobby: 2 of 2 places taken: full"),
        "the operator sees the lobby full: {out}"
    );

    // Rejecting one frees its place, leaving no marker behind; the turned
    // away device gets in on its next request.
    let (code, out) = fleet.fleetctl(&["device", "reject", "dev-f0"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("lobby: 1 of 2 places taken (1 freed now)"),
        "{out}"
    );
    assert!(lobby.entry("dev-f0").expect("lobby read").is_none());
    // Its key's requests are rate-limited: the next one after the interval.
    std::thread::sleep(fleet_common::limits::ENROLL_MIN_REQUEST_INTERVAL);
    let a = ask_as(&devices[2]);
    assert_eq!(a.state, AnswerState::Pending, "{a:?}");
    assert_eq!(
        fleet.record("dev-f2").expect("recorded").0.state,
        RecordState::Pending
    );

    // Without a lobby (buckets or a server config from before it), the
    // callout says so once and falls back to its own rate.
    let r = admin
        .request_timeout(
            &format!(
                "$JS.API.STREAM.DELETE.{}",
                fleet_common::subjects::stream_name(BUCKET_LOBBY)
            ),
            b"",
            WAIT,
        )
        .expect("delete the lobby");
    assert!(String::from_utf8_lossy(&r.data).contains("\"success\":true"));
    let late = (
        "dev-f3".to_owned(),
        NkeySeed::generate(NkeyKind::User).expect("seed"),
    );
    let a = ask_as(&late);
    assert_eq!(a.state, AnswerState::Pending, "{a:?}");
    fleet.nats.logged("no lobby (fleet-lobby");
    let (code, out) = fleet.fleetctl(&["device", "pending"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("lobby: not swept"), "{out}");
}
