//! The daemon can die and come back without cutting pod traffic; uninstall removes
//! everything.

use std::{net::SocketAddr, thread, time::Duration};

use ebpf_cni_tests::{
    cni::{Call, veths},
    daemon::{Daemon, eventually},
    node::{NODE_ADDR, Node, port_mappings, socket},
    require_root,
    traffic::{EchoServer, Stream},
};
use serde_json::Value;

const PORT: u16 = 8080;

fn endpoint_ids(node: &Node) -> Vec<String> {
    let mut ids: Vec<String> = node
        .instance
        .cli_json(&["endpoints"])
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|e| e["id"]["container_id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// Waits until the stream has echoed more than `before` bytes.
fn flowing(stream: &Stream, before: u64) -> bool {
    eventually(Duration::from_secs(5), || stream.echoed() > before)
}

#[test]
fn sigkill_of_the_daemon_does_not_interrupt_a_tcp_stream_between_pods() {
    require_root();
    let mut node = Node::start("10.244.40.0/24");
    let (a, b, c) = (
        node.add_pod("rst-a"),
        node.add_pod("rst-b"),
        node.add_pod("rst-c"),
    );
    let _server = EchoServer::start(&b.netns, PORT);
    let to: SocketAddr = format!("{}:{PORT}", b.ip).parse().expect("address");
    let stream = Stream::start(&a.netns, to);
    assert!(flowing(&stream, 0), "the stream starts");

    node.daemon.kill();
    let at_kill = stream.echoed();
    thread::sleep(Duration::from_millis(500));
    assert!(
        flowing(&stream, at_kill),
        "the stream flows while the daemon is dead"
    );

    // While it is down: ADD fails with 11 and leaves nothing; DEL still cleans up.
    let config = node.network.config("1.1.0");
    let d = node.pod("pod");
    Call::new("ADD", "rst-d", "eth0", Some(&d), &config)
        .run(&node.netns)
        .error(11);
    assert!(veths(&d).is_empty(), "ADD left nothing in the pod");
    node.del_pod(&c);
    assert_eq!(node.network.allocated().len(), 2, "c's address was freed");
    assert_eq!(node.host_veths().len(), 2, "c's veth is gone");

    let before_restart = stream.echoed();
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert!(
        flowing(&stream, before_restart),
        "the stream flows after the restart"
    );
    assert_eq!(
        endpoint_ids(&node),
        ["rst-a", "rst-b"],
        "c's record was dropped"
    );
    assert_eq!(
        attached_programs(&node),
        ["from_pod", "from_pod"],
        "both pods' veths are bound to the block with this daemon's program"
    );
    stream.finish().expect("the stream never failed");
}

#[test]
fn restarts_of_the_daemon_do_not_interrupt_a_connection_through_a_host_port() {
    host_port_through_restarts("10.244.42.0/24", &[]);
}

#[test]
fn with_clsact_filters_restarts_do_not_interrupt_a_connection_through_a_host_port() {
    host_port_through_restarts("10.244.46.0/24", &["--enable-tcx", "false"]);
}

/// A connection from outside through a host port, across three restarts of a daemon
/// run with `flags`.
fn host_port_through_restarts(subnet: &str, flags: &[&str]) {
    const HOST_PORT: u16 = 30081;
    require_root();
    let mut node = Node::start_with(subnet, &[], flags);
    let pod = node.add_pod_with(
        "rst-hostport",
        &port_mappings(PORT, &[(HOST_PORT, "tcp", None)]),
    );
    let _server = EchoServer::start(&pod.netns, PORT);
    let stream = Stream::start(&node.external, socket(NODE_ADDR, HOST_PORT));
    assert!(
        flowing(&stream, 0),
        "the stream through the host port starts"
    );
    // Each start writes the mappings again: never a moment without them, in which a
    // segment from outside would meet the node's stack and be reset.
    for restart in 0..3 {
        assert!(node.daemon.stop(), "restart {restart}: the daemon stops");
        node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], flags);
        let after = stream.echoed();
        assert!(
            flowing(&stream, after),
            "restart {restart}: the stream flows on"
        );
    }
    stream.finish().expect("the stream never failed");
}

/// Names of the programs that see each pod veth's traffic, asked from the kernel: TCX
/// programs on either direction (Debian's bpftool predates TCX and cannot list them),
/// and the BPF filters of the TC block the veth's clsact ingress is bound to (`tc -j`).
fn attached_programs(node: &Node) -> Vec<String> {
    let veths = node.host_veths();
    assert!(!veths.is_empty(), "the pods' veths exist");
    let json = |args: &[&str]| -> Value {
        serde_json::from_slice(&node.netns.run("tc", args).stdout).unwrap_or(Value::Null)
    };
    let mut names = Vec::new();
    for veth in &veths {
        let qdiscs = json(&["-j", "qdisc", "show", "dev", veth]);
        let blocks = qdiscs
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|qdisc| qdisc["ingress_block"].as_u64());
        for block in blocks {
            names.extend(
                node.netns
                    .bpf_filters(&["block", &block.to_string()])
                    .into_iter()
                    .map(|(name, _)| name),
            );
        }
    }
    for veth in &veths {
        names.extend(node.netns.tcx_programs(veth));
    }
    names
}

#[test]
fn uninstall_detaches_every_program_and_removes_every_pin() {
    require_root();
    let mut node = Node::start("10.244.41.0/24");
    let (a, b) = (node.add_pod("uni-a"), node.add_pod("uni-b"));
    let reaches_b = || {
        a.netns
            .run("ping", &["-c", "1", "-W", "1", &b.ip.to_string()])
            .status
            .success()
    };
    // The daemon turned IP forwarding on for source NAT; off, only eBPF can carry
    // pod-to-pod traffic, which is what this test is about.
    node.netns
        .run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=0"]);
    assert!(reaches_b(), "forwarding works before");
    assert!(node.daemon.stop());
    assert!(reaches_b(), "and while the daemon is stopped");
    let before = attached_programs(&node);
    assert_eq!(
        before.iter().filter(|name| *name == "from_pod").count(),
        2,
        "{before:?}"
    );
    assert_eq!(before.len(), 2, "nothing but the pod programs: {before:?}");

    // From outside the daemon's namespace uninstall refuses and removes nothing: the
    // pods' TC block lives in that namespace.
    let outside = std::process::Command::new(ebpf_cni_tests::bins::path("ebpf-cnid"))
        .args(node.instance.flags())
        .arg("uninstall")
        .output()
        .expect("ebpf-cnid runs");
    assert!(
        !outside.status.success(),
        "uninstall from another namespace: {}",
        String::from_utf8_lossy(&outside.stderr)
    );
    assert!(node.instance.bpf_dir.exists(), "nothing was removed");
    assert!(reaches_b(), "nor detached");

    let out = node.instance.cli(&["uninstall"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!node.instance.bpf_dir.exists(), "every pin is gone");
    let after = attached_programs(&node);
    assert!(
        after.is_empty(),
        "no pod program is attached any more: {after:?}"
    );
    assert!(!reaches_b(), "pods are no longer forwarded by eBPF");
}
