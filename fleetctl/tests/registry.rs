//! `fleetctl device pending|registry|approve|reject|preauthorize|revoke|
//! decommission` against nats-server 2.14 in the auth-callout layout with
//! the real `fleet-auth-callout`. Enrollment requests are simulated by
//! writing records to `fleet-registry` as the enrollment service does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use fleet_harness::{
    claims, poll_until, rs256, CalloutNats, Idp, NatsServer, NatsVersion, NATS_ADMIN_PASSWORD,
    RSA_KID,
};
use serde_json::{json, Value};

/// Generous bounds: the machine may be shared and loaded.
const WAIT: Duration = Duration::from_secs(20);

struct Fleet {
    idp: Idp,
    nats: CalloutNats,
    admin: nats::Connection,
    dir: tempfile::TempDir,
    pw: PathBuf,
}

impl Fleet {
    fn start() -> Fleet {
        let idp = Idp::start();
        let nats = CalloutNats::start(&idp, json!({}));
        let admin = nats.server.admin();
        let dir = tempfile::tempdir().expect("tempdir");
        let pw = dir.path().join("admin-password");
        std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("pw");
        Fleet {
            idp,
            nats,
            admin,
            dir,
            pw,
        }
    }

    fn fleetctl(&self, args: &[&str]) -> (i32, String, String) {
        run(&self.nats.server, &self.pw, args)
    }

    fn kv(&self, bucket: &str) -> nats::kv::Store {
        nats::jetstream::new(self.admin.clone())
            .key_value(bucket)
            .expect("bucket")
    }

    /// Writes `record` as the enrollment service would.
    fn put_record(&self, record: &Value) {
        let id = record["device-id"].as_str().expect("id");
        self.kv("fleet-registry")
            .put(id, record.to_string())
            .expect("put record");
    }

    fn record(&self, id: &str) -> Option<Value> {
        self.kv("fleet-registry")
            .get(id)
            .expect("get record")
            .filter(|v| !v.is_empty())
            .map(|v| serde_json::from_slice(&v).expect("record JSON"))
    }

    fn registry_revision(&self) -> u64 {
        nats::jetstream::new(self.admin.clone())
            .stream_info("KV_fleet-registry")
            .expect("stream info")
            .state
            .last_seq
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }
}

