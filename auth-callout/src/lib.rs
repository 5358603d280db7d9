//! `fleet-auth-callout`: the NATS auth callout of a Harmony fleet. nats-server
//! (2.10 and later) hands every device connection to it; it verifies the
//! identity provider's bearer JWT against the provider's JWKS and answers
//! with a user in account `DEVICES` carrying exactly the device's permissions
//! from `fleet_common`'s one template, or a refusal with its reason.
//!
//! Modules: `config` (the JSON config), `https` (the identity provider's
//! transport), `jwks` (its keys, cached), `jwt` (bearer verification),
//! `nkeys` (the issuer key's seed file, through the `nkeys` crate),
//! `natsjwt` (NATS JWT encoding and request verification), `callout`
//! (request → decision → response), `service` (NATS, threads, logging). The device side (the agent's
//! client-credentials token client) lives in `fleet-agent`'s `oauth`.

mod callout;
mod config;
mod enroll;
mod https;
mod jwks;
mod jwt;
mod natsjwt;
mod nkeys;
#[cfg(test)]
mod prop_tests;
mod registry;
mod service;
mod strict_json;

pub use callout::{Callout, Decision, EnrollGate, Outcome, Refusal};
pub use config::{Config, ConfigError, DEFAULT_CONFIG_PATH};
pub use enroll::{Enrollment, Handled};
pub use https::{agent as https_agent, HttpsError};
pub use jwks::{HttpsJwks, JwksCache};
pub use jwt::{BearerPolicy, TokenError};
pub use nkeys::{keygen, AccountSigner, NkeysError};
pub use registry::{NatsRegistry, Read, Registry, RegistryError};
pub use service::{run, ServiceError, QUEUE_GROUP};
