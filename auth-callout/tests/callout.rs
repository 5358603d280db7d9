//! `fleet-auth-callout` against nats-server 2.14 (auth callout) and the
//! harness's identity provider (JWKS and token endpoint over HTTPS with a
//! test CA; RS256 with the committed RSA fixture, ES256 with a key made at
//! start).
//!
//! Every test starts its own provider, server (the callout layout from
//! `fleet_common::nats_config::callout_server_config`, issuer key made by
//! `fleet-auth-callout keygen`) and callout process
//! ([`fleet_harness::CalloutNats`]), and connects devices with bearer
//! tokens as the NATS token. The agent's own side (token client, renewal)
//! is tested in `agent/tests/oauth.rs`.

use std::time::{Duration, Instant};

use fleet_common::b64::encode_url as b64url;
use fleet_common::limits::MAX_BEARER_JWT_BYTES;
use fleet_harness::{
    assert_device_isolation, claims, ec_jwk, ec_key, es256, now_secs as now, poll_until, rs256,
    signing_input, Behavior, CalloutNats, DeviceClient, Idp, IdpKeys, EC_KID, JWKS_PATH, RSA_KID,
};
use serde_json::{json, Value};

/// The callout answers and logs within this.
const WAIT: Duration = Duration::from_secs(10);

/// Provider, server and callout of one test.
struct Env {
    idp: Idp,
    nats: CalloutNats,
}

impl Env {
    /// Everything up, the callout answering; `extra` is merged into its config.
    fn start(extra: Value) -> Env {
        let idp = Idp::start();
        let nats = CalloutNats::start(&idp, extra);
        Env { idp, nats }
    }

    fn keys(&self) -> &IdpKeys {
        &self.idp.keys
    }

    fn connect_token(&self, id: &str, token: &str) -> std::io::Result<DeviceClient> {
        self.nats.connect_token(id, token)
    }

    /// The callout's log line about `needle` (waits for it).
    fn logged(&self, needle: &str) -> String {
        self.nats.logged(needle)
    }

    /// Both logs, for a failure message.
    fn logs(&self) -> String {
        self.nats.logs()
    }

    /// Connects and expects the device to be authorized.
    fn device(&self, id: &str, token: &str) -> DeviceClient {
        self.nats.device(id, token)
    }

    fn jwks_fetches(&self) -> usize {
        self.idp.jwks_fetches()
    }
}

#[test]
fn devices_get_exactly_their_permissions_through_the_callout() {
    let env = Env::start(json!({}));
    let keys = env.keys();
    // A with an RS256 token as the NATS token, B with an ES256 token.
    let a = env.device("dev-a", &rs256(&keys.rsa, RSA_KID, &claims("dev-a", 600)));
    let b = env.device("dev-b", &es256(&keys.ec, EC_KID, &claims("dev-b", 600)));
    let line = env.logged("authorized device dev-a");
    assert!(line.contains("subject=user-dev-a"), "{line}");
    env.logged("authorized device dev-b");
    let admin = env.nats.server.admin();
    assert_device_isolation(&admin, &a, &b);
    assert_device_isolation(&admin, &b, &a);
}

#[test]
fn a_client_naming_another_device_gets_the_token_device() {
    let env = Env::start(json!({}));
    let keys = env.keys();
    // The token proves dev-a; the client calls itself dev-b: it is dev-a.
    let token = rs256(&keys.rsa, RSA_KID, &claims("dev-a", 600));
    let options = env
        .nats
        .server
        .client_options(nats::Options::with_token(&token).with_name("dev-b"))
        .max_reconnects(1);
    let a = DeviceClient::connect(options, &env.nats.server.url(), "dev-a").expect("authorized");
    let ack = a.put_status("info", b"a").expect("own status");
    assert!(ack.get("error").is_none(), "{ack}");
    a.conn
        .publish("$KV.fleet-status.dev-b.info", b"forged")
        .expect("publish is buffered");
    let err = a.next_error(WAIT).expect("permission error");
    assert!(
        err.contains("Permissions Violation for Publish") && err.contains("dev-b"),
        "{err}"
    );
    let line = env.logged("authorized device dev-a");
    assert!(!line.contains("dev-b"), "{line}");
}

