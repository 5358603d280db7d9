//! NATS JWTs (`{"typ":"JWT","alg":"ed25519-nkey"}`): encoding the claims the
//! callout signs with its issuer account key, and decoding and verifying the
//! authorization requests nats-server signs with its own nkey.
//!
//! Encoding: `jti` is the base32 (no padding) SHA-512/256 of the claims
//! serialized without `jti`, as NATS' own libraries do; then
//! `base64url(header).base64url(claims)` is signed and the signature
//! appended. Decoding checks, in order: size, shape, header, the issuer is a
//! server key, the signature by that key, the claim type and version, the
//! audience, that the issuer is the server ID named in the request, the
//! expiry, and the user nkey the response must be for.

use std::fmt;

use fleet_common::b64::{decode_url, encode_url};
use fleet_common::callout::{
    AuthRequestClaims, AuthResponseClaims, NatsJwtHeader, UserClaims, AUTH_REQUEST_AUDIENCE,
    CLAIM_TYPE_AUTH_REQUEST, NATS_JWT_ALGORITHM, NATS_JWT_TYPE, NATS_JWT_VERSION,
};
use fleet_common::limits::MAX_AUTH_REQUEST_BYTES;
use fleet_common::nkey::{NkeyError, NkeyKind, PublicNkey};
use ring::digest::{digest, SHA512_256};
use serde::Serialize;

use crate::nkeys::{verify, AccountSigner, SignError};

/// Claims the callout signs; the encoder fills in `jti`.
pub trait NatsClaims: Serialize {
    fn set_jti(&mut self, jti: String);
}

impl NatsClaims for UserClaims {
    fn set_jti(&mut self, jti: String) {
        self.jti = jti;
    }
}

impl NatsClaims for AuthResponseClaims {
    fn set_jti(&mut self, jti: String) {
        self.jti = jti;
    }
}

/// Serializing or signing claims failed (a bug: these types always
/// serialize, and the issuer key always signs).
#[derive(Debug)]
pub enum EncodeError {
    Json(serde_json::Error),
    Sign(SignError),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Json(e) => write!(f, "cannot serialize NATS JWT claims: {e}"),
            Self::Sign(e) => write!(f, "cannot sign NATS JWT claims: {e}"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// The signed JWT of `claims`.
pub fn encode<C: NatsClaims>(mut claims: C, signer: &AccountSigner) -> Result<String, EncodeError> {
    claims.set_jti(String::new());
    let bare = serde_json::to_vec(&claims).map_err(EncodeError::Json)?;
    claims.set_jti(jti(&bare));
    let payload = serde_json::to_vec(&claims).map_err(EncodeError::Json)?;
    let header = serde_json::to_vec(&NatsJwtHeader::nkey()).map_err(EncodeError::Json)?;
    let signing_input = format!("{}.{}", encode_url(&header), encode_url(&payload));
    let signature = signer
        .sign(signing_input.as_bytes())
        .map_err(EncodeError::Sign)?;
    Ok(format!("{signing_input}.{}", encode_url(&signature)))
}

/// The `jti` of claims serialized without it: base32 (RFC 4648, no
/// padding) of their SHA-512/256.
fn jti(bare: &[u8]) -> String {
    data_encoding::BASE32_NOPAD.encode(digest(&SHA512_256, bare).as_ref())
}

/// Why an authorization request was not answered. Nothing in it is trusted,
/// so the callout cannot even address a refusal: the server times out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    TooLarge {
        bytes: usize,
    },
    /// Not a JWT; when the server encrypts requests (`auth_callout.xkey`)
    /// this is what arrives.
    NotJwt,
    Malformed {
        what: &'static str,
    },
    Header {
        typ: String,
        alg: String,
    },
    Issuer(NkeyError),
    Signature,
    ClaimType(String),
    Version(u32),
    Audience(String),
    /// The signer is not the server the request names.
    ServerId {
        iss: String,
        id: String,
    },
    Expired {
        exp: i64,
        now: i64,
    },
    UserNkey(NkeyError),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { bytes } => write!(
                f,
                "authorization request of {bytes} bytes is larger than {MAX_AUTH_REQUEST_BYTES}"
            ),
            Self::NotJwt => f.write_str(
                "authorization request is not a JWT; if the server config sets auth_callout.xkey (encryption), remove it: encrypted requests are not supported",
            ),
            Self::Malformed { what } => write!(f, "malformed authorization request: {what}"),
            Self::Header { typ, alg } => write!(
                f,
                "authorization request header has typ {typ:?} alg {alg:?}, expected {NATS_JWT_TYPE:?} {NATS_JWT_ALGORITHM:?}"
            ),
            Self::Issuer(e) => write!(f, "authorization request issuer: {e}"),
            Self::Signature => f.write_str(
                "authorization request signature does not verify with its issuer's key",
            ),
            Self::ClaimType(t) => write!(
                f,
                "claims of type {t:?} where an {CLAIM_TYPE_AUTH_REQUEST:?} was expected"
            ),
            Self::Version(v) => write!(
                f,
                "authorization request of claims version {v}, expected {NATS_JWT_VERSION}"
            ),
            Self::Audience(a) => write!(
                f,
                "authorization request audience {a:?}, expected {AUTH_REQUEST_AUDIENCE:?}"
            ),
            Self::ServerId { iss, id } => write!(
                f,
                "authorization request signed by {iss} names server {id}"
            ),
            Self::Expired { exp, now } => write!(
                f,
                "authorization request expired at {exp} (now {now}): check this host's clock against the server's"
            ),
            Self::UserNkey(e) => write!(f, "authorization request user_nkey: {e}"),
        }
    }
}

