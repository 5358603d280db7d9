//! `fleet-bench` (`make bench`): measures every target of
//! `docs/development/bench.md` ("Targets") on the release binaries, each
//! beside a baseline measured in the same run, and prints one markdown
//! table (also written to `<target>/bench/last-run.md`). Each section's
//! rows also go to its page `docs/bench/<section>.md` ([`pages`]), which a
//! run rewrites only for the sections it ran.
//!
//! Sections, in order (`--only` picks some):
//! - `sizes`: stripped binary sizes ([`bins`]);
//! - `device`: one agent with 20 workloads and one idle updater: memory,
//!   idle CPU over a window, put → running, put → healthy ([`agent`], [`updater`]);
//! - `download`: 100 MiB download + verify, and the updater's peak memory
//!   ([`updater`]);
//! - `fleet`: N simulated agents converging on one change ([`fleet`]);
//! - `rollout`: `fleetctl rollout` over 10,000 devices ([`rollout`]);
//! - `cutover`: the updater's cutover against `systemctl restart`, in a
//!   booted Debian container ([`cutover`]);
//! - `scale`: simulated fleets of both device protocols on a 3-node
//!   cluster ([`scale`]);
//! - `scale-leaf` (only with `--only`): simulated devices on leaf nodes of
//!   a 3-node hub ([`scale_leaf`]);
//! - `metrics`: the Prometheus exporter over N seeded devices ([`metrics`]);
//! - `enrollment`: N simulated devices enrolling at once through the auth
//!   callout beside N static users: time to approved, memory per device,
//!   the reconnect storm after a node kill on a 3-node cluster
//!   ([`enrollment`]);
//! - `traffic`: one idle device's bytes on the wire per 30 days, a desired
//!   change, an upgrade, against the released 0.2.0 agent ([`traffic`]).
//!
//! Every server and process is started here and stopped on exit, whatever
//! way the run ends (guards); a missing tool panics naming its Debian
//! package.

mod agent;
mod bins;
mod cutover;
mod enrollment;
mod fleet;
mod metrics;
mod notify;
mod pages;
mod procfs;
mod report;
mod rollout;
mod scale;
mod scale_leaf;
mod traffic;
mod updater;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use fleet_harness::{NatsServer, NatsVersion, Podman, TestCa};

use crate::agent::{share, AgentBench, DEVICE};
use crate::bins::Build;
use crate::report::{mib, Row, Table, Verdict};
use crate::updater::{Artifact, UpdaterBench};

const USAGE: &str =
    "fleet-bench: measures the targets of docs/development/bench.md (run it with `make bench`)

Usage: fleet-bench [--only SECTION,...] [--cpu-secs N] [--download-runs N]
                   [--latency-runs N] [--fleet N,...] [--rollout N] [--metrics N]
                   [--cutover-runs N] [--scale N,...] [--scale-window-secs N]
                   [--scale-nats 2.14,2.9] [--scale-gen 1,2] [--docs-dir DIR]
                   [--scale-steady] [--scale-processes auto|P] [--traffic-secs N]
                   [--scale-leaf-devices N] [--leaves K] [--scale-leaf-rate N]
                   [--scale-leaf-callout] [--enrollment N]

Sections: sizes, device, download, fleet, rollout, cutover, scale, traffic,
          metrics, enrollment
          (default: all), and scale-leaf (only when named in --only: N
          generation-2 devices on K leaf nodes of a 3-node hub;
          --scale-leaf-devices 20000 --leaves 3 --scale-leaf-rate 2000
          (devices started a second), the devices over --scale-processes
          workers, auto: at least 2; --scale-leaf-callout: the callout
          layout, every device preauthorized with its own key).
