//! `fleetctl artifact push`: publish an agent binary in an OCI registry.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{Failure, Output};
use crate::artifact;
use fleet_common::validate::{OciReference, OciTarget};

/// Publish agent releases in an OCI registry
#[derive(Debug, Args)]
#[command(arg_required_else_help = true)]
pub struct Artifact {
    #[command(subcommand)]
    command: ArtifactCommand,
}

#[derive(Debug, Subcommand)]
enum ArtifactCommand {
    /// Upload an agent binary as a fleet agent release
    #[command(long_about = "Upload an agent binary as a fleet agent release.

Uploads the binary as an OCI artifact (artifactType \
application/vnd.harmony.fleet-agent.v1, one layer of media type \
application/vnd.harmony.fleet-agent.binary.v1, the empty config) and prints \
the manifest digest, the pinned reference, the sha256 and size, and the \
entry to put under \"artifacts\" of a release file (keyed by the binary's \
architecture) for fleetctl upgrade and rollout. HTTPS only, anonymous.")]
    Push {
        /// oci://host[:port]/repository:tag
        #[arg(value_name = "OCI-REFERENCE", value_parser = parse_tag)]
        reference: OciReference,
        /// The fleet-agent binary (at most 100 MiB)
        #[arg(value_name = "BINARY")]
        binary: PathBuf,
        /// Extra CA certificates (PEM) trusted for the registry
        #[arg(long, value_name = "PEM")]
        ca_file: Option<PathBuf>,
    },
}

/// An OCI reference to a tag: a push names a tag, and prints the digest to
/// pin.
fn parse_tag(s: &str) -> Result<OciReference, String> {
    let reference = OciReference::parse(s).map_err(|e| e.to_string())?;
    if let OciTarget::Digest(_) = reference.target() {
        return Err(format!(
            "{reference}: push to a tag (oci://host[:port]/repository:tag); the digest to pin is printed after the push"
        ));
    }
    Ok(reference)
}

impl Artifact {
    pub fn run(self) -> Result<Output, Failure> {
        let ArtifactCommand::Push {
            reference,
            binary,
            ca_file,
        } = self.command;
        let pushed = artifact::push(&reference, &binary, ca_file.as_deref())
            .map_err(|e| Failure::Other(format!("fleetctl artifact push: {e}")))?;
        Ok(Output::text(pushed.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Command};
    use super::*;

    fn push(a: &[&str]) -> Result<ArtifactCommand, String> {
        match parse(std::iter::once("artifact").chain(a.iter().copied())) {
            Ok(cli) => match cli.command {
                Some(Command::Artifact(Artifact { command })) => Ok(command),
                other => panic!("{a:?}: {other:?}"),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn push_arguments() {
        let ArtifactCommand::Push {
            reference,
            binary,
            ca_file,
        } = push(&[
            "push",
            "oci://reg.io:5000/fleet/agent:2.0",
            "./fleet-agent",
            "--ca-file",
            "/ca.pem",
        ])
        .expect("valid");
        assert_eq!(
            reference,
            OciReference::parse("oci://reg.io:5000/fleet/agent:2.0").expect("ref")
        );
        assert_eq!(binary, PathBuf::from("./fleet-agent"));
        assert_eq!(ca_file, Some(PathBuf::from("/ca.pem")));
        let refused = |a: &[&str]| push(a).expect_err("refused");
        assert!(refused(&["pull"]).contains("unrecognized subcommand 'pull'"));
        assert!(refused(&["push", "oci://reg.io/a:1"])
            .contains("the following required arguments were not provided:\n  <BINARY>"));
        assert!(refused(&["push", "oci://reg.io/a:1", "b", "--ca-file"])
            .contains("a value is required for '--ca-file <PEM>' but none was supplied"));
        assert!(refused(&["push", "oci://reg.io/a:1", "b", "--insecure"])
            .contains("unexpected argument '--insecure' found"));
        assert!(refused(&["push", "https://reg.io/a", "b"])
            .contains("an oci:// reference is required here"));
        assert!(refused(&["push", "oci://reg.io/a", "b"])
            .contains("the reference has neither a :tag nor an @sha256: digest"));
        let d = "a".repeat(64);
        assert!(
            refused(&["push", &format!("oci://reg.io/a@sha256:{d}"), "b"])
                .contains("push to a tag")
        );
    }
}
