//! NATS auth callout wire types (nats-server 2.10 and later, server-config
//! mode): the header of every NATS JWT, the authorization request the server
//! sends on [`AUTH_CALLOUT_SUBJECT`](crate::subjects::AUTH_CALLOUT_SUBJECT),
//! the response the callout returns, and the user claims it issues for a
//! device, built from [`device_permissions`](crate::subjects::device_permissions)
//! (the template the static server config uses too, with the leaf
//! node's mapped status keys).
//!
//! Request types accept unknown fields (newer servers add some); the types
//! the callout writes carry exactly what nats-server reads. Signing and
//! verification live in `fleet-auth-callout`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::contracts::MAX_ENROLL_REQUEST_BYTES;
use crate::subjects::{
    enroll_permissions, leaf_device_permissions, DeviceProtocols, ACCOUNT_DEVICES, ACCOUNT_ENROLL,
};
use crate::validate::DeviceId;

/// `typ` of every NATS JWT.
pub const NATS_JWT_TYPE: &str = "JWT";
/// `alg` of every NATS JWT: Ed25519 by an nkey.
pub const NATS_JWT_ALGORITHM: &str = "ed25519-nkey";
/// `nats.version` of the claims this module writes and reads.
pub const NATS_JWT_VERSION: u32 = 2;
/// `nats.type` of an authorization request.
pub const CLAIM_TYPE_AUTH_REQUEST: &str = "authorization_request";
/// `nats.type` of an authorization response.
pub const CLAIM_TYPE_AUTH_RESPONSE: &str = "authorization_response";
/// `nats.type` of a user JWT.
pub const CLAIM_TYPE_USER: &str = "user";
/// `aud` of every authorization request.
pub const AUTH_REQUEST_AUDIENCE: &str = "nats-authorization-request";
/// "No limit" in a user JWT's `subs`, `data` and `payload`.
pub const NO_LIMIT: i64 = -1;

/// The identity-provider claim holding the device ID when the callout's
/// config names none.
pub const DEFAULT_DEVICE_CLAIM: &str = "device_id";

/// The JOSE header of a NATS JWT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatsJwtHeader {
    pub typ: String,
    pub alg: String,
}

impl NatsJwtHeader {
    /// The header the callout writes.
    pub fn nkey() -> Self {
        Self {
            typ: NATS_JWT_TYPE.to_owned(),
            alg: NATS_JWT_ALGORITHM.to_owned(),
        }
    }
}

/// The claims of an authorization request, signed by the server's nkey
/// (`iss`, an `N...` key equal to `nats.server_id.id`).
#[derive(Debug, Clone, Deserialize)]
pub struct AuthRequestClaims {
    #[serde(default)]
    pub aud: String,
    #[serde(default)]
    pub exp: Option<i64>,
    #[serde(default)]
    pub iat: Option<i64>,
    pub iss: String,
    /// The issuer account configured in `auth_callout.issuer`.
    pub sub: String,
    pub nats: AuthRequest,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AuthRequest {
    pub server_id: ServerId,
    /// The public user nkey the server generated for this connection; the
    /// response and the user JWT must name it as `sub`.
    pub user_nkey: String,
    #[serde(default)]
    pub client_info: ClientInfo,
    #[serde(default)]
    pub connect_opts: ConnectOpts,
    #[serde(rename = "type")]
    pub claim_type: String,
    #[serde(default)]
    pub version: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServerId {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub host: String,
    /// The server's public nkey; the response's `aud`.
    pub id: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub cluster: String,
    /// Set when the server encrypts requests (not supported by the callout).
    #[serde(default)]
    pub xkey: String,
}

/// What the server knows of the connecting client (for logs only: none of
/// it is authenticated).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClientInfo {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub id: u64,
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, rename = "type")]
    pub client_type: String,
    /// The nonce the server sent this client, filled when the CONNECT
    /// carries a signature (`sig`): what the client's nkey signed.
    #[serde(default)]
    pub nonce: String,
}

