//! Mutations: making an image local, creating, replacing, restoring and
//! removing containers (one [`super::Action`] at a time, under the gate's
//! permit), and recording what each did: the applied specs (durably, in
//! `applied.json`), restarts, back-off and the last error.

use std::time::{Duration, Instant};

use fleet_common::contracts::{AppliedSpecs, PullPolicy, WorkloadSpec};
use fleet_common::durable;
use fleet_common::validate::WorkloadName;
use fleet_common::Timestamp;

use super::backoff::CRASH_LOOP_WINDOW;
use super::plan::{workload_of, Action};
use super::Reconciler;
use crate::desired::{DesiredEntry, DesiredMap};
use crate::gate::Permit;
use crate::podman::{LiveContainer, LiveState, PodmanError};

/// Where images may come from for a mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ImageSource {
    /// As the spec's pull policy says.
    AsSpecified,
    /// Local storage only (a change freeze).
    LocalOnly,
}

impl Reconciler {
    /// Records as applied the desired specs a running container already
    /// has (created by an earlier run whose record was lost).
    pub(super) fn adopt(&mut self, desired: &DesiredMap, live: &[LiveContainer]) {
        let mut changed = false;
        for (w, entry) in desired {
            let DesiredEntry::Valid(spec) = entry else {
                continue;
            };
            let hash = spec.spec_hash();
            if self.applied.get(w).map(WorkloadSpec::spec_hash) == Some(hash.clone()) {
                continue;
            }
            let running = live.iter().any(|c| {
                c.workload.as_ref() == Some(w)
                    && c.spec_hash.as_deref() == Some(hash.as_str())
                    && c.state == LiveState::Running
            });
            if running {
                self.applied.insert(w.clone(), spec.clone());
                changed = true;
            }
        }
        if changed {
            self.persist_applied();
        }
    }

    /// Makes the spec's image local: as its pull policy says, or, during a
    /// freeze, only when it is local already.
    pub(super) fn ensure_image(
        &self,
        permit: &Permit<'_>,
        spec: &WorkloadSpec,
        images: ImageSource,
    ) -> Result<(), PodmanError> {
        let p = &self.podman;
        match images {
            ImageSource::AsSpecified => {
                if p.needs_pull(&spec.image, spec.pull)? {
                    let _pulling = permit.pulling(spec.image.as_str());
                    p.pull(&spec.image)?;
                }
                Ok(())
            }
            ImageSource::LocalOnly => {
                if p.needs_pull(&spec.image, PullPolicy::Missing)? {
                    return Err(PodmanError::Failed {
                        what: format!("image {}", spec.image),
                        status: "not local".into(),
                        stderr: "a change freeze restores from local images only; it is pulled after the unfreeze".into(),
                    });
                }
                Ok(())
            }
        }
    }

    /// [`Self::ensure_image`], then creates and starts the container.
    ///
    /// When no pull can be called for (the policy is `missing` or `never`,
    /// or a freeze allows local images only), `podman run --pull=never` is
    /// tried first and the image is looked at only if that fails: one
    /// podman call instead of two in the common case (each costs ~50 ms of
    /// podman start-up, which desired-state put → running pays in full). A
    /// run that failed with the image local keeps its own error.
    pub(super) fn ensure_image_and_run(
        &self,
        permit: &Permit<'_>,
        workload: &WorkloadName,
        spec: &WorkloadSpec,
        images: ImageSource,
    ) -> Result<(), PodmanError> {
        let p = &self.podman;
        let may_pull_now = images == ImageSource::AsSpecified && spec.pull == PullPolicy::Always;
        if !may_pull_now {
            match p.run(&self.device, workload, spec) {
                Ok(_) => return Ok(()),
                Err(e) => match p.image_exists(&spec.image) {
                    Ok(true) => return Err(e),
                    // Not local: pulled, or refused, as the policy says.
                    Ok(false) => {}
                    // The run's error is the cause; the probe's only says
                    // Podman is unwell.
                    Err(probe) => {
                        log::warn!(device = self.device.as_str(), workload = workload.as_str(); "after a failed run, looking for the image: {probe}");
                        return Err(e);
                    }
                },
            }
        }
        self.ensure_image(permit, spec, images)?;
        p.run(&self.device, workload, spec).map(drop)
    }

