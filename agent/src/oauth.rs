//! OAuth2 client credentials (RFC 6749 section 4.4) for the device: get the
//! bearer token the NATS auth callout verifies from the identity provider's
//! token endpoint, keep it, and get a new one before it expires.
//!
//! Request: `POST token-url` over HTTPS only (no redirect followed, connect
//! and whole request bounded), `Authorization: Basic` with the form-encoded
//! client ID and secret (RFC 6749 section 2.3.1), body
//! `grant_type=client_credentials[&scope=...][&audience=...]`. For Zitadel,
//! the scope `openid urn:zitadel:iam:org:project:id:<project id>:aud` puts
//! the project ID (the callout's audience) in `aud`. The endpoint's
//! certificate must chain to `ca-file` when given, else to the system's
//! roots, read at each request (requests are rare; nothing stays in memory).
//!
//! The token travels as the NATS token (CONNECT `auth_token`): nats-server
//! discards a CONNECT `jwt` outside operator mode. The callout's user
//! expires with the token, so [`crate::nats::connection`] opens a new
//! connection with a fresh token before that (at [`AccessToken::refresh_at`]).
//! Neither the secret nor a token is ever logged: both are
//! [`Secret`]s, whose `Debug` hides them, and no error carries them.

use std::fmt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleet_common::b64::encode_std;
use fleet_common::https::{self, ClientSettings, ExchangeError, Trust};
use fleet_common::limits::{
    IDP_CONNECT_TIMEOUT, IDP_REQUEST_TIMEOUT, MAX_BEARER_JWT_BYTES, MAX_OAUTH_TOKEN_RESPONSE_BYTES,
};
use serde_json::Value;

use crate::config::{ClientCredentials, Secret};

/// Lifetime assumed when the endpoint gives no `expires_in`.
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(300);
/// Shortest token lifetime accepted: a connection is renewed at half of it
/// at the latest, and connecting takes a moment.
const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(5);
/// A token is renewed once a quarter of its lifetime is left, and at least
/// this long before it expires (but never before half of it has passed).
const MIN_REFRESH_MARGIN: Duration = Duration::from_secs(30);
/// Longest provider error text kept.
const MAX_ERROR_CHARS: usize = 200;

/// A token and when to renew it.
#[derive(Debug, Clone)]
pub struct AccessToken {
    pub token: Secret,
    pub expires_at: Instant,
    pub refresh_at: Instant,
}

impl AccessToken {
    /// A token living `lifetime` from `now`: renewed when a quarter of it
    /// is left, at least [`MIN_REFRESH_MARGIN`] before it expires, and not
    /// before half of it has passed.
    fn new(token: Secret, now: Instant, lifetime: Duration) -> Self {
        let margin = (lifetime / 4).max(MIN_REFRESH_MARGIN).min(lifetime / 2);
        Self {
            token,
            expires_at: now + lifetime,
            refresh_at: now + (lifetime - margin),
        }
    }
}

/// Why an HTTPS exchange with the token endpoint failed.
#[derive(Debug)]
pub enum HttpsError {
    /// The trust store (the CA file, or the system bundle) could not be built.
    Setup(https::TlsSetupError),
    Exchange(ExchangeError),
}

