//! Every type that crosses a process or wire boundary, with stable
//! kebab-case JSON (pinned by the golden tests in `tests/golden.rs`).

mod attempt;
mod bounded;
mod device;
mod enroll;
mod health;
mod journal;
mod local;
mod oci;
mod operator;
mod release;
mod seen;
mod selftest;
mod spec_error;
mod status;
mod traffic;
mod workload;

pub use attempt::AgentUpgradeAttempt;
pub use bounded::{Bounded, Transitions};
pub use device::{
    ConfigState, ConfigStateReport, DeviceInfo, Freeze, FreezeFile, Heartbeat, PodmanUnreachable,
    Stopping,
};
pub use enroll::{
    check_facts, AnswerState, Conflict, DeviceRecord, EnrollAnswer, EnrollRequest,
    EnrollRequestError, Enrolled, LobbyTicket, Preauthorized, RecordState, FACT_AGENT_VERSION,
    FACT_ARCH, FACT_MACHINE_ID, FACT_OS, FACT_SERIAL, MAX_ENROLL_REQUEST_BYTES, MAX_FACTS,
    MAX_FACT_CHARS, MAX_REASON_CHARS,
};
pub use health::{
    FailedSpec, HealthCheck, HealthReport, HealthState, Probe, ProbeResult, Revert, RevertReason,
    UpdateStrategy, WorkloadHealth, WorkloadHealthRecord, WorkloadHealthState,
    DEFAULT_HEALTHY_AFTER_SECS, MAX_HEALTH_PATH_CHARS, MAX_HEALTH_PERIOD_SECS, MAX_HEALTH_RETRIES,
    MAX_PROBE_ARGS, MAX_PROBE_ARG_CHARS,
};
pub use journal::{
    FinishedAttempt, Journal, JournalError, JournalPhase, JournalTransition, Transaction,
    JOURNAL_FORMAT,
};
pub use local::{
    AgentRequest, AgentStatusReply, ConfigStateName, ConfigStateReply, ErrorBody, ErrorCode,
    MutationAdmission, MutationsView, NatsView, Refusal, Response, UpdaterReply, UpdaterRequest,
    UpdaterView, UpgradeView,
};
pub use oci::{
    registry_error_summary, AgentArtifact, ManifestError, OciDescriptor, OciDigest, OciManifest,
    AGENT_ARTIFACT_TYPE, AGENT_BINARY_MEDIA_TYPE, MAX_REGISTRY_ERROR_BYTES, OCI_EMPTY_BLOB,
    OCI_EMPTY_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE,
};
pub use operator::{
    check_label, is_label_key, is_label_value, is_rollout_id, BatchResult, DeviceLabels,
    LabelError, PreviousSpec, PreviousSpecs, RolloutFailure, RolloutKind, RolloutPhase,
    RolloutState, SpecDevices, WorkloadRollout, FACT_NAMES, MAX_LABELS_PER_DEVICE, MAX_LABEL_CHARS,
    MAX_ROLLOUT_ID_CHARS,
};
pub use release::{Release, ReleaseArtifact, ReleaseArtifacts, ReleaseError};
pub use seen::{
    AttemptBinding, AttemptBindings, AttemptOutcome, BindError, SeenAttempt, SeenAttempts,
};
pub use selftest::{SelfTestCheck, SelfTestReport};
pub use spec_error::SpecError;
pub use status::{
    FieldExcerpt, IntentRef, IntentRule, RefusalReason, RefusedIntent, StatusTransition,
    UpgradePhase, UpgradeReason, UpgradeReport, UpgradeStatus,
};
pub use traffic::{TrafficCounters, TrafficDay, TrafficReport, TCP_IPV4_HEADER_BYTES};
pub use workload::{
    AppliedSpecs, DesiredWorkloads, DesiredWorkloadsRaw, ImageRef, PortMapping, Protocol,
    PullPolicy, RestartPolicy, SpecParseError, VolumeMount, WorkloadSpec, WorkloadState,
    WorkloadStatus, WorkloadsReport, SPEC_FIELDS_SINCE,
};
