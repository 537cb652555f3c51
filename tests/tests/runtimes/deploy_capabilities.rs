//! The daemon with only the capabilities the DaemonSet gives it (dropped with
//! `setpriv`, as a container runtime would): it starts, serves pods that talk to each
//! other, to the outside through source NAT, through hostPorts from outside and from
//! the node itself, and restarts over its own pins.

use std::{fs, path::Path};

use ebpf_cni_tests::{
    daemon::Daemon,
    deploy,
    node::{NODE_ADDR, Node, port_mappings, socket},
    require_root,
    runtimes::{assert_host_port_serves, ping},
    snat::{TCP_PORT, external},
    traffic::{EchoServer, probe, round_trip},
};

const CONTAINER_PORT: u16 = 8080;
const HOST_PORT: u16 = 30080;

/// Bit of each capability the DaemonSet may add, in `/proc/<pid>/status`'s masks
/// (linux/capability.h).
fn bit(capability: &str) -> u32 {
    match capability {
        "NET_ADMIN" => 12,
        "NET_RAW" => 13,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "SYS_RESOURCE" => 24,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("add capability {other} to this test's table"),
    }
}

/// The effective capabilities of process `pid`.
fn effective(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's status");
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .expect("a CapEff line");
    u64::from_str_radix(mask.trim(), 16).expect("a hex mask")
}

#[test]
fn the_daemon_serves_pods_with_only_the_daemon_sets_capabilities() {
    require_root();
    let capabilities = deploy::added_capabilities(&deploy::load());
    let bounding = std::iter::once("-all".to_owned())
        .chain(
            capabilities
                .iter()
                .map(|name| format!("+{}", name.to_lowercase())),
        )
        .collect::<Vec<_>>()
        .join(",");
    let bounding = format!("--bounding-set={bounding}");
    // Root keeps in its effective set what the bounding set holds, nothing inherited.
    let wrapper = [
        "setpriv",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        &bounding,
        "--no-new-privs",
        "--",
    ];
    let mut node = Node::start_under("10.244.151.0/24", &wrapper, &[], &[]);
    let wanted = capabilities
        .iter()
        .fold(0u64, |mask, name| mask | 1 << bit(name));
    let pid = node.daemon.pid().expect("running");
    assert_eq!(
        effective(pid),
        wanted,
        "the daemon runs with exactly {capabilities:?}"
    );

    let mapped = port_mappings(CONTAINER_PORT, &[(HOST_PORT, "tcp", None)]);
    let server = node.add_pod_with("caps-server", &mapped);
    let client = node.add_pod("caps-client");
    assert!(
        ping(&client.netns, &server.ip.to_string()),
        "pod to pod on the node"
    );
    let _outside = EchoServer::start(&node.external, TCP_PORT);
    let back = round_trip(&client.netns, external(TCP_PORT), b"out").expect("through source NAT");
    assert_eq!(back, b"out");
    assert_host_port_serves(&node, &server.netns, HOST_PORT, CONTAINER_PORT);
    {
        let _echo = EchoServer::start(&server.netns, CONTAINER_PORT);
        for address in ["127.0.0.1", NODE_ADDR] {
            let dialled = socket(address, HOST_PORT).to_string();
            let answer = probe(
                &node.netns,
                &node.instance.cgroup,
                Path::new(env!("CARGO_BIN_EXE_ecni-probe")),
                &["tcp", &dialled, "from the node"],
            )
            .unwrap_or_else(|error| {
                panic!("the node's own socket to {dialled} (cgroup programs): {error}")
            });
            assert_eq!(answer["reply"], "from the node", "{answer}");
        }
    }

    // A restart (an upgrade of the DaemonSet) takes the pins over with the same rights.
    assert!(node.daemon.stop(), "the daemon stops cleanly on SIGTERM");
    node.daemon = Daemon::start_under(&node.netns, &node.instance, &wrapper, &[], &[]);
    assert!(
        ping(&client.netns, &server.ip.to_string()),
        "pod to pod after the restart"
    );
    let third = node.add_pod("caps-after-restart");
    assert!(
        ping(&third.netns, &server.ip.to_string()),
        "a new pod after the restart"
    );
    node.del_pod(&third);
    node.del_pod(&client);
    node.del_pod(&server);
}
