//! Pods on different nodes with `--routing native` (issue 24, point 3): three nodes on
//! one L2 segment, each with its own daemon reading the same nodes file. TCP, UDP and
//! ICMP cross between their pods with the pods' own addresses (no source NAT inside the
//! cluster); the node's own traffic reaches other nodes' pods through the routes the
//! daemon installs; traffic to the outside is still translated to the sending node's
//! address. (A node removed, and a daemon restarted under a cross-node stream:
//! `cross_node_changes.rs`.)

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ebpf_cni_tests::{
    cluster::{SEGMENT_HOST, TestCluster, node_addr},
    netns::Netns,
    require_root,
    traffic::{EchoServer, UdpEcho, round_trip, udp_round_trip},
};

const RANGES: [&str; 3] = ["10.244.111.0/24", "10.244.112.0/24", "10.244.113.0/24"];
const PORT: u16 = 9400;

fn to(ip: Ipv4Addr) -> SocketAddr {
    (ip, PORT).into()
}

/// The routes the daemon of `netns` installed (`ip route show proto 208`), one per line.
fn node_routes(netns: &Netns) -> Vec<String> {
    netns
        .ip(&["-4", "route", "show", "proto", "208"])
        .lines()
        .map(|line| line.trim().to_owned())
        .filter(|line| !line.is_empty())
        .collect()
}

fn last_peer(peers: &[SocketAddr]) -> IpAddr {
    peers.last().expect("a peer seen").ip()
}

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
        node_routes(&cluster.node(1).netns),
        [
            format!("{} via {} dev uplink0", RANGES[1], node_addr(2)),
            format!("{} via {} dev uplink0", RANGES[2], node_addr(3)),
        ],
        "node 1 routes the other nodes' ranges via their addresses"
    );

    let tcp_b = EchoServer::start(&b.netns, PORT);
    round_trip(&a.netns, to(b.ip), b"tcp across nodes").expect("pod a reaches pod b");
    assert_eq!(
        last_peer(&tcp_b.peers()),
        IpAddr::V4(a.ip),
        "b sees a's own address"
    );

    let udp_c = UdpEcho::start(&c.netns, PORT);
    udp_round_trip(&a.netns, 0, to(c.ip), b"udp across nodes").expect("pod a reaches pod c");
    assert_eq!(
        last_peer(&udp_c.peers()),
        IpAddr::V4(a.ip),
        "c sees a's own address"
    );

    let ping = c.netns.run(
        "ping",
        &["-c", "2", "-i", "0.2", "-W", "2", &b.ip.to_string()],
    );
    assert!(ping.status.success(), "pod c pings pod b: {ping:?}");

    // The node's own traffic follows the daemon's routes.
    round_trip(&cluster.node(1).netns, to(b.ip), b"from node 1").expect("node 1 reaches pod b");
    assert_eq!(
        last_peer(&tcp_b.peers()),
        node_addr(1).parse::<IpAddr>().expect("an address"),
    );

    // To the outside (the segment's host): translated to the sending node's address.
    let outside = EchoServer::start(&cluster.segment, PORT);
    let host: Ipv4Addr = SEGMENT_HOST.parse().expect("an address");
    round_trip(&b.netns, to(host), b"out").expect("pod b reaches the outside");
    assert_eq!(
        last_peer(&outside.peers()),
        node_addr(2).parse::<IpAddr>().expect("an address"),
        "translated to node 2's address"
    );
}