Defaults: --cpu-secs 60 --download-runs 5 --latency-runs 9 --fleet 100,1000
          --rollout 10000 --metrics 100000 --enrollment 10000 --cutover-runs 7
          --scale 1000,10000
          --scale-window-secs 30 --scale-nats 2.14 --scale-gen 1,2
          (--scale-gen 2 leaves out the baseline, generation 1, which cannot
          bring a fleet up past ~15,000 devices here) --traffic-secs 600
          (--scale-steady: the scale section measures only the steady state,
          agent 0.3's protocol against 0.2's heartbeat protocol, each on a
          fresh cluster)
          --scale-processes auto (the simulated devices in the bench's own
          process up to 18,000, past that split over ceil(N / 18,000)
          fleet-sim-worker processes; P: P worker processes at every N,
          1 = the bench's own process)

Each section run rewrites its page DIR/<section>.md (default: docs/bench in
the workspace) between the page's markers; the others are left as they are.
The whole table also goes to <target>/bench/last-run.md.
";

/// Every section of a default run, in the order they run.
const SECTIONS: [&str; 10] = [
    "sizes",
    "device",
    "download",
    "fleet",
    "rollout",
    "cutover",
    "scale",
    "traffic",
    "metrics",
    "enrollment",
];
/// Sections run only when `--only` names them (after `scale`).
const EXTRA_SECTIONS: [&str; 1] = ["scale-leaf"];

#[derive(Debug)]
struct Args {
    sections: Vec<String>,
    cpu_window: Duration,
    download_runs: usize,
    latency_runs: usize,
    fleet: Vec<usize>,
    rollout: usize,
    /// Devices of the metrics section.
    metrics: usize,
    /// Devices of the enrollment section.
    enrollment: usize,
    cutover_runs: usize,
    scale: Vec<usize>,
    scale_window: Duration,
    scale_nats: Vec<NatsVersion>,
    /// Whether the scale section also runs generation 1 (the baseline).
    scale_baseline: bool,
    /// The scale section measures only the steady state, 0.3 against 0.2.
    scale_steady: bool,
    /// How many processes hold the scale section's simulated devices.
    scale_processes: scale::Processes,
    /// Devices of the scale-leaf section.
    scale_leaf_devices: usize,
    /// Leaf nodes of the scale-leaf section.
    leaves: usize,
    /// Devices the scale-leaf section starts a second.
    scale_leaf_rate: u32,
    /// The scale-leaf section on the callout layout (preauthorized
    /// devices with their own keys) instead of static users.
    scale_leaf_callout: bool,
    /// The traffic section's idle window.
    traffic_window: Duration,
    /// Where the sections' pages are written.
    docs_dir: PathBuf,
    /// The arguments as given, for the pages.
    given: Vec<String>,
}

impl Args {
    fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
        let given: Vec<String> = args.collect();
        let mut a = Args {
            sections: SECTIONS.iter().map(|s| (*s).to_owned()).collect(),
            cpu_window: Duration::from_secs(60),
            download_runs: 5,
            latency_runs: 9,
            fleet: vec![100, 1000],
            rollout: 10_000,
            metrics: 100_000,
            enrollment: 10_000,
            cutover_runs: 7,
            scale: vec![1_000, 10_000],
            scale_window: Duration::from_secs(30),
            scale_nats: vec![NatsVersion::V2_14],
            scale_baseline: true,
            traffic_window: Duration::from_secs(600),
            scale_steady: false,
            scale_processes: scale::Processes::Auto,
            scale_leaf_devices: 20_000,
            leaves: 3,
            scale_leaf_rate: scale::START_RATE,
            scale_leaf_callout: false,
            docs_dir: fleet_harness::workspace_root().join("docs").join("bench"),
            given: given.clone(),
        };
        let mut args = given.into_iter().peekable();
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
            let number = |v: String| {
                v.parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{v:?} is not a positive number"))
            };
            match arg.as_str() {
                "--only" => {
                    a.sections = value()?.split(',').map(str::to_owned).collect();
                    for s in &a.sections {
                        if !SECTIONS.contains(&s.as_str()) && !EXTRA_SECTIONS.contains(&s.as_str())
                        {
                            return Err(format!("unknown section {s:?}"));
                        }
                    }
                }
                "--cpu-secs" => a.cpu_window = Duration::from_secs(number(value()?)? as u64),
                "--download-runs" => a.download_runs = number(value()?)?,
                "--rollout" => a.rollout = number(value()?)?,
                "--metrics" => a.metrics = number(value()?)?,
                "--enrollment" => a.enrollment = number(value()?)?,
                "--cutover-runs" => a.cutover_runs = number(value()?)?,
                "--latency-runs" => a.latency_runs = number(value()?)?,
                "--scale-nats" => {
                    a.scale_nats = value()?
                        .split(',')
                        .map(|v| match v {
                            "2.14" => Ok(NatsVersion::V2_14),
                            "2.9" => Ok(NatsVersion::V2_9),
                            other => Err(format!(
                                "{other:?} is not a nats-server version (2.14, 2.9)"
                            )),
                        })
                        .collect::<Result<_, _>>()?
                }
                "--scale-gen" => {
                    a.scale_baseline = match value()?.as_str() {
                        "1,2" | "2,1" => true,
                        "2" => false,
                        other => {
                            return Err(format!(
                                "--scale-gen {other:?}: 1,2 (both, generation 1 the baseline) or 2"
                            ))
                        }
                    }
                }
                "--scale-steady" => a.scale_steady = true,
                "--scale-leaf-callout" => a.scale_leaf_callout = true,
                "--scale-leaf-devices" => a.scale_leaf_devices = number(value()?)?,
                "--leaves" => a.leaves = number(value()?)?,
                "--scale-leaf-rate" => {
                    a.scale_leaf_rate = u32::try_from(number(value()?)?)
                        .map_err(|_| "--scale-leaf-rate: at most 4294967295 a second".to_owned())?
                }
                "--scale-processes" => {
                    a.scale_processes = match value()?.as_str() {
                        "auto" => scale::Processes::Auto,
                        v => scale::Processes::Fixed(number(v.to_owned()).map_err(|e| {
                            format!("--scale-processes: {e} (auto, or how many processes)")
                        })?),
                    }
                }
                "--traffic-secs" => {
                    a.traffic_window = Duration::from_secs(number(value()?)? as u64)
                }
                "--scale-window-secs" => {
                    a.scale_window = Duration::from_secs(number(value()?)? as u64)
                }
                "--scale" => {
                    a.scale = value()?
                        .split(',')
                        .map(|n| number(n.to_owned()))
                        .collect::<Result<_, _>>()?
                }
                "--fleet" => {
                    a.fleet = value()?
                        .split(',')
                        .map(|n| number(n.to_owned()))
                        .collect::<Result<_, _>>()?
                }
                "--docs-dir" => a.docs_dir = PathBuf::from(value()?),
                "--help" | "-h" => return Err(String::new()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(a)
    }

    fn has(&self, section: &str) -> bool {
        self.sections.iter().any(|s| s == section)
    }

    /// The arguments as a page shows them.
    fn shown(&self) -> String {
        if self.given.is_empty() {
            "none (every section, default sizes)".to_owned()
        } else {
            format!("`{}`", self.given.join(" "))
        }
    }
}

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fleet-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (results, times) = run(&args);
    let header = header();
    let table = Table::joined(results.iter().map(|(_, t)| t));
    let md = table.render(&format!("{header}\n\n{}", times.summary()));
    println!("\n{md}");
    let out = bins::target_dir().join("bench");
    let path = out.join("last-run.md");
    if let Err(e) = std::fs::create_dir_all(&out).and_then(|()| std::fs::write(&path, &md)) {
        eprintln!("fleet-bench: writing {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    let mut pages_ok = true;
    for (section, took) in &times.done {
        let empty = Table::default();
        let rows = results
            .iter()
            .find(|(s, _)| s == section)
            .map_or(&empty, |(_, t)| t);
        let block = rows.render(&format!(
            "{header}\n\n{} This section: {}. Arguments: {}.",
            times.summary(),
            minutes(*took),
            args.shown()
        ));
        match pages::write(&args.docs_dir, section, &block) {
            Ok(p) => eprintln!("fleet-bench: {section}: written to {}", p.display()),
            Err(e) => {
                eprintln!("fleet-bench: {e}");
                pages_ok = false;
            }
        }
    }
    let measured = table
        .rows()
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Pass | Verdict::Fail))
        .count();
    let met = table
        .rows()
        .iter()
        .filter(|r| r.verdict == Verdict::Pass)
        .count();
    eprintln!(
        "fleet-bench: {met} of {measured} measured targets met; written to {}",
        path.display()
    );
    if pages_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The rows of each section run, in order.
type Results = Vec<(String, Table)>;

/// The table of `section` in `results`: the last one when it is that
/// section's, else a new one (rows of one section are pushed together).
fn section_table<'a>(results: &'a mut Results, section: &str) -> &'a mut Table {
    if results.last().map(|(s, _)| s.as_str()) != Some(section) {
        results.push((section.to_owned(), Table::default()));
    }
    &mut results
        .last_mut()
        .expect("INVARIANT: a table was pushed just above when there was none")
        .1
}

