//! Source NAT in eBPF: an external host sees the node's address for every pod flow,
//! replies (and ICMP errors) reach the right pod, ports never collide, entries expire.
//! The external namespace has no route to the pods, so any reply a pod gets proves the
//! translation both ways.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    thread,
    time::Duration,
};

use cni_ebpf_common::{NatEntry, NatKey, NatReverseKey, map_names, tcp_state};
use ebpf_cni_tests::{
    daemon::{Daemon, eventually},
    nat_frames::{UDP, entry, monotonic_ns, out_key},
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, Pod},
    require_root,
    traffic::{
        EchoServer, RawSocket, UdpEcho, many_connections, round_trip, round_trip_from, run_in,
        udp_round_trip,
    },
};
use serde_json::Value;

const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 9000;
/// An IP protocol number for experiments (RFC 3692): no ports, no kernel handler.
const EXPERIMENTAL_PROTO: u8 = 253;

fn external(port: u16) -> SocketAddr {
    format!("{EXTERNAL_ADDR}:{port}").parse().expect("address")
}

fn node_ips(peers: &[SocketAddr]) -> BTreeSet<String> {
    peers.iter().map(|peer| peer.ip().to_string()).collect()
}

fn nat_table(node: &Node) -> Value {
    node.instance.cli_json(&["nat"])
}