/// The client's CONNECT options. `Debug` hides every credential.
#[derive(Clone, Default, Deserialize)]
pub struct ConnectOpts {
    /// A user JWT; nats-server discards it outside operator mode, so it is
    /// empty in the callout layout.
    #[serde(default)]
    pub jwt: Option<String>,
    #[serde(default)]
    pub nkey: Option<String>,
    #[serde(default)]
    pub sig: Option<String>,
    /// A token given with `nats::Options::with_token`.
    #[serde(default)]
    pub auth_token: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub pass: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub lang: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

impl fmt::Debug for ConnectOpts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |v: &Option<String>| if v.is_some() { "<set>" } else { "<none>" };
        f.debug_struct("ConnectOpts")
            .field("jwt", &set(&self.jwt))
            .field("nkey", &self.nkey)
            .field("sig", &set(&self.sig))
            .field("auth_token", &set(&self.auth_token))
            .field("user", &self.user)
            .field("pass", &set(&self.pass))
            .field("name", &self.name)
            .field("lang", &self.lang)
            .field("version", &self.version)
            .finish()
    }
}

/// The claims of an authorization response. Signed by the issuer account
/// nkey; `jti` is filled in by the encoder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthResponseClaims {
    /// The server's ID (`nats.server_id.id` of the request).
    pub aud: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub jti: String,
    pub iat: i64,
    pub iss: String,
    /// The request's `nats.user_nkey`.
    pub sub: String,
    pub nats: AuthResponse,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthResponse {
    /// The user JWT, when authorized.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt: Option<String>,
    /// Why not, when refused (nats-server logs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(rename = "type")]
    pub claim_type: String,
    pub version: u32,
}

