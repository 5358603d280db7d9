//! The status values a simulated device writes, built from the contract
//! types the agent uses (`fleet_common::contracts`), so that fleetctl
//! reads a simulated fleet exactly as a real one.

use std::collections::BTreeMap;

use fleet_common::contracts::{
    ConfigState, ConfigStateReport, DeviceInfo, Heartbeat, WorkloadSpec, WorkloadState,
    WorkloadStatus, WorkloadsReport,
};
use fleet_common::validate::{Arch, BoundedText, DeviceId, Version, WorkloadName};
use fleet_common::Timestamp;

use crate::Generation;

/// The agent version a device of `generation` reports: generation 1 is
/// agent 0.1.0, generation 2 this workspace's.
pub fn agent_version(generation: Generation) -> &'static str {
    match generation {
        Generation::One => "0.1.0",
        Generation::Two => env!("CARGO_PKG_VERSION"),
    }
}

fn text(v: &str) -> BoundedText {
    BoundedText::parse(v).unwrap_or_else(|e| panic!("{v:?}: {e}"))
}

fn version(generation: Generation) -> Version {
    Version::parse(agent_version(generation)).unwrap_or_else(|e| panic!("agent version: {e}"))
}

fn configured() -> ConfigStateReport {
    ConfigStateReport {
        state: ConfigState::Configured,
        waiting_changes: 0,
        intent_waiting: false,
    }
}

/// `<device>.info`, as the agent publishes it at start.
pub fn info(id: &DeviceId, generation: Generation, started: Timestamp) -> Vec<u8> {
    let info = DeviceInfo {
        device_id: id.clone(),
        agent_version: version(generation),
        arch: Arch::X86_64,
        os: text("Debian GNU/Linux 12 (bookworm)"),
        kernel: text("6.1.0-simulated"),
        podman_version: None,
        boot_id: text("00000000-0000-4000-8000-000000000000"),
        config_state: configured(),
        agent_started_at: started,
        updated_at: Timestamp::now(),
    };
    serde_json::to_vec(&info).unwrap_or_default()
}

/// `<device>.heartbeat`.
pub fn heartbeat(generation: Generation, uptime_secs: u64) -> Vec<u8> {
    let hb = Heartbeat {
        at: Timestamp::now(),
        uptime_secs,
        agent_version: version(generation),
        config_state: configured(),
        stopping: None,
        podman_unreachable: None,
    };
    serde_json::to_vec(&hb).unwrap_or_default()
}

/// `<device>.workloads`: the bench's one workload (`web`, the spec the
/// admin side writes; its marker is not tracked), pending: a simulated
/// device runs no container.
pub fn workloads() -> Vec<u8> {
    let spec: WorkloadSpec = serde_json::from_value(serde_json::json!({
        "image": "localhost/fleet-bench/app:2",
        "command": ["sleep", "simulated"],
    }))
    .unwrap_or_else(|e| panic!("the bench's workload spec: {e}"));
    let now = Timestamp::now();
    let status = WorkloadStatus {
        state: WorkloadState::Pending,
        image: spec.image.clone(),
        spec_hash: spec.spec_hash(),
        container_id: None,
        restarts: 0,
        last_error: None,
        since: now,
        waiting: Some(text("simulated device: no Podman")),
    };
    let name = WorkloadName::parse("web").unwrap_or_else(|e| panic!("web: {e}"));
    let report = WorkloadsReport {
        workloads: BTreeMap::from([(name, status)]),
        observed_at: now,
        podman_unreachable: None,
    };
    serde_json::to_vec(&report).unwrap_or_default()
}
