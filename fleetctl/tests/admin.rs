//! `fleetctl` operator commands against a real nats-server with the fleet
//! layout: buckets, workload apply and delete, device status.

use std::process::Command;

use fleet_harness::{NatsServer, NatsVersion, NATS_ADMIN_PASSWORD};

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
        "fleet-workloads: ready\nfleet-control: ready\nfleet-status: ready\nfleet-desired: ready\nfleet-operator: ready\n"
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
