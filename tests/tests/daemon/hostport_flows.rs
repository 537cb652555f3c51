//! The connections through hostPort mappings (`HOSTPORT_FLOWS`, what a pod's replies
//! are rewritten by): they follow TCP's state, a closed one goes after the closed
//! timeout while an idle open one stays and keeps working (also when the pod speaks
//! first after the idle time, as a server pushing does), a deleted pod's go at once,
//! and they are carried into a table of a new size (`--nat-max-flows` changed), their
//! connections unbroken.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, TcpListener, TcpStream},
    thread,
    time::Duration,
};

use cni_ebpf_common::{NatEntry, NatKey, map_names, tcp_state, udp_state};
use ebpf_cni_tests::{
    daemon::{Daemon, eventually},
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, port_mappings, socket},
    require_root,
    traffic::{EchoServer, UdpEcho, many_connections, round_trip, run_in, udp_round_trip},
};

const CONTAINER_PORT: u16 = 8080;
const HOST_PORT: u16 = 30080;

/// A connection as the resize test compares it: key, state, host address and port,
/// pod address and port.
type Carried = (NatKey, u8, [u8; 4], u16, [u8; 4], u16);

/// A node on `subnet` whose closed connections expire after 2 s, swept every second.
fn swept_every_second(subnet: &str) -> Node {
    Node::start_with(
        subnet,
        &[],
        &["--nat-tcp-closed-timeout", "2", "--nat-gc-interval", "1"],
    )
}

/// The connections of `HOSTPORT_FLOWS`.
fn connections(node: &Node) -> Vec<(NatKey, NatEntry)> {
    node.flow_table::<NatKey>(map_names::HOSTPORT_FLOWS)
        .iter()
        .map(|connection| connection.expect("a readable connection"))
        .collect()
}

fn octets(addr: &str) -> [u8; 4] {
    addr.parse::<std::net::Ipv4Addr>()
        .expect("an address")
        .octets()
}

fn node_addr() -> [u8; 4] {
    octets(NODE_ADDR)
}

/// `ebpf-cnid ports`' connection count per mapping, as (protocol, count).
fn connections_listed(node: &Node) -> Vec<(String, u64)> {
    let mut listed: Vec<(String, u64)> = node
        .instance
        .cli_json(&["ports"])
        .as_array()
        .expect("a list")
        .iter()
        .map(|row| {
            (
                row["protocol"].as_str().unwrap_or("?").to_owned(),
                row["connections"].as_u64().expect("a connection count"),
            )
        })
        .collect();
    listed.sort();
    listed
}

/// Sends a line on `stream` (an open connection through the hostPort) and reads the
/// echo back.
fn still_echoes(stream: &mut TcpStream, line: &[u8]) -> bool {
    let mut back = vec![0u8; line.len()];
    stream.write_all(line).is_ok() && stream.read_exact(&mut back).is_ok() && back == line
}

#[test]
fn hostport_connections_follow_tcp_and_go_once_closed_or_with_their_pod() {
    require_root();
    let node = swept_every_second("10.244.87.0/24");
    let pod = node.add_pod_with(
        "hpf",
        &port_mappings(
            CONTAINER_PORT,
            &[(HOST_PORT, "tcp", None), (HOST_PORT, "udp", None)],
        ),
    );
    let _server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let _udp = UdpEcho::start(&pod.netns, CONTAINER_PORT);
    let to = socket(NODE_ADDR, HOST_PORT);
    let mut held = many_connections(&node.external, to, 1).expect("a connection held open");
    round_trip(&node.external, to, b"closed").expect("a connection opened and closed");
    udp_round_trip(&node.external, 0, to, b"a datagram").expect("a UDP exchange");
    let udp = |node: &Node| -> Vec<u8> {
        connections(node)
            .iter()
            .filter(|(key, _)| key.proto == 17)
            .map(|(_, c)| c.state)
            .collect()
    };
    assert_eq!(
        udp(&node),
        [udp_state::REPLIED],
        "the UDP flow the pod answered"
    );
    let states = |node: &Node| -> Vec<u8> {
        let mut states: Vec<u8> = connections(node)
            .iter()
            .filter(|(key, _)| key.proto == 6)
            .map(|(_, c)| c.state)
            .collect();
        states.sort_unstable();
        states
    };
    assert!(
        eventually(Duration::from_secs(5), || states(&node)
            == [tcp_state::ESTABLISHED, tcp_state::CLOSED]),
        "one connection open, one closed: {:?}",
        connections(&node)
    );
    assert_eq!(
        connections_listed(&node),
        [("tcp".to_owned(), 2), ("udp".to_owned(), 1)],
        "`ports` counts them per mapping"
    );
    for (key, connection) in connections(&node) {
        assert_eq!(
            (key.pod_addr, key.pod_port, key.remote_addr),
            (pod.ip.octets(), CONTAINER_PORT, octets(EXTERNAL_ADDR)),
            "keyed from the pod's side"
        );
        assert_eq!(
            (connection.node_addr, connection.node_port),
            (node_addr(), HOST_PORT),
            "the host address and port the client reached"
        );
    }
    // Past the closed timeout (2 s) and a sweep (every second): the closed one went,
    // the open one, idle meanwhile, stays and still gets its replies from the host port.
    thread::sleep(Duration::from_secs(4));
    assert_eq!(
        states(&node),
        [tcp_state::ESTABLISHED],
        "{:?}",
        connections(&node)
    );
    assert!(
        still_echoes(&mut held[0], b"after the sweep\n"),
        "the idle connection still works"
    );
    assert_eq!(
        connections_listed(&node),
        [("tcp".to_owned(), 1), ("udp".to_owned(), 1)]
    );
    assert_eq!(
        udp(&node),
        [udp_state::REPLIED],
        "the answered UDP flow keeps the stream timeout (120 s)"
    );
    node.del_pod(&pod);
    assert!(
        eventually(Duration::from_secs(5), || connections(&node).is_empty()),
        "a deleted pod's connections go at once: {:?}",
        connections(&node)
    );
}

