//! OCI releases end to end: `fleetctl artifact push` to a real registry
//! (Debian's docker-registry over TLS with the test CA), then an upgrade
//! from `oci://` through the real `fleet-updater`; anonymous token auth
//! through a harness front; blob redirects to a second HTTPS host. Every
//! refusal leaves the previous agent running and nothing installed.
//!
//! `fleetctl` is run from `target/debug` (`make build` builds it).

mod support;

use std::process::Command;
use std::time::Instant;

use fleet_common::contracts::{
    UpgradePhase, UpgradeReason, AGENT_ARTIFACT_TYPE, AGENT_BINARY_MEDIA_TYPE, OCI_EMPTY_BLOB,
    OCI_EMPTY_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE,
};
use fleet_common::limits::{MAX_ARTIFACT_BYTES, MAX_BLOB_REDIRECTS, MAX_MANIFEST_BYTES};
use fleet_common::validate::{MaxBytes, Sha256Hex};
use fleet_harness::{
    bin_path, Behavior, FrontAuth, HttpServer, HttpsServer, Registry, RegistryFront, Request,
    ResponseSpec, TestCa, FRONT_SERVICE,
};
use support::{attempt, bench, Bench, StandIn};

const REPO: &str = "fleet/agent";

/// What `fleetctl artifact push` printed.
#[derive(Debug)]
struct Pushed {
    manifest_digest: String,
    pinned: String,
    sha256: String,
    size: u64,
}

/// Pushes `stand_in` to `reference` with the real fleetctl.
fn fleetctl_push(ca: &TestCa, reference: &str, stand_in: &StandIn) -> Pushed {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = dir.path().join("fleet-agent");
    std::fs::write(&binary, stand_in.script()).expect("write binary");
    let out = Command::new(bin_path("fleetctl"))
        .args(["artifact", "push", reference])
        .arg(&binary)
        .arg("--ca-file")
        .arg(ca.ca_path())
        .output()
        .expect("fleetctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "fleetctl artifact push failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name:?} in {stdout}"))
            .to_owned()
    };
    Pushed {
        manifest_digest: field("manifest-digest"),
        pinned: field("pinned"),
        sha256: field("sha256"),
        size: field("size").parse().expect("size"),
    }
}

/// A manifest in the shape of a release, edited.
fn manifest(
    registry: &Registry,
    stand_in: &StandIn,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Vec<u8> {
    let config = registry.push_blob(REPO, OCI_EMPTY_BLOB);
    let layer = registry.push_blob(REPO, &stand_in.script());
    let mut m = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": AGENT_ARTIFACT_TYPE,
        "config": {"mediaType": OCI_EMPTY_MEDIA_TYPE, "digest": config, "size": 2},
        "layers": [{"mediaType": AGENT_BINARY_MEDIA_TYPE, "digest": layer, "size": stand_in.script().len()}],
    });
    edit(&mut m);
    serde_json::to_vec(&m).expect("json")
}

fn blob_path(stand_in: &StandIn) -> String {
    format!("/v2/{REPO}/blobs/sha256:{}", stand_in.sha256())
}

fn redirect(location: String) -> impl Fn(&Request) -> ResponseSpec + Send + Sync + 'static {
    move |_| ResponseSpec {
        status: 307,
        headers: vec![("Location".into(), location.clone())],
        body: Vec::new(),
    }
}

/// The requests `server` read for paths starting with `prefix`.
fn requests_to(requests: &[Request], prefix: &str) -> Vec<Request> {
    requests
        .iter()
        .filter(|r| r.path.starts_with(prefix))
        .cloned()
        .collect()
}

/// Upgrades `b` to `stand_in` from `url`, expecting a commit.
fn upgrade_commits(b: &Bench, url: &str, stand_in: &StandIn) {
    let a = attempt(url, stand_in);
    let started = Instant::now();
    b.device.upgrade_ok(&a);
    let done = b.device.wait_terminal();
    assert_eq!(
        (done.phase, done.reason),
        (UpgradePhase::Complete, Some(UpgradeReason::Ready)),
        "{done:#?}\nupdater log:\n{}",
        b.updater.log()
    );
    eprintln!("{url}: committed in {:?}", started.elapsed());
    b.device.assert_only_agent(&stand_in.version);
    assert_eq!(
        std::fs::read(b.device.binary(&stand_in.version)).expect("installed"),
        stand_in.script()
    );
}

