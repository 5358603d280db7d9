//! `fleetctl artifact push <oci-ref> <binary>`: publishes an agent binary as a
//! fleet agent release in an OCI registry (`docs/design/upgrade.md`
//! "Artifacts"), so no other tool is needed.
//!
//! Steps: validate the reference (a tag) and the binary (a regular file of
//! 1 byte to the 100 MiB ceiling), hash it while reading; upload the OCI
//! 1.1 empty config blob and the binary blob (each skipped when the
//! registry already has it; otherwise `POST` an upload, then one `PUT` of
//! the bytes with their digest); `PUT` the manifest
//! ([`OciManifest::for_agent`]) under the tag; check the digest the
//! registry answers against the one computed here; print the manifest
//! digest, the pinned reference, the sha256 and size, and the entry of a
//! release file for `fleetctl upgrade` and `rollout`.
//!
//! HTTPS only, anonymous (registries that need credentials for a push are
//! not supported yet), trust anchors the system store plus `--ca-file`.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use fleet_common::contracts::{
    registry_error_summary, OciManifest, MAX_REGISTRY_ERROR_BYTES, OCI_EMPTY_BLOB,
    OCI_MANIFEST_MEDIA_TYPE,
};
use fleet_common::https::{self, ClientSettings, Trust};
use fleet_common::limits::{HTTPS_CONNECT_TIMEOUT, HTTPS_REQUEST_TIMEOUT, MAX_ARTIFACT_BYTES};
use fleet_common::validate::{OciReference, Sha256Hex};
use sha2::Digest;

/// The way forward of a failed exchange with the registry
/// ([`https::transport_message`]).
const TRANSPORT_HINTS: https::TransportHints = https::TransportHints {
    certificate: "the registry's certificate is not trusted: give its CA with --ca-file",
    connect: "check the reference's host and port, and this machine's network",
};
/// Read size while hashing the binary.
const HASH_CHUNK_BYTES: usize = 128 * 1024;

/// What a push published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub reference: OciReference,
    pub manifest_digest: Sha256Hex,
    /// The reference pinned to the manifest digest.
    pub pinned: OciReference,
    pub sha256: Sha256Hex,
    pub size: u64,
}

impl fmt::Display for Pushed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "pushed {}", self.reference)?;
        writeln!(f, "manifest-digest: sha256:{}", self.manifest_digest)?;
        writeln!(f, "pinned: {}", self.pinned)?;
        writeln!(f, "sha256: {}", self.sha256)?;
        writeln!(f, "size: {}", self.size)?;
        // The entry of a release file (under "artifacts", keyed by the
        // binary's architecture), pinned to the manifest digest.
        let entry = serde_json::json!({
            "artifact-url": self.pinned.to_string(),
            "sha256": self.sha256,
            "max-bytes": self.size,
        });
        writeln!(f, "release entry: {entry}")
    }
}

/// An `artifact` command that did not publish.
#[derive(Debug)]
pub enum ArtifactError {
    /// The reference pinned to the manifest digest would not parse (the
    /// registry's name and repository came from a valid reference).
    Pinned(String),
    Binary {
        path: PathBuf,
        message: String,
    },
    BinaryTooLarge {
        path: PathBuf,
        size: u64,
    },
    /// The trust store (system bundle plus `--ca-file`) could not be built.
    Tls(https::TlsSetupError),
    Request {
        what: &'static str,
        url: String,
        message: String,
    },
    Status {
        what: &'static str,
        url: String,
        status: u16,
        registry: Option<String>,
    },
    DigestMismatch {
        answered: String,
        computed: Sha256Hex,
    },
}

impl fmt::Display for ArtifactError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pinned(why) => write!(f, "the pinned reference: {why}"),
            Self::Binary { path, message } => {
                write!(f, "reading the binary {}: {message}", path.display())
            }
            Self::BinaryTooLarge { path, size } => write!(
                f,
                "the binary {} is {size} bytes, more than the {MAX_ARTIFACT_BYTES}-byte (100 MiB) ceiling every updater refuses above",
                path.display()
            ),
            Self::Tls(e) => write!(f, "--ca-file: {e}"),
            Self::Request { what, url, message } => write!(f, "{what} ({url}): {message}"),
            Self::Status {
                what,
                url,
                status,
                registry,
            } => {
                write!(f, "{what} ({url}): the registry answered HTTP {status}")?;
                if let Some(r) = registry {
                    write!(f, " ({r})")?;
                }
                if matches!(status, 401 | 403) {
                    f.write_str("; the registry requires credentials to push, and fleetctl pushes anonymously only")?;
                }
                Ok(())
            }
            Self::DigestMismatch { answered, computed } => write!(
                f,
                "the registry stored the manifest as {answered}, not sha256:{computed} as computed here; do not use this release, check the registry"
            ),
        }
    }
}