    pub(super) fn execute(
        &self,
        action: &Action,
        permit: &Permit<'_>,
        images: ImageSource,
    ) -> Result<(), PodmanError> {
        let p = &self.podman;
        match action {
            Action::Remove { container } => p.remove(container),
            Action::Create { workload, spec, .. } => {
                self.ensure_image_and_run(permit, workload, spec, images)
            }
            Action::Replace {
                workload,
                spec,
                old,
            } => {
                // Pull before removing, so a failing pull keeps the old one.
                self.ensure_image(permit, spec, images)?;
                for c in old {
                    p.remove(c)?;
                }
                p.run(&self.device, workload, spec).map(drop)
            }
            Action::Restore {
                workload,
                container,
                spec,
            } => match p.start(container) {
                Ok(()) => Ok(()),
                Err(e) => match spec {
                    Some(spec) => {
                        log::warn!(device = self.device.as_str(), workload = workload.as_str(); "{e}; recreating the container");
                        p.remove(container)?;
                        self.ensure_image_and_run(permit, workload, spec, images)
                    }
                    None => Err(e),
                },
            },
        }
    }

    pub(super) fn record(
        &mut self,
        action: &Action,
        result: Result<(), PodmanError>,
        took: Duration,
    ) {
        let now = Instant::now();
        let device = self.device.clone();
        let what = action.describe();
        match (action, result) {
            (Action::Remove { container }, Ok(())) => {
                self.removal_backoff.remove(&container.id);
                if let Some(w) = &container.workload {
                    let still_desired = self.desired.as_ref().is_some_and(|d| d.contains_key(w));
                    if !still_desired && self.applied.remove(w).is_some() {
                        self.persist_applied();
                    }
                }
                log::info!(device = device.as_str(); "{what}: done in {} ms", took.as_millis());
            }
            (Action::Remove { container }, Err(e)) => {
                let b = self
                    .removal_backoff
                    .entry(container.id.clone())
                    .or_default();
                let d = b.fail(now);
                log::error!(device = device.as_str(), attempt = b.failures; "{what}: {e}; retrying in {} s", d.as_secs());
            }
            (action, Ok(())) => {
                let Some(w) = workload_of(action) else {
                    return;
                };
                let restore = action.is_restore();
                if let Some(t) = self.tracked.get_mut(w) {
                    t.last_error = None;
                    if restore {
                        t.restarts = t.restarts.saturating_add(1);
                        let looping = t
                            .last_restore
                            .is_some_and(|p| now.duration_since(p) < CRASH_LOOP_WINDOW);
                        t.last_restore = Some(now);
                        if looping {
                            let d = t.backoff.fail(now);
                            log::warn!(device = device.as_str(), workload = w.as_str(), attempt = t.backoff.failures; "restored again within {} s; the next restore waits {} s", CRASH_LOOP_WINDOW.as_secs(), d.as_secs());
                        }
                    } else {
                        t.backoff.clear();
                    }
                }
                if let Action::Create { spec, .. } | Action::Replace { spec, .. } = action {
                    self.applied.insert(w.clone(), spec.clone());
                    self.persist_applied();
                }
                log::info!(device = device.as_str(), workload = w.as_str(); "{what}: done in {} ms", took.as_millis());
            }
            (action, Err(e)) => {
                let Some(w) = workload_of(action) else {
                    return;
                };
                if let Some(t) = self.tracked.get_mut(w) {
                    let d = t.backoff.fail(now);
                    t.last_error = Some(e.to_string());
                    log::error!(device = device.as_str(), workload = w.as_str(), attempt = t.backoff.failures; "{what}: {e}; retrying in {} s", d.as_secs());
                }
            }
        }
    }

    pub(super) fn persist_applied(&self) {
        let record = AppliedSpecs {
            format: AppliedSpecs::FORMAT,
            workloads: self.applied.clone(),
            written_at: Timestamp::now(),
        };
        let written = serde_json::to_vec_pretty(&record)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                durable::write_atomic(&self.applied_path, &b, 0o640).map_err(|e| e.to_string())
            });
        if let Err(e) = written {
            log::error!(device = self.device.as_str(); "recording the applied specs in {}: {e}", self.applied_path.display());
        }
    }
}