#[test]
fn every_bad_token_is_refused_with_its_reason_logged() {
    let env = Env::start(json!({"clock_skew_secs": 30}));
    let keys = env.keys();
    let other_rsa_signed = {
        // A valid RS256 token with its signature replaced by the EC key's
        // kid-confused signature: signed by a key that is not the JWKS one.
        let stranger = ec_key();
        es256(&stranger, EC_KID, &claims("dev-a", 600))
    };
    let mut tampered = rs256(&keys.rsa, RSA_KID, &claims("dev-a", 600));
    let payload_start = tampered.find('.').expect("dot") + 1;
    let forged_payload = b64url(claims("dev-b", 600).to_string().as_bytes());
    let payload_end = tampered[payload_start..].find('.').expect("dot") + payload_start;
    tampered.replace_range(payload_start..payload_end, &forged_payload);
    let alg_none = format!(
        "{}.",
        signing_input(
            &json!({"alg": "none", "typ": "JWT", "kid": RSA_KID}),
            &claims("dev-a", 600)
        )
    );
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims("dev-a", 600);
        f(&mut c);
        rs256(&keys.rsa, RSA_KID, &c)
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            with(&|c| c["exp"] = json!(now() - 120)),
            "bearer token expired at",
        ),
        (
            "not yet valid",
            with(&|c| c["nbf"] = json!(now() + 600)),
            "bearer token not valid before",
        ),
        (
            "wrong issuer",
            with(&|c| c["iss"] = json!("https://evil.invalid")),
            "bearer token issuer \"https://evil.invalid\" is not the configured issuer",
        ),
        (
            "wrong audience",
            with(&|c| c["aud"] = json!("someone-else")),
            "bearer token audience \"someone-else\" does not include the configured audience",
        ),
        (
            "unknown kid",
            rs256(&keys.rsa, "no-such-kid", &claims("dev-a", 600)),
            "unknown kid \"no-such-kid\"",
        ),
        (
            "bad signature",
            tampered,
            "bearer token signature does not verify with JWKS key \"rsa-test-1\"",
        ),
        (
            "signed by a stranger",
            other_rsa_signed,
            "bearer token signature does not verify with JWKS key \"ec-test-1\"",
        ),
        (
            "alg none",
            alg_none,
            "bearer token alg \"none\" is not accepted",
        ),
        (
            "device id with .",
            with(&|c| c["device_id"] = json!("dev.b")),
            "invalid device id \"dev.b\"",
        ),
        (
            "device id with *",
            with(&|c| c["device_id"] = json!("dev*")),
            "invalid device id \"dev*\"",
        ),
        (
            "device id with >",
            with(&|c| c["device_id"] = json!("dev>")),
            "invalid device id \"dev>\"",
        ),
        (
            "device id with a space",
            with(&|c| c["device_id"] = json!("dev b")),
            "invalid device id \"dev b\"",
        ),
        (
            "no device id claim",
            with(&|c| {
                c.as_object_mut().expect("obj").remove("device_id");
            }),
            "bearer token has no \"device_id\" claim",
        ),
    ];
    for (what, token, reason) in &cases {
        let started = Instant::now();
        let err = env
            .connect_token("dev-a", token)
            .map(|_| ())
            .expect_err(what);
        assert!(
            err.to_string()
                .to_lowercase()
                .contains("authorization violation"),
            "{what}: {err}"
        );
        let line = env.logged(reason);
        assert!(line.contains("refused: "), "{what}: {line}");
        assert!(
            started.elapsed() < WAIT,
            "{what}: refusal took {:?}",
            started.elapsed()
        );
    }
    // A client with a password instead of a token.
    let options = env
        .nats
        .server
        .client_options(nats::Options::with_user_pass("dev-a", "dev-a-pw"))
        .max_reconnects(1);
    assert!(DeviceClient::connect(options, &env.nats.server.url(), "dev-a").is_err());
    env.logged("refused: no bearer token");
    // No token, nor a part of one, ever reaches the log.
    let log = env.nats.callout.log();
    for (what, token, _) in &cases {
        let signature = token.rsplit('.').next().unwrap_or_default();
        assert!(
            signature.is_empty() || !log.contains(signature),
            "{what}: token in the log"
        );
        let payload = token.split('.').nth(1).unwrap_or_default();
        assert!(!log.contains(payload), "{what}: token in the log");
    }
    // The server logged each refusal with the callout's reason too.
    assert!(
        env.nats.server.log().contains("bearer token expired at"),
        "server log"
    );
}