impl std::error::Error for ArtifactError {}

/// Publishes `binary` at `reference` (a tag).
pub fn push(
    reference: &OciReference,
    binary: &Path,
    ca_file: Option<&Path>,
) -> Result<Pushed, ArtifactError> {
    let (sha256, size) = hash_binary(binary)?;
    let agent = client(ca_file)?;
    let registry = Registry {
        agent: &agent,
        base: format!(
            "https://{}/v2/{}",
            reference.registry(),
            reference.repository()
        ),
        origin: format!("https://{}", reference.registry()),
    };
    registry.upload_blob(
        &Sha256Hex::of(OCI_EMPTY_BLOB),
        OCI_EMPTY_BLOB.len() as u64,
        || Ok(Box::new(OCI_EMPTY_BLOB)),
    )?;
    registry.upload_blob(&sha256, size, || {
        File::open(binary)
            .map(|f| Box::new(f) as Box<dyn Read>)
            .map_err(|e| ArtifactError::Binary {
                path: binary.to_owned(),
                message: e.to_string(),
            })
    })?;
    let manifest = OciManifest::for_agent(&sha256, size).to_bytes();
    let manifest_digest = Sha256Hex::of(&manifest);
    let answered = registry.put_manifest(&reference.manifest_reference(), &manifest)?;
    if let Some(answered) = answered {
        if answered != format!("sha256:{manifest_digest}") {
            return Err(ArtifactError::DigestMismatch {
                answered,
                computed: manifest_digest,
            });
        }
    }
    let pinned = OciReference::parse(&format!(
        "oci://{}/{}@sha256:{manifest_digest}",
        reference.registry(),
        reference.repository()
    ))
    .map_err(|e| ArtifactError::Pinned(e.to_string()))?;
    Ok(Pushed {
        reference: reference.clone(),
        manifest_digest,
        pinned,
        sha256,
        size,
    })
}

/// SHA-256 and size of the binary, streamed; refuses what no updater
/// would install (not a regular file, empty, over the ceiling).
fn hash_binary(path: &Path) -> Result<(Sha256Hex, u64), ArtifactError> {
    let bad = |message: String| ArtifactError::Binary {
        path: path.to_owned(),
        message,
    };
    let mut file = File::open(path).map_err(|e| bad(e.to_string()))?;
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".to_owned()));
    }
    if meta.len() > MAX_ARTIFACT_BYTES {
        return Err(ArtifactError::BinaryTooLarge {
            path: path.to_owned(),
            size: meta.len(),
        });
    }
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; HASH_CHUNK_BYTES];
    let mut size: u64 = 0;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                size += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(bad(e.to_string())),
        }
    }
    if size == 0 {
        return Err(bad("the file is empty".to_owned()));
    }
    if size > MAX_ARTIFACT_BYTES {
        return Err(ArtifactError::BinaryTooLarge {
            path: path.to_owned(),
            size,
        });
    }
    Ok((Sha256Hex::from_digest(&hasher.finalize().into()), size))
}

/// The HTTPS client: the system store plus `ca_file`, ring, redirects off,
/// the connect and request bounds.
fn client(ca_file: Option<&Path>) -> Result<ureq::Agent, ArtifactError> {
    https::agent(
        Trust::System { extra: ca_file },
        ClientSettings {
            connect: HTTPS_CONNECT_TIMEOUT,
            request: HTTPS_REQUEST_TIMEOUT,
            user_agent: concat!("fleetctl/", env!("CARGO_PKG_VERSION")),
        },
    )
    .map_err(ArtifactError::Tls)
}

/// One repository of one registry.
struct Registry<'a> {
    agent: &'a ureq::Agent,
    /// `https://host[:port]/v2/<repository>`.
    base: String,
    /// `https://host[:port]`.
    origin: String,
}

