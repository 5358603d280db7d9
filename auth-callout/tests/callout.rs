//! `fleet-auth-callout` against nats-server 2.14 (auth callout), a local
//! HTTPS identity provider (JWKS and token endpoint, test CA) and test keys:
//! RS256 with the committed RSA fixture, ES256 with keys made here.
//!
//! Every test starts its own server (the callout layout from
//! `fleet_common::nats_config::callout_server_config`, issuer key made by
//! `fleet-auth-callout keygen`), provider and callout process, and connects
//! devices with bearer tokens as the agent will.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_auth_callout::oauth_client::{ClientCredentials, Secret, TokenClient, TokenSource};
use fleet_common::limits::MAX_BEARER_JWT_BYTES;
use fleet_common::nats_config::{callout_server_config, CalloutServerConfig};
use fleet_common::nkey::{NkeyKind, PublicNkey};
use fleet_harness::{
    assert_device_isolation, bin_path, poll_until, Behavior, ChildGuard, DeviceClient, HttpsServer,
    NatsServer, NatsVersion, ResponseSpec, TestCa, NATS_ADMIN_PASSWORD,
};
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;
use serde_json::{json, Value};
use tempfile::TempDir;

const ISSUER: &str = "https://idp.test.invalid";
const AUDIENCE: &str = "fleet-project";
const CALLOUT_PASSWORD: &str = "callout-pw";
const RSA_PEM: &[u8] = include_bytes!("fixtures/rsa-test-key.pem");
const RSA_JWK: &str = include_str!("fixtures/rsa-test-key.jwk.json");
const RSA_KID: &str = "rsa-test-1";
const EC_KID: &str = "ec-test-1";
/// The callout answers and logs within this.
const WAIT: Duration = Duration::from_secs(10);

fn b64url(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(A[((n >> (18 - 6 * i)) & 0x3f) as usize]));
        }
    }
    out
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// The provider's signing keys.
struct Keys {
    rsa: RsaKeyPair,
    ec: Arc<EcdsaKeyPair>,
}

fn ec_key() -> EcdsaKeyPair {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("gen");
    EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("ec")
}

fn ec_jwk(key: &EcdsaKeyPair, kid: &str) -> Value {
    let p = key.public_key().as_ref();
    json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
           "x": b64url(&p[1..33]), "y": b64url(&p[33..65])})
}

impl Keys {
    fn new() -> Keys {
        let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_PEM).expect("pem");
        Keys {
            rsa: RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).expect("rsa"),
            ec: Arc::new(ec_key()),
        }
    }

    fn jwks(&self) -> Value {
        json!({"keys": [serde_json::from_str::<Value>(RSA_JWK).expect("jwk"), ec_jwk(&self.ec, EC_KID)]})
    }
}

fn signing_input(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    )
}

fn rs256(key: &RsaKeyPair, kid: &str, claims: &Value) -> String {
    let input = signing_input(&json!({"alg": "RS256", "typ": "JWT", "kid": kid}), claims);
    let mut sig = vec![0u8; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        input.as_bytes(),
        &mut sig,
    )
    .expect("sign");
    format!("{input}.{}", b64url(&sig))
}

fn es256(key: &EcdsaKeyPair, kid: &str, claims: &Value) -> String {
    let input = signing_input(&json!({"alg": "ES256", "typ": "JWT", "kid": kid}), claims);
    let sig = key
        .sign(&SystemRandom::new(), input.as_bytes())
        .expect("sign");
    format!("{input}.{}", b64url(sig.as_ref()))
}

/// Valid claims for `device`, expiring in `ttl` seconds.
fn claims(device: &str, ttl: i64) -> Value {
    let t = now();
    json!({"iss": ISSUER, "aud": [AUDIENCE, "other"], "sub": format!("user-{device}"),
           "exp": t + ttl, "iat": t - 5, "nbf": t - 5, "device_id": device})
}

/// Server, provider and callout of one test.
struct Env {
    _ca: TestCa,
    idp: HttpsServer,
    server: NatsServer,
    callout: ChildGuard,
    _dir: TempDir,
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

impl Env {
    /// Everything up, the callout answering; `extra` is merged into its config.
    fn start(keys: &Keys, extra: Value) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new();
        let idp = HttpsServer::start(&ca);
        idp.route(
            "/oauth/v2/keys",
            Behavior::Bytes(keys.jwks().to_string().into_bytes()),
        );

        let seed = dir.path().join("issuer.nk");
        let out = Command::new(bin_path("fleet-auth-callout"))
            .arg("keygen")
            .arg(&seed)
            .output()
            .expect("run keygen");
        assert!(out.status.success(), "keygen: {out:?}");
        let public = String::from_utf8(out.stdout).expect("utf8");
        let issuer = PublicNkey::parse_kind(public.trim(), NkeyKind::Account).expect("account key");

