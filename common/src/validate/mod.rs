//! Validated newtypes for every identifier that crosses a wire or names a file.
//!
//! Each type is built only through `parse` (or serde, which calls `parse`), so a
//! value of the type is proof the rule held. Rules:
//!
//! | type | rule |
//! |---|---|
//! | [`DeviceId`] | `^[A-Za-z0-9_-]{1,64}$` (a safe NATS subject token) |
//! | [`WorkloadName`] | `^[a-z0-9][a-z0-9_-]{0,62}$` |
//! | [`Version`] | `^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`, no `..`: never a path |
//! | [`Arch`] | `x86_64`, `aarch64`, `armv7` |
//! | [`AttemptUuid`] | canonical hyphenated UUID, not nil |
//! | [`Sha256Hex`] | 64 lowercase hex digits |
//! | [`ArtifactUrl`] | `https://host[:port]/path` or `oci://host[:port]/repo(:tag|@sha256:hex)` |
//! | [`BoundedText`] | at most [`MAX_TEXT_CHARS`](crate::limits::MAX_TEXT_CHARS) characters |
//! | [`MaxBytes`] | 1 ..= [`MAX_ARTIFACT_BYTES`](crate::limits::MAX_ARTIFACT_BYTES) |

//!
//! The types live in `ids.rs` (identifiers and bounded values) and `url.rs`
//! (artifact locations); `error.rs` holds [`ValidationError`].

mod error;
mod ids;
mod url;

