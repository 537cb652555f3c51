//! Flow tables no party can flush (issue 23, point 4), on a node with
//! `--nat-max-flows 1024`:
//! - a pod opening 15,000 UDP flows to the outside is refused past its budget (half the
//!   table), counted for it in `ebpf-cnid nat`, and another pod's idle connection
//!   through source NAT keeps its translation and still works;
//! - pods that fill the table together within their budgets are refused (the table is
//!   full), the sweep that follows within about a second drops their unanswered flows,
//!   and then new flows pass while the established connection lives on;
//! - outside clients flooding a pod's hostPort from thousands of source ports are
//!   refused past that pod's budget, and its open hostPort connection lives on: the
//!   pod, speaking first after the flood, still answers from the host port;
//! - (with a 512-port range) a pod opening 1,000 short connections a second to one
//!   server, more than its budget of ports holds for a second each, is never refused:
//!   it takes back its own closing ports and no SYN waits for a retransmission.
//!
//! With the LRU tables of before, each flood evicted the established connection's entry
//! and its next segment was translated afresh (a new node port, answered with a reset)
//! or not at all.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    daemon::eventually,
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, port_mappings, socket},
    require_root,
    snat::{TCP_PORT, external, nat_table},
    traffic::{EchoServer, many_connections, run_in},
};
use serde_json::Value;

const UDP_PORT: u16 = 9095;
const FLOOD: u16 = 15_000;
const SMALL_TABLE: [&str; 2] = ["--nat-max-flows", "1024"];
/// Half of [`SMALL_TABLE`]: the default budget of each pod.
const POD_BUDGET: u64 = 512;

/// One connection from `netns` to `to`, a line echoed through it.
fn open_connection(netns: &Netns, to: SocketAddr) -> TcpStream {
    many_connections(netns, to, 1)
        .expect("a connection")
        .pop()
        .expect("one connection that echoed")
}

/// Sends `line` on `connection` and reads it back; panics naming `when` otherwise.
fn echoes(connection: &mut TcpStream, line: &[u8], when: &str) {
    let mut back = vec![0u8; line.len()];
    connection
        .write_all(line)
        .unwrap_or_else(|e| panic!("send {when}: {e}"));
    connection
        .read_exact(&mut back)
        .unwrap_or_else(|e| panic!("the connection still echoes {when}: {e}"));
    assert_eq!(back, line, "{when}");
}

/// From inside `netns`, two datagrams to `to` from each source port of `ports`: a new
/// flow each, used twice (an LRU table keeps an entry used once on its inactive list,
/// where it goes first, and one used again beside the established ones). A refused
/// datagram is dropped on the way; the send itself succeeds.
fn udp_flood(netns: &Netns, ports: std::ops::Range<u16>, to: SocketAddr) {
    run_in(netns, move || {
        for port in ports {
            let socket = UdpSocket::bind(("0.0.0.0", port)).expect("bind");
            socket.send_to(b"flood", to).expect("send");
            socket.send_to(b"again", to).expect("send");
        }
    });
}

