//! Pods' traffic skips the node's netfilter (the fast path): a FORWARD rule in the node
//! does not stop a pod. Destinations given to `--host-firewall-cidr` always cross the
//! node's stack instead, where the node's rules apply: a cloud metadata address that
//! only the node may reach is blocked for pods by one DROP rule.

use ebpf_cni_tests::{
    node::{EXTERNAL_ADDR, Node, socket},
    require_root,
    traffic::{EchoServer, round_trip},
};

const METADATA: &str = "169.254.169.254";

/// A node whose external host also answers at [`METADATA`] port 80, and whose FORWARD
/// chain drops everything to it.
fn node_with_metadata(subnet: &str, flags: &[&str]) -> (Node, EchoServer) {
    let node = Node::start_with(subnet, &[], flags);
    node.external
        .ip(&["addr", "add", &format!("{METADATA}/32"), "dev", "eth0"]);
    let server = EchoServer::start(&node.external, 80);
    // The node knows its next hop, as a running node does: the fast path needs the
    // neighbour (until then the stack forwards, and would meet the rule).
    let ping = node
        .netns
        .run("ping", &["-c", "1", "-W", "2", EXTERNAL_ADDR]);
    assert!(
        ping.status.success(),
        "the node reaches its next hop: {ping:?}"
    );
    let rule = node
        .netns
        .run("iptables", &["-I", "FORWARD", "-d", METADATA, "-j", "DROP"]);
    assert!(rule.status.success(), "iptables: {rule:?}");
    (node, server)
}

#[test]
fn by_default_pods_traffic_skips_the_nodes_forward_rules() {
    require_root();
    let (node, _server) = node_with_metadata("10.244.98.0/24", &[]);
    let pod = node.add_pod("fast-path");
    let back = round_trip(&pod.netns, socket(METADATA, 80), b"past the rule")
        .expect("the fast path does not cross FORWARD");
    assert_eq!(back, b"past the rule");
}

#[test]
fn host_firewall_ranges_cross_the_nodes_stack_where_its_rules_apply() {
    require_root();
    let flags = ["--host-firewall-cidr", "169.254.169.254/32"];
    let (node, _server) = node_with_metadata("10.244.99.0/24", &flags);
    let pod = node.add_pod("firewalled");
    assert!(
        round_trip(&pod.netns, socket(METADATA, 80), b"blocked").is_err(),
        "the node's DROP rule must stop the pod"
    );
    // Everything else still takes the fast path.
    let _other = EchoServer::start(&node.external, 81);
    let back = round_trip(&pod.netns, socket(EXTERNAL_ADDR, 81), b"elsewhere").expect("out");
    assert_eq!(back, b"elsewhere");
    let status = node.instance.cli_json(&["status"]);
    assert_eq!(
        status["host_firewall_cidrs"][0], "169.254.169.254/32",
        "{status}"
    );
}
