//! What a pod with CAP_NET_RAW cannot do to the node and to other nodes: configure the
//! node with IPv6 (a Router Advertisement) or any EtherType but IPv4 and ARP, and send
//! tunnel packets (VXLAN, IP-in-IP, GRE) that another node would take out of its tunnel
//! as a node's. Each case first shows that the honest traffic on the same path passes.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    thread,
    time::Duration,
};

use ebpf_cni_tests::{
    cluster::{SEGMENT_HOST, TestCluster, node_addr},
    frames::internet_checksum,
    netns::Netns,
    node::Node,
    require_root,
    traffic::{
        RawSocket, UdpEcho, run_in,
        spoof::{Capture, send_frame},
        udp_round_trip,
    },
};
use serde_json::Value;

const PORT: u16 = 9000;

fn drops(status: &Value, reason: &str) -> u64 {
    status["drops"][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no {reason} counter in {status}"))
}

/// What a forged packet might take to arrive, were it let through.
fn settle() {
    thread::sleep(Duration::from_millis(300));
}

/// A Router Advertisement from `from_mac` (link-local fe80::bad) to all nodes: a
/// default router for 30 minutes, and the prefix 2001:db8:bad::/64 to configure an
/// address from.
fn router_advertisement(from_mac: [u8; 6]) -> Vec<u8> {
    let source: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b, 0xad];
    let all_nodes: [u8; 16] = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    // Type 134, code 0, checksum, hop limit 64, no flags, router lifetime 1800 s,
    // reachable time and retransmission timer unspecified.
    let mut icmp = vec![134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
    // Source link-layer address.
    icmp.extend([1, 1]);
    icmp.extend(from_mac);
    // Prefix information: /64, on-link and autonomous, valid 1 day, preferred 4 hours.
    icmp.extend([3, 4, 64, 0xc0]);
    icmp.extend(86_400u32.to_be_bytes());
    icmp.extend(14_400u32.to_be_bytes());
    icmp.extend([0; 4]);
    icmp.extend([
        0x20, 0x01, 0x0d, 0xb8, 0x0b, 0xad, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    let len = u16::try_from(icmp.len()).expect("a small packet");
    let mut pseudo = [&source[..], &all_nodes[..]].concat();
    pseudo.extend(u32::from(len).to_be_bytes());
    pseudo.extend([0, 0, 0, 58]);
    pseudo.extend(&icmp);
    let checksum = internet_checksum(&pseudo);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());

    let mut frame = vec![0x33, 0x33, 0, 0, 0, 1];
    frame.extend(from_mac);
    frame.extend(0x86ddu16.to_be_bytes());
    // Version 6, payload length, next header ICMPv6, hop limit 255 (on-link only).
    frame.extend([0x60, 0, 0, 0]);
    frame.extend(len.to_be_bytes());
    frame.extend([58, 255]);
    frame.extend(source);
    frame.extend(all_nodes);
    frame.extend(icmp);
    frame
}

fn sysctl(netns: &Netns, path: &str) -> String {
    let out = netns.run("cat", &[path]);
    assert!(out.status.success(), "cannot read {path}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn a_pods_router_advertisement_never_configures_the_node() {
    require_root();
    let node = Node::start("10.244.94.0/24");
    let pod = node.add_pod("ra");
    let host = node.host_veth(&pod);
    let conf = format!("/proc/sys/net/ipv6/conf/{host}");
    assert_eq!(sysctl(&node.netns, &format!("{conf}/disable_ipv6")), "1");
    assert_eq!(sysctl(&node.netns, &format!("{conf}/accept_ra")), "0");
    // The pod's IPv4 goes on as before.
    let _outside = UdpEcho::start(&node.external, PORT);
    let to: SocketAddr = (node_external(), PORT).into();
    udp_round_trip(&pod.netns, 0, to, b"ipv4").expect("the pod's IPv4 goes out");

    // The kernel on the host veth would take an RA even with IPv6 off elsewhere on the
    // node: turn it on where the datapath alone must stop it.
    node.netns
        .run("sh", &["-c", &format!("echo 0 > {conf}/disable_ipv6")]);
    node.netns
        .run("sh", &["-c", &format!("echo 1 > {conf}/accept_ra")]);
    let advertisement = router_advertisement(pod.netns.mac("eth0"));
    for _ in 0..3 {
        send_frame(&pod.netns, "eth0", &advertisement).expect("send");
    }
    settle();
    let routes = node.netns.ip(&["-6", "route", "show"]);
    assert!(
        !routes.contains("default") && !routes.contains("2001:db8:bad"),
        "the pod gave the node IPv6 routes: {routes}"
    );
    let addresses = node.netns.ip(&["-6", "addr", "show"]);
    assert!(
        !addresses.contains("2001:db8:bad"),
        "the pod gave the node an address: {addresses}"
    );
    let status = node.instance.cli_json(&["status"]);
    // The pod's own IPv6 (its router solicitations) is counted with them.
    assert!(
        drops(&status, "pod_ethertype") >= 3,
        "each counted: {status}"
    );
}

fn node_external() -> Ipv4Addr {
    ebpf_cni_tests::node::EXTERNAL_ADDR
        .parse()
        .expect("an address")
}

/// A VXLAN packet (VNI 1, flannel's and the overlay's default) holding a UDP datagram
/// from `source` to `to` carrying `payload`, as a pod would send it to another node's
/// overlay port from an ordinary UDP socket.
fn vxlan_payload(source: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut inner = vec![0x45, 0];
    let total = u16::try_from(28 + payload.len()).expect("a small packet");
    inner.extend(total.to_be_bytes());
    inner.extend([0, 1, 0x40, 0, 64, 17, 0, 0]);
    inner.extend(source.ip().octets());
    inner.extend(to.ip().octets());
    let checksum = internet_checksum(&inner);
    inner[10..12].copy_from_slice(&checksum.to_be_bytes());
    inner.extend(source.port().to_be_bytes());
    inner.extend(to.port().to_be_bytes());
    inner.extend((total - 20).to_be_bytes());
    inner.extend([0, 0]);
    inner.extend(payload);
    let mut packet = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    packet.extend([0x02, 0, 0, 0, 0, 0x0b]);
    packet.extend([0x02, 0, 0, 0, 0, 0x0a]);
    packet.extend(0x0800u16.to_be_bytes());
    packet.extend(inner);
    packet
}

const RANGES: [&str; 3] = ["10.244.124.0/24", "10.244.125.0/24", "10.244.126.0/24"];

#[test]
fn a_pod_cannot_tunnel_into_another_node() {
    require_root();
    let cluster = TestCluster::start(&RANGES, &[]);
    let a = cluster.node(1).add_pod("tunnel-a");
    let b = cluster.node(2).add_pod("tunnel-b");
    let target = UdpEcho::start(&b.netns, PORT);
    // The honest way: a reaches b through the overlay.
    udp_round_trip(&a.netns, 0, (b.ip, PORT).into(), b"honest").expect("a reaches b");
    assert_eq!(target.peers().len(), 1);

    // From a plain UDP socket: VXLAN to node 2's overlay port, its inner datagram from
    // an address of node 1's range to b. Source NAT would give it node 1's address,
    // the outer source node 2 takes node 1's pods' traffic from.
    let forged_source = SocketAddrV4::new(Ipv4Addr::new(10, 244, 124, 77), 4242);
    let inner = vxlan_payload(forged_source, SocketAddrV4::new(b.ip, PORT), b"tunnelled");
    let node2: Ipv4Addr = node_addr(2).parse().expect("an address");
    run_in(&a.netns, move || {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        for _ in 0..3 {
            socket.send_to(&inner, (node2, 8472))?;
        }
        Ok::<_, std::io::Error>(())
    })
    .expect("send");
    // IP-in-IP and GRE to the node, from raw sockets.
    for proto in [4, 47] {
        RawSocket::open(&a.netns, proto)
            .send_to(node2, &[0x45, 0, 0, 20])
            .expect("send");
    }
    settle();
    assert_eq!(
        target.peers().len(),
        1,
        "the tunnelled datagram reached b: {:?}",
        target.peers()
    );
    let status = cluster.node(1).instance.cli_json(&["status"]);
    assert_eq!(drops(&status, "pod_tunnel"), 5, "each counted: {status}");

    // A tunnel to a host that is no node goes out as any traffic does.
    let capture = Capture::start(&cluster.segment);
    let host: Ipv4Addr = SEGMENT_HOST.parse().expect("an address");
    let own = vxlan_payload(forged_source, SocketAddrV4::new(host, PORT), b"own-tunnel");
    run_in(&a.netns, move || {
        UdpSocket::bind("0.0.0.0:0")?.send_to(&own, (host, 8472))
    })
    .expect("send");
    settle();
    // (Seen once on each of the segment's interfaces it crosses.)
    assert!(
        capture.count(b"own-tunnel") >= 1,
        "a tunnel to the outside leaves"
    );
}

/// A packet whose layer-4 header is perhaps cut short: `l4` after an IPv4 header whose
/// total length counts `counted` bytes of it, with `flags_fragment` as on the wire and
/// `padding` bytes after the packet.
struct Truncated<'a> {
    proto: u8,
    l4: &'a [u8],
    counted: usize,
    flags_fragment: u16,
    padding: usize,
}

/// `packet` in a frame from `pod` to the outside through its gateway.
fn outbound_frame(node: &Node, pod: &ebpf_cni_tests::node::Pod, packet: &Truncated<'_>) -> Vec<u8> {
    let host_mac = node.endpoint(pod)["host_mac"]
        .as_str()
        .expect("the host veth's MAC")
        .split(':')
        .map(|byte| u8::from_str_radix(byte, 16).expect("hex"))
        .collect::<Vec<u8>>();
    let mut frame = host_mac;
    frame.extend(pod.netns.mac("eth0"));
    frame.extend(0x0800u16.to_be_bytes());
    let mut header = vec![0x45, 0];
    header.extend(
        u16::try_from(20 + packet.counted)
            .expect("small")
            .to_be_bytes(),
    );
    header.extend([0x12, 0x34]);
    header.extend(packet.flags_fragment.to_be_bytes());
    header.extend([64, packet.proto, 0, 0]);
    header.extend(pod.ip.octets());
    header.extend(node_external().octets());
    let checksum = internet_checksum(&header);
    header[10..12].copy_from_slice(&checksum.to_be_bytes());
    frame.extend(header);
    frame.extend(packet.l4);
    frame.extend(vec![0xee; packet.padding]);
    frame
}

#[test]
fn a_pods_packet_source_nat_cannot_parse_never_leaves_with_its_address() {
    require_root();
    let node = Node::start("10.244.95.0/24");
    let pod = node.add_pod("unparsable");
    let _outside = UdpEcho::start(&node.external, PORT);
    let to: SocketAddr = (node_external(), PORT).into();
    udp_round_trip(&pod.netns, 0, to, b"parsable").expect("the pod's UDP goes out");

    let udp = [0x9c, 0x40, 0x23, 0x28, 0, 12, 0, 0];
    let tcp = [0x9c, 0x41, 0x23, 0x28, 0, 0, 0, 1];
    let packet = |proto, l4, counted, flags_fragment, padding| Truncated {
        proto,
        l4,
        counted,
        flags_fragment,
        padding,
    };
    let cases = [
        // UDP whose total length holds 4 bytes of its header, the rest padding.
        packet(17, &udp, 4, 0x4000, 30),
        // The same without padding: the frame ends with the total length.
        packet(17, &udp[..4], 4, 0x4000, 0),
        // A first fragment (more follow) with 8 bytes of TCP.
        packet(6, &tcp, 8, 0x2000, 0),
        // TCP counted whole in the total length's 8 bytes, padded.
        packet(6, &tcp, 8, 0x4000, 20),
    ];
    let capture = Capture::start(&node.external);
    for case in &cases {
        let frame = outbound_frame(&node, &pod, case);
        send_frame(&pod.netns, "eth0", &frame).expect("send");
    }
    settle();
    assert_eq!(
        capture.count(&pod.ip.octets()),
        0,
        "a packet left with the pod's address"
    );
    let status = node.instance.cli_json(&["status"]);
    assert_eq!(
        drops(&status, "nat_unparsable"),
        4,
        "each counted: {status}"
    );
    // The pod's parsable traffic still goes out.
    udp_round_trip(&pod.netns, 0, to, b"parsable").expect("the pod's UDP goes out");
}
