//! `fleet-updater run`: the daemon's start, in the order recovery requires
//! (`docs/design/upgrade.md` "Recovery").
//!
//! 1. Settings: config file, bounds, directories; temp files of an
//!    interrupted write removed.
//! 2. The journal: a corrupt one stops here, before any socket exists.
//! 3. The HTTPS client and the service manager.
//! 4. Recovery, first half: the previous link selected and the recovery
//!    phase persisted ([`transaction::recover`]). On a full disk the phase
//!    may not be written: the link is selected all the same and the
//!    updater goes on, so the device is never left without an agent; the
//!    recovery thread writes the journal once space is freed.
//! 5. The socket, then `READY=1`.
//! 6. Recovery, second half (stop/start), on the `updater-recovery` thread,
//!    which holds the mutator meanwhile (an `upgrade` is told `busy`, a
//!    `status` is answered), then, on a full disk, the journal write that
//!    failed, retried with backoff until it succeeds
//!    ([`transaction::settle`]).
//!
//! SIGTERM ends the process like a crash would: the journal makes every
//! instant safe, and the next start recovers.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use fleet_common::layout::AGENT_GROUP;
use fleet_common::socket::{PeerPolicy, SocketError, SocketServer};
use fleet_common::{durable, users, Layout};

use crate::config::{Bounds, ConfigError, UpdaterConfig};
use crate::fetch::{Fetcher, TlsSetupError};
use crate::journal::{Found, JournalLoadError, JournalStore};
use crate::server::UpdaterHandler;
use crate::service::SupervisorError;
use crate::service::{ManagerKind, ServiceManager, Supervisor, Systemctl};
use crate::state::Shared;
use crate::status::StatusInfo;
use crate::transaction::{self, Context};

/// Socket mode: owner and group read-write (root and the agent's group).
const SOCKET_MODE: u32 = 0o660;

/// `fleet-updater run` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunArgs {
    pub root: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub manager: ManagerKind,
}

