//! `fleetctl artifact push` as an operator runs it, against Debian's
//! docker-registry over TLS with the test CA: what it stores, what it
//! prints, and every refusal with its exit code and message.

use std::path::Path;
use std::process::{Command, Output};

use fleet_common::contracts::{OciManifest, OCI_MANIFEST_MEDIA_TYPE};
use fleet_common::validate::Sha256Hex;
use fleet_harness::{FrontAuth, HttpsServer, Registry, RegistryFront, TestCa};

fn fleetctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(args)
        .output()
        .expect("fleetctl runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_binary(dir: &Path, bytes: &[u8]) -> String {
    let p = dir.join("fleet-agent");
    std::fs::write(&p, bytes).expect("write");
    p.to_string_lossy().into_owned()
}

#[test]
fn push_stores_the_release_and_prints_what_an_attempt_needs() {
    let ca = TestCa::new();
    let registry = Registry::start(&ca);
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = b"#!/bin/sh\necho fleet-agent 2.0\n".repeat(1000);
    let binary = write_binary(dir.path(), &bytes);
    let reference = registry.reference("fleet/agent", "2.0");
    let ca_path = ca.ca_path().to_string_lossy().into_owned();
    let out = fleetctl(&[
        "artifact",
        "push",
        &reference,
        &binary,
        "--ca-file",
        &ca_path,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let sha = Sha256Hex::of(&bytes);
    let manifest = OciManifest::for_agent(&sha, bytes.len() as u64).to_bytes();
    let digest = Sha256Hex::of(&manifest);
    let pinned = format!("oci://{}/fleet/agent@sha256:{digest}", registry.host());
    assert_eq!(
        text(&out.stdout),
        format!(
            "pushed {reference}\nmanifest-digest: sha256:{digest}\npinned: {pinned}\nsha256: {sha}\nsize: {}\nrelease entry: {{\"artifact-url\":\"{pinned}\",\"max-bytes\":{},\"sha256\":\"{sha}\"}}\n",
            bytes.len(),
            bytes.len()
        )
    );
    // Stored as computed, by tag and by digest; the blob is the binary.
    for r in ["2.0".to_owned(), format!("sha256:{digest}")] {
        let got = registry.get(
            &format!("/v2/fleet/agent/manifests/{r}"),
            Some(OCI_MANIFEST_MEDIA_TYPE),
        );
        assert_eq!((got.status, &got.body), (200, &manifest), "{r}");
    }
    let blob = registry.get(&format!("/v2/fleet/agent/blobs/sha256:{sha}"), None);
    assert_eq!((blob.status, blob.body), (200, bytes));
}

#[test]
fn refusals_exit_non_zero_and_say_why() {
    let ca = TestCa::new();
    let registry = Registry::start(&ca);
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = write_binary(dir.path(), b"agent");
    let ca_path = ca.ca_path().to_string_lossy().into_owned();
    let reference = registry.reference("fleet/agent", "2.0");

    // Usage errors: 2.
    let out = fleetctl(&["artifact", "push", "oci://reg.io/fleet/agent", &binary]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("the reference has neither a :tag nor an @sha256: digest"),
        "{}",
        text(&out.stderr)
    );

    // Failures: 1, nothing stored.
    let missing = dir.path().join("missing").to_string_lossy().into_owned();
    let out = fleetctl(&[
        "artifact",
        "push",
        &reference,
        &missing,
        "--ca-file",
        &ca_path,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("reading the binary {missing}: ")));

    let out = fleetctl(&["artifact", "push", &reference, &binary]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("the registry's certificate is not trusted: give its CA with --ca-file"),
        "{}",
        text(&out.stderr)
    );

    let front = RegistryFront::start(&ca, &registry, FrontAuth::Token);
    let out = fleetctl(&[
        "artifact",
        "push",
        &front.reference("fleet/agent", "2.0"),
        &binary,
        "--ca-file",
        &ca_path,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("the registry answered HTTP 401 (UNAUTHORIZED: authentication required); the registry requires credentials to push, and fleetctl pushes anonymously only"),
        "{}",
        text(&out.stderr)
    );

    // Not a registry at all.
    let server = HttpsServer::start(&ca);
    let out = fleetctl(&[
        "artifact",
        "push",
        &format!("oci://127.0.0.1:{}/fleet/agent:2.0", server.port()),
        &binary,
        "--ca-file",
        &ca_path,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("starting a blob upload")
            && text(&out.stderr).contains("HTTP 404"),
        "{}",
        text(&out.stderr)
    );

    let got = registry.get(
        "/v2/fleet/agent/manifests/2.0",
        Some(OCI_MANIFEST_MEDIA_TYPE),
    );
    assert_eq!(got.status, 404, "nothing was stored");
}