/// How long each section of a run took: where the time of `make bench`
/// goes, to keep it within its budget.
#[derive(Default)]
struct SectionTimes {
    started: Option<std::time::Instant>,
    done: Vec<(String, Duration)>,
}

impl SectionTimes {
    fn start() -> Self {
        Self {
            started: Some(std::time::Instant::now()),
            done: Vec::new(),
        }
    }

    /// Records `section` as ending now (it began where the last one ended).
    fn lap(&mut self, section: &str) {
        let now = std::time::Instant::now();
        let begun = self.started.unwrap_or(now);
        let before: Duration = self.done.iter().map(|(_, d)| *d).sum();
        let took = now.saturating_duration_since(begun).saturating_sub(before);
        self.done.push((section.to_owned(), took));
    }

    fn summary(&self) -> String {
        let total: Duration = self.done.iter().map(|(_, d)| *d).sum();
        let parts: Vec<String> = self
            .done
            .iter()
            .map(|(s, d)| format!("{s} {}", minutes(*d)))
            .collect();
        format!(
            "Time: {} in all ({}).",
            minutes(total),
            if parts.is_empty() {
                "no section run".to_owned()
            } else {
                parts.join(", ")
            }
        )
    }
}

/// `1 min 05 s`, or `12 s` under a minute.
fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {:02} s", s / 60, s % 60)
    }
}

