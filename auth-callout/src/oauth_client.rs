//! OAuth2 client credentials (RFC 6749 section 4.4) for a device: get the
//! bearer token the callout verifies from the identity provider's token
//! endpoint, keep it, and get a new one before it expires.
//!
//! PARKED HERE for the agent. It is self-contained (this file, `b64` and
//! `https`) so it moves into `agent/` as is; the callout itself does not use
//! it. How the agent uses it:
//!
//! ```text
//! let source = TokenSource::new(TokenClient::new(https_agent, credentials));
//! let token = source.token(Instant::now())?;
//! let nc = nats::Options::with_token(token.expose()) ... .connect(url)?;
//! ```
//!
//! The token goes in the CONNECT's `auth_token` (nats-server discards a
//! CONNECT `jwt` outside operator mode, so `with_jwt` cannot carry it). The
//! callout's user expires with the token: the server then closes the
//! connection, and the nats crate's own reconnect presents the old token,
//! which the callout refuses ("bearer token expired"). So the agent must
//! build a new connection with a fresh token: on that disconnect or refusal
//! (call [`TokenSource::invalidate`] first if the server refused the token),
//! or ahead of it, at the token's refresh time. Never log the token:
//! [`Secret`]'s `Debug` hides it.
//!
//! Request: `POST token_url`, `Authorization: Basic` with the form-encoded
//! client ID and secret (RFC 6749 section 2.3.1), body
//! `grant_type=client_credentials[&scope=...]`. For Zitadel, the scope
//! `openid urn:zitadel:iam:org:project:id:<project id>:aud` puts the project
//! ID (the callout's audience) in `aud`.

use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fleet_common::limits::{MAX_BEARER_JWT_BYTES, MAX_OAUTH_TOKEN_RESPONSE_BYTES};
use serde_json::Value;

use fleet_common::b64::encode_std;
use crate::https::{self, HttpsError};

/// Lifetime assumed when the endpoint gives no `expires_in`.
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(300);
/// A token is renewed once less than a quarter of its lifetime is left, and
/// at least this long before it expires.
const MIN_REFRESH_MARGIN: Duration = Duration::from_secs(30);
/// Longest provider error text kept.
const MAX_ERROR_CHARS: usize = 200;

/// A secret string whose `Debug` does not show it and that has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Self {
        Self(s)
    }

    /// The secret itself, to send it; never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What identifies the device to the token endpoint.
#[derive(Debug, Clone)]
pub struct ClientCredentials {
    /// `https://...` token endpoint (Zitadel: `<issuer>/oauth/v2/token`).
    pub token_url: String,
    pub client_id: String,
    pub client_secret: Secret,
    /// Space-separated scopes, if any.
    pub scope: Option<String>,
}

/// A token and when to renew it.
#[derive(Debug, Clone)]
pub struct AccessToken {
    pub token: Secret,
    pub expires_at: Instant,
    pub refresh_at: Instant,
}

/// Why no token was obtained.
#[derive(Debug)]
pub enum TokenError {
    Https(HttpsError),
    /// The endpoint answered an error (OAuth2 `error` and description).
    Refused {
        status: u16,
        error: String,
        description: String,
    },
    Malformed {
        what: &'static str,
    },
    TokenType(String),
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Https(e) => write!(f, "token endpoint: {e}"),
            Self::Refused {
                status,
                error,
                description,
            } => write!(
                f,
                "token endpoint refused (HTTP {status}, {error:?}: {description:?}); check the client ID, secret and scope"
            ),
            Self::Malformed { what } => write!(f, "token endpoint answer: {what}"),
            Self::TokenType(t) => write!(
                f,
                "token endpoint issued a {t:?} token, expected a Bearer token"
            ),
        }
    }
}

impl std::error::Error for TokenError {}

fn bounded_text(v: Option<&Value>) -> String {
    v.and_then(Value::as_str)
        .unwrap_or_default()
        .chars()
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
    agent: ureq::Agent,
    credentials: ClientCredentials,
}

impl TokenClient {
    /// `agent` from [`crate::https::agent`] (HTTPS only, no redirects, bounded).
    pub fn new(agent: ureq::Agent, credentials: ClientCredentials) -> Self {
        Self { agent, credentials }
    }

    /// One token request, at monotonic time `now`.
    pub fn fetch(&self, now: Instant) -> Result<AccessToken, TokenError> {
        let c = &self.credentials;
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
        let (status, body) = https::post_form(
            &self.agent,
            &c.token_url,
            &[("Authorization", authorization.as_str())],
            &form,
            MAX_OAUTH_TOKEN_RESPONSE_BYTES,
        )
        .map_err(TokenError::Https)?;
        let json: Option<Value> = serde_json::from_slice(&body).ok();
        if status != 200 {
            return Err(TokenError::Refused {
                status,
                error: bounded_text(json.as_ref().and_then(|j| j.get("error"))),
                description: bounded_text(json.as_ref().and_then(|j| j.get("error_description"))),
            });
        }
        let json = json.ok_or(TokenError::Malformed { what: "not JSON" })?;
        let token = json
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or(TokenError::Malformed {
                what: "no access_token",
            })?;
        if token.len() > MAX_BEARER_JWT_BYTES {
            return Err(TokenError::Malformed {
                what: "access_token larger than the callout accepts",
            });
        }
        let token_type = json.get("token_type").and_then(Value::as_str).unwrap_or("");
        if !token_type.eq_ignore_ascii_case("bearer") {
            return Err(TokenError::TokenType(token_type.chars().take(32).collect()));
        }
        let lifetime = match json.get("expires_in") {
            None => DEFAULT_TOKEN_LIFETIME,
            Some(v) => v
                .as_u64()
                .filter(|s| *s > 0)
                .map(Duration::from_secs)
                .ok_or(TokenError::Malformed {
                    what: "expires_in is not a positive number of seconds",
                })?,
        };
        let margin = (lifetime / 4).max(MIN_REFRESH_MARGIN).min(lifetime);
        Ok(AccessToken {
            token: Secret::new(token.to_owned()),
            expires_at: now + lifetime,
            refresh_at: now + (lifetime - margin),
        })
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

    /// The token to present at `now`: the kept one until its refresh time,
    /// else a new one. Concurrent callers wait for one fetch.
    pub fn token(&self, now: Instant) -> Result<Secret, TokenError> {
        let mut current = self.lock();
        if let Some(t) = current.as_ref().filter(|t| now < t.refresh_at) {
            return Ok(t.token.clone());
        }
        match self.client.fetch(now) {
            Ok(t) => {
                let token = t.token.clone();
                *current = Some(t);
                Ok(token)
            }
            // A token past its refresh time but not expired still serves
            // while the endpoint is unreachable.
            Err(e) => match current.as_ref().filter(|t| now < t.expires_at) {
                Some(t) => {
                    log::warn!(
                        "token refresh failed, using the current token until it expires: {e}"
                    );
                    Ok(t.token.clone())
                }
                None => Err(e),
            },
        }
    }

    /// Forgets the kept token (the server refused it): the next call fetches.
    pub fn invalidate(&self) {
        *self.lock() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_show_in_debug() {
        let c = ClientCredentials {
            token_url: "https://idp.test/oauth/v2/token".into(),
            client_id: "dev-a".into(),
            client_secret: Secret::new("s3cr3t".into()),
            scope: None,
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn form_encoding_follows_rfc6749() {
        assert_eq!(form_encode("dev-a_1.x*"), "dev-a_1.x*");
        assert_eq!(form_encode("a b:c/d+é"), "a+b%3Ac%2Fd%2B%C3%A9");
    }
}
