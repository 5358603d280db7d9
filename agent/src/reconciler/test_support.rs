//! Helpers shared by the reconciler's unit tests.

use fleet_common::contracts::WorkloadSpec;
use fleet_common::validate::WorkloadName;

use super::plan::Action;
use crate::podman::{LiveContainer, LiveState};

pub(super) fn w(n: &str) -> WorkloadName {
    WorkloadName::parse(n).expect("name")
}

pub(super) fn spec(image: &str) -> WorkloadSpec {
    WorkloadSpec::from_json(format!(r#"{{"image":"{image}"}}"#).as_bytes()).expect("spec")
}

pub(super) fn container(id: &str, workload: &str, hash: &str, state: LiveState) -> LiveContainer {
    LiveContainer {
        id: id.into(),
        name: format!("fleet-{workload}"),
        state,
        image: "img".into(),
        workload: WorkloadName::parse(workload).ok(),
        spec_hash: Some(hash.into()),
        started_at: 0,
        pid: 0,
    }
}

pub(super) fn kinds(actions: &[Action]) -> Vec<String> {
    actions.iter().map(Action::describe).collect()
}