#[test]
fn the_external_host_sees_the_node_address_for_tcp_udp_and_icmp() {
    require_root();
    let node = Node::start("10.244.50.0/24");
    let rules_before = node.netns.iptables_rules();
    let pods: Vec<Pod> = (0..2).map(|n| node.add_pod(&format!("snat-{n}"))).collect();
    let tcp = EchoServer::start(&node.external, TCP_PORT);
    let udp = UdpEcho::start(&node.external, UDP_PORT);

    for pod in &pods {
        let payload = format!("tcp from {}", pod.ip).into_bytes();
        let back = round_trip(&pod.netns, external(TCP_PORT), &payload).expect("TCP through NAT");
        assert_eq!(back, payload);
        let payload = format!("udp from {}", pod.ip).into_bytes();
        let back =
            udp_round_trip(&pod.netns, 0, external(UDP_PORT), &payload).expect("UDP through NAT");
        assert_eq!(back, payload);
        let ping = pod
            .netns
            .run("ping", &["-c", "2", "-i", "0.2", "-W", "2", EXTERNAL_ADDR]);
        assert!(
            ping.status.success(),
            "ICMP echo through NAT from {}",
            pod.ip
        );
    }
    assert_eq!(
        node_ips(&tcp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );
    assert_eq!(
        node_ips(&udp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );

    let table = nat_table(&node);
    let entries = table["entries"].as_array().expect("entries");
    for proto in ["tcp", "udp", "icmp"] {
        assert!(
            entries.iter().any(|e| e["proto"] == proto),
            "the NAT table lists a {proto} flow: {table}"
        );
    }
    assert_eq!(
        node.netns.iptables_rules(),
        rules_before,
        "no iptables rule was written"
    );
}

#[test]
fn pod_to_pod_and_cluster_traffic_keeps_the_pod_address() {
    require_root();
    let node = Node::start("10.244.51.0/24");
    let (a, b) = (node.add_pod("keep-a"), node.add_pod("keep-b"));
    let server = EchoServer::start(&b.netns, TCP_PORT);
    let to: SocketAddr = format!("{}:{TCP_PORT}", b.ip).parse().expect("address");
    round_trip(&a.netns, to, b"same cluster").expect("pod to pod");
    assert_eq!(
        node_ips(&server.peers()),
        BTreeSet::from([a.ip.to_string()])
    );
}

#[test]
fn two_pods_with_the_same_source_port_get_distinct_node_ports() {
    require_root();
    let node = Node::start("10.244.52.0/24");
    let (a, b) = (node.add_pod("coll-a"), node.add_pod("coll-b"));
    let tcp = EchoServer::start(&node.external, TCP_PORT);
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    for pod in [&a, &b] {
        round_trip_from(&pod.netns, 40000, external(TCP_PORT), b"same port").expect("TCP");
        udp_round_trip(&pod.netns, 40000, external(UDP_PORT), b"same port").expect("UDP");
    }
    for (proto, peers) in [("tcp", tcp.peers()), ("udp", udp.peers())] {
        assert_eq!(peers.len(), 2, "{proto}: {peers:?}");
        assert_eq!(
            node_ips(&peers),
            BTreeSet::from([NODE_ADDR.to_owned()]),
            "{proto}"
        );
        assert_ne!(
            peers[0].port(),
            peers[1].port(),
            "{proto}: distinct node ports"
        );
    }
}

#[test]
fn two_thousand_concurrent_connections_from_ten_pods_each_get_a_node_port() {
    require_root();
    const PODS: usize = 10;
    const PER_POD: usize = 200;
    let node = Node::start("10.244.53.0/24");
    let pods: Vec<Pod> = (0..PODS)
        .map(|n| node.add_pod(&format!("many-{n}")))
        .collect();
    let server = EchoServer::start(&node.external, TCP_PORT);
    let echoed: Vec<Result<Vec<std::net::TcpStream>, String>> = thread::scope(|scope| {
        let handles: Vec<_> = pods
            .iter()
            .map(|pod| scope.spawn(|| many_connections(&pod.netns, external(TCP_PORT), PER_POD)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    // Every connection stays open (held in `echoed`) until the checks are done: node
    // ports are unique among open flows; a closed flow's port may serve again.
    for result in &echoed {
        assert_eq!(
            result.as_ref().map(Vec::len),
            Ok(PER_POD),
            "every connection echoed"
        );
    }
    let peers = server.peers();
    assert_eq!(peers.len(), PODS * PER_POD);
    assert_eq!(node_ips(&peers), BTreeSet::from([NODE_ADDR.to_owned()]));
    let ports: BTreeSet<u16> = peers.iter().map(SocketAddr::port).collect();
    assert_eq!(
        ports.len(),
        PODS * PER_POD,
        "a unique node port per connection"
    );
    assert!(
        ports.iter().all(|port| (1024..=32767).contains(port)),
        "ports from the default range"
    );
}

#[test]
fn an_icmp_port_unreachable_about_a_translated_flow_reaches_the_pod() {
    require_root();
    let node = Node::start("10.244.54.0/24");
    let pod = node.add_pod("icmp-err");
    // Nothing listens on this port: the external host answers with ICMP port
    // unreachable, quoting the translated packet; the pod's socket must see it.
    let error =
        udp_round_trip(&pod.netns, 0, external(9999), b"anyone?").expect_err("no server listens");
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "the ICMP error reached the pod's socket: {error}"
    );
    let stats = &nat_table(&node)["counters"];
    assert!(
        stats["icmp_errors_in"].as_u64().is_some_and(|n| n >= 1),
        "{stats}"
    );
}

#[test]
fn datagrams_larger_than_the_mtu_cross_the_nat_in_fragments_both_ways() {
    require_root();
    let node = Node::start("10.244.74.0/24");
    let pod = node.add_pod("snat-frag");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    // 4,000 bytes: three fragments each way at the veths' 1,500-byte MTU; only the
    // first carries the ports.
    let payload: Vec<u8> = (0..4000u32).map(|n| (n % 251) as u8).collect();
    let back = udp_round_trip(&pod.netns, 0, external(UDP_PORT), &payload)
        .expect("a 4,000-byte datagram through NAT and its echo back");
    assert_eq!(back, payload, "the echo reassembled whole in the pod");
    assert_eq!(
        node_ips(&udp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "the external host reassembled it from the node's address"
    );
    // ICMP echo of 3,000 bytes, fragments both ways (the identifier in the first).
    let ping = pod.netns.run(
        "ping",
        &[
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "2",
            "-s",
            "3000",
            "-M",
            "dont",
            EXTERNAL_ADDR,
        ],
    );
    assert!(
        ping.status.success(),
        "a fragmented ping through NAT: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    // Two later fragments per datagram: one UDP datagram and two echoes each way.
    let stats = &nat_table(&node)["counters"];
    for counter in ["fragments_out", "fragments_in"] {
        assert!(
            stats[counter].as_u64().is_some_and(|n| n >= 6),
            "{counter}: {stats}"
        );
    }
}

#[test]
fn a_protocol_without_ports_leaves_with_the_node_address_one_pod_per_remote() {
    require_root();
    let node = Node::start("10.244.75.0/24");
    let rules_before = node.netns.iptables_rules();
    let (a, b) = (node.add_pod("snat-raw-a"), node.add_pod("snat-raw-b"));
    let external = RawSocket::open(&node.external, EXPERIMENTAL_PROTO);
    let (in_a, in_b) = (
        RawSocket::open(&a.netns, EXPERIMENTAL_PROTO),
        RawSocket::open(&b.netns, EXPERIMENTAL_PROTO),
    );
    let external_addr: Ipv4Addr = EXTERNAL_ADDR.parse().expect("address");
    let node_addr: Ipv4Addr = NODE_ADDR.parse().expect("address");
    let wait = Duration::from_secs(2);

    in_a.send_to(external_addr, b"from a").expect("send");
    assert_eq!(
        external.recv(wait),
        Some((node_addr, b"from a".to_vec())),
        "the external host gets a's packet from the node's address"
    );
    external.send_to(node_addr, b"to a").expect("send");
    assert_eq!(
        in_a.recv(wait),
        Some((external_addr, b"to a".to_vec())),
        "the answer to the node's address reaches pod a"
    );

    // The one mapping to that host is a's: b's packet is dropped, never sent with b's
    // address or given a's replies.
    // Waited for by its count (a loaded machine may take a while to pass it on), then
    // checked not to have reached the external host.
    in_b.send_to(external_addr, b"from b").expect("send");
    let exhausted = || node.instance.cli_json(&["status"])["drops"]["nat_ports_exhausted"].as_u64();
    assert!(
        eventually(Duration::from_secs(10), || exhausted() == Some(1)),
        "b's packet counted as a drop: {:?}",
        exhausted()
    );
    assert_eq!(
        external.recv(Duration::from_millis(500)),
        None,
        "nothing from b"
    );
    let table = nat_table(&node);
    assert!(
        table["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .any(|e| e["proto"] == "253"),
        "the flow is listed: {table}"
    );
    assert_eq!(
        node.netns.iptables_rules(),
        rules_before,
        "no iptables rule"
    );
}

#[test]
fn a_pods_icmp_error_about_a_translated_flow_reaches_the_remote_as_the_nodes() {
    require_root();
    let node = Node::start("10.244.77.0/24");
    let pod = node.add_pod("snat-icmp-out");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"open").expect("UDP through NAT");
    let node_side = *udp.peers().first().expect("the external host saw the flow");
    drop(udp);
    // The pod's socket is closed; the remote sends on, from the flow's own port. The
    // pod's "port unreachable" must come back as the node's, quoting what the remote
    // sent, for the remote's socket to take it.
    let late = run_in(&node.external, move || {
        // The echo server's socket is closed, but a process another test forks in the
        // meantime holds a copy until it execs: the port may stay taken a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let socket = loop {
            match UdpSocket::bind(("0.0.0.0", UDP_PORT)) {
                Err(error)
                    if error.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    thread::sleep(Duration::from_millis(20));
                }
                bound => break bound?,
            }
        };
        socket.connect(node_side)?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.send(b"late")?;
        socket.recv(&mut [0u8; 64])
    });
    let error = late.expect_err("nobody answers");
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "the pod's ICMP error reached the remote's socket: {error}"
    );
}

#[test]
fn a_host_outside_reaching_a_pods_own_address_gets_answers_from_that_address() {
    require_root();
    let node = Node::start("10.244.78.0/24");
    let pod = node.add_pod("snat-routed");
    let in_pod = EchoServer::start(&pod.netns, TCP_PORT);
    let in_pod_udp = UdpEcho::start(&pod.netns, UDP_PORT);
    let outside = EchoServer::start(&node.external, TCP_PORT);
    // A routed pod network: the external host reaches the pods through the node.
    node.external
        .ip(&["route", "add", "10.244.78.0/24", "via", NODE_ADDR]);
    let at_pod =
        |port: u16| -> SocketAddr { format!("{}:{port}", pod.ip).parse().expect("address") };

    let back = round_trip(&node.external, at_pod(TCP_PORT), b"routed tcp")
        .expect("TCP to the pod's own address");
    assert_eq!(back, b"routed tcp");
    let back = udp_round_trip(&node.external, 0, at_pod(UDP_PORT), b"routed udp")
        .expect("UDP to the pod's own address: the answer comes from it (connected socket)");
    assert_eq!(back, b"routed udp");
    let peers = [in_pod.peers(), in_pod_udp.peers()].concat();
    assert!(
        peers
            .iter()
            .all(|peer| peer.ip().to_string() == EXTERNAL_ADDR),
        "{peers:?}"
    );
    let table = nat_table(&node);
    assert_eq!(
        table["entries"].as_array().map(Vec::len),
        Some(0),
        "answers are not translated: {table}"
    );

    // What the pod opens itself still leaves with the node's address.
    let back = round_trip(&pod.netns, external(TCP_PORT), b"out").expect("TCP through NAT");
    assert_eq!(back, b"out");
    assert_eq!(
        node_ips(&outside.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );
}

#[test]
fn entries_expire_and_an_exhausted_range_drops_until_a_port_is_free_again() {
    require_root();
    // One node port, a 2 s timeout for UDP without a reply and 8 s with one, swept
    // every second.
    let node = Node::start_with(
        "10.244.55.0/24",
        &[],
        &[
            "--nat-port-range",
            "61000-61000",
            "--nat-udp-timeout",
            "2",
            "--nat-udp-stream-timeout",
            "8",
            "--nat-gc-interval",
            "1",
        ],
    );
    let (a, b) = (node.add_pod("exp-a"), node.add_pod("exp-b"));
    let udp = UdpEcho::start(&node.external, UDP_PORT);

    udp_round_trip(&a.netns, 5000, external(UDP_PORT), b"first").expect("a gets the only port");
    assert!(
        udp_round_trip(&b.netns, 5001, external(UDP_PORT), b"second").is_err(),
        "b finds the range exhausted"
    );
    let status = node.instance.cli_json(&["status"]);
    assert!(
        status["drops"]["nat_ports_exhausted"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{status}"
    );
    let table = nat_table(&node);
    let entries = table["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 1, "{table}");
    assert_eq!(
        entries[0]["state"], "replied",
        "a's flow had a reply: {table}"
    );

    // Past the timeout of UDP without a reply, a's flow (a stream) keeps its port.
    thread::sleep(Duration::from_secs(4));
    assert_eq!(
        nat_table(&node)["entries"].as_array().map(Vec::len),
        Some(1),
        "a stream outlives the unreplied timeout"
    );
    assert!(
        eventually(Duration::from_secs(15), || nat_table(&node)["entries"]
            .as_array()
            .is_some_and(Vec::is_empty)),
        "the idle entry expired and was swept"
    );
    udp_round_trip(&b.netns, 5001, external(UDP_PORT), b"third").expect("the port is reused");
    let ports: BTreeSet<u16> = udp.peers().iter().map(SocketAddr::port).collect();
    assert_eq!(
        ports,
        BTreeSet::from([61000]),
        "both flows used the one port, in turn"
    );
}

/// The node stack's count of forwarded datagrams (`Ip: ForwDatagrams`).
fn forwarded_datagrams(node: &Node) -> u64 {
    let out = node.netns.run("cat", &["/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut ip_lines = text.lines().filter(|line| line.starts_with("Ip:"));
    let (names, values) = (
        ip_lines.next().expect("header"),
        ip_lines.next().expect("values"),
    );
    let column = names
        .split_whitespace()
        .position(|name| name == "ForwDatagrams")
        .expect("ForwDatagrams column");
    values
        .split_whitespace()
        .nth(column)
        .and_then(|value| value.parse().ok())
        .expect("a count")
}

#[test]
fn pod_traffic_to_the_outside_skips_the_node_stack_once_the_neighbour_is_known() {
    require_root();
    let node = Node::start("10.244.56.0/24");
    let pod = node.add_pod("fib");
    // The first packet may wait in the stack for the node's ARP to the next hop.
    let warm = pod
        .netns
        .run("ping", &["-c", "1", "-W", "2", EXTERNAL_ADDR]);
    assert!(warm.status.success());
    let before = forwarded_datagrams(&node);
    let ping = pod.netns.run(
        "ping",
        &["-c", "20", "-i", "0.01", "-W", "2", EXTERNAL_ADDR],
    );
    assert!(ping.status.success(), "pings through NAT");
    assert_eq!(
        forwarded_datagrams(&node),
        before,
        "the FIB redirect to the uplink carried them, not the node's forwarding"
    );
}

/// Large enough that the pod's TCP sends GSO packets (bursts of segments), small
/// enough that the echo fits the sockets' buffers while the test writes it all first.
const BULK: usize = 512 * 1024;

fn bulk_payload() -> Vec<u8> {
    (0..BULK).map(|n| (n % 251) as u8).collect()
}

#[test]
fn bulk_pod_traffic_to_the_outside_also_skips_the_node_stack() {
    require_root();
    let node = Node::start("10.244.58.0/24");
    let pod = node.add_pod("bulk");
    let _tcp = EchoServer::start(&node.external, TCP_PORT);
    let warm = round_trip(&pod.netns, external(TCP_PORT), b"warm");
    assert_eq!(warm.expect("a first exchange"), b"warm");
    let before = forwarded_datagrams(&node);
    let payload = bulk_payload();
    let back = round_trip(&pod.netns, external(TCP_PORT), &payload).expect("bulk through NAT");
    assert!(back == payload, "the echo came back intact");
    assert_eq!(
        forwarded_datagrams(&node),
        before,
        "GSO packets took the redirect to the uplink too, not the node's forwarding"
    );
}

#[test]
fn a_pod_packet_too_big_for_the_uplink_gets_fragmentation_needed_from_the_node() {
    require_root();
    let node = Node::start("10.244.59.0/24");
    let pod = node.add_pod("big");
    // The pods' MTU is the network's 1450; the uplink's, now 1400, is smaller. The
    // external host advertises a large MSS anyway (as a host further away, behind a
    // link with a larger MTU, would): the pod's TCP then sends 1450-byte packets,
    // in GSO bursts, that do not fit the uplink.
    node.netns.ip(&["link", "set", "uplink0", "mtu", "1400"]);
    node.external.ip(&["link", "set", "eth0", "mtu", "1400"]);
    let advmss: Vec<&str> = "route change 198.18.0.0/24 dev eth0 advmss 1460"
        .split(' ')
        .collect();
    node.external.ip(&advmss);
    let _tcp = EchoServer::start(&node.external, TCP_PORT);
    let payload = bulk_payload();
    let back = round_trip(&pod.netns, external(TCP_PORT), &payload).expect("bulk through NAT");
    assert!(back == payload, "the echo came back intact");
    let route = pod.netns.ip(&["route", "get", EXTERNAL_ADDR]);
    assert!(
        route.contains("mtu 1400"),
        "the node's ICMP fragmentation-needed taught the pod the path MTU: {route}"
    );
}

#[test]
fn the_source_counter_on_the_uplink_does_not_stop_the_nat_programs_after_it() {
    require_root();
    // The counter is attached first; TCX runs the next program only if it returns
    // TCX_NEXT (an observer's TC_ACT_PIPE would end the chain there).
    let node = Node::start_with_counters("10.244.57.0/24", &["uplink0"]);
    let pod = node.add_pod("observed");
    let _tcp = EchoServer::start(&node.external, TCP_PORT);
    let back = round_trip(&pod.netns, external(TCP_PORT), b"counted and translated")
        .expect("replies still get translated back");
    assert_eq!(back, b"counted and translated");
    assert!(node.counted(EXTERNAL_ADDR), "the counter saw the replies");
}

/// The notes of `NAT_INBOUND` (flows a host outside opened to a pod's own address).
fn notes(node: &Node) -> Vec<(NatKey, NatEntry)> {
    node.flow_table::<NatKey>(map_names::NAT_INBOUND)
        .iter()
        .map(|note| note.expect("a readable note"))
        .collect()
}

#[test]
fn notes_of_connections_from_outside_follow_tcp_and_go_once_closed_or_with_their_pod() {
    require_root();
    let node = Node::start_with(
        "10.244.80.0/24",
        &[],
        &["--nat-tcp-closed-timeout", "2", "--nat-gc-interval", "1"],
    );
    let pod = node.add_pod("notes");
    let _in_pod = EchoServer::start(&pod.netns, TCP_PORT);
    // A routed pod network: the external host reaches the pods through the node.
    node.external
        .ip(&["route", "add", "10.244.80.0/24", "via", NODE_ADDR]);
    let at_pod: SocketAddr = format!("{}:{TCP_PORT}", pod.ip).parse().expect("address");
    let held = many_connections(&node.external, at_pod, 1).expect("a connection held open");
    round_trip(&node.external, at_pod, b"closed").expect("a connection opened and closed");
    let states = |node: &Node| -> Vec<u8> {
        let mut states: Vec<u8> = notes(node).iter().map(|(_, note)| note.state).collect();
        states.sort_unstable();
        states
    };
    assert!(
        eventually(Duration::from_secs(5), || states(&node)
            == [tcp_state::ESTABLISHED, tcp_state::CLOSED]),
        "one note open, one closed: {:?}",
        notes(&node)
    );
    let table = nat_table(&node);
    let listed = table["from_outside"].as_array().expect("from_outside");
    let own = format!("{}:{TCP_PORT}", pod.ip);
    assert!(
        listed.len() == 2 && listed.iter().all(|flow| flow["node"] == own.as_str()),
        "listed by `nat`, untranslated: {table}"
    );
    let readable = node.instance.cli(&["nat"]);
    let readable = String::from_utf8_lossy(&readable.stdout);
    assert!(
        readable.contains("opened from outside to a pod's own address, answered untranslated: 2"),
        "{readable}"
    );
    // Past the closed timeout (2 s) and a sweep (every second): the closed one went.
    thread::sleep(Duration::from_secs(4));
    assert_eq!(
        states(&node),
        [tcp_state::ESTABLISHED],
        "the open connection's note stays: {:?}",
        notes(&node)
    );
    node.del_pod(&pod);
    assert!(
        eventually(Duration::from_secs(5), || notes(&node).is_empty()),
        "a deleted pod's notes go at once: {:?}",
        notes(&node)
    );
    drop(held);
}

#[test]
fn notes_pinned_by_an_earlier_release_are_carried_into_the_new_table() {
    require_root();
    let mut node = Node::start("10.244.81.0/24");
    // Notes of a pod of the node: a sweep removes those of pods gone.
    let pod = node.add_pod("old-notes");
    let pod_addr = pod.ip.octets();
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    // An earlier release's NAT_INBOUND: a bare timestamp per flow, 65,536 of them.
    let tcp_flow = out_key(pod_addr, 8080, 50000, 6);
    let udp_flow = out_key(pod_addr, 53, 50001, UDP);
    let seen = monotonic_ns();
    node.pin_earlier_flows(
        map_names::NAT_INBOUND,
        65536,
        &[(tcp_flow, seen), (udp_flow, seen)],
    );

    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(
        node.pinned_layout(map_names::NAT_INBOUND),
        (size_of::<NatEntry>(), 262_144),
        "created anew at this release's layout and the NAT tables' size"
    );
    let mut carried = notes(&node);
    carried.sort_by_key(|(key, _)| key.proto);
    let summary: Vec<(NatKey, u8, u64, [u8; 4], u16)> = carried
        .iter()
        .map(|(key, note)| {
            (
                *key,
                note.state,
                note.last_seen_ns,
                note.pod_addr,
                note.pod_port,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                tcp_flow,
                tcp_state::ESTABLISHED,
                seen,
                [10, 244, 81, 2],
                8080
            ),
            (
                udp_flow,
                cni_ebpf_common::udp_state::REPLIED,
                seen,
                [10, 244, 81, 2],
                53
            ),
        ],
        "carried as answered flows, their timestamps kept"
    );
    assert!(
        node.instance
            .log()
            .lines()
            .any(|line| line.contains("its flows are carried over") && line.contains("NAT_INBOUND")),
        "said in the log"
    );
}

#[test]
fn a_sweep_removes_thousands_of_expired_flows_and_keeps_the_live_one() {
    require_root();
    // Swept every 3 s: one sweep must take all of them (a sweep that read one batch of
    // 4,096 only would need three, 6 s or more after they were written).
    let node = Node::start_with("10.244.56.0/24", &[], &["--nat-gc-interval", "3"]);
    let mut out = node.flow_table::<NatKey>(map_names::NAT_OUT);
    let mut inbound = node.flow_table::<NatReverseKey>(map_names::NAT_IN);
    // Flows of a pod of the node (a sweep removes those of pods gone, whatever their age).
    let pod = node.add_pod("sweep");
    let pod_addr = pod.ip.octets();
    // UDP flows (30 s timeout) last seen a minute ago: more than two batches' worth.
    let now = monotonic_ns();
    let long_ago = now.checked_sub(60_000_000_000).expect("up for a minute");
    let flow = |n: u16| out_key(pod_addr, 10_000 + n, 53, UDP);
    for n in 0..10_000 {
        let key = flow(n);
        let stamp = if n == 7_777 { now } else { long_ago };
        let entry = entry(&key, 1024 + n, 0, stamp);
        out.insert(key, entry, 0).expect("NAT_OUT insert");
        inbound
            .insert(key.reverse(1024 + n), entry, 0)
            .expect("NAT_IN insert");
    }
    assert!(
        eventually(Duration::from_secs(5), || {
            out.keys().count() == 1 && inbound.keys().count() == 1
        }),
        "one sweep down to the live flow: {} in NAT_OUT, {} in NAT_IN",
        out.keys().count(),
        inbound.keys().count()
    );
    assert!(out.get(&flow(7_777), 0).is_ok(), "the live flow stays");
    assert!(inbound.get(&flow(7_777).reverse(1024 + 7_777), 0).is_ok());
}

#[test]
fn translation_follows_the_uplink_address_and_nothing_leaves_while_it_has_none() {
    require_root();
    let mut node = Node::start("10.244.57.0/24");
    let pod = node.add_pod("follow");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    let node_addr = |node: &Node| nat_table(node)["node_addr"].clone();
    let drops = |node: &Node| {
        node.instance.cli_json(&["status"])["drops"]["nat_no_address"]
            .as_u64()
            .expect("a nat_no_address counter")
    };

    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"before").expect("UDP through NAT");
    let first = udp.peers();
    assert_eq!(node_ips(&first), BTreeSet::from([NODE_ADDR.to_owned()]));

    // The uplink loses its address. A route and the external host's MAC stay (as a
    // device route and a static neighbour would), so pod packets still reach the
    // uplink's egress program: it must drop them, not send them with the pod's address.
    node.netns
        .ip(&["addr", "del", &format!("{NODE_ADDR}/24"), "dev", "uplink0"]);
    // (`ip -j`: /sys/class/net shows the namespace /sys was mounted in, not ours.)
    let link: Value = serde_json::from_str(&node.external.ip(&["-j", "link", "show", "eth0"]))
        .expect("ip -j link");
    let external_mac = link[0]["address"].as_str().expect("a MAC").to_owned();
    node.netns
        .ip(&["route", "replace", "default", "dev", "uplink0"]);
    node.netns.ip(&[
        "neigh",
        "replace",
        EXTERNAL_ADDR,
        "lladdr",
        &external_mac,
        "dev",
        "uplink0",
        "nud",
        "permanent",
    ]);
    assert!(
        eventually(Duration::from_secs(5), || node_addr(&node).is_null()),
        "the daemon saw the address go: {}",
        nat_table(&node)
    );
    let status = node.instance.cli(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("no IPv4 address"), "{status}");
    let table = node.instance.cli(&["nat"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("no IPv4 address"), "{table}");
    let dropped = drops(&node);
    for from_port in [5000, 5001] {
        assert!(
            udp_round_trip(&pod.netns, from_port, external(UDP_PORT), b"none").is_err(),
            "nothing comes back from port {from_port} without a node address"
        );
    }
    assert_eq!(udp.peers(), first, "nothing reached the external host");
    assert!(
        drops(&node) >= dropped + 2,
        "the old flow's and the new flow's datagrams were dropped and counted"
    );

    // A daemon (re)started while the uplink has no address runs, and still drops.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert!(node_addr(&node).is_null(), "{}", nat_table(&node));
    let dropped = drops(&node);
    assert!(udp_round_trip(&pod.netns, 5003, external(UDP_PORT), b"none").is_err());
    assert_eq!(udp.peers(), first, "nothing reached the external host");
    assert!(
        drops(&node) > dropped,
        "dropped and counted after the restart"
    );

    // A new address: new flows leave from it, and the flow of before goes on from it
    // with its node port.
    let new_addr = "198.18.0.9";
    node.netns
        .ip(&["addr", "add", &format!("{new_addr}/24"), "dev", "uplink0"]);
    node.netns
        .ip(&["route", "replace", "default", "via", EXTERNAL_ADDR]);
    assert!(
        eventually(Duration::from_secs(5), || node_addr(&node) == new_addr),
        "the daemon took the new address: {}",
        nat_table(&node)
    );
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"old flow").expect("the old flow");
    udp_round_trip(&pod.netns, 5002, external(UDP_PORT), b"new flow").expect("a new flow");
    let after: Vec<SocketAddr> = udp.peers()[first.len()..].to_vec();
    assert_eq!(node_ips(&after), BTreeSet::from([new_addr.to_owned()]));
    assert_eq!(
        after[0].port(),
        first[0].port(),
        "the old flow kept its node port"
    );
}

#[test]
fn an_uplink_device_created_again_gets_the_programs_back_and_pods_still_leave_translated() {
    uplink_created_again("10.244.66.0/24", &[]);
}

#[test]
fn with_clsact_filters_an_uplink_device_created_again_gets_them_back_too() {
    uplink_created_again("10.244.90.0/24", &["--enable-tcx", "false"]);
}

/// A node started with `flags` whose uplink device is deleted and created again: the
/// programs come back on the new device (once each) and the pod's traffic still leaves
/// translated.
fn uplink_created_again(subnet: &str, flags: &[&str]) {
    require_root();
    let node = Node::start_with(subnet, &[], flags);
    let pod = node.add_pod("replug");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"before").expect("UDP through NAT");

    // The uplink goes (its veth peer with it) and a new device of the same name comes,
    // with the same address and route: a NIC replugged, a bond rebuilt.
    node.netns.ip(&["link", "del", "uplink0"]);
    node.netns.link_veth(
        "uplink0",
        &format!("{NODE_ADDR}/24"),
        &node.external,
        "eth0",
        &format!("{EXTERNAL_ADDR}/24"),
    );
    node.netns
        .ip(&["route", "replace", "default", "via", EXTERNAL_ADDR]);
    let link: Value = serde_json::from_str(&node.netns.ip(&["-j", "link", "show", "uplink0"]))
        .expect("ip -j link");
    let ifindex = link[0]["ifindex"].as_u64().expect("an ifindex");
    assert!(
        eventually(
            Duration::from_secs(5),
            || nat_table(&node)["uplink_ifindex"] == ifindex
        ),
        "the datapath learnt the new device: {}",
        nat_table(&node)
    );
    let status = node.instance.cli_json(&["status"]);
    let on_uplink: Vec<&Value> = status["attachments"]
        .as_array()
        .expect("attachments")
        .iter()
        .filter(|a| a["interface"] == "uplink0")
        .collect();
    assert_eq!(
        on_uplink.len(),
        2,
        "egress and ingress, once each: {status}"
    );
    assert!(
        on_uplink.iter().all(|a| a["ifindex"] == ifindex),
        "{status}"
    );
    assert_eq!(
        node.netns.tc_programs("uplink0"),
        ["uplink_ingress", "uplink_egress"],
        "the kernel has both on the new device, once each"
    );

    udp_round_trip(&pod.netns, 5001, external(UDP_PORT), b"after").expect("UDP through NAT");
    assert_eq!(
        node_ips(&udp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "translated before and after: the pod's address never left the node"
    );
}

#[test]
fn the_nat_tables_take_the_asked_size_and_a_new_size_creates_them_anew() {
    require_root();
    let small = ["--nat-max-flows", "4096"];
    let mut node = Node::start_with("10.244.67.0/24", &[], &small);
    let pod = node.add_pod("size");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    let sizes = |node: &Node| {
        [
            map_names::NAT_OUT,
            map_names::NAT_IN,
            map_names::NAT_INBOUND,
            map_names::HOSTPORT_FLOWS,
        ]
        .map(|name| {
            aya::maps::MapInfo::from_pin(node.instance.bpf_dir.join(name))
                .expect("a pinned NAT table")
                .max_entries()
        })
    };
    let flows = |node: &Node| nat_table(node)["entries"].as_array().map_or(0, Vec::len);
    assert_eq!(sizes(&node), [4096, 4096, 4096, 4096]);
    assert_eq!(nat_table(&node)["max_flows"], 4096);
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"small").expect("UDP through NAT");
    assert_eq!(flows(&node), 1);

    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &small);
    assert_eq!(
        flows(&node),
        1,
        "the same size keeps the tables and their flows"
    );

    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(
        sizes(&node),
        [262_144, 262_144, 262_144, 262_144],
        "the default size"
    );
    assert_eq!(flows(&node), 0, "new tables, the old flows gone");
    assert!(
        node.instance.log().contains("the NAT tables change size"),
        "said in the log"
    );
    udp_round_trip(&pod.netns, 5001, external(UDP_PORT), b"default").expect("UDP through NAT");
    assert_eq!(flows(&node), 1);
    assert_eq!(
        node_ips(&udp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );
}

#[test]
fn a_nat_config_pinned_by_an_earlier_release_is_replaced_and_flows_keep_going() {
    require_root();
    let mut node = Node::start("10.244.79.0/24");
    let pod = node.add_pod("old-config");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"before").expect("UDP through NAT");
    let pin = node.instance.bpf_dir.join(map_names::NAT_CONFIG);
    let value_size = |pin: &std::path::Path| {
        aya::maps::MapInfo::from_pin(pin)
            .expect("a pinned NAT_CONFIG")
            .value_size()
    };
    assert_eq!(
        value_size(&pin) as usize,
        std::mem::size_of::<cni_ebpf_common::NatConfig>()
    );

    // An earlier release's NAT_CONFIG: 32 bytes, before `udp_stream_secs`.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.pin_earlier_map(&pin, "array", 4, 32, 1);
    assert_eq!(value_size(&pin), 32, "test bug: the old size");

    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(
        value_size(&pin) as usize,
        std::mem::size_of::<cni_ebpf_common::NatConfig>(),
        "created anew at this release's size"
    );
    assert!(
        node.instance
            .log()
            .contains("NAT_CONFIG pinned by an earlier release"),
        "said in the log"
    );
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"old flow").expect("the old flow");
    udp_round_trip(&pod.netns, 5001, external(UDP_PORT), b"new flow").expect("a new flow");
    assert_eq!(
        node_ips(&udp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );
    let ports: BTreeSet<u16> = udp.peers().iter().map(SocketAddr::port).collect();
    assert_eq!(ports.len(), 2, "the old flow kept its node port: {ports:?}");
}

#[test]
fn a_deleted_pods_flows_go_at_once_and_another_pods_stay() {
    require_root();
    let node = Node::start("10.244.68.0/24");
    let (gone, stays) = (node.add_pod("gone"), node.add_pod("stays"));
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    let tcp = EchoServer::start(&node.external, TCP_PORT);
    for pod in [&gone, &stays] {
        udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"udp").expect("UDP through NAT");
        round_trip(&pod.netns, external(TCP_PORT), b"tcp").expect("TCP through NAT");
    }
    assert_eq!(udp.peers().len() + tcp.peers().len(), 4);
    // The pods with flows in either table (NAT_IN's entries name their pod too).
    let pods = |node: &Node| -> BTreeSet<[u8; 4]> {
        let out = node.flow_table::<NatKey>(map_names::NAT_OUT);
        let inbound = node.flow_table::<NatReverseKey>(map_names::NAT_IN);
        let mut pods: BTreeSet<[u8; 4]> = out
            .iter()
            .map(|entry| entry.expect("a NAT_OUT entry").1.pod_addr)
            .collect();
        pods.extend(
            inbound
                .iter()
                .map(|entry| entry.expect("a NAT_IN entry").1.pod_addr),
        );
        pods
    };
    assert_eq!(
        pods(&node),
        BTreeSet::from([gone.ip.octets(), stays.ip.octets()])
    );

    // UDP flows live 30 s and the sweeps come every 10 s: only the DEL can make them go
    // within 5 s.
    node.del_pod(&gone);
    assert!(
        eventually(Duration::from_secs(5), || pods(&node)
            == BTreeSet::from([stays.ip.octets()])),
        "the deleted pod's flows went from both tables, the other pod's stayed: {}",
        nat_table(&node)
    );
}

#[test]
fn the_uplink_follows_the_default_route_to_another_device() {
    uplink_follows_the_default_route("10.244.69.0/24", &[]);
}

#[test]
fn with_clsact_filters_the_uplink_follows_the_default_route_too() {
    uplink_follows_the_default_route("10.244.89.0/24", &["--enable-tcx", "false"]);
}

/// A node started with `flags`, whose default route moves from uplink0 to uplink1: NAT
/// follows, its programs move (off uplink0), and the pod's traffic leaves translated
/// to uplink1's address.
fn uplink_follows_the_default_route(subnet: &str, flags: &[&str]) {
    require_root();
    let node = Node::start_with(subnet, &[], flags);
    let pod = node.add_pod("failover");
    // A second way out: `uplink1` to another external host. Both hosts answer for one
    // remote address (on their loopback), as two paths to the same service would.
    let second = Netns::new("ext2");
    node.netns
        .link_veth("uplink1", "198.19.0.1/24", &second, "eth0", "198.19.0.2/24");
    let remote = "203.0.113.10";
    for host in [&node.external, &second] {
        host.ip(&["addr", "add", &format!("{remote}/32"), "dev", "lo"]);
    }
    let (first_server, second_server) = (
        EchoServer::start(&node.external, TCP_PORT),
        EchoServer::start(&second, TCP_PORT),
    );
    let to: SocketAddr = format!("{remote}:{TCP_PORT}").parse().expect("address");
    round_trip(&pod.netns, to, b"by uplink0").expect("TCP through NAT on uplink0");
    assert_eq!(
        node_ips(&first_server.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );

    // The default route fails over to uplink1.
    node.netns
        .ip(&["route", "replace", "default", "via", "198.19.0.2"]);
    let link: Value = serde_json::from_str(&node.netns.ip(&["-j", "link", "show", "uplink1"]))
        .expect("ip -j link");
    let ifindex = link[0]["ifindex"].as_u64().expect("an ifindex");
    assert!(
        eventually(Duration::from_secs(5), || {
            let table = nat_table(&node);
            table["uplink_ifindex"] == ifindex && table["node_addr"] == "198.19.0.1"
        }),
        "NAT moved to uplink1: {}",
        nat_table(&node)
    );
    let status = node.instance.cli_json(&["status"]);
    let uplink_programs: Vec<&Value> = status["attachments"]
        .as_array()
        .expect("attachments")
        .iter()
        .filter(|a| a["program"] == "uplink_egress" || a["program"] == "uplink_ingress")
        .collect();
    assert_eq!(uplink_programs.len(), 2, "{status}");
    assert!(
        uplink_programs.iter().all(|a| a["interface"] == "uplink1"),
        "{status}"
    );
    assert!(
        node.netns.tc_programs("uplink0").is_empty(),
        "uplink0 kept none"
    );
    assert_eq!(
        node.netns.tc_programs("uplink1"),
        ["uplink_ingress", "uplink_egress"],
        "the kernel has both on uplink1"
    );

    round_trip(&pod.netns, to, b"by uplink1").expect("TCP through NAT on uplink1");
    assert_eq!(
        node_ips(&second_server.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()]),
        "the second host sees uplink1's address, never the pod's"
    );
}

/// The uplink pins in the node's links folder, sorted.
fn uplink_pins(node: &Node) -> Vec<String> {
    let dir = node.instance.bpf_dir.join("links");
    let mut pins: Vec<String> = std::fs::read_dir(&dir)
        .expect("the links folder")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("uplink_"))
        .collect();
    pins.sort();
    pins
}

#[test]
fn a_second_uplink_translates_to_its_own_address() {
    require_root();
    let mut node = Node::start("10.244.70.0/24");
    let pod = node.add_pod("two-nics");
    // A second network (storage, say) on `uplink1`: its hosts are reached there, and
    // know nothing of the pods, as on a real node with a second NIC.
    let storage = Netns::new("storage");
    let storage_addr = "198.19.0.2";
    node.netns.link_veth(
        "uplink1",
        "198.19.0.1/24",
        &storage,
        "eth0",
        &format!("{storage_addr}/24"),
    );
    let (internet, storage_server) = (
        EchoServer::start(&node.external, TCP_PORT),
        EchoServer::start(&storage, TCP_PORT),
    );
    let storage_udp = UdpEcho::start(&storage, UDP_PORT);
    let to_storage =
        |port: u16| -> SocketAddr { format!("{storage_addr}:{port}").parse().expect("address") };

    // Restarted with both uplinks, from pins as a daemon of one uplink named them (no
    // device in the name): those go, and no device gets the programs twice.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    let links = node.instance.bpf_dir.join("links");
    for program in ["uplink_egress", "uplink_ingress"] {
        std::fs::rename(
            links.join(format!("{program}@uplink0")),
            links.join(program),
        )
        .expect("an uplink pin to rename");
    }
    let both = ["--uplink", "uplink0,uplink1"];
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &both);
    assert_eq!(
        uplink_pins(&node),
        [
            "uplink_egress@uplink0",
            "uplink_egress@uplink1",
            "uplink_ingress@uplink0",
            "uplink_ingress@uplink1"
        ],
        "one pair of pins per uplink, the unnamed ones gone"
    );
    for device in ["uplink0", "uplink1"] {
        assert_eq!(
            node.netns.tcx_programs(device),
            ["uplink_ingress", "uplink_egress"],
            "the kernel has each program once on {device}"
        );
    }

    round_trip(&pod.netns, to_storage(TCP_PORT), b"to storage").expect("TCP out of uplink1");
    udp_round_trip(&pod.netns, 0, to_storage(UDP_PORT), b"udp").expect("UDP out of uplink1");
    round_trip(&pod.netns, external(TCP_PORT), b"to the internet").expect("TCP out of uplink0");
    assert_eq!(
        node_ips(&storage_server.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()]),
        "the storage host sees uplink1's address, never the pod's"
    );
    assert_eq!(
        node_ips(&storage_udp.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()])
    );
    assert_eq!(
        node_ips(&internet.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "the external host still sees uplink0's"
    );

    let table = nat_table(&node);
    let uplinks: Vec<(&str, &str)> = table["uplinks"]
        .as_array()
        .expect("uplinks")
        .iter()
        .map(|u| {
            (
                u["name"].as_str().expect("a name"),
                u["node_addr"].as_str().expect("an address"),
            )
        })
        .collect();
    assert_eq!(
        uplinks,
        [("uplink0", NODE_ADDR), ("uplink1", "198.19.0.1")],
        "{table}"
    );
    let node_of = |remote: &str| -> BTreeSet<String> {
        table["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["remote"].as_str().is_some_and(|r| r.starts_with(remote)))
            .map(|e| {
                let node: SocketAddr = e["node"].as_str().expect("node").parse().expect("addr");
                node.ip().to_string()
            })
            .collect()
    };
    assert_eq!(
        node_of(storage_addr),
        BTreeSet::from(["198.19.0.1".to_owned()]),
        "{table}"
    );
    assert_eq!(
        node_of(EXTERNAL_ADDR),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "{table}"
    );
    let status = node.instance.cli_json(&["status"]);
    let names: Vec<&Value> = status["uplinks"]
        .as_array()
        .expect("uplinks")
        .iter()
        .map(|u| &u["name"])
        .collect();
    assert_eq!(names, ["uplink0", "uplink1"], "{status}");

    // Restarted with the second one only: the first loses its programs and pins.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &["--uplink", "uplink1"]);
    assert!(
        node.netns.tcx_programs("uplink0").is_empty(),
        "uplink0 kept none"
    );
    assert_eq!(
        uplink_pins(&node),
        ["uplink_egress@uplink1", "uplink_ingress@uplink1"]
    );
    round_trip(&pod.netns, to_storage(TCP_PORT), b"again").expect("TCP out of uplink1");
    assert_eq!(
        node_ips(&storage_server.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()])
    );
}