fn run(args: &Args) -> (Results, SectionTimes) {
    let mut results = Results::new();
    let mut times = SectionTimes::start();
    if args.has("sizes") {
        let table = section_table(&mut results, "sizes");
        for row in bins::size_rows() {
            table.push(row);
        }
        times.lap("sizes");
    }
    if args.has("device") || args.has("download") {
        let ca = TestCa::new();
        // Both builds of the updater idle side by side for the whole run;
        // their idle memory is a device figure (a download one when the
        // device section does not run).
        let idle = if args.has("device") {
            "device"
        } else {
            "download"
        };
        let mut updater = UpdaterBench::start(&ca, &Build::Shipped.bin("fleet-updater"));
        let mut glibc = UpdaterBench::start(&ca, &Build::Glibc.bin("fleet-updater"));
        for (build, u) in [(Build::Shipped, &updater), (Build::Glibc, &glibc)] {
            section_table(&mut results, idle).push(updater_idle_rss(u, build));
        }
        if args.has("device") {
            for build in Build::all() {
                let u = match build {
                    Build::Shipped => &updater,
                    Build::Glibc => &glibc,
                };
                device_section(args, section_table(&mut results, "device"), u, build);
            }
            times.lap("device");
        }
        if args.has("download") {
            let artifact = Artifact::random();
            let table = section_table(&mut results, "download");
            for row in
                updater::download_rows(&mut updater, &mut glibc, &ca, &artifact, args.download_runs)
            {
                table.push(row);
            }
            times.lap("download");
        }
    }
    if args.has("fleet") {
        let table = section_table(&mut results, "fleet");
        for n in &args.fleet {
            for row in fleet::fleet_rows(*n) {
                table.push(row);
            }
        }
        times.lap("fleet");
    }
    if args.has("rollout") {
        let table = section_table(&mut results, "rollout");
        for row in rollout::rollout_rows(args.rollout) {
            table.push(row);
        }
        times.lap("rollout");
    }
    if args.has("cutover") {
        let table = section_table(&mut results, "cutover");
        for row in cutover::cutover_rows(args.cutover_runs) {
            table.push(row);
        }
        times.lap("cutover");
    }
    if args.has("scale") {
        let table = section_table(&mut results, "scale");
        for v in &args.scale_nats {
            let rows = if args.scale_steady {
                scale::steady_rows(&args.scale, args.scale_window, *v, args.scale_processes)
            } else {
                scale::scale_rows(
                    &args.scale,
                    args.scale_window,
                    *v,
                    args.scale_baseline,
                    args.scale_processes,
                )
            };
            for row in rows {
                table.push(row);
            }
        }
        times.lap("scale");
    }
    if args.has("scale-leaf") {
        let table = section_table(&mut results, "scale-leaf");
        for row in scale_leaf::leaf_rows(
            args.scale_leaf_devices,
            args.leaves,
            args.scale_leaf_rate,
            args.scale_window,
            args.scale_processes,
            args.scale_leaf_callout,
        ) {
            table.push(row);
        }
        times.lap("scale-leaf");
    }
    if args.has("traffic") {
        let table = section_table(&mut results, "traffic");
        for row in traffic::traffic_rows(args.traffic_window) {
            table.push(row);
        }
        times.lap("traffic");
    }
    if args.has("metrics") {
        let table = section_table(&mut results, "metrics");
        for row in metrics::metrics_rows(args.metrics) {
            table.push(row);
        }
        times.lap("metrics");
    }
    if args.has("enrollment") {
        let table = section_table(&mut results, "enrollment");
        for row in enrollment::enrollment_rows(args.enrollment) {
            table.push(row);
        }
        times.lap("enrollment");
    }
    (results, times)
}