        let server = NatsServer::start_with_config(NatsVersion::V2_14, |port, store| {
            callout_server_config(&CalloutServerConfig {
                listen: ([127, 0, 0, 1], port).into(),
                server_name: None,
                store_dir: store.to_path_buf(),
                admin_password: NATS_ADMIN_PASSWORD.to_owned(),
                callout_password: CALLOUT_PASSWORD.to_owned(),
                issuer: issuer.clone(),
                cluster: None,
            })
        });

        let password = dir.path().join("nats-password");
        write_private(&password, &format!("{CALLOUT_PASSWORD}\n"));
        let mut config = json!({
            "issuer": ISSUER,
            "audience": AUDIENCE,
            "jwks_url": idp.url("/oauth/v2/keys"),
            "https_ca_file": ca.ca_path(),
            "nats_url": server.url(),
            "nats_password_file": password,
            "issuer_seed_file": seed,
        });
        for (k, v) in extra.as_object().expect("object") {
            config[k] = v.clone();
        }
        let config_path = dir.path().join("auth-callout.json");
        std::fs::write(&config_path, config.to_string()).expect("write config");
        let mut cmd = Command::new(bin_path("fleet-auth-callout"));
        cmd.arg("--config")
            .arg(&config_path)
            .env("FLEET_LOG", "info");
        let callout = ChildGuard::spawn(cmd, "fleet-auth-callout");
        callout.wait_for_line("answering authorization requests", WAIT);
        Env {
            _ca: ca,
            idp,
            server,
            callout,
            _dir: dir,
        }
    }

    fn connect_token(&self, id: &str, token: &str) -> std::io::Result<DeviceClient> {
        let options = self
            .server
            .client_options(nats::Options::with_token(token))
            .max_reconnects(1);
        DeviceClient::connect(options, &self.server.url(), id)
    }

    /// The callout's log line about `needle` (waits for it).
    fn logged(&self, needle: &str) -> String {
        self.callout.wait_for_line(needle, WAIT)
    }

    /// Both logs, for a failure message.
    fn logs(&self) -> String {
        format!(
            "--- callout log:\n{}\n--- server log:\n{}",
            self.callout.log(),
            self.server.log()
        )
    }

    /// Connects and expects the device to be authorized.
    fn device(&self, id: &str, token: &str) -> DeviceClient {
        self.connect_token(id, token)
            .unwrap_or_else(|e| panic!("{id} not authorized: {e}\n{}", self.logs()))
    }

    fn jwks_fetches(&self) -> usize {
        self.idp
            .requests()
            .iter()
            .filter(|r| r.path == "/oauth/v2/keys")
            .count()
    }
}

#[test]
fn devices_get_exactly_their_permissions_through_the_callout() {
    let keys = Keys::new();
    let env = Env::start(&keys, json!({}));
    // A with an RS256 token as the NATS token, B with an ES256 token.
    let a = env.device("dev-a", &rs256(&keys.rsa, RSA_KID, &claims("dev-a", 600)));
    let b = env.device("dev-b", &es256(&keys.ec, EC_KID, &claims("dev-b", 600)));
    let line = env.logged("authorized device dev-a");
    assert!(line.contains("subject=user-dev-a"), "{line}");
    env.logged("authorized device dev-b");
    let admin = env.server.admin();
    assert_device_isolation(&admin, &a, &b);
    assert_device_isolation(&admin, &b, &a);
}

#[test]
fn a_client_naming_another_device_gets_the_token_device() {
    let keys = Keys::new();
    let env = Env::start(&keys, json!({}));
    // The token proves dev-a; the client calls itself dev-b: it is dev-a.
    let token = rs256(&keys.rsa, RSA_KID, &claims("dev-a", 600));
    let options = env
        .server
        .client_options(nats::Options::with_token(&token).with_name("dev-b"))
        .max_reconnects(1);
    let a = DeviceClient::connect(options, &env.server.url(), "dev-a").expect("authorized");
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
    let keys = Keys::new();
    let env = Env::start(&keys, json!({"clock_skew_secs": 30}));
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
        .server
        .client_options(nats::Options::with_user_pass("dev-a", "dev-a-pw"))
        .max_reconnects(1);
    assert!(DeviceClient::connect(options, &env.server.url(), "dev-a").is_err());
    env.logged("refused: no bearer token");
    // No token, nor a part of one, ever reaches the log.
    let log = env.callout.log();
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
        env.server.log().contains("bearer token expired at"),
        "server log"
    );
}

