//! The harness's HTTPS server and test CA, seen from ureq (rustls, trusting
//! only the test CA) and from curl: every `Behavior` does what it says.

use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_harness::{
    require_tool, Behavior, HttpServer, HttpsServer, Request, ResponseSpec, TestCa,
};
use sha2::{Digest, Sha256};

fn agent(ca: &TestCa) -> ureq::Agent {
    fleet_common::https::agent_builder(ca.client_config())
        .redirects(0)
        .timeout(Duration::from_secs(10))
        .build()
}

#[test]
fn bytes_are_served_over_tls_to_a_client_trusting_the_ca() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route("/a", Behavior::Bytes(b"hello".to_vec()));
    let resp = agent(&ca)
        .get(&server.url("/a"))
        .set("Authorization", "Bearer t")
        .call()
        .expect("GET");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("Content-Length"), Some("5"));
    assert_eq!(resp.into_string().expect("body"), "hello");

    // Via localhost too (DNS SAN), and a query still finds the route.
    let url = server.url("/a?x=1").replace("127.0.0.1", "localhost");
    let body = agent(&ca).get(&url).call().expect("GET").into_string();
    assert_eq!(body.expect("body"), "hello");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].path, "/a");
    assert_eq!(requests[0].header("authorization"), Some("Bearer t"));
    assert_eq!(requests[1].path, "/a?x=1");

    // Unknown paths are 404; a route can be replaced at any time.
    match agent(&ca).get(&server.url("/nothing")).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("expected 404, got {other:?}"),
    }
    server.route("/a", Behavior::Bytes(b"new".to_vec()));
    let body = agent(&ca).get(&server.url("/a")).call().expect("GET");
    assert_eq!(body.into_string().expect("body"), "new");
}

#[test]
fn curl_trusts_the_ca_file_and_refuses_the_untrusted_server() {
    let curl = require_tool("curl", "curl");
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route("/c", Behavior::Bytes(b"curl ok".to_vec()));
    let out = Command::new(&curl)
        .arg("-sS")
        .arg("--cacert")
        .arg(ca.ca_path())
        .arg(server.url("/c"))
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"curl ok");

    let untrusted = HttpsServer::start_untrusted();
    untrusted.route("/c", Behavior::Bytes(b"nope".to_vec()));
    let out = Command::new(&curl)
        .arg("-sS")
        .arg("--cacert")
        .arg(ca.ca_path())
        .arg(untrusted.url("/c"))
        .output()
        .expect("curl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(60), "curl: {stderr}");
}

#[test]
fn untrusted_server_is_refused_before_any_request() {
    let ca = TestCa::new();
    let server = HttpsServer::start_untrusted();
    server.route("/a", Behavior::Bytes(b"secret".to_vec()));
    match agent(&ca).get(&server.url("/a")).call() {
        Err(ureq::Error::Transport(t)) => {
            let msg = t.to_string();
            assert!(msg.contains("certificate"), "{msg}");
        }
        other => panic!("untrusted server accepted: {other:?}"),
    }
    assert!(server.requests().is_empty(), "no request got through");
}

#[test]
fn leaf_certificates_are_server_only_with_both_sans() {
    let openssl = require_tool("openssl", "openssl");
    let ca = TestCa::new();
    let (cert, key) = ca.leaf_files(&["127.0.0.1", "localhost"]);
    assert!(std::fs::read_to_string(&key)
        .expect("key")
        .contains("PRIVATE KEY"));
    let text = Command::new(&openssl)
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&cert)
        .output()
        .expect("openssl");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("CA:FALSE"), "{text}");
    assert!(text.contains("TLS Web Server Authentication"), "{text}");
    assert!(text.contains("IP Address:127.0.0.1"), "{text}");
    assert!(text.contains("DNS:localhost"), "{text}");
    let verify = Command::new(&openssl)
        .args(["verify", "-purpose", "sslserver", "-CAfile"])
        .arg(ca.ca_path())
        .arg(&cert)
        .output()
        .expect("openssl verify");
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    assert!(ca.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
}

#[test]
fn redirect_is_returned_not_followed() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route(
        "/r",
        Behavior::Redirect {
            status: 302,
            location: server.url("/target"),
        },
    );
    server.route("/target", Behavior::Bytes(b"t".to_vec()));
    let resp = agent(&ca).get(&server.url("/r")).call().expect("GET");
    assert_eq!(resp.status(), 302);
    assert_eq!(
        resp.header("Location"),
        Some(server.url("/target").as_str())
    );
    assert_eq!(server.requests().len(), 1, "target not requested");
}

#[test]
fn truncated_body_fails_and_wrong_length_cuts_at_the_declared_length() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route(
        "/t",
        Behavior::Truncate {
            body: vec![7; 1000],
            declared_len: 5000,
        },
    );
    let resp = agent(&ca).get(&server.url("/t")).call().expect("headers");
    assert_eq!(resp.header("Content-Length"), Some("5000"));
    let mut body = Vec::new();
    let err = resp
        .into_reader()
        .read_to_end(&mut body)
        .expect_err("a short body is an error");
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");

    server.route(
        "/w",
        Behavior::WrongLength {
            body: vec![9; 1000],
            declared_len: 10,
        },
    );
    let resp = agent(&ca).get(&server.url("/w")).call().expect("GET");
    let mut body = Vec::new();
    resp.into_reader().read_to_end(&mut body).expect("read");
    assert_eq!(
        body,
        vec![9; 10],
        "the client reads only the declared bytes"
    );
}

