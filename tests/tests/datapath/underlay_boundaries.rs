//! What a host on the underlay cannot do to the node's pods: a frame addressed to
//! another host's MAC (flooded by a switch, or seen by a promiscuous uplink) is never
//! translated nor delivered into a pod, even when it matches a pod's flow; the same
//! packet to the node's own MAC is. A VXLAN packet forging a node's address from
//! another MAC is dropped; a natively routed packet forging another node's pod goes
//! through the node's stack, where its firewall applies; with `--underlay-trust
//! strict` every packet from other nodes' pods does.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    traffic::{
        UdpEcho, run_in,
        spoof::{send_frame, udp_frame},
    },
};

const PORT: u16 = 9100;

/// The next datagram `socket` receives within a second.
fn received(socket: &UdpSocket) -> Option<Vec<u8>> {
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("a read timeout");
    let mut buffer = [0u8; 1500];
    let (n, _) = socket.recv_from(&mut buffer).ok()?;
    Some(buffer[..n].to_vec())
}

#[test]
fn a_frame_for_another_hosts_mac_never_reaches_a_pod() {
    require_root();
    let node = Node::start("10.244.96.0/24");
    let pod = node.add_pod("otherhost");
    let outside = UdpEcho::start(&node.external, PORT);
    // The pod's flow to the outside, translated; the echo's answer comes back.
    let socket = run_in(&pod.netns, || UdpSocket::bind("0.0.0.0:0")).expect("bind");
    let external: Ipv4Addr = EXTERNAL_ADDR.parse().expect("an address");
    socket
        .send_to(b"open", (external, PORT))
        .expect("send to the outside");
    assert_eq!(received(&socket).as_deref(), Some(&b"open"[..]));
    let SocketAddr::V4(translated) = outside.peers()[0] else {
        panic!("an IPv4 peer");
    };
    assert_eq!(translated.ip().to_string(), NODE_ADDR);

    // A promiscuous uplink receives frames for other MACs too.
    node.netns.ip(&["link", "set", "uplink0", "promisc", "on"]);
    let from = SocketAddrV4::new(external, PORT);
    let src_mac = node.external.mac("eth0");
    let elsewhere = [0x02, 0, 0, 0, 0, 0x99];
    let frame =
        |dst_mac, payload: &[u8]| udp_frame(dst_mac, src_mac, None, from, translated, payload);
    send_frame(&node.external, "eth0", &frame(elsewhere, b"another host's")).expect("send");
    assert_eq!(
        received(&socket),
        None,
        "a frame for another host's MAC reached the pod"
    );
    // The same datagram to the node's MAC is the flow's answer.
    let node_mac = node.netns.mac("uplink0");
    send_frame(&node.external, "eth0", &frame(node_mac, b"the node's")).expect("send");
    assert_eq!(received(&socket).as_deref(), Some(&b"the node's"[..]));
}

const RANGES: [&str; 3] = ["10.244.131.0/24", "10.244.132.0/24", "10.244.133.0/24"];
/// An address of node 3's pod range that no pod has.
const FORGED_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 133, 77);

/// An IPv4 UDP packet from `from` to `to` with `payload`, its header checksum set.
fn udp_packet(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let total = u16::try_from(28 + payload.len()).expect("a small packet");
    let mut packet = vec![0x45, 0];
    packet.extend(total.to_be_bytes());
    packet.extend([0, 1, 0x40, 0, 64, 17, 0, 0]);
    packet.extend(from.ip().octets());
    packet.extend(to.ip().octets());
    let checksum = ebpf_cni_tests::frames::internet_checksum(&packet);
    packet[10..12].copy_from_slice(&checksum.to_be_bytes());
    packet.extend(from.port().to_be_bytes());
    packet.extend(to.port().to_be_bytes());
    packet.extend((total - 20).to_be_bytes());
    packet.extend([0, 0]);
    packet.extend(payload);
    packet
}

fn ethernet(dst: [u8; 6], src: [u8; 6], packet: &[u8]) -> Vec<u8> {
    let mut frame = dst.to_vec();
    frame.extend(src);
    frame.extend(0x0800u16.to_be_bytes());
    frame.extend(packet);
    frame
}

/// Sends `packet` three times from the segment's host (its own MAC) to node 2's MAC,
/// and waits for what might arrive.
fn send_to_node_2_three_times(cluster: &ebpf_cni_tests::cluster::TestCluster, packet: &[u8]) {
    let frame = ethernet(
        cluster.node(2).netns.mac("uplink0"),
        cluster.segment.mac("br0"),
        packet,
    );
    for _ in 0..3 {
        send_frame(&cluster.segment, "br0", &frame).expect("send");
    }
    std::thread::sleep(Duration::from_millis(300));
}

fn addr(text: &str) -> Ipv4Addr {
    text.parse().expect("an address")
}