/// One agent of `build` with 20 workloads and the idle updater of the same
/// build, side by side, on their own nats-server and Podman.
fn device_section(args: &Args, table: &mut Table, updater: &UpdaterBench, build: Build) {
    eprintln!("bench: device section, {}", build.label());
    let nats = NatsServer::start_fleet(NatsVersion::V2_9, &[DEVICE]);
    let podman = Podman::new();
    let agent = AgentBench::start(&nats, &podman, build);
    for row in agent.rss_rows() {
        table.push(row);
    }
    for row in idle_cpu_rows(args.cpu_window, &nats, &agent, updater, &podman) {
        table.push(build.row(row));
    }
    for row in agent.put_to_running_rows(args.latency_runs) {
        table.push(row);
    }
    for row in agent.put_to_healthy_rows(args.latency_runs) {
        table.push(row);
    }
}

/// The idle updater of `build`: the shipped (static musl) one against its
/// target, the glibc one as context.
fn updater_idle_rss(updater: &UpdaterBench, build: Build) -> Row {
    let rss = procfs::rss(updater.pid());
    let (anon, file) = procfs::rss_parts(updater.pid());
    let floor = agent::sleep_rss();
    build.row(
        Row::new("updater RSS, idle")
            .ours(mib(rss))
            .baseline(format!("{} (idle `sleep`)", mib(floor)))
            .ratio(format!("{:.1}×", rss as f64 / floor as f64))
            .target("≤ 2 MiB", Verdict::from_ok(rss <= 2 * 1024 * 1024))
            .note(format!(
                "{}: {} anonymous + {} file-backed (the binary's touched pages{}).",
                build.label(),
                mib(anon),
                mib(file),
                match build {
                    Build::Shipped => "; static, so no loader or libc mapped",
                    Build::Glibc => ", glibc and the loader, resident whole once in the page cache",
                }
            )),
    )
}