fn run(server: &NatsServer, pw: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(args)
        .args(["--server", &server.url(), "--password-file"])
        .arg(pw)
        .output()
        .expect("run fleetctl");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn key() -> String {
    nkeys::KeyPair::new_user().public_key()
}

fn pending(id: &str, key: &str, arch: &str) -> Value {
    json!({
        "device-id": id, "state": "pending", "public-key": key,
        "facts": {"arch": arch, "os": "Debian GNU/Linux 12", "serial": format!("SN-{id}")},
        "requested-at": "2026-12-01T10:00:00Z"
    })
}

#[test]
fn pending_lists_requests_with_facts_and_flags_conflicting_keys() {
    let f = Fleet::start();
    let (ka, kb, kother) = (key(), key(), key());
    f.put_record(&pending("dev-a", &ka, "arm64"));
    let mut approved = pending("dev-b", &kb, "x86_64");
    approved["state"] = json!("approved");
    approved["decided-by"] = json!("operator");
    approved["conflict"] = json!({
        "public-key": kother, "facts": {"arch": "arm64"},
        "at": "2026-12-01T11:00:00Z", "count": 3
    });
    f.put_record(&approved);
    let mut rejected = pending("dev-c", &key(), "arm64");
    rejected["state"] = json!("rejected");
    f.put_record(&rejected);

    let (code, out, err) = f.fleetctl(&["device", "pending"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    // dev-a was recorded without a ticket (as before the lobby): it gets one.
    assert_eq!(
        lines[4],
        "lobby: 1 of 10000 places taken (0 freed now; 1 given to pending devices that had none)"
    );
    for col in ["DEVICE", "STATE", "KEY", "REQUESTED", "CONFLICT", "FACTS"] {
        assert!(lines[0].contains(col), "{out}");
    }
    assert!(lines[1].starts_with("dev-a"), "{out}");
    assert!(
        lines[1].contains(&ka[..12]) && !lines[1].contains(&ka[..13]),
        "{out}"
    );
    assert!(
        lines[1].contains("arch=arm64,os=Debian GNU/Linux 12,serial=SN-dev-a"),
        "{out}"
    );
    assert!(lines[1].contains("2026-12-01T10:00:00"), "{out}");
    assert!(
        lines[2].starts_with("dev-b") && lines[2].contains("approved"),
        "{out}"
    );
    assert!(
        lines[2].contains(&format!("{} asked 3x", &kother[..12])),
        "{out}"
    );
    assert!(
        !out.contains("dev-c"),
        "a rejected record without conflict is not pending: {out}"
    );
    assert!(
        lines[3].starts_with("1 pending, 1 with a conflicting request"),
        "{out}"
    );

    let (code, out, err) = f.fleetctl(&["device", "pending", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Vec<Value> = serde_json::from_str(&out).expect("json");
    assert_eq!(v.len(), 2);
    assert_eq!(v[1]["conflict"]["count"], 3);

    let (code, out, err) = f.fleetctl(&["device", "registry", "-l", "arch=arm64"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("dev-a") && out.contains("dev-c") && !out.contains("dev-b"),
        "{out}"
    );
    assert!(out.ends_with("2 records\n"), "{out}");
    let (code, out, _) = f.fleetctl(&["device", "registry", "-l", "state=approved"]);
    assert_eq!(code, 0);
    assert!(out.contains("dev-b") && !out.contains("dev-a"), "{out}");
}

#[test]
fn approve_by_id_and_by_selector_and_refuse_unknown_ids_writing_nothing() {
    let f = Fleet::start();
    let k = [key(), key(), key(), key()];
    f.put_record(&pending("dev-a", &k[0], "arm64"));
    f.put_record(&pending("dev-b", &k[1], "arm64"));
    f.put_record(&pending("dev-c", &k[2], "x86_64"));
    let mut decom = pending("dev-d", &k[3], "x86_64");
    decom["state"] = json!("decommissioned");
    decom["conflict"] =
        json!({"public-key": key(), "facts": {}, "at": "2026-12-01T11:00:00Z", "count": 1});
    f.put_record(&decom);

    // One unknown id refuses the whole command: nothing written.
    let before = f.registry_revision();
    let (code, _, err) = f.fleetctl(&["device", "approve", "dev-c", "dev-x"]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("no enrollment request from dev-x: use `fleetctl device preauthorize`"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(f.registry_revision(), before);
    assert_eq!(f.record("dev-c").expect("dev-c")["state"], "pending");

    // By selector over the pending records' facts.
    let (code, out, err) = f.fleetctl(&["device", "approve", "-l", "arch=arm64"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "dev-a: approved\ndev-b: approved\n");
    for id in ["dev-a", "dev-b"] {
        let r = f.record(id).expect("record");
        assert_eq!(r["state"], "approved");
        assert_eq!(r["decided-by"], "operator");
        assert!(r["decided-at"].is_string());
        assert_eq!(r["facts"]["arch"], "arm64", "facts kept");
    }
    assert_eq!(f.record("dev-c").expect("dev-c")["state"], "pending");

    // By id: a decommissioned record too (re-enrollment), clearing nothing.
    let (code, out, err) = f.fleetctl(&["device", "approve", "dev-c", "dev-d", "dev-a"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "dev-c: approved\ndev-d: approved\ndev-a: approved already\n"
    );
    let d = f.record("dev-d").expect("dev-d");
    assert_eq!(d["state"], "approved");
    assert_eq!(d["public-key"], k[3].as_str());
    assert_eq!(d["conflict"]["count"], 1, "the conflict stays");

    // Approved by id alone: a new record without a key; a recorded id refused.
    let (code, out, err) = f.fleetctl(&["device", "approve", "--id-only", "idp-1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "idp-1: approved by id alone\n");
    let r = f.record("idp-1").expect("idp-1");
    assert_eq!(r["state"], "approved");
    assert!(r.get("public-key").is_none(), "{r}");
    let before = f.registry_revision();
    let (code, _, err) = f.fleetctl(&["device", "approve", "--id-only", "idp-2", "dev-a"]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("device dev-a has a record (state approved)"),
        "{err}"
    );
    assert_eq!(f.registry_revision(), before);
    assert!(f.record("idp-2").is_none());
}

#[test]
fn pending_frees_the_lobby_places_of_decided_and_orphaned_devices() {
    let f = Fleet::start();
    let lobby = f.kv("fleet-lobby");
    let ticket = |at: &str| json!({"requested-at": at}).to_string();
    let now = fleet_common::Timestamp::now().to_string();
    // dev-a waits; dev-b was approved by the rule meanwhile; dev-c's writer
    // died before its record 11 minutes ago; dev-d's is being written now.
    f.put_record(&pending("dev-a", &key(), "arm64"));
    let mut approved = pending("dev-b", &key(), "arm64");
    approved["state"] = json!("approved");
    f.put_record(&approved);
    let old = fleet_common::Timestamp::from_unix_millis(
        fleet_common::Timestamp::now().unix_millis() - 11 * 60 * 1000,
    )
    .to_string();
    for (id, at) in [
        ("dev-a", &now),
        ("dev-b", &now),
        ("dev-c", &old),
        ("dev-d", &now),
    ] {
        lobby.put(id, ticket(at)).expect("ticket");
    }
    let (code, out, err) = f.fleetctl(&["device", "pending"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.ends_with("lobby: 2 of 10000 places taken (2 freed now)\n"),
        "{out}"
    );
    let left: Vec<String> = ["dev-a", "dev-b", "dev-c", "dev-d"]
        .into_iter()
        .filter(|id| lobby.entry(id).expect("read").is_some())
        .map(str::to_owned)
        .collect();
    assert_eq!(left, ["dev-a", "dev-d"], "purged, no deletion marker left");

    // Approving dev-a frees its place too, and says so.
    let (code, out, err) = f.fleetctl(&["device", "approve", "dev-a"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "dev-a: approved\n");
    assert!(
        err.contains("lobby: 1 of 10000 places taken (1 freed now)"),
        "{err}"
    );
}

#[test]
fn pending_gives_devices_recorded_without_the_lobby_a_place_while_places_are_left() {
    let f = Fleet::start();
    fleet_harness::set_lobby_places(&f.admin, 2);
    let lobby = f.kv("fleet-lobby");
    // dev-x holds a place; dev-old and dev-new were recorded pending before
    // the lobby existed, dev-old first.
    let now = fleet_common::Timestamp::now().to_string();
    lobby
        .put("dev-x", json!({"requested-at": now}).to_string())
        .expect("ticket");
    let mut old = pending("dev-old", &key(), "arm64");
    old["requested-at"] = json!("2026-11-30T08:00:00Z");
    f.put_record(&old);
    f.put_record(&pending("dev-new", &key(), "arm64"));

    let (code, out, err) = f.fleetctl(&["device", "pending"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.ends_with(
            "lobby: 2 of 2 places taken: full, new devices are told to slow down until some are approved or rejected (0 freed now; 1 given to pending devices that had none; 1 pending devices recorded without the lobby have no place)\n"
        ),
        "{out}"
    );
    let ticket = lobby
        .entry("dev-old")
        .expect("read")
        .expect("dev-old placed");
    let ticket: Value = serde_json::from_slice(&ticket.value).expect("json");
    assert_eq!(
        ticket["requested-at"], "2026-11-30T08:00:00.000Z",
        "its own request time"
    );
    assert!(
        lobby.entry("dev-new").expect("read").is_none(),
        "no place left"
    );

    // Rejecting dev-old frees its place, and the same sweep gives it to dev-new.
    let (code, _, err) = f.fleetctl(&["device", "reject", "dev-old"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("(1 freed now; 1 given to pending devices that had none)"),
        "{err}"
    );
    assert!(
        lobby.entry("dev-new").expect("read").is_some(),
        "dev-new placed"
    );
    assert!(
        lobby.entry("dev-old").expect("read").is_none(),
        "dev-old freed"
    );
}

#[test]
fn reject_keeps_the_reason_and_refuses_an_approved_device() {
    let f = Fleet::start();
    f.put_record(&pending("dev-a", &key(), "arm64"));
    let mut approved = pending("dev-b", &key(), "arm64");
    approved["state"] = json!("approved");
    f.put_record(&approved);

    let (code, out, err) = f.fleetctl(&[
        "device",
        "reject",
        "dev-a",
        "--reason",
        "serial not in the shipment",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "dev-a: rejected\n");
    let r = f.record("dev-a").expect("dev-a");
    assert_eq!(r["state"], "rejected");
    assert_eq!(r["decided-by"], "operator: serial not in the shipment");

    let before = f.registry_revision();
    let (code, _, err) = f.fleetctl(&["device", "reject", "dev-b"]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("cannot reject a device in state approved: it may connect: revoke it instead"),
        "{err}"
    );
    assert_eq!(f.registry_revision(), before);
}

#[test]
fn preauthorize_creates_approved_records_and_refuses_a_bad_file_whole() {
    let f = Fleet::start();
    let (ka, kb, kc) = (key(), key(), key());
    let line = |id: &str, k: &str| format!("{{\"device-id\":\"{id}\",\"public-key\":\"{k}\"}}\n");

    let good = f.file(
        "good.jsonl",
        &format!("{}{}", line("dev-a", &ka), line("dev-b", &kb)),
    );
    let (code, out, err) = f.fleetctl(&[
        "device",
        "preauthorize",
        "--file",
        good.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "dev-a: preauthorized\ndev-b: preauthorized\n2 preauthorized, 0 already approved with the same key\n"
    );
    let r = f.record("dev-a").expect("dev-a");
    assert_eq!(r["state"], "approved");
    assert_eq!(r["decided-by"], "preauthorized");
    assert_eq!(r["public-key"], ka.as_str());

    // Again, with one more: the approved ones are no-ops.
    let again = f.file(
        "again.jsonl",
        &format!("{}{}", line("dev-a", &ka), line("dev-c", &kc)),
    );
    let (code, out, err) = f.fleetctl(&[
        "device",
        "preauthorize",
        "--file",
        again.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "dev-c: preauthorized\n1 preauthorized, 1 already approved with the same key\n"
    );

    // A bad key on line 2: the whole file refused, nothing written.
    let account = nkeys::KeyPair::new_account().public_key();
    let before = f.registry_revision();
    let bad = f.file(
        "bad.jsonl",
        &format!("{}{}", line("dev-d", &key()), line("dev-e", &account)),
    );
    let (code, _, err) = f.fleetctl(&[
        "device",
        "preauthorize",
        "--file",
        bad.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("line 2: device dev-e: public key:"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(f.registry_revision(), before);
    assert!(f.record("dev-d").is_none());

    // An id recorded with another key: refused whole.
    let other = f.file(
        "other.jsonl",
        &format!("{}{}", line("dev-f", &key()), line("dev-b", &key())),
    );
    let (code, _, err) = f.fleetctl(&[
        "device",
        "preauthorize",
        "--file",
        other.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("device dev-b is recorded with another key"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(f.registry_revision(), before);
    assert!(f.record("dev-f").is_none());
    assert_eq!(f.record("dev-b").expect("dev-b")["public-key"], kb.as_str());
}

#[test]
fn revoke_closes_the_live_connection_of_the_device() {
    let f = Fleet::start();
    let mut approved = pending("dev-a", &key(), "arm64");
    approved["state"] = json!("approved");
    f.put_record(&approved);
    let token = rs256(&f.idp.keys.rsa, RSA_KID, &claims("dev-a", 600));
    let (tx, closed) = mpsc::channel();
    let options = f
        .nats
        .server
        .client_options(nats::Options::with_token(&token))
        .max_reconnects(1)
        .disconnect_callback(move || {
            let _ = tx.send(());
        });
    let device = options
        .connect(f.nats.server.url())
        .unwrap_or_else(|e| panic!("dev-a not admitted: {e}\n{}", f.nats.logs()));
    device.flush().expect("flush");

    let (code, out, err) = f.fleetctl(&["device", "revoke", "dev-a"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "dev-a: revoked; 1 connection closed\n");
    assert_eq!(f.record("dev-a").expect("dev-a")["state"], "revoked");
    closed
        .recv_timeout(WAIT)
        .expect("the device's connection is closed by the kick");

    // The client's one reconnect may be admitted again (this callout
    // admits an identity-provider device without reading the registry):
    // close it before revoking again.
    device.close();

    // Revoking again writes nothing, and kicks whatever is still there.
    let (code, out, err) = f.fleetctl(&["device", "revoke", "dev-a"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("dev-a: revoked already; "), "{out}");
    assert_eq!(f.record("dev-a").expect("dev-a")["state"], "revoked");
}

#[test]
fn revoke_needs_the_callout_layout() {
    let server = NatsServer::start_fleet(NatsVersion::V2_14, &["dev-a"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let pw = dir.path().join("pw");
    std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("pw");
    let (code, _, err) = run(&server, &pw, &["device", "revoke", "dev-a"]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("fleetctl device revoke needs the auth-callout layout"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
}

/// Which of the keys [`seed_device_keys`] writes hold a value.
fn device_keys(f: &Fleet, dev: &str) -> Vec<String> {
    [
        ("fleet-workloads", format!("{dev}.desired")),
        ("fleet-desired", format!("{dev}.web")),
        ("fleet-control", format!("{dev}.agent-upgrade-intent")),
        ("fleet-status", format!("{dev}.workloads")),
        ("fleet-status", format!("{dev}.heartbeat")),
        ("fleet-operator", format!("labels.{dev}")),
    ]
    .into_iter()
    .filter(|(bucket, key)| {
        f.kv(bucket)
            .get(key)
            .expect("get")
            .is_some_and(|v| !v.is_empty())
    })
    .map(|(bucket, key)| format!("{bucket} {key}"))
    .collect()
}

fn seed_device_keys(f: &Fleet, dev: &str) {
    f.kv("fleet-workloads")
        .put(
            &format!("{dev}.desired"),
            r#"{"workloads":{"web":{"image":"localhost/web:1"}}}"#,
        )
        .expect("desired");
    f.kv("fleet-desired")
        .put(&format!("{dev}.web"), r#"{"image":"localhost/web:1"}"#)
        .expect("legacy desired");
    f.kv("fleet-control")
        .put(&format!("{dev}.agent-upgrade-intent"), "{}")
        .expect("intent");
    f.kv("fleet-status")
        .put(
            &format!("{dev}.workloads"),
            r#"{"workloads":{"web":{"state":"running"}},"observed-at":"2026-12-01T10:00:00Z"}"#,
        )
        .expect("status");
    f.kv("fleet-status")
        .put(&format!("{dev}.heartbeat"), "{}")
        .expect("heartbeat");
    f.kv("fleet-operator")
        .put(&format!("labels.{dev}"), r#"{"labels":{"site":"berlin"}}"#)
        .expect("labels");
}

#[test]
fn decommission_with_force_deletes_the_device_keys_and_keeps_the_record() {
    let f = Fleet::start();
    let k = key();
    let mut approved = pending("dev-a", &k, "arm64");
    approved["state"] = json!("approved");
    f.put_record(&approved);
    seed_device_keys(&f, "dev-a");
    seed_device_keys(&f, "dev-b");
    assert_eq!(device_keys(&f, "dev-a").len(), 6);

    let (code, out, err) = f.fleetctl(&["device", "decommission", "dev-a", "--force"]);
    assert_eq!(code, 0, "{err}");
    // fleet-desired's key went with the workloads (agent 0.1.0), first.
    assert!(out.contains("dev-a: desired workloads emptied\n"), "{out}");
    assert!(out.contains("dev-a: decommissioned\n"), "{out}");
    assert!(out.contains("dev-a: 0 connections closed\n"), "{out}");
    assert!(
        out.contains("dev-a: 5 keys deleted; its record stays"),
        "{out}"
    );
    assert_eq!(device_keys(&f, "dev-a"), Vec::<String>::new());
    assert_eq!(
        device_keys(&f, "dev-b").len(),
        6,
        "another device's keys stay"
    );
    let r = f.record("dev-a").expect("the archive record");
    assert_eq!(r["state"], "decommissioned");
    assert_eq!(r["public-key"], k.as_str());
    assert_eq!(r["facts"]["serial"], "SN-dev-a");

    // Unknown device: refused, nothing written.
    let (code, _, err) = f.fleetctl(&["device", "decommission", "dev-x", "--force"]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("no record of device dev-x"), "{err}");
}

#[test]
fn decommission_without_force_refuses_when_the_device_keeps_its_workloads() {
    let f = Fleet::start();
    let mut approved = pending("dev-a", &key(), "arm64");
    approved["state"] = json!("approved");
    f.put_record(&approved);
    seed_device_keys(&f, "dev-a");

    let (code, _, err) = f.fleetctl(&["device", "decommission", "dev-a", "--wait", "2s"]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("device dev-a still reports workloads web after 2 s: it is offline, or still removing them"),
        "{err}"
    );
    assert!(err.contains("or with --force"), "{err}");
    // The desired workloads are empty; nothing else changed.
    let doc = f
        .kv("fleet-workloads")
        .get("dev-a.desired")
        .expect("get")
        .expect("doc");
    assert_eq!(doc, br#"{"workloads":{}}"#);
    assert_eq!(f.record("dev-a").expect("dev-a")["state"], "approved");
    assert!(f
        .kv("fleet-status")
        .get("dev-a.heartbeat")
        .expect("get")
        .is_some());
    assert!(f
        .kv("fleet-operator")
        .get("labels.dev-a")
        .expect("get")
        .is_some());

    // The device reports its workloads gone: the next run completes.
    f.kv("fleet-status")
        .put(
            "dev-a.workloads",
            r#"{"workloads":{},"observed-at":"2026-12-01T10:01:00Z"}"#,
        )
        .expect("status");
    let (code, out, err) = f.fleetctl(&["device", "decommission", "dev-a", "--wait", "20s"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dev-a: reports no workloads\n"), "{out}");
    poll_until("the archive record", WAIT, || {
        (f.record("dev-a")?["state"] == "decommissioned").then_some(())
    });
}