#[test]
fn fleetctl_push_then_upgrade_by_tag_and_by_digest() {
    let b = bench();
    let registry = Registry::start(&b.ca);
    let v2 = StandIn::good("2.0");
    let pushed = fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    assert_eq!(pushed.sha256, v2.sha256().to_string());
    assert_eq!(pushed.size, v2.script().len() as u64);
    // The manifest stored is the one fleetctl computed, byte for byte.
    let stored = registry.get(
        &format!("/v2/{REPO}/manifests/2.0"),
        Some(OCI_MANIFEST_MEDIA_TYPE),
    );
    assert_eq!(stored.status, 200);
    assert_eq!(
        format!("sha256:{}", Sha256Hex::of(&stored.body)),
        pushed.manifest_digest
    );
    assert_eq!(
        pushed.pinned,
        format!(
            "oci://{}/{REPO}@{}",
            registry.host(),
            pushed.manifest_digest
        )
    );
    upgrade_commits(&b, &registry.reference(REPO, "2.0"), &v2);

    // By digest: the pinned reference fleetctl printed.
    let v3 = StandIn::good("3.0");
    let pushed = fleetctl_push(&b.ca, &registry.reference(REPO, "3.0"), &v3);
    upgrade_commits(&b, &pushed.pinned, &v3);

    // Pushing the same binary again is idempotent: same digest.
    let again = fleetctl_push(&b.ca, &registry.reference(REPO, "3.0-again"), &v3);
    assert_eq!(again.manifest_digest, pushed.manifest_digest);
}

#[test]
fn the_pre_1_1_form_is_accepted() {
    // No artifactType; the config's media type names the artifact, as
    // tools before OCI 1.1 push it (docker-registry 2.8 stores it as is).
    let b = bench();
    let registry = Registry::start(&b.ca);
    let v2 = StandIn::good("2.0");
    let m = manifest(&registry, &v2, |m| {
        m.as_object_mut().expect("object").remove("artifactType");
        m["config"]["mediaType"] = AGENT_ARTIFACT_TYPE.into();
    });
    registry.push_manifest(REPO, "2.0", &m);
    upgrade_commits(&b, &registry.reference(REPO, "2.0"), &v2);
}

#[test]
fn anonymous_token_auth() {
    let b = bench();
    let registry = Registry::start(&b.ca);
    let front = RegistryFront::start(&b.ca, &registry, FrontAuth::Token);
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    upgrade_commits(&b, &front.reference(REPO, "2.0"), &v2);

    let requests = front.requests();
    let summary: Vec<(String, Option<String>)> = requests
        .iter()
        .map(|r| {
            (
                r.path.split('?').next().unwrap_or_default().to_owned(),
                r.header("authorization").map(str::to_owned),
            )
        })
        .collect();
    let bearer = Some(format!("Bearer {}", front.token()));
    assert_eq!(
        summary,
        vec![
            (format!("/v2/{REPO}/manifests/2.0"), None),
            ("/token".to_owned(), None),
            (format!("/v2/{REPO}/manifests/2.0"), bearer.clone()),
            (blob_path(&v2), bearer),
        ]
    );
    assert_eq!(
        requests[1].path,
        format!("/token?service={FRONT_SERVICE}&scope=repository%3Afleet%2Fagent%3Apull")
    );
    assert_eq!(requests[0].header("accept"), Some(OCI_MANIFEST_MEDIA_TYPE));
}

#[test]
fn blob_redirects_to_a_second_host_without_the_token() {
    let b = bench();
    let registry = Registry::start(&b.ca);
    let front = RegistryFront::start(&b.ca, &registry, FrontAuth::Token);
    let cdn = HttpsServer::start(&b.ca);
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    // Exactly the most allowed: the registry's redirect, then 4 on the CDN.
    front.route(&blob_path(&v2), redirect(cdn.url("/hop/1?sig=abc")));
    for hop in 1..MAX_BLOB_REDIRECTS {
        let next = if hop + 1 < MAX_BLOB_REDIRECTS {
            format!("/hop/{}", hop + 1)
        } else {
            "/blob".to_owned()
        };
        cdn.route(
            &format!("/hop/{hop}"),
            Behavior::Redirect {
                status: if hop % 2 == 0 { 302 } else { 308 },
                location: next,
            },
        );
    }
    cdn.route("/blob", Behavior::Bytes(v2.script()));
    upgrade_commits(&b, &front.reference(REPO, "2.0"), &v2);

    // The registry got the token; the CDN never did.
    let to_front = requests_to(&front.requests(), &blob_path(&v2));
    assert_eq!(to_front.len(), 1);
    assert_eq!(
        to_front[0].header("authorization"),
        Some(format!("Bearer {}", front.token()).as_str())
    );
    let to_cdn = cdn.requests();
    let paths: Vec<&str> = to_cdn.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/hop/1?sig=abc", "/hop/2", "/hop/3", "/hop/4", "/blob"]
    );
    for r in &to_cdn {
        assert_eq!(r.header("authorization"), None, "{r:?}");
    }
}

