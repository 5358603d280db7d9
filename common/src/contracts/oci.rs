//! Agent releases as OCI artifacts (`docs/design/upgrade.md` "Artifacts"): the
//! media types, the image-manifest and descriptor wire types shared by the
//! updater (pull) and fleetctl (push), and the one check that turns manifest
//! bytes into a validated [`AgentArtifact`].
//!
//! What fleetctl pushes is an OCI 1.1 artifact: `artifactType` set, the
//! empty config (`{}`), one layer holding the agent binary as is. Pre-1.1
//! tools mark an artifact by the config's media type instead; the pull
//! accepts that form too (OCI image spec: without `artifactType`, the
//! artifact's type is the config's media type). Debian's docker-registry
//! 2.8 stores both forms unchanged.
//!
//! Unlike our own contracts, these types ignore unknown fields: the format
//! is the OCI image spec's, which requires readers to ignore properties
//! they do not know (annotations, `data`, `urls`, ...). Everything the
//! updater relies on is checked by [`AgentArtifact::from_manifest`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::validate::{Sha256Hex, ValidationError};

/// `Content-Type` and `mediaType` of an OCI image manifest.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of the OCI 1.1 empty descriptor.
pub const OCI_EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The blob of the empty descriptor: the two bytes `{}`.
pub const OCI_EMPTY_BLOB: &[u8] = b"{}";
/// `artifactType` of a fleet agent release.
pub const AGENT_ARTIFACT_TYPE: &str = "application/vnd.harmony.fleet-agent.v1";
/// Media type of the one layer of a release: the agent binary, unpacked.
pub const AGENT_BINARY_MEDIA_TYPE: &str = "application/vnd.harmony.fleet-agent.binary.v1";

/// A content digest as OCI writes it, `sha256:<64 lowercase hex>`; other
/// algorithms are refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OciDigest(Sha256Hex);

impl OciDigest {
    pub fn parse(v: &str) -> Result<Self, ValidationError> {
        v.strip_prefix("sha256:")
            .and_then(|hex| Sha256Hex::parse(hex).ok())
            .map(Self)
            .ok_or_else(|| ValidationError::Sha256(v.chars().take(80).collect()))
    }

    pub fn sha256(&self) -> &Sha256Hex {
        &self.0
    }
}

impl From<Sha256Hex> for OciDigest {
    fn from(v: Sha256Hex) -> Self {
        Self(v)
    }
}

impl fmt::Display for OciDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

impl TryFrom<String> for OciDigest {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<OciDigest> for String {
    fn from(v: OciDigest) -> String {
        v.to_string()
    }
}

/// An OCI content descriptor (the fields this system reads or writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciDescriptor {
    pub media_type: String,
    pub digest: OciDigest,
    pub size: u64,
}

impl OciDescriptor {
    /// The OCI 1.1 empty descriptor: `{}`, 2 bytes.
    pub fn empty() -> Self {
        Self {
            media_type: OCI_EMPTY_MEDIA_TYPE.to_owned(),
            digest: Sha256Hex::of(OCI_EMPTY_BLOB).into(),
            size: OCI_EMPTY_BLOB.len() as u64,
        }
    }
}

/// An OCI image manifest (the fields this system reads or writes). Field
/// order is the order fleetctl writes, pinned by the golden test: the
/// manifest digest of a release depends on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: OciDescriptor,
    pub layers: Vec<OciDescriptor>,
}

impl OciManifest {
    /// The manifest of an agent release whose binary has `sha256` and
    /// `size`. No annotations (no timestamp): one binary always gives one
    /// manifest digest.
    pub fn for_agent(sha256: &Sha256Hex, size: u64) -> Self {
        Self {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_owned()),
            artifact_type: Some(AGENT_ARTIFACT_TYPE.to_owned()),
            config: OciDescriptor::empty(),
            layers: vec![OciDescriptor {
                media_type: AGENT_BINARY_MEDIA_TYPE.to_owned(),
                digest: sha256.clone().into(),
                size,
            }],
        }
    }

    /// The bytes pushed: compact JSON in field order.
    pub fn to_bytes(&self) -> Vec<u8> {
        // INVARIANT: strings and integers only, so serialization cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A manifest that is not a fleet agent release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestError {
    NotJson(String),
    SchemaVersion(u32),
    MediaType(String),
    ArtifactType(String),
    /// No `artifactType`, and the config's media type is not ours either.
    ConfigMediaType(String),
    LayerCount(usize),
    LayerMediaType(String),
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PUSH: &str = "publish the agent with `fleetctl artifact push`";
        match self {
            Self::NotJson(e) => write!(f, "the manifest is not an OCI image manifest: {e}"),
            Self::SchemaVersion(v) => {
                write!(f, "the manifest has schemaVersion {v}; an OCI image manifest has 2")
            }
            Self::MediaType(m) => write!(
                f,
                "the manifest's mediaType is {}, not {OCI_MANIFEST_MEDIA_TYPE}",
                shown(m)
            ),
            Self::ArtifactType(a) => write!(
                f,
                "the manifest's artifactType is {}, not {AGENT_ARTIFACT_TYPE}: it is not a fleet agent release; {PUSH}",
                shown(a)
            ),
            Self::ConfigMediaType(c) => write!(
                f,
                "the manifest has no artifactType and its config's mediaType is {}, not {AGENT_ARTIFACT_TYPE}: it is not a fleet agent release; {PUSH}",
                shown(c)
            ),
            Self::LayerCount(n) => write!(
                f,
                "the manifest has {n} layers; a fleet agent release has exactly one; {PUSH}"
            ),
            Self::LayerMediaType(m) => write!(
                f,
                "the manifest's layer has media type {}, not {AGENT_BINARY_MEDIA_TYPE}; {PUSH}",
                shown(m)
            ),
        }
    }
}