/// Why the daemon could not start.
#[derive(Debug)]
pub enum DaemonError {
    Config(ConfigError),
    Bounds(String),
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    Journal(JournalLoadError),
    Tls(TlsSetupError),
    Supervisor(SupervisorError),
    Socket(SocketError),
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => e.fmt(f),
            Self::Bounds(e) => f.write_str(e),
            Self::Directory { path, source } => write!(
                f,
                "creating {}: {source}: check the file system is writable",
                path.display()
            ),
            Self::Journal(e) => e.fmt(f),
            Self::Tls(e) => write!(f, "artifact trust store: {e} (updater config key ca-file)"),
            Self::Supervisor(e) => e.fmt(f),
            Self::Socket(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for DaemonError {}

/// Runs the daemon; returns only on a start-up error.
pub fn run(args: RunArgs) -> Result<(), DaemonError> {
    let layout = args
        .root
        .as_ref()
        .map_or_else(Layout::production, Layout::with_root);
    let config_path = args
        .config
        .clone()
        .unwrap_or_else(|| layout.updater_config());
    let config =
        UpdaterConfig::load(&config_path, args.config.is_some()).map_err(DaemonError::Config)?;
    let bounds = Bounds::from_env().map_err(DaemonError::Bounds)?;
    for dir in [
        layout.updater_state_dir(),
        layout.run_dir(),
        layout.versions_dir(),
    ] {
        std::fs::create_dir_all(&dir).map_err(|source| DaemonError::Directory {
            path: dir.clone(),
            source,
        })?;
    }
    remove_stale_temps(&layout);

    let (store, found) = JournalStore::load(&layout).map_err(DaemonError::Journal)?;
    if found == Found::Missing {
        log::info!(
            "no journal at {}: no upgrade has run on this device",
            store.path().display()
        );
    }
    let fetcher = Fetcher::new(config.ca_file.as_deref(), &bounds).map_err(DaemonError::Tls)?;
    let service: Box<dyn ServiceManager> = match args.manager {
        ManagerKind::Systemctl => Box::new(Systemctl::new(&config.agent_unit)),
        ManagerKind::Supervisor => Box::new(
            Supervisor::spawn(&layout, &config.probe_user, &config.agent_unit)
                .map_err(DaemonError::Supervisor)?,
        ),
    };
    let info = StatusInfo::new(service.unit());
    let ctx = Arc::new(Context {
        layout: layout.clone(),
        fetcher,
        service,
        probe_user: config.probe_user.clone(),
        bounds,
    });
    let shared = Shared::new(store);
    let mut mutator = shared
        .try_mutator()
        .expect("INVARIANT: the first mutator is taken before any other thread exists");
    let pending = transaction::recover(&mut mutator, &ctx);

    let group = users::lookup_group(AGENT_GROUP);
    let (uid, _) = users::current_ids();
    let mut uids = vec![0, uid];
    uids.dedup();
    let policy = PeerPolicy {
        uids,
        gids: group.into_iter().collect(),
    };
    let server = SocketServer::bind(
        "updater",
        &layout.updater_socket(),
        SOCKET_MODE,
        group,
        policy,
    )
    .map_err(DaemonError::Socket)?;
    let handler = Arc::new(UpdaterHandler::new(
        Arc::clone(&shared),
        Arc::clone(&ctx),
        info,
    ));
    let _server = server.spawn(handler).map_err(DaemonError::Socket)?;

    let _ = libsystemd::daemon::notify(false, &[libsystemd::daemon::NotifyState::Ready]);
    shared.notify_status();
    log::info!(
        "fleet-updater ready on {} (recovery: {pending})",
        layout.updater_socket().display()
    );

    // The thread exists before it gets the mutator, so that if it cannot
    // be created the rest of recovery still runs, here.
    let (give, take) = std::sync::mpsc::channel();
    let recovery_ctx = Arc::clone(&ctx);
    let spawned = std::thread::Builder::new()
        .name("updater-recovery".to_owned())
        .spawn(move || {
            if let Ok(mut m) = take.recv() {
                transaction::complete_recovery(&mut m, &recovery_ctx, pending);
                log::info!("recovery complete");
                transaction::settle(&mut m, &recovery_ctx);
            }
        });
    match spawned {
        Ok(_) => {
            let _ = give.send(mutator);
        }
        Err(e) => {
            log::warn!("cannot start the recovery thread ({e}); recovering on the main thread");
            transaction::complete_recovery(&mut mutator, &ctx, pending);
            log::info!("recovery complete");
            transaction::settle(&mut mutator, &ctx);
            drop(mutator);
        }
    }
    loop {
        std::thread::park();
    }
}

/// Temp files of a run that was killed mid-write, in the directories the
/// updater owns: downloads (`.fleet-agent-v*.tmp.*`, up to 100 MiB each) in
/// the versions directory, journal writes (`.journal.json.tmp.*`) in its
/// state directory, and active-link switches (`.fleet-agent.tmp.*`) beside
/// the link. Only names [`durable`] gives its temp files are removed, and
/// only before anything of this run writes.
fn remove_stale_temps(layout: &Layout) {
    let link_dir = layout.active_agent_link().parent().map(PathBuf::from);
    let places = [
        (Some(layout.versions_dir()), "fleet-agent-v"),
        (Some(layout.updater_state_dir()), ""),
        (link_dir, "fleet-agent"),
    ];
    for (dir, prefix) in places {
        let Some(dir) = dir else { continue };
        for t in durable::remove_stale_temps(&dir, prefix) {
            match t.removed {
                Ok(()) => log::info!(
                    "removed the stale temp file {} ({} bytes) of an interrupted write",
                    t.path.display(),
                    t.bytes
                ),
                Err(e) => log::warn!("removing the stale temp file {}: {e}", t.path.display()),
            }
        }
    }
}
