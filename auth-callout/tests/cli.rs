//! The binary's command line: help, version, keygen and public-key, and the
//! refusals of bad arguments and configs (exit 2 and 1, with what to do).

use std::process::{Command, Output};

use fleet_harness::bin_path;

fn run(args: &[&str]) -> Output {
    Command::new(bin_path("fleet-auth-callout"))
        .args(args)
        .env("FLEET_LOG", "error")
        .output()
        .expect("run fleet-auth-callout")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn help_and_version() {
    let o = run(&["--help"]);
    assert!(o.status.success());
    for key in ["issuer_seed_file", "jwks_url", "keygen", "device_claim"] {
        assert!(text(&o).contains(key), "help lacks {key}");
    }
    let o = run(&["--version"]);
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("fleet-auth-callout {}", env!("CARGO_PKG_VERSION"))
    );
    let o = run(&["--bogus"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("see fleet-auth-callout --help"),
        "{}",
        text(&o)
    );
}

#[test]
fn keygen_and_public_key_agree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = dir.path().join("issuer.nk");
    let seed = seed.to_str().expect("utf-8");
    let o = run(&["keygen", seed]);
    assert!(o.status.success(), "{}", text(&o));
    let public = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    assert!(public.starts_with('A') && public.len() == 56, "{public}");
    let o = run(&["public-key", seed]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), public);
    // Never overwrites a seed.
    let o = run(&["keygen", seed]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("cannot write the new seed file"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_bad_config_stops_it_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("auth-callout.json");
    std::fs::write(
        &config,
        r#"{"issuer": "http://idp.example.com", "audience": "a", "jwks_url": "https://idp.example.com/keys",
            "nats_url": "nats://127.0.0.1:4222", "nats_password_file": "/x", "issuer_seed_file": "/y"}"#,
    )
    .expect("write");
    let o = run(&["--config", config.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("config issuer: \"http://idp.example.com\" is not an https:// URL"),
        "{}",
        text(&o)
    );
    let o = run(&["--config", "/nonexistent/auth-callout.json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("cannot read the config /nonexistent/auth-callout.json"),
        "{}",
        text(&o)
    );
}
