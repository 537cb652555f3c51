//! Pods on different nodes with `--routing native` (issue 24, point 3): three nodes on
//! one L2 segment, each with its own daemon reading the same nodes file. TCP, UDP and
//! ICMP cross between their pods with the pods' own addresses (no source NAT inside the
//! cluster); the node's own traffic reaches other nodes' pods through the routes the
//! daemon installs; traffic to the outside is still translated to the sending node's
//! address. Pod traffic between nodes skips both nodes' stacks (a FORWARD chain
//! dropping everything stops none of it). (A node removed, and a daemon restarted under a cross-node stream:
//! `cross_node_changes.rs`.)

use std::net::{IpAddr, SocketAddr};

use ebpf_cni_tests::{
    cluster::{TestCluster, daemon_routes, last_peer, node_addr, pods_talk_as_themselves},
    require_root,
    traffic::{EchoServer, round_trip},
};

const RANGES: [&str; 3] = ["10.244.111.0/24", "10.244.112.0/24", "10.244.113.0/24"];
const PORT: u16 = 9400;

#[test]
fn pods_on_three_nodes_talk_with_their_own_addresses() {
    require_root();
    let cluster = TestCluster::start(&RANGES, &["--routing", "native"]);
    let a = cluster.node(1).add_pod("native-a");
    let b = cluster.node(2).add_pod("native-b");
    let c = cluster.node(3).add_pod("native-c");
    assert_eq!(
        a.ip.octets()[..3],
        [10, 244, 111],
        "usePodCidr: node 1's range"
    );
    assert_eq!(
        c.ip.octets()[..3],
        [10, 244, 113],
        "usePodCidr: node 3's range"
    );
    assert_eq!(
        daemon_routes(&cluster.node(1).netns),
        [
            format!("{} via {} dev uplink0", RANGES[1], node_addr(2)),
            format!("{} via {} dev uplink0", RANGES[2], node_addr(3)),
        ],
        "node 1 routes the other nodes' ranges via their addresses"
    );

    pods_talk_as_themselves(&cluster, [&a, &b, &c], PORT);

    // Both ways past the nodes' stacks: out by a FIB lookup and the neighbour, in
    // straight into the pod from the uplink. A FORWARD chain that drops everything on
    // both nodes stops no pod.
    let server = EchoServer::start(&b.netns, PORT + 2);
    let forward_drop = |action: &str| {
        for node in [1, 2] {
            let rule = cluster
                .node(node)
                .netns
                .run("iptables", &[action, "FORWARD", "-j", "DROP"]);
            assert!(rule.status.success(), "iptables {action}: {rule:?}");
        }
    };
    forward_drop("-I");
    round_trip(&a.netns, (b.ip, PORT + 2).into(), b"past FORWARD")
        .expect("pod a reaches pod b with FORWARD dropping everything");
    assert_eq!(last_peer(&server.peers()), IpAddr::from(a.ip));
    drop(server);
    forward_drop("-D");

    // The node's own traffic follows the daemon's routes.
    let server = EchoServer::start(&b.netns, PORT + 1);
    let to: SocketAddr = (b.ip, PORT + 1).into();
    round_trip(&cluster.node(1).netns, to, b"from node 1").expect("node 1 reaches pod b");
    assert_eq!(
        last_peer(&server.peers()),
        node_addr(1).parse::<IpAddr>().expect("an address"),
    );
}