impl std::error::Error for ManifestError {}

/// A manifest checked to be a fleet agent release: its one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentArtifact {
    /// SHA-256 of the agent binary (the layer's digest).
    pub sha256: Sha256Hex,
    /// The binary's size as the manifest declares it.
    pub size: u64,
}

impl AgentArtifact {
    /// Parses and checks manifest bytes: an OCI image manifest (schema 2,
    /// mediaType absent or the OCI one), of artifact type
    /// [`AGENT_ARTIFACT_TYPE`] (by `artifactType`, or when that is absent
    /// by the config's media type), with exactly one layer of media type
    /// [`AGENT_BINARY_MEDIA_TYPE`].
    pub fn from_manifest(bytes: &[u8]) -> Result<Self, ManifestError> {
        let m: OciManifest =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::NotJson(e.to_string()))?;
        if m.schema_version != 2 {
            return Err(ManifestError::SchemaVersion(m.schema_version));
        }
        if let Some(t) = m.media_type.filter(|t| t != OCI_MANIFEST_MEDIA_TYPE) {
            return Err(ManifestError::MediaType(t));
        }
        match m.artifact_type {
            Some(a) if a == AGENT_ARTIFACT_TYPE => {}
            Some(a) => return Err(ManifestError::ArtifactType(a)),
            None if m.config.media_type == AGENT_ARTIFACT_TYPE => {}
            None => return Err(ManifestError::ConfigMediaType(m.config.media_type)),
        }
        let [layer] = <[OciDescriptor; 1]>::try_from(m.layers)
            .map_err(|layers| ManifestError::LayerCount(layers.len()))?;
        if layer.media_type != AGENT_BINARY_MEDIA_TYPE {
            return Err(ManifestError::LayerMediaType(layer.media_type));
        }
        Ok(Self {
            sha256: layer.digest.0,
            size: layer.size,
        })
    }
}

