//! The daemon's socket against clients that hold it open and a process out of files
//! (issue 23, point 8): a failed `accept` is retried, not fatal; the open-file limit is
//! raised at start; and only a socket folder the daemon creates is made private.

use std::{
    fs,
    os::unix::{fs::PermissionsExt, net::UnixStream},
    process::Command,
    thread,
    time::Duration,
};

use ebpf_cni_tests::{
    daemon::{Daemon, Instance, eventually},
    netns::Netns,
    node::external_host,
    require_root,
};

/// Idle clients: more than the daemon's files allow once its limit is lowered.
const IDLE_CLIENTS: usize = 80;

/// The soft and hard limits of open files of process `pid`.
fn file_limits(pid: u32) -> (u64, u64) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("a Max open files line");
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

#[test]
fn idle_connections_past_the_file_limit_do_not_end_the_daemon() {
    require_root();
    let netns = Netns::new("node");
    let _external = external_host(&netns);
    let instance = Instance::new();
    let daemon = Daemon::start_under(
        &netns,
        &instance,
        &["prlimit", "--nofile=512:4096", "--"],
        &[],
        &[],
    );
    let pid = daemon.pid().expect("running");
    assert_eq!(
        file_limits(pid),
        (4096, 4096),
        "the soft limit is raised to the hard one at start"
    );

    // Leave the daemon a few files more than it holds, then hold many connections open.
    let open = fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    let limit = format!("--nofile={}:{}", open + 8, open + 8);
    let out = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &limit])
        .output()
        .expect("prlimit");
    assert!(out.status.success(), "prlimit failed");
    let idle: Vec<UnixStream> = (0..IDLE_CLIENTS)
        .map(|_| UnixStream::connect(&instance.socket).expect("connect"))
        .collect();
    thread::sleep(Duration::from_secs(2));
    drop(idle);
    assert!(
        eventually(Duration::from_secs(30), || instance
            .cli(&["status"])
            .status
            .success()),
        "the daemon answers again once the idle clients are gone:\n{}",
        instance.log()
    );
    assert!(
        instance.log().contains("cannot accept a connection"),
        "the failed accepts are logged:\n{}",
        instance.log()
    );
}

#[test]
fn an_existing_socket_folder_keeps_its_mode() {
    require_root();
    let netns = Netns::new("node");
    let _external = external_host(&netns);
    let instance = Instance::new();
    let folder = instance.socket.parent().expect("a folder").to_owned();
    fs::create_dir_all(&folder).expect("create the folder");
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).expect("chmod");
    // The instance removes the folder when it drops.
    let _daemon = Daemon::start(&netns, &instance, &[]);
    let mode =
        |path: &std::path::Path| fs::metadata(path).expect("stat").permissions().mode() & 0o7777;
    assert_eq!(mode(&folder), 0o755, "a folder the daemon did not create");
    assert_eq!(
        mode(&instance.socket) & 0o777,
        0o600,
        "the socket is root-only"
    );
}
