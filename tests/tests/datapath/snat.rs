//! Source NAT in eBPF, the translation: an external host sees the node's address for
//! every pod flow, replies (and ICMP errors) reach the right pod, ports never collide,
//! fragments follow their first one, and pods' traffic to the outside skips the node's
//! stack. The external namespace has no route to the pods, so any reply a pod gets proves
//! the translation both ways.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    thread,
    time::Duration,
};

use ebpf_cni_tests::{
    daemon::eventually,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, Pod},
    require_root,
    snat::{TCP_PORT, UDP_PORT, external, nat_table, node_ips},
    traffic::{
        EchoServer, RawSocket, UdpEcho, many_connections, round_trip, round_trip_from, run_in,
        udp_round_trip,
    },
};

/// An IP protocol number for experiments (RFC 3692): no ports, no kernel handler.
const EXPERIMENTAL_PROTO: u8 = 253;

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
        let deadline = std::time::Instant::now() + ebpf_cni_tests::scaled(Duration::from_secs(2));
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
