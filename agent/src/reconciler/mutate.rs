//! Mutations: making an image local, creating, replacing, restoring and
//! removing containers (one [`super::Action`] at a time, under the gate's
//! permit), and recording what each did: the applied specs (durably, in
//! `applied.json`), restarts, back-off and the last error.

use std::time::{Duration, Instant};

use fleet_common::contracts::{PullPolicy, WorkloadSpec};
use fleet_common::validate::WorkloadName;

use super::backoff::CRASH_LOOP_WINDOW;
use super::health::Health;
use super::plan::{workload_of, Action};
use super::records::Held;
use super::{unix_now, Reconciler};
use crate::desired::{DesiredEntry, DesiredMap};
use crate::gate::Permit;
use crate::podman::{container_name, LiveContainer, LiveState, PodmanError};

/// A mutation that failed. `ran`: a `podman run` of the spec was tried
/// with its image local (so the spec itself may be at fault, and its
/// trial clock runs), not only a pull or a removal.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) error: PodmanError,
    pub(super) ran: bool,
}

impl Failure {
    fn before_run(error: PodmanError) -> Self {
        Self { error, ran: false }
    }
    fn of_run(error: PodmanError) -> Self {
        Self { error, ran: true }
    }
}

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
            self.persist();
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
        name: &str,
        images: ImageSource,
    ) -> Result<String, Failure> {
        let p = &self.podman;
        let may_pull_now = images == ImageSource::AsSpecified && spec.pull == PullPolicy::Always;
        if !may_pull_now {
            match p.run(&self.device, workload, spec, name) {
                Ok(id) => return Ok(id),
                Err(e) => match p.image_exists(&spec.image) {
                    Ok(true) => return Err(Failure::of_run(e)),
                    // Not local: pulled, or refused, as the policy says.
                    Ok(false) => {}
                    // The run's error is the cause; the probe's only says
                    // Podman is unwell.
                    Err(probe) => {
                        log::warn!(device = self.device.as_str(), workload = workload.as_str(); "after a failed run, looking for the image: {probe}");
                        return Err(Failure::before_run(e));
                    }
                },
            }
        }
        self.ensure_image(permit, spec, images)
            .map_err(Failure::before_run)?;
        p.run(&self.device, workload, spec, name)
            .map_err(Failure::of_run)
    }

    /// Does `action`; the id of the container it created, if any.
    pub(super) fn execute(
        &self,
        action: &Action,
        permit: &Permit<'_>,
        images: ImageSource,
    ) -> Result<Option<String>, Failure> {
        let p = &self.podman;
        match action {
            Action::Remove { container } => p
                .remove(container)
                .map(|()| None)
                .map_err(Failure::before_run),
            Action::Create {
                workload,
                spec,
                name,
                ..
            } => self
                .ensure_image_and_run(permit, workload, spec, name, images)
                .map(Some),
            Action::Replace {
                workload,
                spec,
                old,
            } => {
                // Pull before removing, so a failing pull keeps the old one.
                self.ensure_image(permit, spec, images)
                    .map_err(Failure::before_run)?;
                for c in old {
                    p.remove(c).map_err(Failure::before_run)?;
                }
                p.run(&self.device, workload, spec, &container_name(workload))
                    .map(Some)
                    .map_err(Failure::of_run)
            }
            Action::Restore {
                workload,
                container,
                spec,
            } => match p.start(container) {
                Ok(()) => Ok(None),
                Err(e) => match spec {
                    Some(spec) => {
                        log::warn!(device = self.device.as_str(), workload = workload.as_str(); "{e}; recreating the container");
                        p.remove(container).map_err(Failure::before_run)?;
                        self.ensure_image_and_run(permit, workload, spec, &container.name, images)
                            .map(Some)
                    }
                    None => Err(Failure::before_run(e)),
                },
            },
        }
    }

    pub(super) fn record(
        &mut self,
        action: &Action,
        result: Result<Option<String>, Failure>,
        took: Duration,
    ) {
        let now = Instant::now();
        let device = self.device.clone();
        let what = action.describe();
        match (action, result) {
            (Action::Remove { container }, Ok(_)) => {
                self.removal_backoff.remove(&container.id);
                if let Some(w) = &container.workload {
                    // A workload left stopped (its only spec failed) runs
                    // nothing once its container is gone.
                    let still_desired = self.desired.as_ref().is_some_and(|d| d.contains_key(w))
                        && !matches!(self.held.get(w), Some(Held::Stopped { .. }));
                    if !still_desired && self.applied.remove(w).is_some() {
                        self.persist();
                    }
                }
                log::info!(device = device.as_str(); "{what}: done in {} ms", took.as_millis());
            }
            (Action::Remove { container }, Err(Failure { error: e, .. })) => {
                let b = self
                    .removal_backoff
                    .entry(container.id.clone())
                    .or_default();
                let d = b.fail(now);
                log::error!(device = device.as_str(), attempt = b.failures; "{what}: {e}; retrying in {} s", d.as_secs());
            }
            (action, Ok(created)) => {
                let Some(w) = workload_of(action) else {
                    return;
                };
                if let Action::Create { spec, .. }
                | Action::Replace { spec, .. }
                | Action::Restore {
                    spec: Some(spec), ..
                } = action
                {
                    self.attempted(w, spec, created.as_deref());
                }
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
                    self.persist();
                }
                log::info!(device = device.as_str(), workload = w.as_str(); "{what}: done in {} ms", took.as_millis());
            }
            (action, Err(Failure { error: e, ran })) => {
                let Some(w) = workload_of(action) else {
                    return;
                };
                if let (true, Action::Create { spec, .. } | Action::Replace { spec, .. }) =
                    (ran, action)
                {
                    self.attempted(w, spec, None);
                }
                if let Some(t) = self.tracked.get_mut(w) {
                    let d = t.backoff.fail(now);
                    t.last_error = Some(e.to_string());
                    log::error!(device = device.as_str(), workload = w.as_str(), attempt = t.backoff.failures; "{what}: {e}; retrying in {} s", d.as_secs());
                }
            }
        }
    }

    /// Writes the applied specs and the health records
    /// (`workload-health.json`, then `applied.json`: see `records`).
    pub(super) fn persist(&self) {
        if let Err(e) = self.files.write(&self.applied, &self.records) {
            log::error!(device = self.device.as_str(); "recording the applied specs and workload health: {e}");
        }
    }

    /// The reconciler ran (or tried to run, with the image local) `spec`
    /// for `w`: its health is now about that spec, and a trial's clock
    /// runs. A container just created is probed at once, before `ps`
    /// shows it.
    fn attempted(&mut self, w: &WorkloadName, spec: &WorkloadSpec, created: Option<&str>) {
        let hash = spec.spec_hash();
        let check = spec.health.clone().unwrap_or_default();
        let h = self
            .health
            .entry(w.clone())
            .or_insert_with(|| Health::new(hash.clone(), check.clone()));
        if h.spec_hash != hash {
            h.switch(hash, check);
        }
        h.attempted(created, unix_now(), Instant::now());
        self.send_probe_targets();
    }
}
