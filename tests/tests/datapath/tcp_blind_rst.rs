//! A host that knows a connection's addresses and ports but not its sequence numbers
//! (it spoofs the other end) sends RSTs and FINs at guessed sequence numbers to an idle
//! connection: its flow stays established, is not swept as closed, and the connection
//! works after the closed timeout. Through source NAT and through a hostPort mapping, in
//! namespaces, the segments sent from a raw socket.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    thread,
    time::Duration,
};

use cni_ebpf_common::{NatEntry, NatKey, NatReverseKey, map_names, tcp_state};
use ebpf_cni_tests::{
    nat_frames::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, Pod, port_mappings},
    require_root,
    snat::TCP_PORT,
    traffic::{EchoServer, many_connections, spoof::send_tcp_as},
};

const CONTAINER_PORT: u16 = 8080;
const HOST_PORT: u16 = 30081;

/// A node whose closed flows expire after 2 s, swept every second: a flow a blind RST
/// closed would be gone within the test.
fn node(subnet: &str) -> Node {
    Node::start_with(
        subnet,
        &[],
        &["--nat-tcp-closed-timeout", "2", "--nat-gc-interval", "1"],
    )
}

fn addr(text: &str) -> Ipv4Addr {
    text.parse().expect("an address")
}

/// Half the sequence space away from `mark`: as far from the window as a guess can be.
fn far_from(mark: u32) -> u32 {
    mark.wrapping_add(0x8000_0000)
}

/// Leaves `connection` idle past the closed timeout and two sweeps (a flow closed by
/// the RST would be gone), then checks that it still echoes.
fn still_works(mut connection: TcpStream) {
    thread::sleep(Duration::from_secs(4));
    connection
        .write_all(b"after the guesses\n")
        .expect("the connection still takes data");
    let mut back = [0u8; 18];
    connection
        .read_exact(&mut back)
        .expect("the connection still echoes (not reset)");
    assert_eq!(&back, b"after the guesses\n");
}

/// One connection from `netns` to `to`, open and idle.
fn idle_connection(netns: &ebpf_cni_tests::netns::Netns, to: SocketAddrV4) -> TcpStream {
    many_connections(netns, to.into(), 1)
        .expect("a connection")
        .pop()
        .expect("one connection")
}

#[test]
fn blind_rsts_and_fins_from_a_spoofing_host_do_not_cut_a_pods_connection_through_source_nat() {
    require_root();
    let node = node("10.244.85.0/24");
    let pod = node.add_pod("blind-snat");
    let server = EchoServer::start(&node.external, TCP_PORT);
    let to_server = SocketAddrV4::new(addr(EXTERNAL_ADDR), TCP_PORT);
    let connection = idle_connection(&pod.netns, to_server);
    let flow = |node: &Node| -> (NatReverseKey, NatEntry) {
        node.flow_table::<NatReverseKey>(map_names::NAT_IN)
            .iter()
            .map(|flow| flow.expect("a readable flow"))
            .find(|(key, _)| key.remote_port == TCP_PORT)
            .expect("the connection's flow")
    };
    let (key, entry) = flow(&node);
    assert_eq!(entry.state, tcp_state::ESTABLISHED);
    // The server's address and port, to the node port: all a spoofing host needs.
    let from = SocketAddrV4::new(addr(EXTERNAL_ADDR), TCP_PORT);
    let to = SocketAddrV4::new(addr(NODE_ADDR), key.node_port);
    let guess = far_from(entry.seq[1]);
    for flags in [TCP_RST, TCP_RST | TCP_ACK, TCP_FIN | TCP_ACK] {
        send_tcp_as(&node.external, from, to, flags, (guess, guess)).expect("sent");
    }
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        flow(&node).1.state,
        tcp_state::ESTABLISHED,
        "guessed sequence numbers move nothing"
    );
    still_works(connection);
    assert_eq!(
        server.peers().len(),
        1,
        "one connection: {:?}",
        server.peers()
    );
}

/// The hostPort connection (to the pod's `CONTAINER_PORT`) as `HOSTPORT_FLOWS` holds it.
fn host_port_connection(node: &Node) -> (NatKey, NatEntry) {
    node.flow_table::<NatKey>(map_names::HOSTPORT_FLOWS)
        .iter()
        .map(|flow| flow.expect("a readable connection"))
        .find(|(key, _)| key.pod_port == CONTAINER_PORT)
        .expect("the connection")
}

/// An idle connection from the external host through a host port to a pod's echo
/// server, established, with what a spoofer knows of it.
struct Spoofable {
    client: TcpStream,
    /// The client's address and port.
    from: SocketAddrV4,
    /// The host address and port.
    to: SocketAddrV4,
    /// The client's highest sequence number the flow has seen.
    seq: u32,
    // Dropped in this order: the server before its pod, the pod before its node.
    _server: EchoServer,
    _pod: Pod,
    node: Node,
}

/// A [`Spoofable`] connection through `host_port` to a pod of a new node on `subnet`.
fn spoofable_host_port_connection(subnet: &str, tag: &str, host_port: u16) -> Spoofable {
    let node = node(subnet);
    let pod = node.add_pod_with(
        tag,
        &port_mappings(CONTAINER_PORT, &[(host_port, "tcp", None)]),
    );
    let server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let to = SocketAddrV4::new(addr(NODE_ADDR), host_port);
    let client = idle_connection(&node.external, to);
    let (key, entry) = host_port_connection(&node);
    assert_eq!(entry.state, tcp_state::ESTABLISHED);
    Spoofable {
        client,
        from: SocketAddrV4::new(addr(EXTERNAL_ADDR), key.remote_port),
        to,
        seq: entry.seq[0],
        _server: server,
        _pod: pod,
        node,
    }
}

#[test]
fn a_blind_rst_from_a_spoofing_host_does_not_cut_a_connection_through_a_host_port() {
    require_root();
    let flow = spoofable_host_port_connection("10.244.86.0/24", "blind-hostport", HOST_PORT);
    let guess = far_from(flow.seq);
    send_tcp_as(&flow.node.external, flow.from, flow.to, TCP_RST, (guess, 0)).expect("sent");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        host_port_connection(&flow.node).1.state,
        tcp_state::ESTABLISHED,
        "a guessed sequence number moves nothing"
    );
    still_works(flow.client);
}

#[test]
fn a_syn_then_a_rst_at_its_own_number_do_not_cut_a_connection_through_a_host_port() {
    require_root();
    let flow = spoofable_host_port_connection("10.244.87.0/24", "syn-hostport", HOST_PORT + 1);
    // The client's 4-tuple is all the spoofer knows: its own SYN, then a RST at the
    // number the SYN gave.
    let chosen = far_from(flow.seq);
    let external = &flow.node.external;
    send_tcp_as(external, flow.from, flow.to, TCP_SYN, (chosen, 0)).expect("sent");
    thread::sleep(Duration::from_millis(100));
    send_tcp_as(external, flow.from, flow.to, TCP_RST, (chosen, 0)).expect("sent");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        host_port_connection(&flow.node).1.state,
        tcp_state::ESTABLISHED,
        "a SYN on the live connection reopened nothing"
    );
    still_works(flow.client);
}