// ---- refusals: each fails with a clear error and installs nothing ----

/// A bench with a registry and an anonymous front (to see what was asked).
fn refusal_bench() -> (Bench, Registry, RegistryFront) {
    let b = bench();
    let registry = Registry::start(&b.ca);
    let front = RegistryFront::start(&b.ca, &registry, FrontAuth::Anonymous);
    (b, registry, front)
}

/// No blob was requested from the front.
fn assert_no_blob_request(front: &RegistryFront) {
    let blobs = requests_to(&front.requests(), &format!("/v2/{REPO}/blobs/"));
    assert!(blobs.is_empty(), "a blob was requested: {blobs:?}");
}

#[test]
fn wrong_artifact_type() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    let m = manifest(&registry, &v2, |m| {
        m["artifactType"] = "application/vnd.example.sbom.v1".into()
    });
    registry.push_manifest(REPO, "2.0", &m);
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Artifact,
        "the manifest's artifactType is \"application/vnd.example.sbom.v1\", not application/vnd.harmony.fleet-agent.v1: it is not a fleet agent release",
    );
    assert_no_blob_request(&front);
}

#[test]
fn two_layers() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    let m = manifest(&registry, &v2, |m| {
        let layer = m["layers"][0].clone();
        m["layers"] = serde_json::json!([layer.clone(), layer]);
    });
    registry.push_manifest(REPO, "2.0", &m);
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Artifact,
        "the manifest has 2 layers; a fleet agent release has exactly one",
    );
    assert_no_blob_request(&front);
}

#[test]
fn layer_digest_is_not_the_attempts_sha256() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    let mut a = attempt(&front.reference(REPO, "2.0"), &v2);
    a.sha256 = Sha256Hex::of(b"another build");
    b.assert_failed(
        &a,
        UpgradeReason::Checksum,
        &format!(
            "the release's binary has sha256 {}, not the attempt's {}: the reference names another build; nothing was downloaded",
            v2.sha256(),
            a.sha256
        ),
    );
    assert_no_blob_request(&front);
}

#[test]
fn oversize_layer() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    let mut a = attempt(&front.reference(REPO, "2.0"), &v2);
    a.max_bytes = MaxBytes::new(100).expect("max");
    b.assert_failed(
        &a,
        UpgradeReason::TooLarge,
        &format!(
            "the release's binary is {} bytes, more than the limit of 100; nothing was downloaded",
            v2.script().len()
        ),
    );
    // Over the 100 MiB ceiling, whatever the attempt allows.
    let huge = manifest(&registry, &v2, |m| {
        m["layers"][0]["size"] = (MAX_ARTIFACT_BYTES + 1).into()
    });
    registry.push_manifest(REPO, "huge", &huge);
    let mut a = attempt(&front.reference(REPO, "huge"), &v2);
    a.max_bytes = MaxBytes::new(MAX_ARTIFACT_BYTES).expect("max");
    b.assert_failed(
        &a,
        UpgradeReason::TooLarge,
        &format!(
            "the release's binary is {} bytes, more than the limit of {MAX_ARTIFACT_BYTES}",
            MAX_ARTIFACT_BYTES + 1
        ),
    );
    assert_no_blob_request(&front);
}