#[test]
fn a_pod_speaking_first_on_an_idle_hostport_connection_still_leaves_by_the_host_port() {
    require_root();
    let node = swept_every_second("10.244.91.0/24");
    let pod = node.add_pod_with(
        "hpf-push",
        &port_mappings(CONTAINER_PORT, &[(HOST_PORT, "tcp", None)]),
    );
    // A server that pushes: it answers nothing, and writes when the test says so.
    let listener = run_in(&pod.netns, || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, CONTAINER_PORT)).expect("a listener")
    });
    let to = socket(NODE_ADDR, HOST_PORT);
    let mut client = run_in(&node.external, move || {
        TcpStream::connect_timeout(&to, Duration::from_secs(5))
    })
    .expect("a connection through the hostPort");
    client
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("a read timeout");
    let (mut server, _) = listener.accept().expect("the connection reaches the pod");
    // Idle through four sweeps (one a second); then the pod speaks first, as a server
    // pushing to its client does: its packet leaves by the connection's entry alone
    // (nothing came in to restore one).
    thread::sleep(Duration::from_secs(4));
    assert_eq!(
        connections(&node).len(),
        1,
        "the idle connection is still followed"
    );
    server.write_all(b"pushed\n").expect("the pod writes");
    let mut pushed = [0u8; 7];
    client
        .read_exact(&mut pushed)
        .expect("the pod's data reaches the client from the host port it dialled");
    assert_eq!(&pushed, b"pushed\n");
}

#[test]
fn connections_are_carried_into_a_table_of_a_new_size_and_keep_working() {
    require_root();
    let mut node = Node::start_with("10.244.88.0/24", &[], &["--nat-max-flows", "4096"]);
    let pod = node.add_pod_with(
        "hpf-size",
        &port_mappings(CONTAINER_PORT, &[(HOST_PORT, "tcp", None)]),
    );
    let _server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let to = socket(NODE_ADDR, HOST_PORT);
    let mut held = many_connections(&node.external, to, 1).expect("a connection held open");
    let before: Vec<Carried> = connections(&node).iter().map(carried).collect();
    assert_eq!(before.len(), 1, "the held connection is followed");
    assert_eq!(node.pinned_layout(map_names::HOSTPORT_FLOWS).1, 4096);
    assert!(node.daemon.stop(), "the daemon stops cleanly");

    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(
        node.pinned_layout(map_names::HOSTPORT_FLOWS),
        (size_of::<NatEntry>(), 262_144),
        "created anew at the NAT tables' new size"
    );
    let after: Vec<Carried> = connections(&node).iter().map(carried).collect();
    assert_eq!(after, before, "carried as it was");
    let (_, state, host_addr, host_port, pod_addr, pod_port) = after[0];
    assert_eq!(
        (state, host_addr, host_port, pod_addr, pod_port),
        (
            tcp_state::ESTABLISHED,
            node_addr(),
            HOST_PORT,
            pod.ip.octets(),
            CONTAINER_PORT
        )
    );
    assert!(
        node.instance
            .log()
            .lines()
            .any(|line| line.contains("its flows are carried over")
                && line.contains("HOSTPORT_FLOWS")),
        "said in the log"
    );
    assert!(
        still_echoes(&mut held[0], b"after the new size\n"),
        "the connection opened before the restart still works"
    );
}

/// A connection as [`Carried`] compares it.
fn carried((key, c): &(NatKey, NatEntry)) -> Carried {
    (
        *key,
        c.state,
        c.node_addr,
        c.node_port,
        c.pod_addr,
        c.pod_port,
    )
}