/// Idle CPU of the agent (20 workloads) and the updater over one window,
/// beside the nats-server they talk to over the same window (an idle Go
/// daemon serving this one device).
fn idle_cpu_rows(
    window: Duration,
    nats: &NatsServer,
    agent: &AgentBench<'_>,
    updater: &UpdaterBench,
    podman: &Podman,
) -> Vec<Row> {
    let nats_pid = fleet::server_pid(nats)
        .unwrap_or_else(|| panic!("the bench's nats-server process was not found"));
    eprintln!("bench: idle CPU window of {} s", window.as_secs());
    let a0 = procfs::cpu(agent.pid());
    let u0 = procfs::cpu(updater.pid());
    let n0 = procfs::cpu(nats_pid);
    let (as0, us0) = (
        procfs::threads_cpu(agent.pid()),
        procfs::threads_cpu(updater.pid()),
    );
    std::thread::sleep(window);
    let a = procfs::cpu(agent.pid()).since(a0);
    let u = procfs::cpu(updater.pid()).since(u0);
    let a_ns = procfs::threads_cpu(agent.pid()).saturating_sub(as0);
    let u_ns = procfs::threads_cpu(updater.pid()).saturating_sub(us0);
    let n = procfs::cpu(nats_pid).since(n0);
    let (a_own, a_all) = share(a, window);
    let (_, u_all) = share(u, window);
    let (_, n_all) = share(n, window);
    let ps = podman_ps_cpu(podman);
    let base = format!("{n_all:.3}% (nats-server, same window)");
    let ratio = |v: f64| {
        if n_all > 0.0 {
            format!("{:.2}×", v / n_all)
        } else {
            "— (nats-server used no tick)".to_owned()
        }
    };
    vec![
        Row::new("idle CPU: agent, 20 workloads")
            .ours(format!("{a_all:.3}% ({a_own:.3}% own, the rest podman calls)"))
            .baseline(base.clone())
            .ratio(ratio(a_all))
            .target("≤ 0.1% of one core", Verdict::from_ok(a_all <= 0.1))
            .note(format!(
                "utime+stime of the agent and of its reaped children (every podman call) over {} s, from /proc/<pid>/stat (10 ms ticks): own {} ms, children {} ms; the scheduler's count for the agent's threads (ns) says {:.1} ms. One `podman ps` of the 20 containers costs {} ms of CPU here. Production intervals: heartbeat 30 s, resync 30 s.",
                window.as_secs(),
                a.own.as_millis(),
                a.children.as_millis(),
                a_ns.as_secs_f64() * 1e3,
                ps.as_millis()
            )),
        Row::new("idle CPU: updater")
            .ours(format!("{u_all:.3}%"))
            .baseline(base)
            .ratio(ratio(u_all))
            .target("≤ 0.1% of one core", Verdict::from_ok(u_all <= 0.1))
            .note(format!(
                "Same window and method: {} ms in ticks; the scheduler's count for its threads says {:.1} ms.",
                u.own.as_millis(),
                u_ns.as_secs_f64() * 1e3
            )),
    ]
}

/// CPU (user + system) of one `podman ps` like the agent's resync, median
/// of three.
fn podman_ps_cpu(podman: &Podman) -> Duration {
    let me = std::process::id();
    let mut v: Vec<Duration> = (0..3)
        .map(|_| {
            let before = procfs::cpu(me).children;
            podman.run(&[
                "ps",
                "--all",
                "--filter",
                "label=io.harmony.fleet.managed-by=fleet-agent",
                "--format",
                "json",
            ]);
            procfs::cpu(me).children.saturating_sub(before)
        })
        .collect();
    v.sort();
    v[1]
}

