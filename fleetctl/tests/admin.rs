//! `fleetctl` operator commands against a real nats-server with the fleet
//! layout: buckets, workload apply and delete, device status.

use std::process::Command;

use std::time::Duration;

use fleet_harness::{poll_until, NatsCluster, NatsServer, NatsVersion, NATS_ADMIN_PASSWORD};

fn fleetctl(server: &NatsServer, pw: &std::path::Path, args: &[&str]) -> (i32, String, String) {
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

#[test]
fn apply_validates_then_writes_and_status_reads_back() {
    let server = NatsServer::start_fleet(NatsVersion::V2_14, &["dev1"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let pw = dir.path().join("pw");
    std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("write");

    // The harness created the buckets with the same bodies: idempotent.
    let (code, out, err) = fleetctl(&server, &pw, &["buckets", "create"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "fleet-workloads: ready\nfleet-control: ready\nfleet-status: ready\nfleet-desired: ready\nfleet-registry: ready\nfleet-operator: ready\nfleet-lobby: ready\n"
    );

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"image":"localhost/web:1","colour":"red"}"#).expect("write");
    let (code, _, err) = fleetctl(
        &server,
        &pw,
        &[
            "workload",
            "apply",
            "dev1",
            "web",
            bad.to_str().expect("utf8"),
        ],
    );
    assert_eq!(code, 3);
    assert!(err.contains("unknown field `colour`"), "{err}");
    let (code, _, err) = fleetctl(
        &server,
        &pw,
        &[
            "workload",
            "apply",
            "dev.1",
            "web",
            bad.to_str().expect("utf8"),
        ],
    );
    assert_eq!(code, 3);
    assert!(err.contains("invalid device id \"dev.1\""), "{err}");

    let good = dir.path().join("web.json");
    std::fs::write(&good, r#"{ "image": "localhost/web:1" }"#).expect("write");
    let (code, out, err) = fleetctl(
        &server,
        &pw,
        &[
            "workload",
            "apply",
            "dev1",
            "web",
            good.to_str().expect("utf8"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("applied dev1.web (revision "), "{out}");
    let store = nats::jetstream::new(server.admin())
        .key_value("fleet-desired")
        .expect("bucket");
    assert_eq!(
        store.get("dev1.web").expect("get").as_deref(),
        Some(br#"{"image":"localhost/web:1","restart":"always","pull":"missing"}"#.as_slice())
    );

    let (code, out, _) = fleetctl(&server, &pw, &["device", "status", "dev1"]);
    assert_eq!(code, 0);
    assert!(out.contains("device dev1: no device info yet"), "{out}");

    let (code, out, _) = fleetctl(&server, &pw, &["workload", "delete", "dev1", "web"]);
    assert_eq!(code, 0);
    assert_eq!(out, "deleted dev1.web\n");
    assert_eq!(store.get("dev1.web").expect("get"), None);

    std::fs::write(&pw, "wrong\n").expect("write");
    let (code, _, err) = fleetctl(&server, &pw, &["device", "status", "dev1"]);
    assert_eq!(code, 4, "{err}");
}

/// An older deployment's `fleet-control` (no republish) with an intent in
/// it: `buckets create` brings it to this release's config in place on
/// 2.14; on 2.9, which cannot add republish to a stream, it refuses and
/// says what to do, and `--recreate` keeps the intent.
fn an_older_deployments_buckets_are_brought_up_to_date(v: NatsVersion) {
    use fleet_common::nats_config::{kv_stream_config, stream_create_subject, FLEET_BUCKETS};
    let server = NatsServer::start_fleet(v, &["dev1"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let pw = dir.path().join("pw");
    std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("write");
    let admin = server.admin();
    let api = |subject: &str, body: String| {
        let r = admin
            .request_timeout(subject, body, std::time::Duration::from_secs(5))
            .expect("answer");
        serde_json::from_slice::<serde_json::Value>(&r.data).expect("json")
    };
    let spec = FLEET_BUCKETS
        .iter()
        .find(|b| b.bucket == "fleet-control")
        .expect("fleet-control");
    let mut old = kv_stream_config(spec, 1);
    old.as_object_mut().expect("object").remove("republish");
    api("$JS.API.STREAM.DELETE.KV_fleet-control", String::new());
    let created = api(&stream_create_subject("fleet-control"), old.to_string());
    assert!(created.get("error").is_none(), "{created}");
    let put = api(
        "$KV.fleet-control.dev1.agent-upgrade-intent",
        r#"{"kept":true}"#.to_owned(),
    );
    assert!(put.get("error").is_none(), "{put}");
    let republish = || {
        api("$JS.API.STREAM.INFO.KV_fleet-control", String::new())["config"]["republish"].clone()
    };
    assert!(republish().is_null());

    let (code, out, err) = fleetctl(&server, &pw, &["buckets", "create"]);
    match v {
        NatsVersion::V2_14 => {
            assert_eq!(code, 0, "{err}");
            assert!(
                out.contains("fleet-control: updated in place to this release's config\n"),
                "{out}"
            );
        }
        NatsVersion::V2_9 => {
            assert_eq!(code, 6, "{out}{err}");
            assert!(err.contains("fleetctl buckets create --recreate"), "{err}");
            assert!(republish().is_null(), "nothing changed");
            let (code, out, err) = fleetctl(&server, &pw, &["buckets", "create", "--recreate"]);
            assert_eq!(code, 0, "{err}");
            assert!(
                out.contains(
                    "fleet-control: recreated with this release's config, 1 keys copied\n"
                ),
                "{out}"
            );
        }
    }
    assert_eq!(
        republish(),
        serde_json::json!({"src": "$KV.fleet-control.>", "dest": "fleetkv.fleet-control.>"})
    );
    let kept = api(
        "$JS.API.DIRECT.GET.KV_fleet-control.$KV.fleet-control.dev1.agent-upgrade-intent",
        String::new(),
    );
    assert_eq!(kept, serde_json::json!({"kept": true}));
    // Idempotent.
    let (code, out, err) = fleetctl(&server, &pw, &["buckets", "create"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("fleet-control: ready\n"), "{out}");
}

#[test]
fn an_older_deployments_buckets_are_brought_up_to_date_2_9() {
    an_older_deployments_buckets_are_brought_up_to_date(NatsVersion::V2_9);
}

#[test]
fn an_older_deployments_buckets_are_brought_up_to_date_2_14() {
    an_older_deployments_buckets_are_brought_up_to_date(NatsVersion::V2_14);
}

/// A node of a 3-node cluster killed on Debian's nats-server 2.9.10, which
/// places one ephemeral read consumer in three on the dead node and never
/// answers its create: once the cluster has its leaders again, every
/// `fleetctl status` (four buckets read, each through its own consumer)
/// answers the first time, with every device's labels.
#[test]
fn reads_go_on_through_a_node_loss_on_2_9() {
    let devices = ["dev1", "dev2", "dev3"];
    let mut cluster = NatsCluster::start_fleet(NatsVersion::V2_9, &devices);
    let dir = tempfile::tempdir().expect("tempdir");
    let pw = dir.path().join("pw");
    std::fs::write(&pw, format!("{NATS_ADMIN_PASSWORD}\n")).expect("write");
    let run = |cluster: &NatsCluster, args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        cmd.args(args);
        for url in cluster.live_urls().split(',') {
            cmd.args(["--server", url]);
        }
        let out = cmd
            .arg("--password-file")
            .arg(&pw)
            .output()
            .expect("run fleetctl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for d in devices {
        let (ok, _, err) = run(&cluster, &["device", "label", d, "site=berlin"]);
        assert!(ok, "{err}");
    }
    cluster.kill_node(2);
    cluster.wait_for_leaders(Duration::from_secs(60));
    // The first read may also wait out the election of a new meta leader.
    poll_until(
        "a read after the node loss",
        Duration::from_secs(90),
        || run(&cluster, &["status", "--json"]).0.then_some(()),
    );
    for i in 0..6 {
        let (ok, out, err) = run(&cluster, &["status", "--json", "-l", "site=berlin"]);
        assert!(ok, "read {i} after the node loss: {err}");
        let rows: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(rows.as_array().map(Vec::len), Some(3), "{out}");
    }
}