impl fmt::Display for HttpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Setup(e) => write!(f, "{e} (nats.auth.ca-file)"),
            Self::Exchange(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for HttpsError {}

/// Why no token was obtained.
#[derive(Debug)]
pub enum TokenError {
    Https(HttpsError),
    /// The endpoint answered an error status (OAuth2 `error` and
    /// description when it sent them; redirects included: none is followed).
    Refused {
        url: String,
        status: u16,
        error: String,
        description: String,
    },
    Malformed {
        url: String,
        what: &'static str,
    },
    TokenType {
        url: String,
        token_type: String,
    },
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Https(e) => write!(f, "token endpoint: {e}"),
            Self::Refused {
                url,
                status,
                error,
                description,
            } if error.is_empty() && description.is_empty() && self.is_permanent() => write!(
                f,
                "token endpoint {url} answered HTTP {status} (redirects are not followed); check nats.auth.token-url"
            ),
            Self::Refused { url, status, error, description }
                if error.is_empty() && description.is_empty() =>
            {
                write!(f, "token endpoint {url} is unavailable (HTTP {status})")
            }
            Self::Refused {
                url,
                status,
                error,
                description,
            } if self.is_permanent() => write!(
                f,
                "token endpoint {url} refused (HTTP {status}, {error:?}: {description:?}); check nats.auth.client-id, the client secret and nats.auth.scope"
            ),
            Self::Refused {
                url,
                status,
                error,
                description,
            } => write!(
                f,
                "token endpoint {url} is unavailable (HTTP {status}, {error:?}: {description:?})"
            ),
            Self::Malformed { url, what } => write!(f, "token endpoint {url} answered {what}"),
            Self::TokenType { url, token_type } => write!(
                f,
                "token endpoint {url} issued a {token_type:?} token, expected a Bearer token; set the client's access token type to Bearer (JWT)"
            ),
        }
    }
}

impl std::error::Error for TokenError {}

impl TokenError {
    /// Asking again cannot help until the identity provider or the config
    /// changes: a redirect, the client or scope refused, an answer that is
    /// not a bearer token, or CAs that do not load. (Transport errors, 408,
    /// 429 and 5xx may pass.)
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Refused { status, .. } => {
                (300..500).contains(status) && !matches!(status, 408 | 429)
            }
            Self::Malformed { .. } | Self::TokenType { .. } => true,
            Self::Https(e) => matches!(e, HttpsError::Setup(_)),
        }
    }
}

/// A ureq agent trusting `ca_file` only, or the system bundle: HTTPS only,
/// no redirects, connect and whole request bounded.
fn https_agent(ca_file: Option<&Path>) -> Result<ureq::Agent, HttpsError> {
    https::agent(
        Trust::file_or_system(ca_file),
        ClientSettings {
            connect: IDP_CONNECT_TIMEOUT,
            request: IDP_REQUEST_TIMEOUT,
            user_agent: concat!("fleet-agent/", env!("CARGO_PKG_VERSION")),
        },
    )
    .map_err(HttpsError::Setup)
}

/// `POST url` with a form body and extra headers; the status and a body of
/// up to `limit` bytes whatever the status (an OAuth2 error body says why).
fn post_form(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&str, &str)],
    form: &[(&str, &str)],
    limit: u64,
) -> Result<(u16, Vec<u8>), HttpsError> {
    let mut request = agent.post(url).set("Accept", "application/json");
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let response = match request.send_form(form) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(HttpsError::Exchange(ExchangeError::request(url, &e))),
    };
    let status = response.status();
    let body = https::read_body_of(url, response, limit).map_err(HttpsError::Exchange)?;
    Ok((status, body))
}

fn bounded_text(v: Option<&Value>) -> String {
    v.and_then(Value::as_str)
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_ERROR_CHARS)
        .collect()
}

/// `application/x-www-form-urlencoded` of one value (RFC 6749 appendix B).
fn form_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Fetches tokens from one endpoint.
#[derive(Debug)]
pub struct TokenClient {
    credentials: ClientCredentials,
    url: String,
}

impl TokenClient {
    /// Checks the CAs can be loaded now, so a bad `ca-file` fails at start.
    pub fn new(credentials: ClientCredentials) -> Result<Self, TokenError> {
        https_agent(credentials.ca_file.as_deref()).map_err(TokenError::Https)?;
        Ok(Self {
            url: credentials.token_url.to_string(),
            credentials,
        })
    }