impl Registry<'_> {
    /// Uploads a blob unless the registry has it: `POST` an upload session,
    /// then one `PUT` of the `size` bytes `body` gives, with their digest.
    fn upload_blob(
        &self,
        digest: &Sha256Hex,
        size: u64,
        body: impl FnOnce() -> Result<Box<dyn Read>, ArtifactError>,
    ) -> Result<(), ArtifactError> {
        let blob = format!("{}/blobs/sha256:{digest}", self.base);
        if let Ok(r) = self.agent.head(&blob).call() {
            if r.status() == 200 {
                return Ok(());
            }
        }
        let start = format!("{}/blobs/uploads/", self.base);
        let what = "starting a blob upload";
        let started = self.call(what, &start, self.agent.post(&start).send_bytes(&[]))?;
        if started.status() != 202 {
            return Err(status(what, &start, started));
        }
        let location = started.header("location").unwrap_or_default();
        let upload = if location.starts_with('/') {
            format!("{}{location}", self.origin)
        } else if location.starts_with("https://") {
            location.to_owned()
        } else {
            return Err(ArtifactError::Request {
                what,
                url: start,
                message: format!(
                    "the registry answered an upload location that is not https: {location:?}"
                ),
            });
        };
        let separator = if upload.contains('?') { '&' } else { '?' };
        let put = format!("{upload}{separator}digest=sha256%3A{digest}");
        let what = "uploading a blob";
        let shown = format!("{}/blobs/uploads/… sha256:{digest}", self.base);
        let done = self.call(
            what,
            &shown,
            self.agent
                .put(&put)
                .set("Content-Type", "application/octet-stream")
                .set("Content-Length", &size.to_string())
                .send(body()?),
        )?;
        if done.status() != 201 {
            return Err(status(what, &shown, done));
        }
        Ok(())
    }

    /// PUTs the manifest; the digest the registry answers, if it does.
    fn put_manifest(&self, tag: &str, manifest: &[u8]) -> Result<Option<String>, ArtifactError> {
        let url = format!("{}/manifests/{tag}", self.base);
        let what = "putting the manifest";
        let r = self.call(
            what,
            &url,
            self.agent
                .put(&url)
                .set("Content-Type", OCI_MANIFEST_MEDIA_TYPE)
                .send_bytes(manifest),
        )?;
        if r.status() != 201 {
            return Err(status(what, &url, r));
        }
        Ok(r.header("docker-content-digest").map(str::to_owned))
    }

    /// A response, whatever its status; transport failures are errors.
    fn call(
        &self,
        what: &'static str,
        url: &str,
        result: Result<ureq::Response, ureq::Error>,
    ) -> Result<ureq::Response, ArtifactError> {
        match result {
            Ok(r) | Err(ureq::Error::Status(_, r)) => Ok(r),
            Err(ureq::Error::Transport(t)) => Err(ArtifactError::Request {
                what,
                url: url.to_owned(),
                message: https::transport_message(&t, TRANSPORT_HINTS),
            }),
        }
    }
}

fn status(what: &'static str, url: &str, response: ureq::Response) -> ArtifactError {
    ArtifactError::Status {
        what,
        url: url.to_owned(),
        status: response.status(),
        registry: registry_error(response),
    }
}

/// The first error of a registry's error JSON, `CODE: message`.
fn registry_error(response: ureq::Response) -> Option<String> {
    let body = https::read_body(response, MAX_REGISTRY_ERROR_BYTES).ok()?;
    registry_error_summary(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_no_updater_would_install_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").expect("write");
        assert_eq!(
            hash_binary(&empty).map_err(|e| e.to_string()),
            Err(format!(
                "reading the binary {}: the file is empty",
                empty.display()
            ))
        );
        assert_eq!(
            hash_binary(dir.path()).map_err(|e| e.to_string()),
            Err(format!(
                "reading the binary {}: not a regular file",
                dir.path().display()
            ))
        );
        let big = dir.path().join("big");
        let f = File::create(&big).expect("create");
        f.set_len(MAX_ARTIFACT_BYTES + 1).expect("sparse");
        assert!(matches!(
            hash_binary(&big),
            Err(ArtifactError::BinaryTooLarge { size, .. }) if size == MAX_ARTIFACT_BYTES + 1
        ));
        let ok = dir.path().join("ok");
        std::fs::write(&ok, b"agent").expect("write");
        assert_eq!(
            hash_binary(&ok).expect("hash"),
            (Sha256Hex::of(b"agent"), 5)
        );
    }
}