#[test]
fn a_blob_longer_than_its_descriptor_is_stopped() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    let mut longer = v2.script();
    longer.extend_from_slice(b"\n# trailing bytes\n");
    // Chunked: no declared length, only counting finds out.
    let mut chunked = Vec::new();
    for part in longer.chunks(100) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    front.route(&blob_path(&v2), move |_| ResponseSpec {
        status: 200,
        headers: vec![("Transfer-Encoding".into(), "chunked".into())],
        body: chunked.clone(),
    });
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Checksum,
        &format!(
            "it is longer than the {} bytes the manifest declares; download stopped",
            v2.script().len()
        ),
    );
    // With a declared length: refused before reading.
    let declared = longer.clone();
    front.route(&blob_path(&v2), move |_| ResponseSpec {
        status: 200,
        headers: Vec::new(),
        body: declared.clone(),
    });
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Checksum,
        &format!(
            "the server declares {} bytes, the manifest's layer {}; nothing was read",
            longer.len(),
            v2.script().len()
        ),
    );
}

#[test]
fn a_blob_shorter_than_its_descriptor_is_refused() {
    // docker-registry 2.8 stores a layer size that is not the blob's.
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    let real = v2.script().len();
    let m = manifest(&registry, &v2, |m| {
        m["layers"][0]["size"] = (real + 10).into()
    });
    registry.push_manifest(REPO, "2.0", &m);
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Checksum,
        &format!("it has {real} bytes, the manifest declares {}", real + 10),
    );
}

#[test]
fn a_blob_with_other_bytes_fails_its_checksum() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    let mut other = v2.script();
    let last = other.len() - 2;
    other[last] ^= 1;
    let other_sha = Sha256Hex::of(&other);
    front.route(&blob_path(&v2), move |_| ResponseSpec {
        status: 200,
        headers: Vec::new(),
        body: other.clone(),
    });
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Checksum,
        &format!("have sha256 {other_sha}, not the attempt's {}", v2.sha256()),
    );
}

#[test]
fn manifest_over_4_mib() {
    // docker-registry 2.8 itself refuses to store such a manifest, so the
    // front serves it, once with a declared length and once chunked.
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    let big = manifest(&registry, &v2, |m| {
        m["annotations"] = serde_json::json!({"pad": "x".repeat(MAX_MANIFEST_BYTES as usize)});
    });
    assert!(big.len() as u64 > MAX_MANIFEST_BYTES);
    let declared = big.clone();
    front.route(&format!("/v2/{REPO}/manifests/big"), move |_| {
        ResponseSpec {
            status: 200,
            headers: vec![("Content-Type".into(), OCI_MANIFEST_MEDIA_TYPE.into())],
            body: declared.clone(),
        }
    });
    let says = format!(
        "fetching the manifest (https://127.0.0.1:{}/v2/{REPO}/manifests/big): the answer is larger than the limit of {MAX_MANIFEST_BYTES} bytes",
        front.server().port()
    );
    b.assert_failed(
        &attempt(&front.reference(REPO, "big"), &v2),
        UpgradeReason::Artifact,
        &says,
    );
    let mut chunked = Vec::new();
    for part in big.chunks(1024 * 1024) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    front.route(&format!("/v2/{REPO}/manifests/big"), move |_| {
        ResponseSpec {
            status: 200,
            headers: vec![
                ("Content-Type".into(), OCI_MANIFEST_MEDIA_TYPE.into()),
                ("Transfer-Encoding".into(), "chunked".into()),
            ],
            body: chunked.clone(),
        }
    });
    b.assert_failed(
        &attempt(&front.reference(REPO, "big"), &v2),
        UpgradeReason::Artifact,
        &says,
    );
    assert_no_blob_request(&front);
}

#[test]
fn unknown_tag() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    b.assert_failed(
        &attempt(&front.reference(REPO, "9.9"), &v2),
        UpgradeReason::Download,
        "the server answered HTTP 404 (MANIFEST_UNKNOWN: manifest unknown); the registry has no such tag or digest",
    );
}

#[test]
fn a_by_digest_reference_is_checked_against_the_manifest_bytes() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    let pushed = fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    // The front answers the pinned digest with another (valid) manifest.
    let other = manifest(&registry, &v2, |m| {
        m["annotations"] = serde_json::json!({"note": "not the pinned one"});
    });
    let other_digest = Sha256Hex::of(&other);
    front.route(
        &format!("/v2/{REPO}/manifests/{}", pushed.manifest_digest),
        move |_| ResponseSpec {
            status: 200,
            headers: vec![("Content-Type".into(), OCI_MANIFEST_MEDIA_TYPE.into())],
            body: other.clone(),
        },
    );
    let pinned = pushed.pinned.replace(
        &registry.host(),
        &format!("127.0.0.1:{}", front.server().port()),
    );
    b.assert_failed(
        &attempt(&pinned, &v2),
        UpgradeReason::Artifact,
        &format!("the registry served a manifest with digest sha256:{other_digest}, not the one the reference names"),
    );
    assert_no_blob_request(&front);
}

