//! A test identity provider, as Zitadel looks to the fleet: an HTTPS server
//! (test CA) with a JWKS at `/oauth/v2/keys` and an OAuth2 token endpoint
//! at `/oauth/v2/token` (client credentials, HTTP Basic client
//! authentication), issuing RS256 access tokens (JWT) with the device ID in
//! a `device_id` claim. Its keys: the committed RSA fixture (kid
//! `rsa-test-1`) and an EC P-256 key made at start (kid `ec-test-1`), both
//! in the JWKS; tests sign their own tokens with [`rs256`] / [`es256`].
//!
//! Clients are registered with [`Idp::add_client`] (ID, secret, device,
//! token lifetime). [`Idp::set_outage`] makes the endpoint answer an error
//! status instead of tokens until cleared; every request is counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_common::b64::{encode_std, encode_url};
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;
use serde_json::{json, Value};

use crate::https::{Behavior, HttpsServer, ResponseSpec, TestCa};

/// `iss` of every token; the callout's `issuer`.
pub const IDP_ISSUER: &str = "https://idp.test.invalid";
/// One of `aud` of every token; the callout's `audience`.
pub const IDP_AUDIENCE: &str = "fleet-project";
/// The committed RSA test key (PKCS#8 PEM) and its public JWK.
pub const RSA_TEST_KEY_PEM: &[u8] = include_bytes!("../fixtures/rsa-test-key.pem");
pub const RSA_TEST_KEY_JWK: &str = include_str!("../fixtures/rsa-test-key.jwk.json");
pub const RSA_KID: &str = "rsa-test-1";
pub const EC_KID: &str = "ec-test-1";
pub const JWKS_PATH: &str = "/oauth/v2/keys";
pub const TOKEN_PATH: &str = "/oauth/v2/token";

/// Seconds since the epoch, now.
pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// A fresh EC P-256 key.
pub fn ec_key() -> EcdsaKeyPair {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("gen");
    EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("ec")
}

/// The public JWK of `key` under `kid`.
pub fn ec_jwk(key: &EcdsaKeyPair, kid: &str) -> Value {
    let p = key.public_key().as_ref();
    json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
           "x": encode_url(&p[1..33]), "y": encode_url(&p[33..65])})
}

/// The provider's signing keys.
#[derive(Debug)]
pub struct IdpKeys {
    pub rsa: RsaKeyPair,
    pub ec: EcdsaKeyPair,
}

impl IdpKeys {
    pub fn new() -> IdpKeys {
        let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_TEST_KEY_PEM).expect("pem");
        IdpKeys {
            rsa: RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).expect("rsa"),
            ec: ec_key(),
        }
    }

    /// Both public keys.
    pub fn jwks(&self) -> Value {
        json!({"keys": [serde_json::from_str::<Value>(RSA_TEST_KEY_JWK).expect("jwk"), ec_jwk(&self.ec, EC_KID)]})
    }
}

impl Default for IdpKeys {
    fn default() -> Self {
        Self::new()
    }
}

/// `base64url(header).base64url(claims)`.
pub fn signing_input(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}",
        encode_url(header.to_string().as_bytes()),
        encode_url(claims.to_string().as_bytes())
    )
}

/// A JWT signed RS256 by `key` under `kid`.
pub fn rs256(key: &RsaKeyPair, kid: &str, claims: &Value) -> String {
    let input = signing_input(&json!({"alg": "RS256", "typ": "JWT", "kid": kid}), claims);
    let mut sig = vec![0u8; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        input.as_bytes(),
        &mut sig,
    )
    .expect("sign");
    format!("{input}.{}", encode_url(&sig))
}

/// A JWT signed ES256 by `key` under `kid`.
pub fn es256(key: &EcdsaKeyPair, kid: &str, claims: &Value) -> String {
    let input = signing_input(&json!({"alg": "ES256", "typ": "JWT", "kid": kid}), claims);
    let sig = key
        .sign(&SystemRandom::new(), input.as_bytes())
        .expect("sign");
    format!("{input}.{}", encode_url(sig.as_ref()))
}

/// Valid claims for `device`, expiring in `ttl` seconds.
pub fn claims(device: &str, ttl: i64) -> Value {
    let t = now_secs();
    json!({"iss": IDP_ISSUER, "aud": [IDP_AUDIENCE, "other"], "sub": format!("user-{device}"),
           "exp": t + ttl, "iat": t - 5, "nbf": t - 5, "device_id": device})
}