impl std::error::Error for RequestError {}

/// Decodes and verifies an authorization request at unix time `now`,
/// tolerating `skew_secs` of clock difference on its expiry.
pub fn decode_request(
    bytes: &[u8],
    now: i64,
    skew_secs: i64,
) -> Result<AuthRequestClaims, RequestError> {
    if bytes.len() > MAX_AUTH_REQUEST_BYTES {
        return Err(RequestError::TooLarge { bytes: bytes.len() });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| RequestError::NotJwt)?;
    let mut parts = text.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::NotJwt);
    };
    let malformed = |what| RequestError::Malformed { what };
    let header: NatsJwtHeader = decode_url(h)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(malformed("header is not base64url JSON"))?;
    if !header.typ.eq_ignore_ascii_case(NATS_JWT_TYPE) || header.alg != NATS_JWT_ALGORITHM {
        return Err(RequestError::Header {
            typ: header.typ,
            alg: header.alg,
        });
    }
    let payload = decode_url(p).ok_or(malformed("claims are not base64url"))?;
    let claims: AuthRequestClaims =
        serde_json::from_slice(&payload).map_err(|_| malformed("claims are not request JSON"))?;
    let signature = decode_url(s).ok_or(malformed("signature is not base64url"))?;
    let server =
        PublicNkey::parse_kind(&claims.iss, NkeyKind::Server).map_err(RequestError::Issuer)?;
    let signing_input = &text[..h.len() + 1 + p.len()];
    if !verify(&server, signing_input.as_bytes(), &signature) {
        return Err(RequestError::Signature);
    }
    if claims.nats.claim_type != CLAIM_TYPE_AUTH_REQUEST {
        return Err(RequestError::ClaimType(claims.nats.claim_type));
    }
    if claims.nats.version != NATS_JWT_VERSION {
        return Err(RequestError::Version(claims.nats.version));
    }
    if claims.aud != AUTH_REQUEST_AUDIENCE {
        return Err(RequestError::Audience(claims.aud));
    }
    if claims.nats.server_id.id != claims.iss {
        return Err(RequestError::ServerId {
            iss: claims.iss,
            id: claims.nats.server_id.id,
        });
    }
    if let Some(exp) = claims.exp {
        if now > exp.saturating_add(skew_secs) {
            return Err(RequestError::Expired { exp, now });
        }
    }
    PublicNkey::parse_kind(&claims.nats.user_nkey, NkeyKind::User)
        .map_err(RequestError::UserNkey)?;
    Ok(claims)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fleet_common::validate::DeviceId;
    use serde_json::{json, Value};

    /// A request as nats-server 2.14 writes it, signed by `server`.
    pub(crate) fn signed_request(server: &nkeys::KeyPair, claims: &Value) -> String {
        let header = encode_url(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
        let payload = encode_url(claims.to_string().as_bytes());
        let input = format!("{header}.{payload}");
        let sig = server.sign(input.as_bytes()).expect("sign");
        format!("{input}.{}", encode_url(&sig))
    }

    pub(crate) fn request_claims(
        server: &nkeys::KeyPair,
        issuer: &str,
        user: &str,
        now: i64,
    ) -> Value {
        json!({
            "aud": "nats-authorization-request",
            "exp": now + 2,
            "iat": now,
            "iss": server.public_key(),
            "jti": "ABC",
            "sub": issuer,
            "nats": {
                "server_id": {"name": "n1", "host": "0.0.0.0", "id": server.public_key(), "version": "2.14.0"},
                "user_nkey": user,
                "client_info": {"host": "127.0.0.1", "id": 5, "kind": "Client", "type": "nats"},
                "connect_opts": {"auth_token": "tok", "lang": "rust", "version": "0.25.0", "protocol": 1},
                "type": "authorization_request",
                "version": 2
            }
        })
    }

    fn parts(token: &str) -> (Value, Value) {
        let mut it = token.split('.');
        let h = decode_url(it.next().expect("h")).expect("b64");
        let p = decode_url(it.next().expect("p")).expect("b64");
        (
            serde_json::from_slice(&h).expect("json"),
            serde_json::from_slice(&p).expect("json"),
        )
    }

    #[test]
    fn encoded_user_jwt_verifies_and_names_its_hash() {
        let seed = crate::nkeys::generate_account_seed().expect("seed");
        let signer = AccountSigner::from_seed(&seed).expect("signer");
        let user = nkeys::KeyPair::new_user().public_key();
        let d = DeviceId::parse("dev-7").expect("valid");
        let claims = UserClaims::for_device(
            &d,
            &user,
            &signer.public_key().encode(),
            10,
            20,
            fleet_common::subjects::DeviceProtocols::WithLegacy,
        );
        let token = encode(claims.clone(), &signer).expect("encodes");
        let (header, payload) = parts(&token);
        assert_eq!(header, json!({"typ": "JWT", "alg": "ed25519-nkey"}));
        assert_eq!(payload["sub"], user.as_str());
        assert_eq!(payload["aud"], "DEVICES");
        assert_eq!(payload["name"], "dev-7");
        // jti = base32(SHA-512/256(claims without jti)).
        let bare = serde_json::to_vec(&claims).expect("json");
        assert_eq!(payload["jti"], jti(&bare).as_str());
        assert_eq!(payload["jti"].as_str().map(str::len), Some(52));
        // RFC 4648 base32 of SHA-512/256 (FIPS 180-4 "abc" vector).
        assert_eq!(
            jti(b"abc"),
            data_encoding::BASE32_NOPAD.encode(&[
                0x53, 0x04, 0x8e, 0x26, 0x81, 0x94, 0x1e, 0xf9, 0x9b, 0x2e, 0x29, 0xb7, 0x6b, 0x4c,
                0x7d, 0xab, 0xe4, 0xc2, 0xd0, 0xc6, 0x34, 0xfc, 0x6d, 0x46, 0xe0, 0xe2, 0xf1, 0x31,
                0x07, 0xe7, 0xaf, 0x23
            ])
        );
        // The signature verifies with the nkeys crate.
        let (input, sig) = token.rsplit_once('.').expect("three parts");
        let kp = nkeys::KeyPair::from_public_key(&signer.public_key().encode()).expect("pk");
        kp.verify(input.as_bytes(), &decode_url(sig).expect("b64"))
            .expect("signature verifies");
    }

    #[test]
    fn a_server_signed_request_decodes() {
        let server = nkeys::KeyPair::new_server();
        let user = nkeys::KeyPair::new_user().public_key();
        let token = signed_request(&server, &request_claims(&server, "AISS", &user, 1000));
        let r = decode_request(token.as_bytes(), 1001, 5).expect("valid request");
        assert_eq!(r.nats.user_nkey, user);
        assert_eq!(r.sub, "AISS");
        assert_eq!(r.nats.connect_opts.auth_token.as_deref(), Some("tok"));
    }

    #[test]
    fn every_defect_of_a_request_is_refused() {
        let server = nkeys::KeyPair::new_server();
        let other = nkeys::KeyPair::new_server();
        let user = nkeys::KeyPair::new_user().public_key();
        let base = request_claims(&server, "AISS", &user, 1000);
        let refuse = |token: String, now: i64| {
            decode_request(token.as_bytes(), now, 5).expect_err("refused")
        };
        let with = |f: &dyn Fn(&mut Value)| {
            let mut c = base.clone();
            f(&mut c);
            signed_request(&server, &c)
        };

        assert_eq!(refuse("garbage".to_owned(), 1000), RequestError::NotJwt);
        assert_eq!(
            decode_request(&vec![b'a'; MAX_AUTH_REQUEST_BYTES + 1], 1000, 5).map(|_| ()),
            Err(RequestError::TooLarge {
                bytes: MAX_AUTH_REQUEST_BYTES + 1
            })
        );
        // Signed by another server than the one it names as issuer.
        let forged = signed_request(&other, &base);
        assert_eq!(refuse(forged, 1000), RequestError::Signature);
        // Issuer and server id disagree.
        let t = with(&|c| c["nats"]["server_id"]["id"] = json!(other.public_key()));
        assert!(matches!(refuse(t, 1000), RequestError::ServerId { .. }));
        // Issuer is not a server key.
        let t = with(&|c| c["iss"] = json!(user));
        assert!(matches!(refuse(t, 1000), RequestError::Issuer(_)));
        let t = with(&|c| c["nats"]["type"] = json!("user"));
        assert_eq!(refuse(t, 1000), RequestError::ClaimType("user".to_owned()));
        let t = with(&|c| c["nats"]["version"] = json!(1));
        assert_eq!(refuse(t, 1000), RequestError::Version(1));
        let t = with(&|c| c["aud"] = json!("elsewhere"));
        assert_eq!(
            refuse(t, 1000),
            RequestError::Audience("elsewhere".to_owned())
        );
        let t = with(&|_| {});
        assert_eq!(
            refuse(t, 1008),
            RequestError::Expired {
                exp: 1002,
                now: 1008
            }
        );
        let t = with(&|c| c["nats"]["user_nkey"] = json!(server.public_key()));
        assert!(matches!(refuse(t, 1000), RequestError::UserNkey(_)));
        // A header of another algorithm.
        let t = with(&|_| {});
        let (_, rest) = t.split_once('.').expect("dot");
        let none = format!("{}.{rest}", encode_url(br#"{"typ":"JWT","alg":"none"}"#));
        assert_eq!(
            refuse(none, 1000),
            RequestError::Header {
                typ: "JWT".to_owned(),
                alg: "none".to_owned()
            }
        );
    }
}
