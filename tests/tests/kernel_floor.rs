//! The kernel floor (docs/kernels.md), Linux 5.17 (the datapath's newest helper, `bpf_loop`):
//! below it `ebpf-cnid run` stops with the kernel's version, the program the kernel
//! refused and the floor, and leaves nothing behind; from it up, the daemon starts.
//! This machine's kernel takes the second branch; `cargo xtask vm-test --kernel 5.10`
//! (bullseye's kernel, in a guest) the first.

use std::{
    fs,
    process::Stdio,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    bins,
    daemon::{Daemon, Instance},
    kernel,
    netns::Netns,
    node::external_host,
    require_root, scaled,
};

const FLOOR: (u32, u32) = (5, 17);

/// How long a refusing daemon may take to stop (stretched in a slow guest).
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn the_daemon_runs_on_kernels_from_the_floor_up_and_refuses_older_ones_by_name() {
    require_root();
    let release = kernel::release();
    let node = Netns::new("node");
    let _external = external_host(&node);
    let instance = Instance::new();

    if kernel::major_minor(&release) >= FLOOR {
        let _daemon = Daemon::start(&node, &instance, &[]);
        let status = instance.cli_json(&["status"]);
        assert!(
            status.is_object(),
            "Linux {release}: the daemon answers `status`: {status}"
        );
        return;
    }

    let log = fs::File::create(&instance.log).expect("the daemon's log");
    let mut child = node
        .command(bins::path("ebpf-cnid"))
        .args(instance.flags())
        .arg("run")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .spawn()
        .expect("cannot start ebpf-cnid");
    let deadline = Instant::now() + scaled(REFUSAL_TIMEOUT);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "Linux {release}: the daemon still runs after {REFUSAL_TIMEOUT:?}:\n{}",
                instance.log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = instance.log();
    assert!(
        !status.success(),
        "Linux {release}: below the floor the daemon exits with an error:\n{log}"
    );
    // The version as the daemon reads it: Debian's `5.10.0-32-amd64` runs 5.10.223.
    let (major, minor) = kernel::major_minor(&release);
    let error = log
        .lines()
        .find(|line| line.contains("refuses program"))
        .unwrap_or_else(|| panic!("Linux {release}: the refusal names the program:\n{log}"));
    for expected in [format!("kernel ({major}.{minor}."), "Linux 5.17".to_owned()] {
        assert!(
            error.contains(&expected),
            "Linux {release}: the refusal names {expected:?}: {error}"
        );
    }
    assert!(
        log.lines().count() < 20,
        "Linux {release}: the refusal is a few lines, the verifier's output only at debug \
         level:\n{log}"
    );
    assert!(
        !instance.socket.exists(),
        "Linux {release}: a refusing daemon leaves no socket"
    );
    // Dropping the instance runs `ebpf-cnid uninstall` and fails the test if any pin
    // stays.
}
