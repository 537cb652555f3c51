//! Pod traffic through the eBPF datapath on one simulated node: ping and TCP between
//! pods and with the node, counters, no bridge, no IP forwarding needed.

use std::net::SocketAddr;

use ebpf_cni_tests::{
    netns::{Netns, run_ok},
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, Pod},
    require_root,
    traffic::{EchoServer, round_trip},
};
use serde_json::Value;

const PORT: u16 = 8080;

fn ping(from: &Netns, to: &str) -> bool {
    pings(from, to, 2)
}

/// `count` pings from `from` to `to`, all answered.
fn pings(from: &Netns, to: &str, count: u32) -> bool {
    let count = count.to_string();
    from.run("ping", &["-c", &count, "-i", "0.2", "-W", "2", to])
        .status
        .success()
}

fn tcp_ok(from: &Netns, to: &str, port: u16) {
    let addr: SocketAddr = format!("{to}:{port}").parse().expect("address");
    let payload = format!("hello {to}").into_bytes();
    let back = round_trip(from, addr, &payload).unwrap_or_else(|e| panic!("TCP to {addr}: {e}"));
    assert_eq!(back, payload, "the echo of {addr}");
}

fn sysctl(netns: &Netns, setting: &str) {
    run_ok(netns.command("sysctl").args(["-q", "-w", setting]));
}

#[test]
fn ten_pods_reach_each_other_and_the_node_by_ping_and_tcp() {
    require_root();
    let node = Node::start("10.244.30.0/24");
    let pods: Vec<Pod> = (0..10).map(|n| node.add_pod(&format!("fwd-{n}"))).collect();
    let _servers: Vec<EchoServer> = pods
        .iter()
        .map(|pod| EchoServer::start(&pod.netns, PORT))
        .collect();
    let _node_server = EchoServer::start(&node.netns, PORT);

    for (n, pod) in pods.iter().enumerate() {
        let next = &pods[(n + 1) % pods.len()];
        let peer = next.ip.to_string();
        assert!(ping(&pod.netns, &peer), "{} -> {peer}", pod.container_id);
        tcp_ok(&pod.netns, &peer, PORT);
        tcp_ok(&next.netns, &pod.ip.to_string(), PORT);
        assert!(ping(&pod.netns, NODE_ADDR), "{} -> node", pod.container_id);
        tcp_ok(&pod.netns, NODE_ADDR, PORT);
        assert!(
            ping(&node.netns, &pod.ip.to_string()),
            "node -> {}",
            pod.container_id
        );
        tcp_ok(&node.netns, &pod.ip.to_string(), PORT);
    }

    let endpoints = node.instance.cli_json(&["endpoints"]);
    let endpoints = endpoints.as_array().expect("a list");
    assert_eq!(endpoints.len(), 10);
    for endpoint in endpoints {
        let counters = &endpoint["counters"];
        for field in [
            "from_pod_packets",
            "from_pod_bytes",
            "to_pod_packets",
            "to_pod_bytes",
        ] {
            assert!(
                counters[field].as_u64().is_some_and(|n| n > 0),
                "{field}: {endpoint}"
            );
        }
    }
    // Every link with its kind, filtered here: `ip link show type bridge` leaves the
    // filtering to the kernel, and on 6.1 prints an empty object per other link.
    let links: Value = serde_json::from_str(&node.netns.ip(&["-j", "-d", "link", "show"]))
        .expect("ip -j -d link show prints JSON");
    let links = links.as_array().expect("a list of links");
    assert!(links.len() > 10, "the node's links are listed: {links:?}");
    let bridges: Vec<&Value> = links
        .iter()
        .filter(|link| link["linkinfo"]["info_kind"] == "bridge")
        .collect();
    assert!(
        bridges.is_empty(),
        "no bridge device in the node: {bridges:?}"
    );
}

#[test]
fn pods_reach_each_other_with_ip_forwarding_off_in_the_node() {
    require_root();
    let node = Node::start("10.244.31.0/24");
    let (a, b) = (node.add_pod("nofwd-a"), node.add_pod("nofwd-b"));
    let _server = EchoServer::start(&b.netns, PORT);
    // The external host routes the pod subnet through the node, so only the node's
    // forwarding decides whether a pod reaches it: the control for this test.
    node.external
        .ip(&["route", "add", "10.244.31.0/24", "via", NODE_ADDR]);

    sysctl(&node.netns, "net.ipv4.ip_forward=1");
    assert!(
        ping(&a.netns, EXTERNAL_ADDR),
        "control: routed traffic works with forwarding on"
    );
    sysctl(&node.netns, "net.ipv4.ip_forward=0");
    assert!(
        !ping(&a.netns, EXTERNAL_ADDR),
        "control: the node no longer forwards"
    );

    assert!(
        ping(&a.netns, &b.ip.to_string()),
        "pod to pod without forwarding"
    );
    assert!(ping(&b.netns, &a.ip.to_string()), "and back");
    tcp_ok(&a.netns, &b.ip.to_string(), PORT);
}

#[test]
fn what_the_node_sends_a_pod_and_what_pods_send_each_other_both_count_as_to_pod() {
    require_root();
    let node = Node::start("10.244.39.0/24");
    let a = node.add_pod("count-a");
    let b = node.add_pod("count-b");
    let to_pod = |pod: &Pod| {
        node.endpoint(pod)["counters"]["to_pod_packets"]
            .as_u64()
            .expect("the pod's counters")
    };
    let before = to_pod(&a);
    // From the node's stack: the veth's kernel counters (no TC program on its egress).
    assert!(pings(&node.netns, &a.ip.to_string(), 3), "node to pod");
    let after_node = to_pod(&a);
    assert!(after_node >= before + 3, "{before} -> {after_node}");
    // From another pod: delivered and counted by the datapath.
    assert!(pings(&b.netns, &a.ip.to_string(), 3), "pod to pod");
    let after_pod = to_pod(&a);
    assert!(after_pod >= after_node + 3, "{after_node} -> {after_pod}");
}

#[test]
fn pods_added_after_the_block_anchor_was_deleted_by_hand_are_still_forwarded() {
    require_root();
    let node = Node::start("10.244.38.0/24");
    // With no pod bound to it, the pods' TC block (and the program in it) goes with its
    // anchor.
    node.netns.ip(&["link", "del", "ecnblock0"]);
    let a = node.add_pod("anchor-a");
    let b = node.add_pod("anchor-b");
    sysctl(&node.netns, "net.ipv4.ip_forward=0");
    assert!(
        ping(&a.netns, &b.ip.to_string()),
        "pod to pod through eBPF (IP forwarding is off)"
    );
    assert!(
        node.netns
            .ip(&["link", "show", "ecnblock0"])
            .contains("ecnblock0"),
        "the anchor is back"
    );
}
