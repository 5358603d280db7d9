//! The harness's isolated Podman: a container runs from the busybox image,
//! shows with its label, is removed, and nothing is left mounted.

use std::path::PathBuf;

use fleet_harness::Podman;

fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|m| m.starts_with(&*dir.to_string_lossy()))
        .collect()
}

#[test]
fn container_runs_is_listed_with_its_label_and_is_removed() {
    let podman = Podman::new();
    let image = podman.busybox_image();
    assert_eq!(image, "localhost/fleet-test/busybox:1");
    assert_eq!(podman.busybox_image(), image, "imported once");

    let out = podman.run(&["run", "--rm", &image, "sh", "-c", "echo hello; ulimit -n"]);
    assert_eq!(out, "hello\n20000\n");

    let id = podman.run(&[
        "run",
        "-d",
        "--name",
        "web",
        "--label",
        "fleet.workload=web",
        &image,
        "sleep",
        "600",
    ]);
    let id = id.trim();
    let ps = podman.ps_all();
    assert_eq!(ps.len(), 1, "{ps:?}");
    assert_eq!(ps[0]["Id"], id);
    assert_eq!(ps[0]["Labels"]["fleet.workload"], "web");
    assert_eq!(ps[0]["State"], "running");

    podman.run(&["rm", "-f", "-t", "0", "web"]);
    assert!(podman.ps_all().is_empty());
}

#[test]
fn instances_are_isolated_and_leave_no_mounts() {
    let a = Podman::new();
    let b = Podman::new();
    let dir: PathBuf = a.dir().to_path_buf();
    a.run(&[
        "run",
        "-d",
        "--name",
        "only-in-a",
        &a.busybox_image(),
        "sleep",
        "600",
    ]);
    assert_eq!(a.ps_all().len(), 1);
    assert!(b.ps_all().is_empty(), "b sees a's container");

    // A process that gets only the environment is isolated too.
    let mut cmd = std::process::Command::new(a.binary());
    cmd.envs(a.env())
        .args(["ps", "-a", "--format", "{{.Names}}"]);
    let out = cmd.output().expect("podman ps");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "only-in-a\n");

    assert!(
        !mounts_under(&dir).is_empty(),
        "a running container mounts its rootfs"
    );
    drop(a); // with a running container
    assert!(
        mounts_under(&dir).is_empty(),
        "left: {:?}",
        mounts_under(&dir)
    );
    assert!(!dir.exists(), "temp dir removed");
}