#[test]
fn a_docker_manifest_or_index_is_not_a_release() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    let m = manifest(&registry, &v2, |_| {});
    front.route(&format!("/v2/{REPO}/manifests/2.0"), move |_| {
        ResponseSpec {
            status: 200,
            headers: vec![(
                "Content-Type".into(),
                "application/vnd.oci.image.index.v1+json".into(),
            )],
            body: m.clone(),
        }
    });
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Artifact,
        "has Content-Type application/vnd.oci.image.index.v1+json, not application/vnd.oci.image.manifest.v1+json",
    );
}

#[test]
fn blob_redirect_to_plain_http() {
    let (b, registry, front) = refusal_bench();
    let plain = HttpServer::start();
    let v2 = StandIn::good("2.0");
    plain.route("/blob", Behavior::Bytes(v2.script()));
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    front.route(&blob_path(&v2), redirect(plain.url("/blob")));
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Download,
        &format!(
            "redirected to {}, which is not https://; refused",
            plain.url("/blob")
        ),
    );
    assert!(plain.requests().is_empty(), "the http:// URL was requested");
}

#[test]
fn more_than_5_redirects() {
    let (b, registry, front) = refusal_bench();
    let cdn = HttpsServer::start(&b.ca);
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    // The registry's redirect, then 5 more on the CDN: 6 in all.
    front.route(&blob_path(&v2), redirect(cdn.url("/hop/1")));
    for hop in 1..=MAX_BLOB_REDIRECTS {
        cdn.route(
            &format!("/hop/{hop}"),
            Behavior::Redirect {
                status: 302,
                location: cdn.url(&format!("/hop/{}", hop + 1)),
            },
        );
    }
    cdn.route(
        &format!("/hop/{}", MAX_BLOB_REDIRECTS + 1),
        Behavior::Bytes(v2.script()),
    );
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Download,
        &format!(
            "downloading the blob: more than 5 redirects (the last to {}); refused",
            cdn.url("/hop/6")
        ),
    );
    let paths: Vec<String> = cdn.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/hop/1", "/hop/2", "/hop/3", "/hop/4", "/hop/5"]);
}

#[test]
fn a_registry_that_refuses_the_anonymous_token() {
    let b = bench();
    let registry = Registry::start(&b.ca);
    let front = RegistryFront::start(&b.ca, &registry, FrontAuth::Token);
    let v2 = StandIn::good("2.0");
    // Behind the token check, the repository still says no.
    front.route(&format!("/v2/{REPO}/manifests/2.0"), |_| ResponseSpec {
        status: 403,
        headers: Vec::new(),
        body: Vec::new(),
    });
    b.assert_failed(
        &attempt(&front.reference(REPO, "2.0"), &v2),
        UpgradeReason::Download,
        "HTTP 403 even with an anonymous token: the repository does not allow anonymous pulls",
    );
    assert_eq!(requests_to(&front.requests(), "/token").len(), 1);
}

#[test]
fn an_unreachable_registry() {
    let b = bench();
    let v2 = StandIn::good("2.0");
    // A port nobody listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    b.assert_failed(
        &attempt(&format!("oci://127.0.0.1:{port}/{REPO}:2.0"), &v2),
        UpgradeReason::Download,
        &format!("fetching the manifest (https://127.0.0.1:{port}/v2/{REPO}/manifests/2.0): Connection Failed"),
    );
}

#[test]
fn a_stalled_blob_times_out_within_the_pull_bound() {
    let (b, registry, front) = refusal_bench();
    let v2 = StandIn::good("2.0");
    fleetctl_push(&b.ca, &registry.reference(REPO, "2.0"), &v2);
    front
        .server()
        .route(&blob_path(&v2), Behavior::StallBeforeHeaders);
    let (_, took) = support::timed(|| {
        b.assert_failed(
            &attempt(&front.reference(REPO, "2.0"), &v2),
            UpgradeReason::Download,
            "downloading the blob",
        )
    });
    // The test build's bound on a whole pull is 4 s (production: 5 min).
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");
}