/// `application/x-www-form-urlencoded` of one value, as clients encode
/// their ID and secret for Basic authentication (RFC 6749 section 2.3.1).
fn form_encode(v: &str) -> String {
    let mut out = String::new();
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

/// A registered client of the token endpoint.
#[derive(Debug, Clone)]
struct Client {
    secret: String,
    device: String,
    ttl: Duration,
}

#[derive(Debug, Default)]
struct EndpointState {
    clients: HashMap<String, Client>,
    /// Answer this status (with an OAuth2 error body) instead of tokens.
    outage: Option<u16>,
    /// Tokens issued, per client ID.
    issued: HashMap<String, Vec<String>>,
}

/// The provider: keys, HTTPS server, token endpoint. Dropping it stops it.
#[derive(Debug)]
pub struct Idp {
    pub ca: TestCa,
    pub server: HttpsServer,
    pub keys: Arc<IdpKeys>,
    state: Arc<Mutex<EndpointState>>,
    requests: Arc<AtomicUsize>,
}

impl Idp {
    /// The JWKS and the token endpoint up, no client registered.
    pub fn start() -> Idp {
        let ca = TestCa::new();
        let server = HttpsServer::start(&ca);
        let keys = Arc::new(IdpKeys::new());
        server.route(
            JWKS_PATH,
            Behavior::Bytes(keys.jwks().to_string().into_bytes()),
        );
        let state: Arc<Mutex<EndpointState>> = Arc::default();
        let requests = Arc::new(AtomicUsize::new(0));
        {
            let keys = Arc::clone(&keys);
            let state = Arc::clone(&state);
            let requests = Arc::clone(&requests);
            server.route(
                TOKEN_PATH,
                Behavior::Handler(Box::new(move |req| {
                    requests.fetch_add(1, Ordering::SeqCst);
                    token_answer(&keys, &mut state.lock().expect("lock"), req)
                })),
            );
        }
        Idp {
            ca,
            server,
            keys,
            state,
            requests,
        }
    }

    /// Registers client `id` with `secret`, issuing tokens for `device`
    /// that live `ttl`.
    pub fn add_client(&self, id: &str, secret: &str, device: &str, ttl: Duration) {
        self.state.lock().expect("lock").clients.insert(
            id.to_owned(),
            Client {
                secret: secret.to_owned(),
                device: device.to_owned(),
                ttl,
            },
        );
    }

    /// From now on the token endpoint answers `status` (an OAuth2 error
    /// body with it), or tokens again with `None`.
    pub fn set_outage(&self, status: Option<u16>) {
        self.state.lock().expect("lock").outage = status;
    }

    /// Tokens issued so far to client `id`.
    pub fn issued(&self, id: &str) -> usize {
        self.issued_tokens(id).len()
    }

    /// The tokens issued so far to client `id`, in order (to check none
    /// reaches a log).
    pub fn issued_tokens(&self, id: &str) -> Vec<String> {
        self.state
            .lock()
            .expect("lock")
            .issued
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    /// Requests to the token endpoint so far, answered or not.
    pub fn token_requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn token_url(&self) -> String {
        self.server.url(TOKEN_PATH)
    }

    pub fn jwks_url(&self) -> String {
        self.server.url(JWKS_PATH)
    }

    /// Requests to the JWKS so far.
    pub fn jwks_fetches(&self) -> usize {
        self.server
            .requests()
            .iter()
            .filter(|r| r.path == JWKS_PATH)
            .count()
    }

    /// A client-credentials token request as a device makes it (HTTPS with
    /// the test CA, Basic authentication); the access token, or the
    /// status and body of a refusal.
    pub fn fetch_token(&self, id: &str, secret: &str) -> Result<String, (u16, String)> {
        let agent = fleet_common::https::agent_builder(self.ca.client_config())
            .timeout(Duration::from_secs(10))
            .build();
        let basic = encode_std(format!("{}:{}", form_encode(id), form_encode(secret)).as_bytes());
        let response = agent
            .post(&self.token_url())
            .set("Authorization", &format!("Basic {basic}"))
            .send_form(&[("grant_type", "client_credentials")]);
        match response {
            Ok(r) => {
                let v: Value = serde_json::from_str(&r.into_string().expect("token response"))
                    .expect("token response JSON");
                Ok(v["access_token"].as_str().expect("access_token").to_owned())
            }
            Err(ureq::Error::Status(status, r)) => {
                Err((status, r.into_string().unwrap_or_default()))
            }
            Err(e) => panic!("token request failed: {e}"),
        }
    }
}

/// 401 with an OAuth2 error body.
fn oauth_error(status: u16, error: &str, description: &str) -> ResponseSpec {
    ResponseSpec {
        status,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: json!({"error": error, "error_description": description})
            .to_string()
            .into_bytes(),
    }
}

fn token_answer(
    keys: &IdpKeys,
    state: &mut EndpointState,
    req: &crate::https::Request,
) -> ResponseSpec {
    if let Some(status) = state.outage {
        return oauth_error(
            status,
            "temporarily_unavailable",
            "the test provider is down",
        );
    }
    let form = String::from_utf8_lossy(&req.body).into_owned();
    if req.method != "POST"
        || !form
            .split('&')
            .any(|kv| kv == "grant_type=client_credentials")
    {
        return oauth_error(400, "unsupported_grant_type", "client_credentials only");
    }
    let authorization = req.header("authorization").unwrap_or_default();
    let client = state.clients.iter().find(|(id, c)| {
        let basic =
            encode_std(format!("{}:{}", form_encode(id), form_encode(&c.secret)).as_bytes());
        authorization == format!("Basic {basic}")
    });
    let Some((id, client)) = client else {
        return oauth_error(401, "invalid_client", "unknown client or bad secret");
    };
    let id = id.clone();
    let client = client.clone();
    let ttl = client.ttl.as_secs() as i64;
    let token = rs256(&keys.rsa, RSA_KID, &claims(&client.device, ttl));
    state.issued.entry(id).or_default().push(token.clone());
    ResponseSpec {
        status: 200,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: json!({"access_token": token, "token_type": "Bearer", "expires_in": ttl})
            .to_string()
            .into_bytes(),
    }
}
