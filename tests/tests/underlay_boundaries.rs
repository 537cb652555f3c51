//! What a host on the underlay cannot do to the node's pods: a frame addressed to
//! another host's MAC (flooded by a switch, or seen by a promiscuous uplink) is never
//! translated nor delivered into a pod, even when it matches a pod's flow; the same
//! packet to the node's own MAC is.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    traffic::{
        UdpEcho, run_in,
        spoof::{send_frame, udp_frame},
    },
};
use serde_json::Value;

const PORT: u16 = 9100;

fn mac_of(netns: &Netns, ifname: &str) -> [u8; 6] {
    let out = netns.ip(&["-j", "link", "show", "dev", ifname]);
    let links: Value = serde_json::from_str(&out).expect("ip -j prints JSON");
    let text = links[0]["address"].as_str().expect("a MAC");
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(text.split(':')) {
        *byte = u8::from_str_radix(part, 16).expect("hex");
    }
    mac
}

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
    let src_mac = mac_of(&node.external, "eth0");
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
    let node_mac = mac_of(&node.netns, "uplink0");
    send_frame(&node.external, "eth0", &frame(node_mac, b"the node's")).expect("send");
    assert_eq!(received(&socket).as_deref(), Some(&b"the node's"[..]));
}
