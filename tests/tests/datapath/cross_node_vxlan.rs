//! Pods on different nodes with `--routing vxlan`, the default (issue 24, point 3):
//! three nodes on one segment, each with its own daemon and overlay device. TCP, UDP and
//! ICMP cross between their pods with the pods' own addresses, inside VXLAN; pods get
//! the uplink's MTU less the overlay's 50 bytes, and a 4 MiB transfer arrives intact;
//! the node's own traffic reaches other nodes' pods from the overlay's address; a pod
//! reaches another node and a hostPort there (translated, out of the uplink); traffic
//! to the outside is still translated. Once the remote node (or the router towards it)
//! is a known neighbour, the pod program encapsulates itself and the overlay device
//! sends nothing; a whole datagram at the pods' MTU takes the device. What comes out
//! of the tunnel is checked: a host that is no node, speaking VXLAN for a node's pod
//! range, is dropped and counted. Single packets for a pod are taken out of the tunnel
//! by the uplink's program and the overlay device receives none of them; no
//! translated UDP flow and no hostPort gets the overlay's port. A node restarted over
//! pins of another layout (an `OVERLAY_CONFIG` without the port) starts fresh, and its
//! pods reach the other node's again.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use cni_ebpf_common::{OverlayConfig, map_names};
use ebpf_cni_tests::{
    cluster::{
        SEGMENT_HOST, TestCluster, daemon_routes, last_peer, node_addr, node_name,
        pods_talk_as_themselves,
    },
    daemon::Daemon,
    netns::Netns,
    node::port_mappings,
    require_root,
    traffic::{EchoServer, UdpEcho, bulk, round_trip, udp_round_trip},
};

const RANGES: [&str; 3] = ["10.244.121.0/24", "10.244.122.0/24", "10.244.123.0/24"];
const PORT: u16 = 9500;

fn to(ip: Ipv4Addr) -> SocketAddr {
    (ip, PORT).into()
}

/// The overlay device's name.
const DEVICE: &str = "ebpf-vxlan";

/// Packets `device` in `netns` sent.
fn tx_packets(netns: &Netns, device: &str) -> u64 {
    packets(netns, device, "tx")
}