#[test]
fn an_unknown_kid_refetches_the_jwks_at_most_once_per_interval() {
    // Default interval (30 s): the fetch at start counts.
    let env = Env::start(json!({}));
    assert_eq!(env.jwks_fetches(), 1, "fetched once at start");
    let rotated = ec_key();
    let token = es256(&rotated, "ec-rotated", &claims("dev-a", 600));
    for _ in 0..5 {
        assert!(env.connect_token("dev-a", &token).is_err());
    }
    env.logged("the next refetch is allowed in");
    assert_eq!(env.jwks_fetches(), 1, "no refetch within the interval");

    // With a 1 s interval, a key the provider adds is found by a refetch.
    let env = Env::start(json!({"jwks_min_refetch_secs": 1}));
    let keys = env.keys();
    assert!(env.connect_token("dev-a", &token).is_err());
    let mut jwks = keys.jwks();
    jwks["keys"]
        .as_array_mut()
        .expect("keys")
        .push(ec_jwk(&rotated, "ec-rotated"));
    env.idp
        .server
        .route(JWKS_PATH, Behavior::Bytes(jwks.to_string().into_bytes()));
    let started = Instant::now();
    let device = poll_until("the rotated key to be accepted", WAIT, || {
        env.connect_token("dev-a", &token).ok()
    });
    assert!(device.put_status("info", b"rotated").is_some());
    let fetches = env.jwks_fetches();
    let allowed = 2 + started.elapsed().as_secs() as usize + 1;
    assert!(
        fetches <= allowed,
        "{fetches} fetches, at most {allowed} allowed"
    );
}

#[test]
fn a_device_is_cut_off_at_token_expiry_and_only_a_fresh_token_lets_it_back() {
    let env = Env::start(json!({"clock_skew_secs": 0}));
    env.idp
        .add_client("dev-c", "s3cr3t", "dev-c", Duration::from_secs(3));
    // A wrong secret: the provider refuses, nothing is issued.
    let (status, body) = env.idp.fetch_token("dev-c", "wrong").expect_err("refused");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("invalid_client"), "{body}");
    assert_eq!(env.idp.issued("dev-c"), 0);

    let (lost_tx, lost) = std::sync::mpsc::channel();
    let connect = |lost_tx: std::sync::mpsc::Sender<()>| {
        let token = env
            .idp
            .fetch_token("dev-c", "s3cr3t")
            .expect("token from the endpoint");
        let options = env
            .nats
            .server
            .client_options(nats::Options::with_token(&token))
            .max_reconnects(3)
            .disconnect_callback(move || {
                let _ = lost_tx.send(());
            });
        DeviceClient::connect(options, &env.nats.server.url(), "dev-c")
            .unwrap_or_else(|e| panic!("dev-c not authorized: {e}\n{}", env.logs()))
    };
    let first = connect(lost_tx.clone());
    assert!(first.put_status("info", b"first").is_some());
    // The user expires with its 3 s token: the server closes the connection.
    lost.recv_timeout(Duration::from_secs(15))
        .unwrap_or_else(|_| panic!("not disconnected at expiry\n{}", env.logs()));
    // The crate's own reconnect carries the old token: refused.
    env.logged("refused: bearer token expired at");
    drop(first);
    // A new connection with a fresh token, as the agent makes it.
    let second = connect(lost_tx);
    let ack = second
        .put_status("info", b"second")
        .expect("status after reconnect");
    assert!(ack.get("error").is_none(), "{ack}");
    assert_eq!(env.idp.issued("dev-c"), 2, "a second token was fetched");
    let log = env.nats.callout.log();
    assert_eq!(log.matches("authorized device dev-c").count(), 2, "{log}");
    assert!(
        env.nats.server.log().to_lowercase().contains("expired"),
        "server log:\n{}",
        env.nats.server.log()
    );
}

