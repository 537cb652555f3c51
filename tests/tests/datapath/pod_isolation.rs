//! Pods are untrusted: a pod sends only as itself. IPv4 with another source address (a
//! neighbour's, the node's, a made-up one), frames from another MAC, ARP about anyone
//! else and VLAN-tagged frames (802.1Q and 802.1ad) are dropped by the pod program and
//! counted under their own reasons, and never reach the outside or another pod. Each
//! case first shows that the same path carries the pod's honest traffic.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    thread,
    time::Duration,
};

use ebpf_cni_tests::{
    netns::parse_mac,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, Pod},
    require_root,
    traffic::{
        UdpEcho,
        spoof::{Capture, send_frame, send_udp_as, udp_frame},
        udp_round_trip,
    },
};
use serde_json::Value;

const PORT: u16 = 9000;

fn drops(node: &Node, reason: &str) -> u64 {
    let status = node.instance.cli_json(&["status"]);
    status["drops"][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no {reason} counter in {status}"))
}

fn external(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(EXTERNAL_ADDR.parse().expect("address"), port)
}

/// What a spoofed datagram might take to arrive, were it let through.
fn settle() {
    thread::sleep(Duration::from_millis(300));
}

/// The MAC of `pod`'s host veth, as the daemon recorded it.
fn host_mac(node: &Node, pod: &Pod) -> [u8; 6] {
    parse_mac(
        node.endpoint(pod)["host_mac"]
            .as_str()
            .expect("the host veth's MAC"),
    )
}

#[test]
fn a_pod_cannot_send_as_a_neighbour_the_node_or_a_made_up_address() {
    require_root();
    let node = Node::start("10.244.90.0/24");
    let (a, b) = (node.add_pod("iso-a"), node.add_pod("iso-b"));
    let outside = UdpEcho::start(&node.external, PORT);
    let neighbour = UdpEcho::start(&b.netns, PORT);

    // The pod's own address goes out (translated) and reaches its neighbour.
    send_udp_as(&a.netns, a.ip, 40000, external(PORT), b"honest").expect("send");
    send_udp_as(
        &a.netns,
        a.ip,
        40001,
        SocketAddrV4::new(b.ip, PORT),
        b"honest",
    )
    .expect("send");
    settle();
    assert_eq!(outside.peers().len(), 1, "the honest datagram left");
    assert_eq!(neighbour.peers().len(), 1, "the honest datagram reached b");

    let claimed: [Ipv4Addr; 3] = [
        b.ip,
        NODE_ADDR.parse().expect("address"),
        Ipv4Addr::new(203, 0, 113, 7),
    ];
    for (n, source) in claimed.iter().enumerate() {
        let port = 41000 + n as u16;
        for to in [external(PORT), SocketAddrV4::new(b.ip, PORT)] {
            send_udp_as(&a.netns, *source, port, to, b"spoofed").expect("send");
        }
    }
    settle();
    assert_eq!(outside.peers().len(), 1, "nothing spoofed left the node");
    assert_eq!(neighbour.peers().len(), 1, "nothing spoofed reached b");
    assert_eq!(drops(&node, "spoofed_ipv4_source"), 6);
    // Nothing was remembered for them either.
    let flows = node.instance.cli_json(&["nat"]);
    let flows = flows["entries"].as_array().map_or(0, Vec::len);
    assert_eq!(flows, 1, "only the honest flow is in the NAT table");
}

#[test]
fn a_pod_sending_from_another_mac_is_dropped() {
    require_root();
    let node = Node::start("10.244.91.0/24");
    let (a, b) = (node.add_pod("mac-a"), node.add_pod("mac-b"));
    let _outside = UdpEcho::start(&node.external, PORT);
    let to = external(PORT).into();
    udp_round_trip(&a.netns, 0, to, b"own MAC").expect("the pod's own MAC goes out");
    let capture = Capture::start(&node.external);

    // A new MAC flushes the pod's neighbours: the gateway's is set by hand, so that what
    // leaves is IPv4 (ARP from the new MAC is refused too, as spoofed_arp).
    let gateway = a.netns.ip(&["-j", "route", "show", "default"]);
    let gateway: Value = serde_json::from_str(&gateway).expect("ip -j prints JSON");
    let gateway = gateway[0]["gateway"]
        .as_str()
        .expect("a gateway")
        .to_owned();
    let host = host_mac(&node, &a)
        .map(|byte| format!("{byte:02x}"))
        .join(":");
    let theirs = b
        .netns
        .mac("eth0")
        .map(|byte| format!("{byte:02x}"))
        .join(":");
    a.netns.ip(&["link", "set", "eth0", "address", &theirs]);
    a.netns.ip(&[
        "neigh",
        "replace",
        &gateway,
        "lladdr",
        &host,
        "dev",
        "eth0",
        "nud",
        "permanent",
    ]);
    assert!(
        udp_round_trip(&a.netns, 0, to, b"b's MAC").is_err(),
        "a frame from another pod's MAC went through"
    );
    assert_eq!(capture.count(b"b's MAC"), 0, "it never reached the outside");
    assert!(drops(&node, "spoofed_mac") > 0);
}

/// An ARP reply from `from`'s interface that says `claimed` is at `from`'s MAC.
fn arp_claim(from: &Pod, from_mac: [u8; 6], claimed: Ipv4Addr, to_mac: [u8; 6]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend(to_mac);
    frame.extend(from_mac);
    frame.extend([0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 2]);
    frame.extend(from_mac);
    frame.extend(claimed.octets());
    frame.extend(to_mac);
    frame.extend(from.ip.octets());
    frame
}

#[test]
fn arp_about_another_address_than_the_pods_own_is_dropped() {
    require_root();
    let node = Node::start("10.244.92.0/24");
    let (a, b) = (node.add_pod("arp-a"), node.add_pod("arp-b"));
    let (mac, host_mac) = (a.netns.mac("eth0"), host_mac(&node, &a));

    // About itself: the stack's business, not a drop.
    send_frame(&a.netns, "eth0", &arp_claim(&a, mac, a.ip, host_mac)).expect("send");
    settle();
    assert_eq!(drops(&node, "spoofed_arp"), 0);
    for claimed in [
        b.ip,
        NODE_ADDR.parse().expect("address"),
        Ipv4Addr::UNSPECIFIED,
    ] {
        send_frame(&a.netns, "eth0", &arp_claim(&a, mac, claimed, host_mac)).expect("send");
    }
    settle();
    assert_eq!(drops(&node, "spoofed_arp"), 3);
}

#[test]
fn tagged_frames_from_a_pod_are_dropped_and_never_reach_the_outside() {
    require_root();
    let node = Node::start("10.244.93.0/24");
    let pod = node.add_pod("vlan");
    let (mac, host_mac) = (pod.netns.mac("eth0"), host_mac(&node, &pod));
    let from = SocketAddrV4::new(pod.ip, 40000);
    let frame = |tag, marker: &[u8]| udp_frame(host_mac, mac, tag, from, external(PORT), marker);

    // The same frame without a tag goes out (translated).
    let capture = Capture::start(&node.external);
    send_frame(&pod.netns, "eth0", &frame(None, b"untagged-frame")).expect("send");
    settle();
    // Seen arriving (and quoted again in the port-unreachable the host answers with).
    assert!(
        capture.count(b"untagged-frame") > 0,
        "the untagged frame left"
    );

    let capture = Capture::start(&node.external);
    // 802.1Q VLAN 100, 802.1ad VLAN 42, and a priority tag (VLAN 0).
    for tag in [(0x8100, 100), (0x88a8, 42), (0x8100, 0)] {
        send_frame(&pod.netns, "eth0", &frame(Some(tag), b"tagged-frame")).expect("send");
    }
    settle();
    assert_eq!(
        capture.count(b"tagged-frame"),
        0,
        "a tagged frame reached the outside"
    );
    assert_eq!(drops(&node, "vlan_tagged"), 3);
}

#[test]
fn tagged_frames_on_the_uplink_are_left_alone_never_translated_into_a_pod() {
    require_root();
    let node = Node::start("10.244.94.0/24");
    let pod = node.add_pod("vlan-in");
    let _outside = UdpEcho::start(&node.external, PORT);
    send_udp_as(&pod.netns, pod.ip, 40100, external(PORT), b"opens a flow").expect("send");
    settle();
    let nat = node.instance.cli_json(&["nat"]);
    let flow = nat["entries"][0]["node"]
        .as_str()
        .unwrap_or_else(|| panic!("a translated flow in {nat}"));
    let flow: SocketAddrV4 = flow.parse().expect("node address and port");
    let (uplink, outside) = (node.netns.mac("uplink0"), node.external.mac("eth0"));
    let reply = |tag, marker: &[u8]| udp_frame(uplink, outside, tag, external(PORT), flow, marker);

    // An untagged reply on the flow is translated and delivered into the pod.
    let capture = Capture::start(&pod.netns);
    send_frame(&node.external, "eth0", &reply(None, b"untagged-reply")).expect("send");
    settle();
    assert!(
        capture.count(b"untagged-reply") > 0,
        "the untagged reply reached the pod"
    );

    // A priority-tagged one (802.1Q, VLAN 0, which the node's stack would take as its
    // own) is not: the uplink programs leave tagged frames alone.
    let capture = Capture::start(&pod.netns);
    send_frame(
        &node.external,
        "eth0",
        &reply(Some((0x8100, 0)), b"tagged-reply"),
    )
    .expect("send");
    settle();
    assert_eq!(
        capture.count(b"tagged-reply"),
        0,
        "a tagged frame was translated into the pod"
    );
}