    /// One token request, at monotonic time `now`.
    pub fn fetch(&self, now: Instant) -> Result<AccessToken, TokenError> {
        let c = &self.credentials;
        let url = self.url.as_str();
        let agent = https_agent(c.ca_file.as_deref()).map_err(TokenError::Https)?;
        let basic = encode_std(
            format!(
                "{}:{}",
                form_encode(&c.client_id),
                form_encode(c.client_secret.expose())
            )
            .as_bytes(),
        );
        let authorization = format!("Basic {basic}");
        let mut form = vec![("grant_type", "client_credentials")];
        if let Some(scope) = &c.scope {
            form.push(("scope", scope.as_str()));
        }
        if let Some(audience) = &c.audience {
            form.push(("audience", audience.as_str()));
        }
        let (status, body) = post_form(
            &agent,
            url,
            &[("Authorization", authorization.as_str())],
            &form,
            MAX_OAUTH_TOKEN_RESPONSE_BYTES,
        )
        .map_err(TokenError::Https)?;
        let malformed = |what| TokenError::Malformed {
            url: url.to_owned(),
            what,
        };
        let json: Option<Value> = serde_json::from_slice(&body).ok();
        if status != 200 {
            return Err(TokenError::Refused {
                url: url.to_owned(),
                status,
                error: bounded_text(json.as_ref().and_then(|j| j.get("error"))),
                description: bounded_text(json.as_ref().and_then(|j| j.get("error_description"))),
            });
        }
        let json = json.ok_or_else(|| malformed("something that is not JSON"))?;
        let token = json
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| malformed("no access_token"))?;
        if token.len() > MAX_BEARER_JWT_BYTES {
            return Err(malformed("an access_token larger than the callout accepts"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(malformed(
                "an access_token with characters a NATS token cannot hold",
            ));
        }
        let token_type = json.get("token_type").and_then(Value::as_str).unwrap_or("");
        if !token_type.eq_ignore_ascii_case("bearer") {
            return Err(TokenError::TokenType {
                url: url.to_owned(),
                token_type: token_type.chars().take(32).collect(),
            });
        }
        let lifetime = match json.get("expires_in") {
            None => DEFAULT_TOKEN_LIFETIME,
            Some(v) => v
                .as_u64()
                .filter(|s| *s > 0)
                .map(Duration::from_secs)
                .ok_or_else(|| {
                    malformed("an expires_in that is not a positive number of seconds")
                })?,
        };
        if lifetime < MIN_TOKEN_LIFETIME {
            return Err(malformed(
                "an expires_in under 5 s, too short to connect and renew with",
            ));
        }
        Ok(AccessToken::new(
            Secret::new(token.to_owned()),
            now,
            lifetime,
        ))
    }
}

/// The device's current token, renewed before it expires.
#[derive(Debug)]
pub struct TokenSource {
    client: TokenClient,
    current: Mutex<Option<AccessToken>>,
}

impl TokenSource {
    pub fn new(client: TokenClient) -> Self {
        Self {
            client,
            current: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<AccessToken>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The token to connect with at `now`: the kept one until its refresh
    /// time, else a new one; when the endpoint fails, a kept token that has
    /// not expired still serves. Concurrent callers wait for one fetch.
    pub fn token(&self, now: Instant) -> Result<AccessToken, TokenError> {
        let mut current = self.lock();
        if let Some(t) = current.as_ref().filter(|t| now < t.refresh_at) {
            return Ok(t.clone());
        }
        match self.client.fetch(now) {
            Ok(t) => {
                *current = Some(t.clone());
                Ok(t)
            }
            Err(e) => match current.as_ref().filter(|t| now < t.expires_at) {
                Some(t) => {
                    log::warn!(
                        "token renewal failed, the current token serves until it expires: {e}"
                    );
                    Ok(t.clone())
                }
                None => Err(e),
            },
        }
    }

    /// A token not due for renewal at `now`: the kept one, or a new one.
    /// Unlike [`TokenSource::token`], an endpoint failure is an error even
    /// while the kept token is valid (a renewal that failed).
    pub fn fresh(&self, now: Instant) -> Result<AccessToken, TokenError> {
        let mut current = self.lock();
        if let Some(t) = current.as_ref().filter(|t| now < t.refresh_at) {
            return Ok(t.clone());
        }
        let t = self.client.fetch(now)?;
        *current = Some(t.clone());
        Ok(t)
    }

    /// Forgets the kept token (the server refused it): the next call fetches.
    pub fn invalidate(&self) {
        *self.lock() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use fleet_harness::{Behavior, HttpServer, HttpsServer, ResponseSpec, TestCa};
    use serde_json::json;

    fn credentials(url: &str, ca: Option<&TestCa>) -> ClientCredentials {
        ClientCredentials {
            token_url: fleet_common::validate::HttpsUrl::parse(url).expect("https url"),
            client_id: "dev a".into(),
            client_secret: Secret::new("p:w".into()),
            scope: Some("openid urn:zitadel:iam:org:project:id:42:aud".into()),
            audience: None,
            ca_file: ca.map(TestCa::ca_path),
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
    fn secrets_never_show_in_debug() {
        let c = credentials("https://idp.test/oauth/v2/token", None);
        let t = AccessToken::new(
            Secret::new("eyJhbGciOi.tok".into()),
            Instant::now(),
            Duration::from_secs(60),
        );
        let shown = format!("{c:?} {t:?}");
        assert!(!shown.contains("p:w"), "{shown}");
        assert!(!shown.contains("eyJhbGciOi"), "{shown}");
    }

    #[test]
    fn form_encoding_follows_rfc6749() {
        assert_eq!(form_encode("dev-a_1.x*"), "dev-a_1.x*");
        assert_eq!(form_encode("a b:c/d+é"), "a+b%3Ac%2Fd%2B%C3%A9");
    }

    #[test]
    fn renewal_is_due_at_three_quarters_at_least_30_s_early_never_before_half() {
        let t0 = Instant::now();
        let at = |secs| {
            let t = AccessToken::new(Secret::new("t".into()), t0, Duration::from_secs(secs));
            assert_eq!(t.expires_at, t0 + Duration::from_secs(secs));
            (t.refresh_at - t0).as_millis()
        };
        assert_eq!(at(3600), 2_700_000);
        assert_eq!(at(100), 70_000, "30 s before expiry");
        assert_eq!(at(40), 20_000, "not before half");
        assert_eq!(at(6), 3_000, "not before half");
    }

    #[test]
    fn sends_client_credentials_and_renews_before_expiry() {
        let ca = TestCa::new();
        let server = HttpsServer::start(&ca);
        let issued = endpoint(&server, 3600);
        let mut c = credentials(&server.url("/oauth/v2/token"), Some(&ca));
        c.audience = Some("fleet api".into());
        let source = TokenSource::new(TokenClient::new(c).expect("client"));
        let t0 = Instant::now();
        assert_eq!(source.token(t0).expect("token").token.expose(), "tok-1");
        // The request: POST, Basic with the form-encoded id and secret, the
        // grant, scope and audience in a form body.
        let req = &server.requests()[0];
        assert_eq!(req.method, "POST");
        // base64("dev+a:p%3Aw")
        assert_eq!(req.header("authorization"), Some("Basic ZGV2K2E6cCUzQXc="));
        assert_eq!(
            String::from_utf8_lossy(&req.body),
            "grant_type=client_credentials&scope=openid+urn%3Azitadel%3Aiam%3Aorg%3Aproject%3Aid%3A42%3Aaud&audience=fleet+api"
        );
        // Kept until three quarters of its life.
        let kept = source.token(t0 + Duration::from_secs(2699)).expect("kept");
        assert_eq!(kept.token.expose(), "tok-1");
        assert_eq!(kept.refresh_at, t0 + Duration::from_secs(2700));
        assert_eq!(issued.load(Ordering::SeqCst), 1);
        let t1 = t0 + Duration::from_secs(2700);
        assert_eq!(source.token(t1).expect("renewed").token.expose(), "tok-2");
        assert_eq!(source.fresh(t1).expect("kept").token.expose(), "tok-2");
        // Forgotten on demand (the server refused it).
        source.invalidate();
        assert_eq!(source.fresh(t1).expect("new").token.expose(), "tok-3");

        // The endpoint fails: the current token serves until it expires,
        // but a renewal (`fresh`) is an error.
        server.route("/oauth/v2/token", Behavior::Status(503));
        let late = t1 + Duration::from_secs(3000);
        assert_eq!(
            source.token(late).expect("still valid").token.expose(),
            "tok-3"
        );
        let err = source.fresh(late).expect_err("renewal failed").to_string();
        assert!(err.contains("HTTP 503"), "{err}");
        let err = source
            .token(t1 + Duration::from_secs(3600))
            .expect_err("expired and no endpoint")
            .to_string();
        assert_eq!(
            err,
            format!(
                "token endpoint {} is unavailable (HTTP 503)",
                server.url("/oauth/v2/token")
            )
        );
    }

    #[test]
    fn endpoint_errors_are_reported_without_the_secret() {
        let ca = TestCa::new();
        let server = HttpsServer::start(&ca);
        let url = server.url("/oauth/v2/token");
        server.route(
            "/oauth/v2/token",
            Behavior::Handler(Box::new(|_| ResponseSpec {
                status: 400,
                headers: vec![],
                body: br#"{"error":"invalid_scope","error_description":"no such project"}"#
                    .to_vec(),
            })),
        );
        let client = TokenClient::new(credentials(&url, Some(&ca))).expect("client");
        let err = client
            .fetch(Instant::now())
            .expect_err("refused")
            .to_string();
        assert_eq!(
            err,
            format!("token endpoint {url} refused (HTTP 400, \"invalid_scope\": \"no such project\"); check nats.auth.client-id, the client secret and nats.auth.scope")
        );
        assert!(!err.contains("p:w") && !err.contains("cCUzQXc"), "{err}");
        for (body, expected) in [
            (
                json!({"access_token": "x", "token_type": "mac"}),
                "issued a \"mac\" token, expected a Bearer token",
            ),
            (json!({"token_type": "Bearer"}), "answered no access_token"),
            (
                json!({"access_token": "x y", "token_type": "Bearer"}),
                "characters a NATS token cannot hold",
            ),
            (
                json!({"access_token": "x", "token_type": "Bearer", "expires_in": -5}),
                "expires_in that is not a positive number",
            ),
            (
                json!({"access_token": "x", "token_type": "Bearer", "expires_in": 4}),
                "an expires_in under 5 s",
            ),
        ] {
            server.route(
                "/oauth/v2/token",
                Behavior::Bytes(body.to_string().into_bytes()),
            );
            let err = client.fetch(Instant::now()).expect_err("bad").to_string();
            assert!(err.contains(expected), "{err}");
        }
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
        assert!(
            err.ends_with(
                "answered HTTP 307 (redirects are not followed); check nats.auth.token-url"
            ),
            "{err}"
        );
        // A server the CA did not sign gets no request, nor does one
        // outside the system roots when no ca-file is given.
        let stranger = HttpsServer::start_untrusted();
        endpoint(&stranger, 60);
        let url = stranger.url("/oauth/v2/token");
        for ca in [Some(&ca), None] {
            let untrusted = TokenClient::new(credentials(&url, ca)).expect("client");
            let err = untrusted.fetch(Instant::now()).expect_err("untrusted");
            assert!(
                matches!(
                    err,
                    TokenError::Https(HttpsError::Exchange(ExchangeError::Request { .. }))
                ),
                "{err}"
            );
        }
        assert!(
            stranger.requests().is_empty(),
            "a request reached an untrusted server"
        );
        // Plain HTTP: the agent refuses before sending (the config refuses
        // such a URL already).
        let http = HttpServer::start();
        let agent = https_agent(Some(&ca.ca_path())).expect("agent");
        assert!(post_form(&agent, &http.url("/oauth/v2/token"), &[], &[], 10).is_err());
        assert!(http.requests().is_empty(), "a request went out over HTTP");
    }

    #[test]
    fn a_bad_ca_file_fails_when_the_client_is_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let mut c = credentials("https://idp.test/oauth/v2/token", None);
        c.ca_file = Some(empty.clone());
        let err = TokenClient::new(c).expect_err("no certificate").to_string();
        assert_eq!(
            err,
            format!(
                "token endpoint: the CA file {} holds no PEM certificate: give a PEM file of CA certificates (nats.auth.ca-file)",
                empty.display()
            )
        );
    }
}
