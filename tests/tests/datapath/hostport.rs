//! hostPort in eBPF: an external host reaches a pod through the node's address and a
//! host port (TCP and UDP), a mapping without hostIP follows the node's addresses as
//! they come and go, hostIP restricts a mapping, conflicts are refused with code
//! 105, DEL and GC remove mappings, and 5,000 mappings still hit the right pods.

use std::time::Duration;

use ebpf_cni_tests::{
    cni::Call,
    daemon::eventually,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, port_mappings, socket},
    require_root,
    traffic::{EchoServer, UdpEcho, round_trip, udp_round_trip},
};
use serde_json::{Value, json};

const CONTAINER_PORT: u16 = 8080;

fn mappings(list: &[(u16, &str, Option<&str>)]) -> Value {
    port_mappings(CONTAINER_PORT, list)
}

fn ports(node: &Node) -> Vec<Value> {
    node.instance
        .cli_json(&["ports"])
        .as_array()
        .cloned()
        .expect("a list")
}

#[test]
fn an_external_host_reaches_a_pod_through_a_host_port_over_tcp_and_udp() {
    require_root();
    let node = Node::start("10.244.60.0/24");
    let rules_before = node.netns.iptables_rules();
    let pod = node.add_pod_with(
        "hp",
        &mappings(&[(30080, "tcp", None), (30053, "udp", None)]),
    );
    let tcp = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let udp = UdpEcho::start(&pod.netns, CONTAINER_PORT);

    let back = round_trip(&node.external, socket(NODE_ADDR, 30080), b"via hostPort").expect("TCP");
    assert_eq!(back, b"via hostPort");
    let back = udp_round_trip(
        &node.external,
        0,
        socket(NODE_ADDR, 30053),
        b"udp via hostPort",
    )
    .expect("UDP");
    assert_eq!(back, b"udp via hostPort");
    // Larger than the MTU: the fragments after the first follow it to the pod, and those
    // of the pod's reply follow its first out with the host's address.
    let big: Vec<u8> = (0..4000u32).map(|n| (n % 251) as u8).collect();
    let back = udp_round_trip(&node.external, 0, socket(NODE_ADDR, 30053), &big)
        .expect("a 4,000-byte datagram via hostPort");
    assert_eq!(back, big, "reassembled whole both ways");
    // With nothing listening in the pod, its "port unreachable" leaves as the host's,
    // quoting what the client sent, so that the client's socket takes it.
    let udp_peers = udp.peers();
    drop(udp);
    // The pod's kernel may hold an ICMP error back (its rate limits are global, shared
    // with the other tests' namespaces): one of three tries must come back refused.
    let tries: Vec<std::io::Error> = (0..3)
        .map(|_| {
            udp_round_trip(&node.external, 0, socket(NODE_ADDR, 30053), b"anyone?")
                .expect_err("nothing listens")
        })
        .take_while(|error| error.kind() != std::io::ErrorKind::ConnectionRefused)
        .collect();
    assert!(
        tries.len() < 3,
        "the pod's ICMP error never reached the client: {tries:?}"
    );
    // Like portmap's default, the pod sees the client's own address.
    assert!(
        tcp.peers()
            .iter()
            .all(|peer| peer.ip().to_string() == EXTERNAL_ADDR)
    );
    assert!(
        udp_peers
            .iter()
            .all(|peer| peer.ip().to_string() == EXTERNAL_ADDR)
    );
    assert_eq!(ports(&node).len(), 2);
    // An unmapped port still belongs to the node: refused, not misdelivered.
    assert!(round_trip(&node.external, socket(NODE_ADDR, 30081), b"x").is_err());
    assert_eq!(
        node.netns.iptables_rules(),
        rules_before,
        "no iptables rule was written"
    );
}

#[test]
fn host_ip_restricts_a_mapping_to_that_address() {
    require_root();
    let node = Node::start("10.244.61.0/24");
    node.netns
        .ip(&["addr", "add", "198.18.0.3/24", "dev", "uplink0"]);
    let pod = node.add_pod_with("hp-ip", &mappings(&[(30080, "tcp", Some("198.18.0.3"))]));
    let _server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    round_trip(&node.external, socket("198.18.0.3", 30080), b"ok").expect("the mapped address");
    assert!(
        round_trip(&node.external, socket(NODE_ADDR, 30080), b"no").is_err(),
        "the other node address is not mapped"
    );
}