#[test]
fn a_token_up_to_the_limit_fits_the_connect_line_and_a_larger_one_is_refused() {
    let env = Env::start(json!({}));
    let keys = env.keys();
    let token_of = |len: usize| {
        // Pad a claim until the token is `len` bytes (base64 grows 4/3).
        let mut c = claims("dev-a", 600);
        let base = rs256(&keys.rsa, RSA_KID, &c).len();
        c["pad"] = json!("x".repeat((len - base - 12) * 3 / 4));
        let t = rs256(&keys.rsa, RSA_KID, &c);
        assert!(t.len() <= len && t.len() + 8 > len, "{} for {len}", t.len());
        t
    };
    let fits = token_of(MAX_BEARER_JWT_BYTES);
    let a = env.device("dev-a", &fits);
    assert!(a.put_status("info", b"big token").is_some());
    let over = token_of(MAX_BEARER_JWT_BYTES + 100);
    assert!(env.connect_token("dev-a", &over).is_err());
    env.logged(&format!("is larger than {MAX_BEARER_JWT_BYTES}"));
}

/// A token the provider signed with `device_id` twice
/// ("dev1", then "dev2") is refused by the running callout, not admitted
/// as dev2; so is one naming `alg` twice in its header.
#[test]
fn a_token_naming_a_key_twice_is_refused() {
    use ring::rand::SystemRandom;
    use ring::signature::RSA_PKCS1_SHA256;
    let env = Env::start(json!({}));
    let sign = |header: &str, claims: &str| {
        let input = format!(
            "{}.{}",
            b64url(header.as_bytes()),
            b64url(claims.as_bytes())
        );
        let key = &env.keys().rsa;
        let mut sig = vec![0u8; key.public().modulus_len()];
        key.sign(
            &RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            input.as_bytes(),
            &mut sig,
        )
        .expect("sign");
        format!("{input}.{}", b64url(&sig))
    };
    let c = claims("dev1", 600);
    let base = format!(
        r#""iss":{},"aud":{},"exp":{},"iat":{},"device_id":"dev1""#,
        c["iss"], c["aud"], c["exp"], c["iat"]
    );
    let header = format!(r#"{{"alg":"RS256","typ":"JWT","kid":"{RSA_KID}"}}"#);
    // The control: without the duplicate the token is admitted.
    drop(env.device("dev1", &sign(&header, &format!("{{{base}}}"))));
    let twice = sign(&header, &format!(r#"{{{base},"device_id":"dev2"}}"#));
    let err = env
        .connect_token("dev2", &twice)
        .map(|_| ())
        .expect_err("refused");
    assert!(
        err.to_string()
            .to_lowercase()
            .contains("authorization violation"),
        "{err}"
    );
    env.logged("bearer token claims name the key \"device_id\" twice");
    let alg_twice = sign(
        &format!(r#"{{"alg":"none","alg":"RS256","typ":"JWT","kid":"{RSA_KID}"}}"#),
        &format!("{{{base}}}"),
    );
    assert!(env.connect_token("dev1", &alg_twice).is_err());
    env.logged("bearer token header names the key \"alg\" twice");
}

/// With `bearer_requires_approval`, a device with a valid token that the
/// registry does not know is refused and waits in the lobby (pending by
/// id, its token's subject as a fact), where `fleetctl device pending`
/// shows it; approved by id, it connects.
/// An enrollment token file (0600) holding `token` and the admin's
/// password file for fleetctl, in `dir`.
fn operator_files(dir: &std::path::Path, token: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let token_file = dir.join("enrollment-token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let pw = dir.join("admin-password");
    std::fs::write(&pw, format!("{}\n", fleet_harness::NATS_ADMIN_PASSWORD)).expect("write");
    (token_file, pw)
}

#[test]
fn an_unapproved_identity_provider_device_waits_in_the_lobby_until_approved() {
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let (token_file, pw) = operator_files(dir.path(), "lobby-test-token");
    let env = Env::start(json!({"enrollment": {
        "token_files": [token_file],
        "bearer_requires_approval": true,
    }}));
    let fleetctl = |args: &[&str]| {
        let out = Command::new(fleet_harness::bin_path("fleetctl"))
            .args(args)
            .args(["--server", &env.nats.server.url(), "--password-file"])
            .arg(&pw)
            .output()
            .expect("run fleetctl");
        (
            out.status.code().expect("exit code"),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let token = rs256(&env.keys().rsa, RSA_KID, &claims("dev-idp", 600));
    assert!(env.connect_token("dev-idp", &token).is_err(), "admitted");
    let line = env.logged("refused: device dev-idp is not approved");
    assert!(line.contains("fleetctl device approve dev-idp"), "{line}");
    env.logged("dev-idp is waiting for approval");
    let (code, out, err) = fleetctl(&["device", "pending"]);
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("dev-idp"))
        .unwrap_or_else(|| panic!("not listed:\n{out}"));
    assert!(
        row.contains("pending") && row.contains("idp-subject=user-dev-idp"),
        "{row}"
    );
    // Refused again: still one record, still pending.
    assert!(env.connect_token("dev-idp", &token).is_err(), "admitted");
    let (code, out, err) = fleetctl(&["device", "approve", "dev-idp"]);
    assert_eq!(code, 0, "{out}{err}");
    let dev = env.device("dev-idp", &token);
    let ack = dev.put_status("info", b"approved").expect("status");
    assert!(ack.get("error").is_none(), "{ack}");
}

/// The registry stream's leader, as node `admin` is connected to sees it.
fn registry_leader(admin: &nats::Connection) -> Option<String> {
    let subject = format!(
        "$JS.API.STREAM.INFO.{}",
        fleet_common::subjects::stream_name(fleet_common::subjects::BUCKET_REGISTRY)
    );
    let m = admin.request_timeout(&subject, b"", WAIT).ok()?;
    let info: Value = serde_json::from_slice(&m.data).ok()?;
    info["cluster"]["leader"]
        .as_str()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

/// The state of `id`'s record as the replica on `admin`'s node answers a
/// Direct Get: what a callout reading any replica would see.
fn replica_state(admin: &nats::Connection, id: &str) -> Option<String> {
    let subject =
        fleet_common::subjects::direct_get_subject(fleet_common::subjects::BUCKET_REGISTRY, id);
    let m = admin
        .request_timeout(&subject, b"", Duration::from_secs(2))
        .ok()?;
    let record: Value = serde_json::from_slice(&m.data).ok()?;
    record["state"].as_str().map(str::to_owned)
}

#[test]
fn a_device_revoked_while_a_node_is_cut_off_is_not_admitted_through_that_node() {
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let (token_file, pw) = operator_files(dir.path(), "partition-test-token");
    let idp = Idp::start();
    // Node 2 in a namespace of its own, so that its routes can be cut; the
    // one callout and the device reach the cluster only through it.
    const CUT: usize = 2;
    let fleet = fleet_harness::CalloutCluster::start(
        &idp,
        json!({"enrollment": {
            "token_files": [token_file],
            "bearer_requires_approval": true,
        }}),
        0,
        fleet_harness::ClusterOptions {
            netns_node: Some(CUT),
            ..Default::default()
        },
    );
    let urls = fleet.cluster.urls();
    let callout = fleet.start_callout_to(&urls[CUT]);
    let logs = || {
        format!(
            "--- callout log:\n{}\n--- n{CUT} log:\n{}",
            callout.log(),
            fleet.cluster.node_log(CUT)
        )
    };
    // The operator's side is on node 0, which stays with the majority.
    let fleetctl = |args: &[&str]| {
        let out = Command::new(fleet_harness::bin_path("fleetctl"))
            .args(args)
            .args(["--server", &urls[0], "--password-file"])
            .arg(&pw)
            .output()
            .expect("run fleetctl");
        (
            out.status.code().expect("exit code"),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let admin_on = |i: usize| {
        fleet
            .cluster
            .admin_options()
            .connect(&urls[i])
            .expect("admin connects")
    };
    let connect = |token: &str| {
        let options = fleet
            .cluster
            .client_options(nats::Options::with_token(token))
            .max_reconnects(1);
        DeviceClient::connect(options, &urls[CUT], "dev-cut")
    };
    let token = rs256(&idp.keys.rsa, RSA_KID, &claims("dev-cut", 600));
    assert!(connect(&token).is_err(), "admitted before approval");
    let deadline = Instant::now() + WAIT;
    while !fleetctl(&["device", "pending"]).1.contains("dev-cut") {
        assert!(Instant::now() < deadline, "no pending record\n{}", logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, out) = fleetctl(&["device", "approve", "dev-cut"]);
    assert_eq!(code, 0, "{out}");
    let (admin0, admin_cut) = (admin_on(0), admin_on(CUT));
    poll_until("the approval on every replica", WAIT, || {
        (replica_state(&admin_cut, "dev-cut").as_deref() == Some("approved")).then_some(())
    });
    drop(
        connect(&token)
            .unwrap_or_else(|e| panic!("approved, refused through n{CUT}: {e}\n{}", logs())),
    );

    // The registry is led from the majority's side of the cut.
    let stepdown = format!(
        "$JS.API.STREAM.LEADER.STEPDOWN.{}",
        fleet_common::subjects::stream_name(fleet_common::subjects::BUCKET_REGISTRY)
    );
    let leader = poll_until(
        "a registry leader off the node to cut",
        Duration::from_secs(60),
        || {
            let leader = registry_leader(&admin0)?;
            if leader == format!("n{CUT}") {
                let _ = admin0.request_timeout(&stepdown, b"", WAIT);
                return None;
            }
            Some(leader)
        },
    );
    fleet.cluster.cut_routes();
    let (code, out) = fleetctl(&["device", "revoke", "dev-cut"]);
    assert_eq!(code, 0, "revoke on the majority's side: {out}");
    // The cut-off replica still holds, and serves, the approval: a read of
    // any replica would admit the revoked device. (A Direct Get sent to it
    // is answered by it or by a replica across the cut, which never
    // answers: a few tries find it.)
    let served = (0..10)
        .map(|_| replica_state(&admin_cut, "dev-cut"))
        .find(Option::is_some)
        .flatten();
    assert_eq!(
        served.as_deref(),
        Some("approved"),
        "the cut-off replica (leader {leader}) does not serve the stale approval: the cut did not hold"
    );
    // Each connect is a fresh read: none may admit the device.
    for attempt in 0..8 {
        assert!(
            connect(&token).is_err(),
            "attempt {attempt}: a device revoked on the leader was admitted through a replica cut off from it\n{}",
            logs()
        );
    }
    // Refused for want of the leader's answer (the cut-off node's own
    // "JetStream system temporarily unavailable", or none), not as revoked:
    // nothing on its side of the cut knows of the revocation.
    callout.wait_for_line(
        "refused: the device registry (fleet-registry) did not answer",
        WAIT,
    );

    // The cut healed, the replica catches up and the device stays out.
    fleet.cluster.restore_routes();
    poll_until(
        "the revocation on the healed replica",
        Duration::from_secs(60),
        || (replica_state(&admin_cut, "dev-cut").as_deref() == Some("revoked")).then_some(()),
    );
    assert!(connect(&token).is_err(), "a revoked device was admitted");
}

#[test]
fn a_server_config_from_before_leader_reads_still_admits_approved_devices() {
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let (token_file, pw) = operator_files(dir.path(), "old-config-token");
    let idp = Idp::start();
    let leader_read =
        fleet_common::subjects::stream_msg_get_subject(fleet_common::subjects::BUCKET_REGISTRY);
    // The config as written before registry reads went to the leader: no
    // export of the leader read, no import of it into AUTH.
    let nats = CalloutNats::start_edited(
        &idp,
        json!({"enrollment": {
            "token_files": [token_file],
            "bearer_requires_approval": true,
        }}),
        &|text| {
            let old: Vec<&str> = text.lines().filter(|l| !l.contains(&leader_read)).collect();
            assert_eq!(
                old.len() + 2,
                text.lines().count(),
                "export and import: {text}"
            );
            old.join("\n")
        },
    );
    let token = rs256(&idp.keys.rsa, RSA_KID, &claims("dev-old", 600));
    assert!(nats.connect_token("dev-old", &token).is_err(), "admitted");
    nats.logged("dev-old is waiting for approval");
    let out = Command::new(fleet_harness::bin_path("fleetctl"))
        .args([
            "device",
            "approve",
            "dev-old",
            "--server",
            &nats.server.url(),
            "--password-file",
        ])
        .arg(&pw)
        .output()
        .expect("run fleetctl");
    assert!(out.status.success(), "{out:?}");
    nats.device("dev-old", &token);
    let line = nats.logged("no leader read of the device registry");
    assert!(line.contains("fleetctl nats-config"), "{line}");
}