#[test]
fn an_unknown_kid_refetches_the_jwks_at_most_once_per_interval() {
    let keys = Keys::new();
    // Default interval (30 s): the fetch at start counts.
    let env = Env::start(&keys, json!({}));
    assert_eq!(env.jwks_fetches(), 1, "fetched once at start");
    let rotated = ec_key();
    let token = es256(&rotated, "ec-rotated", &claims("dev-a", 600));
    for _ in 0..5 {
        assert!(env.connect_token("dev-a", &token).is_err());
    }
    env.logged("the next refetch is allowed in");
    assert_eq!(env.jwks_fetches(), 1, "no refetch within the interval");

    // With a 1 s interval, a key the provider adds is found by a refetch.
    let env = Env::start(&keys, json!({"jwks_min_refetch_secs": 1}));
    assert!(env.connect_token("dev-a", &token).is_err());
    let mut jwks = keys.jwks();
    jwks["keys"]
        .as_array_mut()
        .expect("keys")
        .push(ec_jwk(&rotated, "ec-rotated"));
    env.idp.route(
        "/oauth/v2/keys",
        Behavior::Bytes(jwks.to_string().into_bytes()),
    );
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

/// The token endpoint of the test provider: client credentials with Basic
/// auth, answering ES256 tokens for the device that asked, living `ttl` s.
fn token_endpoint(idp: &HttpsServer, key: Arc<EcdsaKeyPair>, ttl: i64, issued: Arc<AtomicUsize>) {
    idp.route(
        "/oauth/v2/token",
        Behavior::Handler(Box::new(move |req| {
            let form = String::from_utf8_lossy(&req.body).into_owned();
            // "dev-c:s3cr3t" in Basic.
            let authorized = req.header("authorization") == Some("Basic ZGV2LWM6czNjcjN0");
            if req.method != "POST"
                || !authorized
                || !form.contains("grant_type=client_credentials")
            {
                return ResponseSpec {
                    status: 401,
                    headers: vec![("Content-Type".into(), "application/json".into())],
                    body: br#"{"error":"invalid_client","error_description":"bad secret"}"#
                        .to_vec(),
                };
            }
            issued.fetch_add(1, Ordering::SeqCst);
            let token = es256(&key, EC_KID, &claims("dev-c", ttl));
            ResponseSpec {
                status: 200,
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: json!({"access_token": token, "token_type": "Bearer", "expires_in": ttl})
                    .to_string()
                    .into_bytes(),
            }
        })),
    );
}

fn credentials(env: &Env, secret: &str) -> ClientCredentials {
    ClientCredentials {
        token_url: env.idp.url("/oauth/v2/token"),
        client_id: "dev-c".into(),
        client_secret: Secret::new(secret.into()),
        scope: Some("openid urn:zitadel:iam:org:project:id:fleet-project:aud".into()),
    }
}

#[test]
fn a_device_with_client_credentials_is_cut_off_at_token_expiry_and_reconnects_with_a_fresh_token() {
    let keys = Keys::new();
    let env = Env::start(&keys, json!({"clock_skew_secs": 0}));
    let ec = Arc::clone(&keys.ec);
    let issued = Arc::new(AtomicUsize::new(0));
    token_endpoint(&env.idp, Arc::clone(&ec), 3, Arc::clone(&issued));

    // A wrong secret: the endpoint's error comes back, the secret does not.
    let ca = env._ca.ca_path();
    let agent = fleet_auth_callout::https_agent(Some(&ca)).expect("agent");
    let bad = TokenClient::new(agent.clone(), credentials(&env, "wrong"));
    let err = bad.fetch(Instant::now()).expect_err("refused").to_string();
    assert!(
        err.contains("invalid_client") && err.contains("bad secret"),
        "{err}"
    );
    assert!(!err.contains("wrong"), "{err}");

    let source = TokenSource::new(TokenClient::new(agent, credentials(&env, "s3cr3t")));
    let (lost_tx, lost) = std::sync::mpsc::channel();
    let connect = |lost_tx: std::sync::mpsc::Sender<()>| {
        let token = source
            .token(Instant::now())
            .expect("token from the endpoint");
        let options = env
            .server
            .client_options(nats::Options::with_token(token.expose()))
            .max_reconnects(3)
            .disconnect_callback(move || {
                let _ = lost_tx.send(());
            });
        DeviceClient::connect(options, &env.server.url(), "dev-c")
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
    assert!(
        issued.load(Ordering::SeqCst) >= 2,
        "a second token was fetched"
    );
    let log = env.callout.log();
    assert_eq!(log.matches("authorized device dev-c").count(), 2, "{log}");
    assert!(
        env.server.log().to_lowercase().contains("expired"),
        "server log:\n{}",
        env.server.log()
    );
}

#[test]
fn a_token_up_to_the_limit_fits_the_connect_line_and_a_larger_one_is_refused() {
    let keys = Keys::new();
    let env = Env::start(&keys, json!({}));
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