/// What the table was measured on.
fn header() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("unknown CPU")
        .to_owned();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let sha_ni = cpuinfo
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "sha_ni"));
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or("?".to_owned(), |kib| {
            format!("{:.0} GiB", kib as f64 / 1048576.0)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "Run of {} on {model} ({cores} cores{}, shared with other work), {mem} RAM, Linux {}; release builds.",
        fleet_common::Timestamp::now(),
        if sha_ni { ", SHA-NI" } else { "" },
        kernel.trim()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Args, String> {
        Args::parse(v.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn section_times_add_up_and_read_as_minutes() {
        assert_eq!(minutes(Duration::from_secs(12)), "12 s");
        assert_eq!(minutes(Duration::from_secs(65)), "1 min 05 s");
        let t = SectionTimes {
            started: None,
            done: vec![
                ("sizes".to_owned(), Duration::from_secs(3)),
                ("scale".to_owned(), Duration::from_secs(600)),
            ],
        };
        assert_eq!(
            t.summary(),
            "Time: 10 min 03 s in all (sizes 3 s, scale 10 min 00 s)."
        );
        assert_eq!(
            SectionTimes::default().summary(),
            "Time: 0 s in all (no section run)."
        );
    }

    #[test]
    fn arguments_select_sections_and_refuse_nonsense() {
        let a =
            parse(&["--only", "sizes,fleet", "--fleet", "10", "--cpu-secs", "5"]).expect("valid");
        assert!(a.has("sizes") && a.has("fleet") && !a.has("device"));
        assert_eq!(a.fleet, vec![10]);
        assert_eq!(a.cpu_window, Duration::from_secs(5));
        assert_eq!(
            parse(&["--only", "sizes,gpu"]).expect_err("bad section"),
            "unknown section \"gpu\""
        );
        assert_eq!(
            parse(&["--fleet", "0"]).expect_err("zero"),
            "\"0\" is not a positive number"
        );
        assert_eq!(
            parse(&["--runs"]).expect_err("unknown"),
            "unknown argument \"--runs\""
        );
    }

    #[test]
    fn the_leaf_scale_run_is_left_out_unless_named() {
        let a = parse(&[]).expect("valid");
        assert!(a.has("scale") && !a.has("scale-leaf"));
        assert_eq!(
            (a.scale_leaf_devices, a.leaves, a.scale_leaf_rate),
            (20_000, 3, 2_000)
        );
        let a = parse(&[
            "--only",
            "scale-leaf",
            "--scale-leaf-devices",
            "5000",
            "--leaves",
            "2",
            "--scale-leaf-rate",
            "500",
            "--scale-leaf-callout",
        ])
        .expect("valid");
        assert!(a.scale_leaf_callout && !parse(&[]).expect("valid").scale_leaf_callout);
        assert!(a.has("scale-leaf") && !a.has("scale"));
        assert_eq!(
            (a.scale_leaf_devices, a.leaves, a.scale_leaf_rate),
            (5_000, 2, 500)
        );
    }

    #[test]
    fn pages_go_to_the_workspace_docs_unless_told_and_show_the_arguments() {
        let a = parse(&[]).expect("defaults");
        assert_eq!(
            a.docs_dir,
            fleet_harness::workspace_root().join("docs/bench")
        );
        assert_eq!(a.shown(), "none (every section, default sizes)");
        let a = parse(&["--only", "scale", "--docs-dir", "/tmp/x"]).expect("valid");
        assert_eq!(a.docs_dir, PathBuf::from("/tmp/x"));
        assert_eq!(a.shown(), "`--only scale --docs-dir /tmp/x`");
        assert_eq!(
            parse(&["--docs-dir"]).expect_err("no value"),
            "--docs-dir needs a value"
        );
    }

    #[test]
    fn each_section_gets_its_own_table_with_its_own_note_numbers() {
        let mut results = Results::new();
        section_table(&mut results, "device").push(Row::new("idle").note("a"));
        section_table(&mut results, "device").push(Row::new("rss").note("b"));
        section_table(&mut results, "scale").push(Row::new("slope").note("c"));
        let names: Vec<&str> = results.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["device", "scale"]);
        let scale = results[1].1.render("h");
        assert!(
            scale.contains("| slope [1] |") && scale.ends_with("1. c\n"),
            "{scale}"
        );
        let all = Table::joined(results.iter().map(|(_, t)| t)).render("h");
        assert!(
            all.contains("| slope [3] |") && all.ends_with("3. c\n"),
            "{all}"
        );
    }

    #[test]
    fn scale_arguments() {
        let a = parse(&[
            "--only",
            "scale",
            "--scale",
            "100,2000",
            "--scale-nats",
            "2.9,2.14",
        ])
        .expect("valid");
        assert!(a.has("scale") && !a.has("fleet"));
        assert_eq!(a.scale, vec![100, 2000]);
        assert_eq!(a.scale_nats, vec![NatsVersion::V2_9, NatsVersion::V2_14]);
        assert!(
            a.scale_baseline,
            "generation 1 runs as the baseline by default"
        );
        assert!(!parse(&["--scale-gen", "2"]).expect("valid").scale_baseline);
        assert!(parse(&["--scale-gen", "1"]).is_err());
        assert!(parse(&["--scale-nats", "2.10"]).is_err());
        assert_eq!(a.scale_processes, scale::Processes::Auto);
        assert_eq!(
            parse(&["--scale-processes", "3"])
                .expect("valid")
                .scale_processes,
            scale::Processes::Fixed(3)
        );
        assert!(parse(&["--scale-processes", "0"]).is_err());
        assert!(parse(&["--scale-processes", "many"]).is_err());
    }
}