#[test]
fn status_and_handler_answer_as_told() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route("/s", Behavior::Status(503));
    match agent(&ca).get(&server.url("/s")).call() {
        Err(ureq::Error::Status(503, _)) => {}
        other => panic!("expected 503, got {other:?}"),
    }
    server.route(
        "/token",
        Behavior::Handler(Box::new(|r: &Request| match r.header("Authorization") {
            Some("Basic dTpw") => ResponseSpec {
                status: 200,
                headers: vec![("Content-Type".to_owned(), "application/json".to_owned())],
                body: format!("{{\"echo\":{}}}", r.body.len()).into_bytes(),
            },
            _ => ResponseSpec {
                status: 401,
                headers: vec![("WWW-Authenticate".to_owned(), "Basic".to_owned())],
                body: Vec::new(),
            },
        })),
    );
    match agent(&ca).get(&server.url("/token")).call() {
        Err(ureq::Error::Status(401, r)) => {
            assert_eq!(r.header("WWW-Authenticate"), Some("Basic"));
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let resp = agent(&ca)
        .post(&server.url("/token"))
        .set("Authorization", "Basic dTpw")
        .send_bytes(b"abc")
        .expect("POST");
    assert_eq!(resp.header("Content-Type"), Some("application/json"));
    assert_eq!(resp.into_string().expect("body"), "{\"echo\":3}");
    let post = server.requests().pop().expect("logged");
    assert_eq!(
        (post.method.as_str(), post.body.as_slice()),
        ("POST", &b"abc"[..])
    );
}

#[test]
fn file_is_streamed_whole() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("artifact");
    // 8 MiB plus an odd tail, not a multiple of any chunk size.
    let data: Vec<u8> = (0..8 * 1024 * 1024 + 12345u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&path, &data).expect("write");
    server.route("/f", Behavior::File(path));
    let resp = agent(&ca).get(&server.url("/f")).call().expect("GET");
    assert_eq!(
        resp.header("Content-Length"),
        Some(data.len().to_string().as_str())
    );
    let mut got = Vec::new();
    resp.into_reader().read_to_end(&mut got).expect("read");
    assert_eq!(Sha256::digest(&got), Sha256::digest(&data));

    let head = agent(&ca).head(&server.url("/f")).call().expect("HEAD");
    assert_eq!(
        head.header("Content-Length"),
        Some(data.len().to_string().as_str())
    );
}

#[test]
fn stalls_hold_the_connection_until_the_server_drops() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route("/stall", Behavior::Stall);
    server.route("/silent", Behavior::StallBeforeHeaders);
    let slow = fleet_common::https::agent_builder(ca.client_config())
        .timeout_read(Duration::from_millis(300))
        .build();

    let resp = slow
        .get(&server.url("/stall"))
        .call()
        .expect("headers arrive");
    assert_eq!(resp.status(), 200);
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let err = resp
        .into_reader()
        .read(&mut buf)
        .expect_err("no body comes");
    assert!(started.elapsed() >= Duration::from_millis(250), "{err}");

    match slow.get(&server.url("/silent")).call() {
        Err(ureq::Error::Transport(t)) => assert!(t.to_string().contains("timed out"), "{t}"),
        other => panic!("expected a read timeout, got {other:?}"),
    }
    assert_eq!(server.requests().len(), 2, "both requests were read");

    // A held connection is released by the drop: the client sees the close.
    let patient = fleet_common::https::agent_builder(ca.client_config())
        .timeout(Duration::from_secs(20))
        .build();
    let url = server.url("/silent");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(
            patient
                .get(&url)
                .call()
                .map(|r| r.status())
                .map_err(|e| e.to_string()),
        );
    });
    fleet_harness::poll_until("the third request read", Duration::from_secs(5), || {
        (server.requests().len() == 3).then_some(())
    });
    let started = Instant::now();
    drop(server);
    assert!(started.elapsed() < Duration::from_secs(2), "drop is quick");
    let result = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the client returns once the server drops");
    assert!(result.is_err(), "closed without a response: {result:?}");
}

#[test]
fn plain_http_server_shares_the_routes() {
    let server = HttpServer::start();
    server.route("/p", Behavior::Bytes(b"plain".to_vec()));
    assert!(server.url("/p").starts_with("http://127.0.0.1:"));
    let body = ureq::get(&server.url("/p"))
        .call()
        .expect("GET")
        .into_string();
    assert_eq!(body.expect("body"), "plain");
    server.route(
        "/r",
        Behavior::Redirect {
            status: 301,
            location: "https://example.invalid/".to_owned(),
        },
    );
    let resp = ureq::AgentBuilder::new()
        .redirects(0)
        .build()
        .get(&server.url("/r"))
        .call()
        .expect("GET");
    assert_eq!(resp.status(), 301);
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn prefix_routes_answer_what_no_exact_route_does() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route_prefix("/v2/", Behavior::Bytes(b"short".to_vec()));
    server.route_prefix("/v2/a/", Behavior::Bytes(b"long".to_vec()));
    server.route("/v2/a/exact", Behavior::Bytes(b"exact".to_vec()));
    let get = |path: &str| match agent(&ca).get(&server.url(path)).call() {
        Ok(r) => r.into_string().expect("body"),
        Err(ureq::Error::Status(s, _)) => s.to_string(),
        Err(e) => panic!("{path}: {e}"),
    };
    assert_eq!(get("/v2/b/x"), "short");
    assert_eq!(get("/v2/a/x?q=1"), "long");
    assert_eq!(get("/v2/a/exact"), "exact");
    assert_eq!(get("/v3/"), "404");
    // Replacing a prefix route keeps one entry for it.
    server.route_prefix("/v2/", Behavior::Status(418));
    assert_eq!(get("/v2/b/x"), "418");
}
