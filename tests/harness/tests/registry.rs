//! The harness's registry: Debian's docker-registry over TLS with the test
//! CA stores what is pushed, and the front's token auth challenges, hands
//! out a token and proxies once it is presented.

use std::time::Duration;

use fleet_common::contracts::{OciManifest, OCI_EMPTY_BLOB, OCI_MANIFEST_MEDIA_TYPE};
use fleet_common::validate::Sha256Hex;
use fleet_harness::{FrontAuth, Registry, RegistryFront, TestCa, FRONT_SERVICE};

fn agent(ca: &TestCa) -> ureq::Agent {
    fleet_common::https::agent_builder(ca.client_config())
        .redirects(0)
        .timeout(Duration::from_secs(10))
        .build()
}

#[test]
fn the_registry_stores_an_agent_release_and_the_front_asks_for_a_token() {
    let ca = TestCa::new();
    let registry = Registry::start(&ca);
    let binary = b"#!/bin/sh\necho agent\n";
    registry.push_blob("fleet/agent", OCI_EMPTY_BLOB);
    let layer = registry.push_blob("fleet/agent", binary);
    assert_eq!(layer, format!("sha256:{}", Sha256Hex::of(binary)));
    let manifest = OciManifest::for_agent(&Sha256Hex::of(binary), binary.len() as u64).to_bytes();
    let digest = registry.push_manifest("fleet/agent", "1.0", &manifest);
    assert_eq!(digest, format!("sha256:{}", Sha256Hex::of(&manifest)));
    let got = registry.get(
        "/v2/fleet/agent/manifests/1.0",
        Some(OCI_MANIFEST_MEDIA_TYPE),
    );
    assert_eq!((got.status, got.body), (200, manifest.clone()));

    let front = RegistryFront::start(&ca, &registry, FrontAuth::Token);
    let url = front.server().url("/v2/fleet/agent/manifests/1.0");
    let challenge = match agent(&ca).get(&url).call() {
        Err(ureq::Error::Status(401, r)) => r.header("www-authenticate").map(str::to_owned),
        other => panic!("expected 401, got {other:?}"),
    };
    assert_eq!(
        challenge,
        Some(format!(
            "Bearer realm=\"{}\",service=\"{FRONT_SERVICE}\",scope=\"repository:fleet/agent:pull\"",
            front.server().url("/token")
        ))
    );
    let token = agent(&ca)
        .get(&front.server().url(&format!(
            "/token?service={FRONT_SERVICE}&scope=repository%3Afleet%2Fagent%3Apull"
        )))
        .call()
        .expect("token")
        .into_string()
        .expect("body");
    let token: serde_json::Value = serde_json::from_str(&token).expect("json");
    assert_eq!(token["token"], front.token());
    let r = agent(&ca)
        .get(&url)
        .set("Accept", OCI_MANIFEST_MEDIA_TYPE)
        .set("Authorization", &format!("Bearer {}", front.token()))
        .call()
        .expect("proxied");
    assert_eq!(r.header("content-type"), Some(OCI_MANIFEST_MEDIA_TYPE));
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut r.into_reader(), &mut body).expect("body");
    assert_eq!(body, manifest);
}
