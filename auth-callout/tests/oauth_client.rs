//! The parked client-credentials token client against a local HTTPS token
//! endpoint: the request it sends, caching and renewal, what it does when
//! the endpoint fails, and the transport rules (HTTPS only, no redirects).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_auth_callout::https_agent;
use fleet_auth_callout::oauth_client::{ClientCredentials, Secret, TokenClient, TokenSource};
use fleet_harness::{Behavior, HttpServer, HttpsServer, ResponseSpec, TestCa};
use serde_json::json;

fn credentials(url: String) -> ClientCredentials {
    ClientCredentials {
        token_url: url,
        client_id: "dev a".into(),
        client_secret: Secret::new("p:w".into()),
        scope: Some("openid urn:zitadel:iam:org:project:id:42:aud".into()),
    }
}

/// An endpoint issuing `tok-<n>` tokens living `ttl` seconds.
fn endpoint(server: &HttpsServer, ttl: u64) -> Arc<AtomicUsize> {
    let issued = Arc::new(AtomicUsize::new(0));
    let n = Arc::clone(&issued);
    server.route(
        "/oauth/v2/token",
        Behavior::Handler(Box::new(move |_| {
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            ResponseSpec {
                status: 200,
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: json!({"access_token": format!("tok-{i}"), "token_type": "bearer", "expires_in": ttl})
                    .to_string()
                    .into_bytes(),
            }
        })),
    );
    issued
}

#[test]
fn sends_client_credentials_and_renews_before_expiry() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    let issued = endpoint(&server, 3600);
    let agent = https_agent(Some(&ca.ca_path())).expect("agent");
    let source = TokenSource::new(TokenClient::new(
        agent,
        credentials(server.url("/oauth/v2/token")),
    ));
    let t0 = Instant::now();
    assert_eq!(source.token(t0).expect("token").expose(), "tok-1");
    // The request: POST, Basic with the form-encoded id and secret, the grant
    // and scope in a form body.
    let req = &server.requests()[0];
    assert_eq!(req.method, "POST");
    // base64("dev+a:p%3Aw")
    assert_eq!(req.header("authorization"), Some("Basic ZGV2K2E6cCUzQXc="));
    assert_eq!(
        String::from_utf8_lossy(&req.body),
        "grant_type=client_credentials&scope=openid+urn%3Azitadel%3Aiam%3Aorg%3Aproject%3Aid%3A42%3Aaud"
    );
    // Kept until three quarters of its life.
    assert_eq!(
        source
            .token(t0 + Duration::from_secs(2699))
            .expect("kept")
            .expose(),
        "tok-1"
    );
    assert_eq!(issued.load(Ordering::SeqCst), 1);
    assert_eq!(
        source
            .token(t0 + Duration::from_secs(2700))
            .expect("renewed")
            .expose(),
        "tok-2"
    );
    // Forgotten on demand (the server refused it).
    source.invalidate();
    assert_eq!(
        source
            .token(t0 + Duration::from_secs(2701))
            .expect("new")
            .expose(),
        "tok-3"
    );

    // The endpoint fails: the current token serves until it expires.
    server.route("/oauth/v2/token", Behavior::Status(503));
    let t1 = t0 + Duration::from_secs(2701);
    assert_eq!(
        source
            .token(t1 + Duration::from_secs(3000))
            .expect("still valid")
            .expose(),
        "tok-3"
    );
    let err = source
        .token(t1 + Duration::from_secs(3600))
        .expect_err("expired and no endpoint")
        .to_string();
    assert!(err.contains("HTTP 503"), "{err}");
}

#[test]
fn endpoint_errors_are_reported_without_the_secret() {
    let ca = TestCa::new();
    let server = HttpsServer::start(&ca);
    server.route(
        "/oauth/v2/token",
        Behavior::Handler(Box::new(|_| ResponseSpec {
            status: 400,
            headers: vec![],
            body: br#"{"error":"invalid_scope","error_description":"no such project"}"#.to_vec(),
        })),
    );
    let agent = https_agent(Some(&ca.ca_path())).expect("agent");
    let client = TokenClient::new(agent.clone(), credentials(server.url("/oauth/v2/token")));
    let err = client
        .fetch(Instant::now())
        .expect_err("refused")
        .to_string();
    assert_eq!(
        err,
        "token endpoint refused (HTTP 400, \"invalid_scope\": \"no such project\"); check the client ID, secret and scope"
    );
    // A token that is not a Bearer token.
    server.route(
        "/oauth/v2/token",
        Behavior::Bytes(
            json!({"access_token": "x", "token_type": "mac"})
                .to_string()
                .into_bytes(),
        ),
    );
    assert!(client
        .fetch(Instant::now())
        .expect_err("mac")
        .to_string()
        .contains("\"mac\""));
    // No redirect is followed.
    server.route(
        "/oauth/v2/token",
        Behavior::Redirect {
            status: 307,
            location: server.url("/elsewhere"),
        },
    );
    let err = client
        .fetch(Instant::now())
        .expect_err("redirect")
        .to_string();
    assert!(err.contains("HTTP 307"), "{err}");
    // Plain HTTP is refused, and so is a server the CA did not sign.
    let http = HttpServer::start();
    endpoint_http(&http);
    let plain = TokenClient::new(agent.clone(), credentials(http.url("/oauth/v2/token")));
    assert!(plain.fetch(Instant::now()).is_err());
    assert!(
        http.requests().is_empty(),
        "a request went out over plain HTTP"
    );
    let stranger = HttpsServer::start_untrusted();
    endpoint(&stranger, 60);
    let untrusted = TokenClient::new(agent, credentials(stranger.url("/oauth/v2/token")));
    assert!(untrusted.fetch(Instant::now()).is_err());
    assert!(
        stranger.requests().is_empty(),
        "a request reached an untrusted server"
    );
}

fn endpoint_http(server: &HttpServer) {
    server.route(
        "/oauth/v2/token",
        Behavior::Bytes(
            json!({"access_token": "x", "token_type": "Bearer"})
                .to_string()
                .into_bytes(),
        ),
    );
}