pub use error::ValidationError;
pub use ids::{
    Arch, AttemptUuid, BoundedText, DeviceId, Excerpt, MaxBytes, Sha256Hex, Version, WorkloadName,
};
pub use url::{ArtifactUrl, HttpsUrl, OciReference, OciTarget};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_ARTIFACT_BYTES, MAX_TEXT_CHARS};

    #[test]
    fn device_id_rules() {
        for ok in ["dev1", "A-b_9", &"x".repeat(64)] {
            assert_eq!(
                DeviceId::parse(ok).map(|d| d.to_string()),
                Ok(ok.to_string())
            );
        }
        for bad in [
            "",
            "a.b",
            "a*",
            "a>",
            "a b",
            "dev\n",
            "dév",
            &"x".repeat(65),
            "a/b",
            "a\0",
        ] {
            assert_eq!(
                DeviceId::parse(bad),
                Err(ValidationError::DeviceId(bad.to_string()))
            );
        }
        assert_eq!(
            DeviceId::parse("a.b").map_err(|e| e.to_string()),
            Err(
                "invalid device id \"a.b\": use 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'"
                    .to_string()
            )
        );
    }

    #[test]
    fn workload_name_rules() {
        for ok in ["web", "0db", "a_b-c", &"a".repeat(63)] {
            assert!(WorkloadName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Web",
            "-web",
            "_web",
            "we.b",
            "we b",
            &"a".repeat(64),
            "wéb",
            "a/b",
        ] {
            assert_eq!(
                WorkloadName::parse(bad),
                Err(ValidationError::WorkloadName(bad.to_string()))
            );
        }
    }

    #[test]
    fn version_is_never_a_path() {
        for ok in ["1.2.3", "1.2.3-rc.1+build_7", "v2", &"1".repeat(64)] {
            assert!(Version::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "..",
            "1..2",
            "../etc",
            "1/2",
            "/abs",
            ".hidden",
            "-1",
            "1\0",
            "1\n",
            "1 2",
            "1.2\u{2024}3", // one-dot leader, a '.' lookalike
            "１.2",         // fullwidth digit
            &"1".repeat(65),
        ] {
            assert_eq!(
                Version::parse(bad),
                Err(ValidationError::Version(bad.to_string())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn arch_rules() {
        assert_eq!(Arch::parse("x86_64"), Ok(Arch::X86_64));
        assert_eq!(Arch::parse("aarch64"), Ok(Arch::Aarch64));
        assert_eq!(Arch::parse("armv7"), Ok(Arch::Armv7));
        for bad in ["amd64", "arm64", "X86_64", "", "riscv64"] {
            assert_eq!(
                Arch::parse(bad),
                Err(ValidationError::Arch(bad.to_string()))
            );
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(Arch::current(), Some(Arch::X86_64));
        #[cfg(target_arch = "aarch64")]
        assert_eq!(Arch::current(), Some(Arch::Aarch64));
    }

    #[test]
    fn uuid_rules() {
        let ok = "0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10";
        assert_eq!(
            AttemptUuid::parse(ok).map(|u| u.to_string()),
            Ok(ok.to_string())
        );
        for bad in [
            "",
            "0F6E4C1A-6D0B-4C39-9B64-3F1D2A7E5C10",
            "0f6e4c1a6d0b4c399b643f1d2a7e5c10",
            "{0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c10}",
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "0f6e4c1a-6d0b-4c39-9b64-3f1d2a7e5c1g",
        ] {
            assert_eq!(
                AttemptUuid::parse(bad),
                Err(ValidationError::Uuid(bad.to_string())),
                "{bad}"
            );
        }
        let fresh = AttemptUuid::new_random();
        assert_eq!(AttemptUuid::parse(&fresh.to_string()), Ok(fresh));
    }

    #[test]
    fn sha256_rules() {
        let ok = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Sha256Hex::of(b"").as_str(), ok);
        assert!(Sha256Hex::parse(ok).is_ok());
        for bad in [
            &ok.to_uppercase(),
            &ok[..63],
            &format!("{ok}0"),
            &ok.replace('e', "g"),
            "",
        ] {
            assert_eq!(
                Sha256Hex::parse(bad),
                Err(ValidationError::Sha256(bad.to_string()))
            );
        }
    }

    #[test]
    fn bounded_text() {
        let long = "é".repeat(MAX_TEXT_CHARS + 1);
        assert_eq!(
            BoundedText::parse(&long),
            Err(ValidationError::TextTooLong {
                chars: MAX_TEXT_CHARS + 1
            })
        );
        assert!(BoundedText::parse(&long[..long.len() - 2]).is_ok());
        let cut = BoundedText::truncate(&long);
        assert_eq!(cut.as_str().chars().count(), MAX_TEXT_CHARS);
        assert!(cut.as_str().ends_with('…'));
        let err: Result<BoundedText, _> = serde_json::from_str(&format!("{long:?}"));
        assert!(err.is_err());
    }

    #[test]
    fn max_bytes_rules() {
        assert!(MaxBytes::new(1).is_ok());
        assert!(MaxBytes::new(MAX_ARTIFACT_BYTES).is_ok());
        assert_eq!(MaxBytes::new(0), Err(ValidationError::MaxBytes(0)));
        assert_eq!(
            MaxBytes::new(MAX_ARTIFACT_BYTES + 1),
            Err(ValidationError::MaxBytes(MAX_ARTIFACT_BYTES + 1))
        );
    }

    #[test]
    fn artifact_url_accepts() {
        let d = "a".repeat(64);
        for ok in [
            "https://example.com/agent",
            "https://127.0.0.1:8443/releases/fleet-agent?x=1",
            "https://[::1]:8443/a",
            "oci://registry.example.com/fleet/agent:1.2.3",
            "oci://127.0.0.1:5000/fleet-agent:v1",
            "oci://localhost:5000/a/b-c/d__e:latest",
            &format!("oci://reg.io/fleet/agent@sha256:{d}"),
            "oci://[::1]:5000/fleet/agent:1.0",
            "oci://reg.io/fleet/agent:_x",
            &format!("oci://reg.io/fleet/agent:{}", "t".repeat(128)),
        ] {
            let parsed = ArtifactUrl::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(parsed.to_string(), ok);
        }
        let ArtifactUrl::Oci(r) =
            ArtifactUrl::parse("oci://127.0.0.1:5000/fleet/agent:1.0").expect("valid")
        else {
            panic!("not oci")
        };
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "fleet/agent");
        assert_eq!(r.target(), &OciTarget::Tag("1.0".into()));
        assert_eq!(r.manifest_reference(), "1.0");
        let ArtifactUrl::Oci(r) = ArtifactUrl::parse(&format!(
            "oci://Reg.IO:443/fleet/agent@sha256:{}",
            "c".repeat(64)
        ))
        .expect("valid") else {
            panic!("not oci")
        };
        assert_eq!((r.host(), r.port()), ("reg.io", Some(443)));
        assert_eq!(r.manifest_reference(), format!("sha256:{}", "c".repeat(64)));
        assert!(
            ArtifactUrl::parse(&format!("oci://reg.io/fleet/agent:{}", "t".repeat(129))).is_err()
        );
    }

    #[test]
    fn artifact_url_refuses() {
        let d = "a".repeat(64);
        let cases: &[(&str, &str)] = &[
            ("http://example.com/agent", "the scheme is neither https:// nor oci://"),
            ("file:///usr/bin/agent", "the scheme is neither https:// nor oci://"),
            ("ftp://x/y", "the scheme is neither https:// nor oci://"),
            ("HTTPS://example.com/a", "the scheme is neither https:// nor oci://"),
            ("https://example.com", "the URL has no path"),
            ("https://user:pw@example.com/a", "credentials in the URL are not allowed"),
            ("https://exa mple.com/a", "contains whitespace, control or non-ASCII characters"),
            ("https://exämple.com/a", "contains whitespace, control or non-ASCII characters"),
            ("https://example.com:0/a", "invalid port"),
            ("https://example.com:99999/a", "invalid port"),
            ("https://-bad.com/a", "invalid host name"),
            ("https:///a", "invalid host name"),
            ("https://example.com/a#frag", "the URL has a fragment"),
            ("oci://reg.io/fleet/agent", "the reference has neither a :tag nor an @sha256: digest"),
            ("oci://reg.io", "the reference has no repository"),
            ("oci://reg.io/Fleet/agent:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet//agent:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet/agent:.bad", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io/fleet/agent@sha512:abc", "only sha256 manifest digests are supported"),
            ("oci://reg.io/fleet/agent@sha256:ABC", "the digest is not 64 lowercase hex"),
            ("oci://reg.io/fleet/agent@sha256:", "the digest is not 64 lowercase hex"),
            ("oci://reg.io/fleet/agent:", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io/fleet/agent:1?x=y", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io/fleet/agent:1#f", "invalid tag: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '-', not starting with '.' or '-'"),
            ("oci://reg.io:5000/:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet/agent/:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/-fleet/agent:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://reg.io/fleet/agent:tag:1", "invalid repository: use lowercase path components separated by '/'"),
            ("oci://user@reg.io/fleet/agent:1", "credentials in the URL are not allowed"),
            ("oci://reg.io:0/fleet/agent:1", "invalid port"),
            ("oci://reg.io:5000", "the reference has no repository"),
            ("oci:reg.io/fleet/agent:1", "the scheme is neither https:// nor oci://"),
        ];
        for (url, why) in cases {
            assert_eq!(
                ArtifactUrl::parse(url),
                Err(ValidationError::ArtifactUrl {
                    url: url.to_string(),
                    why
                }),
                "{url}"
            );
        }
        let long = format!("https://example.com/{}", "a".repeat(1100));
        assert!(ArtifactUrl::parse(&long).is_err());
        assert!(ArtifactUrl::parse(&format!("oci://reg.io/a:tag@sha256:{d}")).is_err());
        assert_eq!(
            ArtifactUrl::parse("http://x/y").map_err(|e| e.to_string()),
            Err("invalid artifact url \"http://x/y\": the scheme is neither https:// nor oci://; use https://host[:port]/path or oci://host[:port]/repository:tag or oci://host[:port]/repository@sha256:<64 hex>".to_string())
        );
    }
}