/// Packets `device` in `netns` counted one `way` ("rx" or "tx").
fn packets(netns: &Netns, device: &str, way: &str) -> u64 {
    let shown: serde_json::Value =
        serde_json::from_str(&netns.ip(&["-s", "-j", "link", "show", device]))
            .expect("ip -j prints JSON");
    shown[0]["stats64"][way]["packets"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {way} count in {shown}"))
}

/// The MTU of `device` in `netns`.
fn mtu(netns: &Netns, device: &str) -> u32 {
    let shown = netns.ip(&["-o", "link", "show", device]);
    shown
        .split_whitespace()
        .skip_while(|word| *word != "mtu")
        .nth(1)
        .and_then(|mtu| mtu.parse().ok())
        .unwrap_or_else(|| panic!("no mtu in {shown}"))
}

#[test]
fn pods_on_three_nodes_talk_through_the_overlay_with_their_own_addresses() {
    require_root();
    let cluster = TestCluster::start(&RANGES, &[]);
    let a = cluster.node(1).add_pod("vxlan-a");
    let b = cluster.node(2).add_pod("vxlan-b");
    let c = cluster.node(3).add_pod("vxlan-c");

    assert_eq!(mtu(&cluster.node(1).netns, DEVICE), 1450);
    assert_eq!(
        mtu(&a.netns, "eth0"),
        1450,
        "the pod's MTU leaves room for the overlay"
    );
    assert_eq!(
        daemon_routes(&cluster.node(1).netns),
        [
            format!("{} dev ebpf-vxlan scope link src 10.244.121.0", RANGES[1]),
            format!("{} dev ebpf-vxlan scope link src 10.244.121.0", RANGES[2]),
        ],
        "node 1 routes the other nodes' ranges into the overlay"
    );

    pods_talk_as_themselves(&cluster, [&a, &b, &c], PORT);

    // Single packets out of the tunnel are taken out by the receiving node's uplink
    // program and handed to the pod: neither node's overlay device receives them.
    let received = || [1, 2].map(|n| packets(&cluster.node(n).netns, DEVICE, "rx"));
    let before = received();
    let ping = a.netns.run(
        "ping",
        &["-c", "3", "-i", "0.2", "-W", "2", &b.ip.to_string()],
    );
    assert!(ping.status.success(), "pod a pings pod b: {ping:?}");
    assert_eq!(received(), before, "the uplink programs delivered them");

    // The pod program encapsulates itself (GSO bursts included) once node 2's address
    // is a known neighbour: the overlay device sends none of it.
    let (device_before, uplink_before) = (
        tx_packets(&cluster.node(1).netns, DEVICE),
        tx_packets(&cluster.node(1).netns, "uplink0"),
    );
    let receiving = bulk::sink(&b.netns, PORT + 3, 4 << 20);
    bulk::send(&a.netns, (b.ip, PORT + 3).into(), 4 << 20).expect("4 MiB through the overlay");
    let received = receiving.join().expect("the sink");
    assert!(received.intact, "4 MiB arrive intact, in order");
    assert_eq!(received.peer.ip(), IpAddr::V4(a.ip));
    assert_eq!(
        tx_packets(&cluster.node(1).netns, DEVICE),
        device_before,
        "the pod program encapsulated the transfer itself"
    );
    assert!(
        tx_packets(&cluster.node(1).netns, "uplink0") > uplink_before + 60,
        "the transfer left by the uplink"
    );
    // A whole datagram at the pods' MTU, which the kernel cannot grow in the pod's veth
    // (its growth check is against that veth's MTU): the device carries it.
    let _udp_b = UdpEcho::start(&b.netns, PORT + 5);
    let datagram = vec![7u8; 1450 - 28];
    let echoed = udp_round_trip(&a.netns, 0, (b.ip, PORT + 5).into(), &datagram)
        .expect("a datagram at the pods' MTU crosses");
    assert_eq!(echoed, datagram);

    let nodes = cluster.node(1).instance.cli_json(&["nodes"]);
    let to_node_2 = &nodes["nodes"][1];
    assert_eq!(to_node_2["name"], "node-2", "{nodes}");
    assert!(
        to_node_2["sent_bytes"]
            .as_u64()
            .is_some_and(|bytes| bytes > 4 << 20),
        "node 1's pods' traffic to node 2 is counted: {nodes}"
    );

    // The node's own traffic, from the overlay's address.
    let tcp_b = EchoServer::start(&b.netns, PORT + 4);
    let to_b: SocketAddr = (b.ip, PORT + 4).into();
    round_trip(&cluster.node(1).netns, to_b, b"from node 1").expect("node 1 reaches pod b");
    assert_eq!(
        last_peer(&tcp_b.peers()),
        "10.244.121.0".parse::<IpAddr>().expect("an address"),
    );

    // Pod to another node: out of the uplink, translated to the sending node's address.
    let node_2: Ipv4Addr = node_addr(2).parse().expect("an address");
    let on_node_2 = EchoServer::start(&cluster.node(2).netns, PORT + 1);
    round_trip(&a.netns, (node_2, PORT + 1).into(), b"to node 2").expect("pod a reaches node 2");
    assert_eq!(
        last_peer(&on_node_2.peers()),
        node_addr(1).parse::<IpAddr>().expect("an address"),
        "node 2 sees node 1's address"
    );

    // A hostPort on node 2, reached from node 1's pod.
    let mapped = cluster.node(2).add_pod_with(
        "vxlan-mapped",
        &port_mappings(PORT + 2, &[(30_090, "tcp", None)]),
    );
    let _mapped_server = EchoServer::start(&mapped.netns, PORT + 2);
    round_trip(
        &a.netns,
        (node_2, 30_090).into(),
        b"to a hostPort of node 2",
    )
    .expect("pod a reaches node 2's hostPort");
}

#[test]
fn vxlan_from_a_host_that_is_no_node_is_dropped_and_counted() {
    require_root();
    let cluster = TestCluster::start(&RANGES, &[]);
    let b = cluster.node(2).add_pod("vxlan-target");
    // The segment's host speaks VXLAN (VNI 1, port 8472) to node 2, claiming an address
    // of node 3's range.
    let host = &cluster.segment;
    host.ip(&[
        "link",
        "add",
        "vx",
        "type",
        "vxlan",
        "id",
        "1",
        "remote",
        &node_addr(2),
        "dstport",
        "8472",
        "dev",
        "br0",
    ]);
    host.ip(&["addr", "add", "10.244.123.9/32", "dev", "vx"]);
    host.ip(&["link", "set", "vx", "arp", "off", "up"]);
    host.ip(&[
        "route",
        "add",
        RANGES[1],
        "dev",
        "vx",
        "src",
        "10.244.123.9",
    ]);
    let ping = host.run(
        "ping",
        &["-c", "2", "-i", "0.2", "-W", "1", &b.ip.to_string()],
    );
    assert!(
        !ping.status.success(),
        "the forged packets reach no pod: {ping:?}"
    );
    let status = cluster.node(2).instance.cli_json(&["status"]);
    let spoofed = status["drops"]["overlay_spoofed_source"]
        .as_u64()
        .unwrap_or_else(|| panic!("a drop count: {status}"));
    assert!(spoofed >= 2, "dropped and counted: {status}");
}

#[test]
fn a_node_behind_a_router_is_reached_through_the_overlay() {
    require_root();
    // Node 2 is not on node 1's segment: the segment's host routes between them, and
    // knows nothing of pod ranges.
    let cluster = TestCluster::start_routed(&["10.244.124.0/24", "10.244.125.0/24"], 1, &[]);
    let a = cluster.node(1).add_pod("routed-a");
    let b = cluster.node(2).add_pod("routed-b");
    let server = EchoServer::start(&b.netns, PORT);
    round_trip(&a.netns, to(b.ip), b"over a router").expect("pod a reaches pod b");
    assert_eq!(
        last_peer(&server.peers()),
        IpAddr::V4(a.ip),
        "b sees a's own address"
    );
    let ping = b.netns.run(
        "ping",
        &["-c", "2", "-i", "0.2", "-W", "2", &a.ip.to_string()],
    );
    assert!(ping.status.success(), "pod b pings pod a: {ping:?}");
    // The router is a known neighbour now: the pod program sends to it itself.
    let device_before = tx_packets(&cluster.node(1).netns, DEVICE);
    round_trip(&a.netns, to(b.ip), b"again").expect("pod a reaches pod b again");
    assert_eq!(
        tx_packets(&cluster.node(1).netns, DEVICE),
        device_before,
        "encapsulated by the pod program, sent to the router"
    );
}

#[test]
fn a_node_restarted_over_pins_of_another_layout_starts_fresh_and_reaches_the_others() {
    require_root();
    let mut cluster = TestCluster::start(&["10.244.126.0/24", "10.244.127.0/24"], &[]);
    let a = cluster.node(1).add_pod("earlier-a");
    let b = cluster.node(2).add_pod("earlier-b");
    let _server = EchoServer::start(&b.netns, PORT);
    round_trip(&a.netns, to(b.ip), b"before").expect("pod a reaches pod b");

    // Another layout's pins: an OVERLAY_CONFIG of 8 bytes, before the UDP port, and no
    // LAYOUT beside it.
    let node = &mut cluster.nodes[0];
    let pin = node.instance.bpf_dir.join(map_names::OVERLAY_CONFIG);
    let value_size = |pin: &std::path::Path| {
        aya::maps::MapInfo::from_pin(pin)
            .expect("a pinned OVERLAY_CONFIG")
            .value_size() as usize
    };
    assert_eq!(value_size(&pin), size_of::<OverlayConfig>());
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.pin_map_of_another_layout(&pin, "array", (4, 8, 1));
    std::fs::remove_file(node.instance.bpf_dir.join(map_names::LAYOUT)).expect("unpin LAYOUT");
    let name = node_name(1);
    let [file_flag, path] = cluster.file.flags();
    node.daemon = Daemon::start_with(
        &node.netns,
        &node.instance,
        &[],
        &["--node-name", &name, file_flag, path],
    );
    assert_eq!(
        value_size(&pin),
        size_of::<OverlayConfig>(),
        "made anew at this layout's size"
    );
    assert!(
        node.instance.log().contains("of another layout"),
        "said in the log"
    );
    // The port the pod program encapsulates to comes from the new map: node 2's
    // device would not take the packets without it.
    let device_before = tx_packets(&cluster.node(1).netns, DEVICE);
    round_trip(&a.netns, to(b.ip), b"after").expect("pod a reaches pod b after the start");
    assert_eq!(
        tx_packets(&cluster.node(1).netns, DEVICE),
        device_before,
        "encapsulated by the pod program"
    );
}

#[test]
fn neither_translated_flows_nor_host_ports_take_the_overlays_port() {
    require_root();
    // Two node ports for translated flows, one of them the overlay's.
    let cluster = TestCluster::start(&["10.244.128.0/24"], &["--nat-port-range", "8472-8473"]);
    let a = cluster.node(1).add_pod("reserved-a");
    let outside: SocketAddr = (SEGMENT_HOST.parse::<Ipv4Addr>().expect("an address"), PORT).into();
    let echo = UdpEcho::start(&cluster.segment, PORT);
    udp_round_trip(&a.netns, 5001, outside, b"first").expect("the first flow gets a port");
    let node: IpAddr = node_addr(1).parse().expect("an address");
    assert_eq!(
        echo.peers(),
        [SocketAddr::new(node, 8473)],
        "translated to the port that is not the overlay's"
    );
    assert!(
        udp_round_trip(&a.netns, 5002, outside, b"second").is_err(),
        "no port is left for a second flow"
    );
    let status = cluster.node(1).instance.cli_json(&["status"]);
    assert!(
        status["drops"]["nat_ports_exhausted"]
            .as_u64()
            .is_some_and(|drops| drops >= 1),
        "counted: {status}"
    );
    assert_eq!(echo.peers().len(), 1, "nothing else reached the outside");

    // Nor does a hostPort: refused at ADD, as a taken port is.
    let (_refused, outcome) = cluster
        .node(1)
        .try_add("reserved-hp", &port_mappings(PORT, &[(8472, "udp", None)]));
    let error = outcome.error(105);
    assert!(
        error["msg"]
            .as_str()
            .is_some_and(|msg| msg.contains("8472/udp is the overlay's")),
        "{error}"
    );
}