/// The claims of a user JWT issued by the callout: in server-config mode its
/// `aud` names the account the user is placed in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserClaims {
    /// The target account's name.
    pub aud: String,
    /// When the server disconnects the user (the bearer token's expiry).
    pub exp: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub jti: String,
    pub iat: i64,
    pub iss: String,
    /// Shown by the server as the connection's user name.
    pub name: String,
    /// The request's `nats.user_nkey`.
    pub sub: String,
    pub nats: UserNats,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserNats {
    #[serde(rename = "pub")]
    pub publish: Permission,
    #[serde(rename = "sub")]
    pub subscribe: Permission,
    pub subs: i64,
    pub data: i64,
    pub payload: i64,
    #[serde(rename = "type")]
    pub claim_type: String,
    pub version: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Permission {
    pub allow: Vec<String>,
}

impl AuthResponseClaims {
    /// An authorization for `user_jwt`.
    pub fn authorized(
        request: &AuthRequestClaims,
        issuer: &str,
        iat: i64,
        user_jwt: String,
    ) -> Self {
        Self::new(request, issuer, iat, Some(user_jwt), None)
    }

    /// A refusal with `reason`.
    pub fn refused(request: &AuthRequestClaims, issuer: &str, iat: i64, reason: String) -> Self {
        Self::new(request, issuer, iat, None, Some(reason))
    }

    fn new(
        request: &AuthRequestClaims,
        issuer: &str,
        iat: i64,
        jwt: Option<String>,
        error: Option<String>,
    ) -> Self {
        Self {
            aud: request.nats.server_id.id.clone(),
            jti: String::new(),
            iat,
            iss: issuer.to_owned(),
            sub: request.nats.user_nkey.clone(),
            nats: AuthResponse {
                jwt,
                error,
                claim_type: CLAIM_TYPE_AUTH_RESPONSE.to_owned(),
                version: NATS_JWT_VERSION,
            },
        }
    }
}

impl UserClaims {
    /// The user of `device` in `DEVICES`, with exactly
    /// [`leaf_device_permissions`] ([`device_permissions`](crate::subjects::device_permissions) and the device's
    /// own status keys as a leaf node maps them: the same user serves on
    /// the hub and on a leaf, docs/design/leafnodes.md) and nothing else:
    /// no response permission, no deny list, the account's limits.
    pub fn for_device(
        device: &DeviceId,
        user_nkey: &str,
        issuer: &str,
        iat: i64,
        exp: i64,
        protocols: DeviceProtocols,
    ) -> Self {
        let p = leaf_device_permissions(device, protocols);
        Self {
            aud: ACCOUNT_DEVICES.to_owned(),
            exp,
            jti: String::new(),
            iat,
            iss: issuer.to_owned(),
            name: device.as_str().to_owned(),
            sub: user_nkey.to_owned(),
            nats: UserNats {
                publish: Permission {
                    allow: p.publish_allow,
                },
                subscribe: Permission {
                    allow: p.subscribe_allow,
                },
                subs: NO_LIMIT,
                data: NO_LIMIT,
                payload: NO_LIMIT,
                claim_type: CLAIM_TYPE_USER.to_owned(),
                version: NATS_JWT_VERSION,
            },
        }
    }

    /// A device not yet approved, in `ENROLL` with exactly
    /// [`enroll_permissions`] of the key it proved: its own request subject
    /// and inbox, one subscription, payloads up to the request limit.
    pub fn for_enrollment(key: &str, user_nkey: &str, issuer: &str, iat: i64, exp: i64) -> Self {
        let p = enroll_permissions(key);
        Self {
            aud: ACCOUNT_ENROLL.to_owned(),
            exp,
            jti: String::new(),
            iat,
            iss: issuer.to_owned(),
            name: format!("enroll {key}"),
            sub: user_nkey.to_owned(),
            nats: UserNats {
                publish: Permission {
                    allow: p.publish_allow,
                },
                subscribe: Permission {
                    allow: p.subscribe_allow,
                },
                subs: ENROLL_MAX_SUBSCRIPTIONS,
                data: NO_LIMIT,
                payload: MAX_ENROLL_REQUEST_BYTES as i64,
                claim_type: CLAIM_TYPE_USER.to_owned(),
                version: NATS_JWT_VERSION,
            },
        }
    }
}

/// Subscriptions a device in `ENROLL` may hold: its request inbox (the
/// client's one wildcard subscription) and one spare for a reconnect.
pub const ENROLL_MAX_SUBSCRIPTIONS: i64 = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> AuthRequestClaims {
        serde_json::from_value(json!({
            "aud": "nats-authorization-request",
            "exp": 1_700_000_002,
            "iat": 1_700_000_000,
            "iss": "NSERVER",
            "jti": "X",
            "sub": "AISSUER",
            "nats": {
                "server_id": {"name": "n1", "host": "127.0.0.1", "id": "NSERVER", "version": "2.14.0"},
                "user_nkey": "UUSER",
                "client_info": {"host": "127.0.0.1", "id": 7, "kind": "Client", "type": "nats", "future": 1},
                "connect_opts": {"auth_token": "secret-token", "lang": "rust", "protocol": 1},
                "type": "authorization_request",
                "version": 2,
                "a_field_from_a_newer_server": true
            }
        }))
        .expect("request parses")
    }

    #[test]
    fn request_parses_and_debug_hides_credentials() {
        let r = request();
        assert_eq!(r.nats.server_id.id, "NSERVER");
        assert_eq!(r.nats.user_nkey, "UUSER");
        assert_eq!(r.nats.claim_type, CLAIM_TYPE_AUTH_REQUEST);
        assert_eq!(
            r.nats.connect_opts.auth_token.as_deref(),
            Some("secret-token")
        );
        let shown = format!("{r:?}");
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(shown.contains("auth_token: \"<set>\""), "{shown}");
    }

    #[test]
    fn user_claims_carry_exactly_the_device_template() {
        let d = DeviceId::parse("dev1").expect("valid");
        let u = UserClaims::for_device(
            &d,
            "UUSER",
            "AISSUER",
            100,
            200,
            DeviceProtocols::WithLegacy,
        );
        let p = leaf_device_permissions(&d, DeviceProtocols::WithLegacy);
        assert_eq!(
            serde_json::to_value(&u).expect("serializes"),
            json!({
                "aud": "DEVICES",
                "exp": 200,
                "iat": 100,
                "iss": "AISSUER",
                "name": "dev1",
                "sub": "UUSER",
                "nats": {
                    "pub": {"allow": p.publish_allow},
                    "sub": {"allow": p.subscribe_allow},
                    "subs": -1, "data": -1, "payload": -1,
                    "type": "user", "version": 2
                }
            })
        );
    }

    #[test]
    fn responses_answer_the_server_for_the_user() {
        let r = request();
        let ok = AuthResponseClaims::authorized(&r, "AISSUER", 5, "user.jwt.x".to_owned());
        assert_eq!(
            serde_json::to_value(&ok).expect("serializes"),
            json!({"aud": "NSERVER", "iat": 5, "iss": "AISSUER", "sub": "UUSER",
                   "nats": {"jwt": "user.jwt.x", "type": "authorization_response", "version": 2}})
        );
        let no = AuthResponseClaims::refused(&r, "AISSUER", 5, "expired".to_owned());
        assert_eq!(
            serde_json::to_value(&no).expect("serializes")["nats"],
            json!({"error": "expired", "type": "authorization_response", "version": 2})
        );
    }
}