#[test]
fn a_host_on_the_underlay_forging_a_nodes_vxlan_is_dropped() {
    use ebpf_cni_tests::cluster::{TestCluster, node_addr};

    require_root();
    let cluster = TestCluster::start(&RANGES, &[]);
    let b = cluster.node(2).add_pod("forged-vxlan-b");
    let c = cluster.node(3).add_pod("forged-vxlan-c");
    let echo = UdpEcho::start(&b.netns, PORT);
    // The honest way: node 3's pod reaches b (and node 2 learns node 3's MAC).
    ebpf_cni_tests::traffic::udp_round_trip(&c.netns, 0, (b.ip, PORT).into(), b"honest")
        .expect("c reaches b");
    let honest = echo.peers().len();

    // The segment's host sends VXLAN as node 3 (its address as the outer source, from
    // the host's own MAC), carrying a datagram from node 3's pod range to b.
    let inner = udp_packet(
        SocketAddrV4::new(FORGED_POD, 4242),
        SocketAddrV4::new(b.ip, PORT),
        b"forged",
    );
    let mut vxlan = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    vxlan.extend(ethernet(
        [0x02, 0, 0, 0, 0, 2],
        [0x02, 0, 0, 0, 0, 3],
        &inner,
    ));
    let outer = udp_packet(
        SocketAddrV4::new(addr(&node_addr(3)), 40123),
        SocketAddrV4::new(addr(&node_addr(2)), 8472),
        &vxlan,
    );
    send_to_node_2_three_times(&cluster, &outer);
    assert_eq!(
        echo.peers().len(),
        honest,
        "the forged datagram reached b: {:?}",
        echo.peers()
    );
    let status = cluster.node(2).instance.cli_json(&["status"]);
    assert!(
        status["drops"]["underlay_spoofed"].as_u64() >= Some(3),
        "dropped and counted: {status}"
    );
    ebpf_cni_tests::traffic::udp_round_trip(&c.netns, 0, (b.ip, PORT).into(), b"still honest")
        .expect("c still reaches b");
}

/// Packets node 2's netfilter saw from node 3's range (a counting rule in FORWARD).
fn forwarded_from_node_3(cluster: &ebpf_cni_tests::cluster::TestCluster) -> u64 {
    let out = cluster
        .node(2)
        .netns
        .run("iptables", &["-w", "-x", "-n", "-v", "-L", "FORWARD"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|line| line.contains(RANGES[2]))
        .and_then(|line| line.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no counting rule: {text}"))
}

#[test]
fn natively_routed_packets_not_tied_to_their_node_cross_the_nodes_firewall() {
    use ebpf_cni_tests::cluster::TestCluster;

    require_root();
    let cluster = TestCluster::start(&RANGES, &["--routing", "native"]);
    let b = cluster.node(2).add_pod("native-b");
    let c = cluster.node(3).add_pod("native-c");
    let echo = UdpEcho::start(&b.netns, PORT);
    // Node 2's firewall drops what comes from node 3's range through its stack.
    let firewall = cluster.node(2).netns.run(
        "iptables",
        &["-w", "-I", "FORWARD", "-s", RANGES[2], "-j", "DROP"],
    );
    assert!(firewall.status.success(), "{firewall:?}");
    // Node 3's pod, tied to node 3 (relaxed): straight into b.
    ebpf_cni_tests::traffic::udp_round_trip(&c.netns, 0, (b.ip, PORT).into(), b"honest")
        .expect("c reaches b");
    let honest = echo.peers().len();
    // The segment's host forges a datagram of node 3's range to b.
    let forged = udp_packet(
        SocketAddrV4::new(FORGED_POD, 4242),
        SocketAddrV4::new(b.ip, PORT),
        b"forged",
    );
    send_to_node_2_three_times(&cluster, &forged);
    assert_eq!(
        echo.peers().len(),
        honest,
        "the forged datagram skipped the firewall"
    );
    assert_eq!(
        forwarded_from_node_3(&cluster),
        3,
        "the stack's firewall took them"
    );
    let status = cluster.node(2).instance.cli_json(&["status"]);
    assert!(
        status["nat_counters"]["underlay_to_stack"].as_u64() >= Some(3),
        "counted: {status}"
    );
}

#[test]
fn with_strict_underlay_trust_other_nodes_pods_cross_the_nodes_stack() {
    use ebpf_cni_tests::cluster::TestCluster;

    require_root();
    let cluster = TestCluster::start(
        &RANGES,
        &["--routing", "native", "--underlay-trust", "strict"],
    );
    let b = cluster.node(2).add_pod("strict-b");
    let c = cluster.node(3).add_pod("strict-c");
    let _echo = UdpEcho::start(&b.netns, PORT);
    let counting = cluster.node(2).netns.run(
        "iptables",
        &["-w", "-I", "FORWARD", "-s", RANGES[2], "-j", "ACCEPT"],
    );
    assert!(counting.status.success(), "{counting:?}");
    ebpf_cni_tests::traffic::udp_round_trip(&c.netns, 0, (b.ip, PORT).into(), b"through")
        .expect("c reaches b through node 2's stack");
    assert!(
        forwarded_from_node_3(&cluster) >= 1,
        "node 2's netfilter saw it"
    );
}