/// The row of `ebpf-cnid nat`'s `endpoints` for the pod at `addr`.
fn endpoint(table: &Value, addr: Ipv4Addr) -> &Value {
    let addr = addr.to_string();
    table["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .find(|view| view["pod"] == addr.as_str())
        .unwrap_or_else(|| panic!("{addr} is listed: {table}"))
}

fn count(view: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(view, |value, key| &value[*key])
        .as_u64()
        .unwrap_or_else(|| panic!("a count at {path:?}: {view}"))
}

fn echo_server_outside() -> SocketAddr {
    SocketAddrV4::new(
        EXTERNAL_ADDR.parse::<Ipv4Addr>().expect("an address"),
        TCP_PORT,
    )
    .into()
}

#[test]
fn a_pod_flooding_new_flows_is_refused_past_its_budget_and_another_pods_connection_lives() {
    require_root();
    let node = Node::start_with("10.244.97.0/24", &[], &SMALL_TABLE);
    let victim = node.add_pod("budget-victim");
    let flooder = node.add_pod("budget-flooder");
    let _server = EchoServer::start(&node.external, TCP_PORT);
    let mut connection = open_connection(&victim.netns, echo_server_outside());

    udp_flood(&flooder.netns, 20_000..20_000 + FLOOD, external(UDP_PORT));

    echoes(&mut connection, b"after!\n", "after the flood");
    let table = nat_table(&node);
    assert_eq!(
        count(&table, &["budgets", "pod_flows"]),
        POD_BUDGET,
        "{table}"
    );
    let flooder_view = endpoint(&table, flooder.ip);
    assert_eq!(
        count(flooder_view, &["counted", "out"]),
        POD_BUDGET,
        "it holds its budget: {flooder_view}"
    );
    assert!(
        count(flooder_view, &["refused_by", "flow_budget"]) >= u64::from(FLOOD) - POD_BUDGET - 1,
        "every flow past the budget refused and counted for it: {flooder_view}"
    );
    let victim_view = endpoint(&table, victim.ip);
    assert_eq!(count(victim_view, &["refused"]), 0, "{victim_view}");
    assert_eq!(
        count(victim_view, &["flows"]),
        1,
        "its connection's flow: {victim_view}"
    );
}

#[test]
fn a_full_table_refuses_until_the_sweep_drops_unanswered_flows_and_keeps_the_established() {
    require_root();
    let node = Node::start_with("10.244.98.0/24", &[], &SMALL_TABLE);
    let holder = node.add_pod("full-holder");
    // Four pods of 500 flows each: every one within its budget (512), together twice
    // the table. A sweep can make room for a quarter of it while they send; the rest
    // meets a full table.
    let flooders: Vec<_> = (0..4)
        .map(|n| node.add_pod(&format!("full-flooder-{n}")))
        .collect();
    let _server = EchoServer::start(&node.external, TCP_PORT);
    let mut connection = open_connection(&holder.netns, echo_server_outside());

    for flooder in &flooders {
        udp_flood(&flooder.netns, 20_000..20_500, external(UDP_PORT));
    }
    let flooded = Instant::now();
    echoes(&mut connection, b"established\n", "after the flood");

    let table = nat_table(&node);
    assert!(
        count(&table, &["counters", "table_full"]) > 0,
        "new flows met a full table: {}",
        table["counters"]
    );
    let refused_for_room: u64 = flooders
        .iter()
        .map(|flooder| {
            let view = endpoint(&table, flooder.ip);
            assert_eq!(
                count(view, &["refused_by", "flow_budget"]),
                0,
                "within its budget: {view}"
            );
            count(view, &["refused_by", "table_full"])
        })
        .sum();
    assert!(
        refused_for_room > 0,
        "the refusals are counted for the pods that met the full table"
    );
    // The sweeper sees the refusals within a second and sweeps at once: above 7/8 of
    // the table it drops unanswered flows down to 3/4.
    let in_use = |node: &Node| {
        nat_table(node)["entries"]
            .as_array()
            .expect("entries")
            .len()
    };
    assert!(
        eventually(Duration::from_secs(3), || in_use(&node) <= 1024 * 7 / 8),
        "the sweep made room: {} flows {:?} after the flood",
        in_use(&node),
        flooded.elapsed()
    );
    echoes(&mut connection, b"still there\n", "after the early drop");
    let mut fresh = open_connection(&holder.netns, echo_server_outside());
    echoes(
        &mut fresh,
        b"a new flow\n",
        "on a connection opened after the sweep",
    );
}

#[test]
fn outside_clients_flooding_a_hostport_are_refused_past_the_pods_budget_and_its_connection_lives() {
    const CONTAINER_PORT: u16 = 8080;
    const HOST_PORT: u16 = 30080;
    const CLIENT_PORTS: u16 = 3_000;
    require_root();
    let node = Node::start_with("10.244.99.0/24", &[], &SMALL_TABLE);
    let pod = node.add_pod_with(
        "hostport-flooded",
        &port_mappings(
            CONTAINER_PORT,
            &[(HOST_PORT, "tcp", None), (HOST_PORT, "udp", None)],
        ),
    );
    // A server that pushes: after the flood the pod speaks first, so its segment
    // leaves by the connection's entry alone (no segment from the client came in
    // meanwhile to make one again).
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
    let mut pushed = |server: &mut TcpStream, line: &[u8], when: &str| {
        server.write_all(line).expect("the pod writes");
        let mut back = vec![0u8; line.len()];
        client.read_exact(&mut back).unwrap_or_else(|e| {
            panic!("the pod's data reaches the client from the host port {when}: {e}")
        });
        assert_eq!(back, line, "{when}");
    };
    pushed(&mut server, b"before\n", "before the flood");

    udp_flood(&node.external, 20_000..20_000 + CLIENT_PORTS, to);

    pushed(&mut server, b"after the flood\n", "after the flood");
    let table = nat_table(&node);
    let view = endpoint(&table, pod.ip);
    assert_eq!(
        count(view, &["counted", "hostport"]),
        POD_BUDGET,
        "its connection and the datagrams up to its budget: {view}"
    );
    assert!(
        count(view, &["refused_by", "flow_budget"]) >= u64::from(CLIENT_PORTS) - POD_BUDGET,
        "the clients past the budget refused and counted for the pod: {view}"
    );
}

#[test]
fn short_connections_at_a_rate_past_the_port_budget_per_second_go_on_without_a_stall() {
    // 448 ports toward the server (the budget, 7/8 of 512), each held a second after
    // its connection closes: 1,000 connections a second need the pod's own closing
    // ports back sooner, or SYNs are refused and each costs its connection a second.
    const CONNECTIONS: u32 = 2_000;
    const PORT: u16 = 7002;
    require_root();
    let node = Node::start_with("10.244.96.0/24", &[], &["--nat-port-range", "20000-20511"]);
    let pod = node.add_pod("short-connections");
    // Bound before the first connection; served from a thread of its own.
    let listener = run_in(&node.external, || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)).expect("a listener")
    });
    let _server = std::thread::spawn(move || {
        for stream in listener.incoming().take(CONNECTIONS as usize) {
            let Ok(mut stream) = stream else { continue };
            let mut byte = [0u8; 1];
            // One byte back, then the pod's close first, as a client's short request.
            while let Ok(1) = stream.read(&mut byte) {
                if stream.write_all(&byte).is_err() {
                    break;
                }
            }
        }
    });
    let to = socket(EXTERNAL_ADDR, PORT);
    let slowest = run_in(&pod.netns, move || {
        let start = Instant::now();
        let mut slowest = Duration::ZERO;
        for index in 0..CONNECTIONS {
            if let Some(wait) = (start + Duration::from_millis(u64::from(index)))
                .checked_duration_since(Instant::now())
            {
                std::thread::sleep(wait);
            }
            let began = Instant::now();
            let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("connection {index}: {e}"));
            stream.write_all(b"x").expect("send");
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).expect("the byte back");
            slowest = slowest.max(began.elapsed());
        }
        slowest
    });
    let table = nat_table(&node);
    let view = endpoint(&table, pod.ip);
    assert_eq!(count(view, &["refused"]), 0, "{view}");
    assert!(
        slowest < Duration::from_millis(500),
        "no connection waited for a retransmitted SYN: the slowest took {slowest:?}"
    );
    assert!(
        count(&table, &["counters", "closing_reclaimed"]) > 0,
        "the pod's own closing ports were taken back: {}",
        table["counters"]
    );
}