#[test]
fn a_mapping_without_host_ip_covers_an_address_the_node_gains_later() {
    require_root();
    let node = Node::start("10.244.65.0/24");
    let pod = node.add_pod_with("hp-later", &mappings(&[(30080, "tcp", None)]));
    let _server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let later = socket("198.18.0.4", 30080);
    let addrs = |node: &Node| {
        node.instance.cli_json(&["status"])["host_port_addrs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    // The pods' gateway is an address of the node too (see gateway.rs).
    assert_eq!(addrs(&node), [json!("10.244.65.1"), json!(NODE_ADDR)]);
    node.netns
        .ip(&["addr", "add", "198.18.0.4/24", "dev", "uplink0"]);
    // The daemon hears of the address from the kernel (rtnetlink) and maps it.
    assert!(
        eventually(Duration::from_secs(5), || round_trip(
            &node.external,
            later,
            b"new address"
        )
        .is_ok_and(|back| back == b"new address")),
        "the added address reaches the pod"
    );
    assert_eq!(
        addrs(&node),
        [json!("10.244.65.1"), json!(NODE_ADDR), json!("198.18.0.4")]
    );
    node.netns
        .ip(&["addr", "del", "198.18.0.4/24", "dev", "uplink0"]);
    assert!(
        eventually(Duration::from_secs(5), || addrs(&node)
            == [json!("10.244.65.1"), json!(NODE_ADDR)]),
        "a removed address is no longer a hostPort address"
    );
}

#[test]
fn a_taken_host_port_is_refused_with_code_105_and_nothing_changes() {
    require_root();
    let node = Node::start("10.244.62.0/24");
    let first = node.add_pod_with("hp-first", &mappings(&[(30080, "tcp", None)]));
    let _server = EchoServer::start(&first.netns, CONTAINER_PORT);
    let (second, outcome) =
        node.try_add("hp-second", &mappings(&[(30080, "tcp", Some(NODE_ADDR))]));
    let error = outcome.error(105);
    assert!(
        error["msg"].as_str().unwrap_or("").contains("30080"),
        "{error}"
    );
    assert_eq!(node.host_veths().len(), 1, "no veth for the refused pod");
    assert_eq!(
        node.network.allocated().len(),
        1,
        "its address was released"
    );
    assert!(ebpf_cni_tests::cni::veths(&second).is_empty());
    round_trip(&node.external, socket(NODE_ADDR, 30080), b"still first")
        .expect("the first pod keeps it");
    // UDP on the same number is another port.
    node.add_pod_with("hp-udp", &mappings(&[(30080, "udp", None)]));
}

#[test]
fn del_and_gc_remove_exactly_the_pods_mappings() {
    require_root();
    let node = Node::start("10.244.63.0/24");
    let a = node.add_pod_with(
        "hp-a",
        &mappings(&[(30001, "tcp", None), (30002, "tcp", None)]),
    );
    let b = node.add_pod_with("hp-b", &mappings(&[(30003, "tcp", None)]));
    let _c = node.add_pod_with("hp-c", &mappings(&[(30004, "tcp", None)]));
    assert_eq!(ports(&node).len(), 4);
    node.del_pod(&a);
    let left: Vec<u64> = ports(&node)
        .iter()
        .filter_map(|row| row["host_port"].as_u64())
        .collect();
    assert_eq!(left, [30003, 30004]);
    let mut gc = node.network.config("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([{ "containerID": b.container_id, "ifname": "eth0" }]);
    Call::bare("GC", &gc).run(&node.netns).ok();
    let left: Vec<u64> = ports(&node)
        .iter()
        .filter_map(|row| row["host_port"].as_u64())
        .collect();
    assert_eq!(left, [30003]);
    // The freed port can be mapped again.
    node.add_pod_with("hp-d", &mappings(&[(30001, "tcp", None)]));
}

#[test]
fn five_thousand_mappings_still_hit_the_right_pods() {
    require_root();
    const PODS: u16 = 50;
    const PER_POD: u16 = 100;
    let node = Node::start("10.244.64.0/24");
    let pods: Vec<_> = (0..PODS)
        .map(|n| {
            let list: Vec<(u16, &str, Option<&str>)> = (0..PER_POD)
                .map(|k| (20000 + n * PER_POD + k, "tcp", None))
                .collect();
            node.add_pod_with(&format!("many-{n}"), &mappings(&list))
        })
        .collect();
    assert_eq!(ports(&node).len(), usize::from(PODS * PER_POD));
    for n in [0, 17, 49] {
        let server = EchoServer::start(&pods[usize::from(n)].netns, CONTAINER_PORT);
        for k in [0, 57, PER_POD - 1] {
            let port = 20000 + n * PER_POD + k;
            let payload = format!("pod {n} port {port}").into_bytes();
            let back = round_trip(&node.external, socket(NODE_ADDR, port), &payload)
                .unwrap_or_else(|e| panic!("host port {port}: {e}"));
            assert_eq!(back, payload);
        }
        assert_eq!(
            server.peers().len(),
            3,
            "pod {n} got exactly its three connections"
        );
    }
}

#[test]
fn host_ports_of_the_ephemeral_range_and_the_nodes_services_are_refused_with_code_105() {
    require_root();
    let node = Node::start("10.244.63.0/24");
    for (port, expected) in [
        (40000, "ephemeral range"),
        (10250, "kubelet"),
        (9876, "metrics port"),
        (9877, "health port"),
    ] {
        let (_, outcome) = node.try_add(
            &format!("hp-refused-{port}"),
            &mappings(&[(port, "tcp", None)]),
        );
        let error = outcome.error(105);
        let message = error["msg"].as_str().unwrap_or("");
        assert!(message.contains(expected), "{port}: {error}");
    }
    assert!(node.host_veths().is_empty(), "no veth for a refused pod");
    // A port reserved out of the ephemeral range is a hostPort's to take.
    node.netns.run(
        "sh",
        &[
            "-c",
            "echo 40000 > /proc/sys/net/ipv4/ip_local_reserved_ports",
        ],
    );
    node.add_pod_with("hp-reserved", &mappings(&[(40000, "tcp", None)]));
}

#[test]
fn answers_to_the_nodes_own_sockets_are_never_taken_by_a_host_port() {
    use std::net::{Ipv4Addr, UdpSocket};

    require_root();
    let node = Node::start("10.244.64.0/24");
    let pod = node.add_pod_with(
        "hp-thief",
        &port_mappings(
            CONTAINER_PORT,
            &[(30500, "udp", None), (30501, "tcp", None)],
        ),
    );
    let in_pod_udp = UdpEcho::start(&pod.netns, CONTAINER_PORT);
    let _in_pod_tcp = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let _outside_udp = UdpEcho::start(&node.external, 9053);
    let _outside_tcp = EchoServer::start(&node.external, 9080);
    let external: Ipv4Addr = EXTERNAL_ADDR.parse().expect("an address");

    // A node process's UDP query from the mapped port (a connected socket, as
    // resolvers use): its answer comes back to it.
    let answer = ebpf_cni_tests::traffic::run_in(&node.netns, move || {
        let socket = UdpSocket::bind("0.0.0.0:30500")?;
        socket.connect((external, 9053))?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.send(b"node query")?;
        let mut buffer = [0u8; 64];
        let n = socket.recv(&mut buffer)?;
        Ok::<_, std::io::Error>(buffer[..n].to_vec())
    });
    assert_eq!(
        answer.as_deref().ok(),
        Some(&b"node query"[..]),
        "the node's query was answered: {answer:?}"
    );
    assert!(in_pod_udp.peers().is_empty(), "the pod got nothing");

    // A node process's TCP connection from the mapped port.
    let reply = ebpf_cni_tests::traffic::run_in(&node.netns, move || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.bind(&std::net::SocketAddr::from(([0, 0, 0, 0], 30501)).into())?;
        socket.connect_timeout(
            &std::net::SocketAddr::from((external, 9080)).into(),
            Duration::from_secs(2),
        )?;
        let mut stream: std::net::TcpStream = socket.into();
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        std::io::Write::write_all(&mut stream, b"node connection\n")?;
        let mut buffer = [0u8; 16];
        std::io::Read::read_exact(&mut stream, &mut buffer)?;
        Ok::<_, std::io::Error>(buffer.to_vec())
    });
    assert_eq!(
        reply.as_deref().ok(),
        Some(&b"node connection\n"[..]),
        "the node's connection works: {reply:?}"
    );

    // The mappings still take new connections from outside.
    udp_round_trip(&node.external, 0, socket(NODE_ADDR, 30500), b"to the pod")
        .expect("UDP through the hostPort");
    round_trip(&node.external, socket(NODE_ADDR, 30501), b"to the pod")
        .expect("TCP through the hostPort");
}