/// A registry-supplied string in a message: quoted, at most 80 characters.
fn shown(v: &str) -> String {
    const SHOWN_CHARS: usize = 80;
    let mut out: String = v.chars().take(SHOWN_CHARS).collect();
    if v.chars().count() > SHOWN_CHARS {
        out.push('…');
    }
    format!("{out:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(c: char) -> Sha256Hex {
        Sha256Hex::parse(&c.to_string().repeat(64)).expect("hex")
    }

    fn manifest(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let mut v = serde_json::to_value(OciManifest::for_agent(&sha('a'), 42)).expect("json");
        edit(&mut v);
        serde_json::to_vec(&v).expect("bytes")
    }

    #[test]
    fn the_pushed_manifest_is_an_agent_artifact() {
        let got = AgentArtifact::from_manifest(&OciManifest::for_agent(&sha('a'), 42).to_bytes());
        assert_eq!(
            got,
            Ok(AgentArtifact {
                sha256: sha('a'),
                size: 42
            })
        );
        assert_eq!(
            OciDescriptor::empty().digest.to_string(),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn the_pre_1_1_form_and_unknown_fields_are_accepted() {
        // No artifactType: the config's media type names the artifact.
        let pre = manifest(|m| {
            m.as_object_mut().expect("object").remove("artifactType");
            m.as_object_mut().expect("object").remove("mediaType");
            m["config"]["mediaType"] = AGENT_ARTIFACT_TYPE.into();
        });
        assert!(AgentArtifact::from_manifest(&pre).is_ok());
        let extra = manifest(|m| {
            m["annotations"] = serde_json::json!({"org.opencontainers.image.created": "x"});
            m["config"]["data"] = "e30=".into();
            m["layers"][0]["urls"] = serde_json::json!(["https://cdn.example.com/x"]);
        });
        assert!(AgentArtifact::from_manifest(&extra).is_ok());
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let cases: Vec<(Vec<u8>, ManifestError, &str)> = vec![
            (
                manifest(|m| m["artifactType"] = "application/vnd.example.sbom".into()),
                ManifestError::ArtifactType("application/vnd.example.sbom".into()),
                "the manifest's artifactType is \"application/vnd.example.sbom\", not application/vnd.harmony.fleet-agent.v1: it is not a fleet agent release; publish the agent with `fleetctl artifact push`",
            ),
            (
                manifest(|m| {
                    m.as_object_mut().expect("object").remove("artifactType");
                }),
                ManifestError::ConfigMediaType(OCI_EMPTY_MEDIA_TYPE.into()),
                "the manifest has no artifactType and its config's mediaType is \"application/vnd.oci.empty.v1+json\", not application/vnd.harmony.fleet-agent.v1: it is not a fleet agent release; publish the agent with `fleetctl artifact push`",
            ),
            (
                manifest(|m| {
                    let layer = m["layers"][0].clone();
                    m["layers"] = serde_json::json!([layer.clone(), layer]);
                }),
                ManifestError::LayerCount(2),
                "the manifest has 2 layers; a fleet agent release has exactly one; publish the agent with `fleetctl artifact push`",
            ),
            (
                manifest(|m| m["layers"] = serde_json::json!([])),
                ManifestError::LayerCount(0),
                "the manifest has 0 layers; a fleet agent release has exactly one; publish the agent with `fleetctl artifact push`",
            ),
            (
                manifest(|m| {
                    m["layers"][0]["mediaType"] =
                        "application/vnd.oci.image.layer.v1.tar+gzip".into()
                }),
                ManifestError::LayerMediaType("application/vnd.oci.image.layer.v1.tar+gzip".into()),
                "the manifest's layer has media type \"application/vnd.oci.image.layer.v1.tar+gzip\", not application/vnd.harmony.fleet-agent.binary.v1; publish the agent with `fleetctl artifact push`",
            ),
            (
                manifest(|m| m["schemaVersion"] = 1.into()),
                ManifestError::SchemaVersion(1),
                "the manifest has schemaVersion 1; an OCI image manifest has 2",
            ),
            (
                manifest(|m| {
                    m["mediaType"] = "application/vnd.oci.image.index.v1+json".into()
                }),
                ManifestError::MediaType("application/vnd.oci.image.index.v1+json".into()),
                "the manifest's mediaType is \"application/vnd.oci.image.index.v1+json\", not application/vnd.oci.image.manifest.v1+json",
            ),
        ];
        for (bytes, error, message) in cases {
            let got = AgentArtifact::from_manifest(&bytes);
            assert_eq!(got, Err(error), "{}", String::from_utf8_lossy(&bytes));
            assert_eq!(got.map_err(|e| e.to_string()), Err(message.to_owned()));
        }
    }

    #[test]
    fn malformed_manifests_are_not_json_errors() {
        for bad in [
            &b"not json"[..],
            b"[]",
            br#"{"schemaVersion":2}"#,
            &manifest(|m| m["layers"][0]["digest"] = "sha512:abc".into()),
            &manifest(|m| m["layers"][0]["digest"] = format!("sha256:{}", "A".repeat(64)).into()),
            &manifest(|m| m["layers"][0]["size"] = (-1).into()),
        ] {
            match AgentArtifact::from_manifest(bad) {
                Err(ManifestError::NotJson(e)) => {
                    assert!(!e.is_empty());
                }
                other => panic!("{}: {other:?}", String::from_utf8_lossy(bad)),
            }
        }
    }

    #[test]
    fn digests_are_sha256_only() {
        let d = format!("sha256:{}", "b".repeat(64));
        assert_eq!(OciDigest::parse(&d).map(|d| d.to_string()), Ok(d));
        assert!(OciDigest::parse(&format!("sha512:{}", "b".repeat(64))).is_err());
        assert!(OciDigest::parse(&"b".repeat(64)).is_err());
    }
}

/// Bytes of a registry's error body read at most.
pub const MAX_REGISTRY_ERROR_BYTES: u64 = 16 * 1024;

/// The first error of a registry's error body (OCI distribution
/// `{"errors":[{"code":..,"message":..}]}`), as `CODE: message`, shortened.
pub fn registry_error_summary(body: &[u8]) -> Option<String> {
    const SHOWN_CHARS: usize = 200;
    #[derive(Deserialize)]
    struct Errors {
        errors: Vec<Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        code: Option<String>,
        message: Option<String>,
    }
    let first = serde_json::from_slice::<Errors>(body)
        .ok()?
        .errors
        .into_iter()
        .next()?;
    let text = match (first.code, first.message) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (c, m) => c.or(m)?,
    };
    Some(text.chars().take(SHOWN_CHARS).collect())
}

#[cfg(test)]
mod registry_error_tests {
    use super::registry_error_summary;

    #[test]
    fn summarises_the_first_error() {
        assert_eq!(
            registry_error_summary(br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{}},{"code":"X"}]}"#),
            Some("MANIFEST_UNKNOWN: manifest unknown".into())
        );
        assert_eq!(
            registry_error_summary(br#"{"errors":[{"code":"DENIED"}]}"#),
            Some("DENIED".into())
        );
        assert_eq!(registry_error_summary(br#"{"errors":[]}"#), None);
        assert_eq!(registry_error_summary(b"<html>502</html>"), None);
    }
}
