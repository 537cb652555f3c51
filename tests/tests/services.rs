//! Kubernetes Services implemented by kube-proxy in iptables mode, next to the datapath:
//! with `--service-cidr`, pods reach ClusterIPs (a backend outside the node, one on the
//! node, over TCP and UDP, the backend itself through its own Service) and a NodePort,
//! and get the replies from the address they asked; so do clients outside the node
//! reaching a NodePort or a LoadBalancer IP whose backend sees their own address. The node's DNAT rules stand in for kube-proxy's: the same PREROUTING DNAT
//! kube-proxy writes, without its chains of chains.

use std::{collections::BTreeSet, net::SocketAddr};

use ebpf_cni_tests::{
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    traffic::{EchoServer, UdpEcho, round_trip, udp_round_trip},
};

const SERVICE_RANGE: &str = "10.96.0.0/12";
/// A Service whose endpoint is outside the cluster (the external host).
const OUTSIDE: &str = "10.96.0.10";
/// A Service whose endpoint is a pod of this node, over TCP and UDP.
const ON_NODE: &str = "10.96.0.11";
const NODE_PORT: u16 = 30080;
/// LoadBalancer IPs (outside the ClusterIP range, routed to the node by the load
/// balancer), and one of them.
const LB_RANGE: &str = "203.0.113.0/24";
const LB_IP: &str = "203.0.113.10";
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 9053;

fn socket(addr: &str, port: u16) -> SocketAddr {
    format!("{addr}:{port}").parse().expect("address")
}

/// A DNAT rule as kube-proxy writes one (nat PREROUTING, for traffic forwarded from pods).
fn dnat(node: &Netns, proto: &str, to: &str, port: u16, endpoint: SocketAddr) {
    let port = port.to_string();
    let endpoint = endpoint.to_string();
    let output = node.run(
        "iptables",
        &[
            "-w",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-p",
            proto,
            "-d",
            to,
            "--dport",
            &port,
            "-j",
            "DNAT",
            "--to-destination",
            &endpoint,
        ],
    );
    assert!(output.status.success(), "iptables: {output:?}");
}

/// A NodePort ([`NODE_PORT`] on the node's address) over `proto`, its endpoint
/// `backend`:`port`.
fn node_port(node: &Netns, proto: &str, backend: &str, port: u16) {
    dnat(node, proto, NODE_ADDR, NODE_PORT, socket(backend, port));
}

/// The TCP Service [`ON_NODE`]:80, its endpoint `backend`:[`TCP_PORT`].
fn on_node_service(node: &Netns, backend: &str) {
    dnat(node, "tcp", ON_NODE, 80, socket(backend, TCP_PORT));
}

#[test]
fn pods_reach_services_that_the_nodes_netfilter_dnats() {
    require_root();
    let node = Node::start_with("10.244.71.0/24", &[], &["--service-cidr", SERVICE_RANGE]);
    let client = node.add_pod("svc-client");
    let backend = node.add_pod("svc-backend");
    let backend_ip = backend.ip.to_string();
    let outside = EchoServer::start(&node.external, TCP_PORT);
    let on_node = EchoServer::start(&backend.netns, TCP_PORT);
    let on_node_udp = UdpEcho::start(&backend.netns, UDP_PORT);
    dnat(
        &node.netns,
        "tcp",
        OUTSIDE,
        80,
        socket(EXTERNAL_ADDR, TCP_PORT),
    );
    on_node_service(&node.netns, &backend_ip);
    dnat(
        &node.netns,
        "udp",
        ON_NODE,
        53,
        socket(&backend_ip, UDP_PORT),
    );
    node_port(&node.netns, "tcp", &backend_ip, TCP_PORT);

    assert_eq!(
        node.instance.cli_json(&["status"])["service_cidrs"],
        serde_json::json!([SERVICE_RANGE]),
        "status names the ranges"
    );
    let cases = [
        (socket(OUTSIDE, 80), "a ClusterIP with its endpoint outside"),
        (
            socket(ON_NODE, 80),
            "a ClusterIP with its endpoint on the node",
        ),
        (
            socket(NODE_ADDR, NODE_PORT),
            "a NodePort on the node's address",
        ),
    ];
    for (to, what) in cases {
        let payload = format!("to {what}").into_bytes();
        let back =
            round_trip(&client.netns, to, &payload).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(back, payload, "{what}");
    }
    // The backend reaching its own Service (a single replica): kube-proxy masquerades
    // such hairpin connections, and the pod gets its answer from the node's address.
    let rule = format!("{backend_ip}/32");
    let masquerade = node.netns.run(
        "iptables",
        &[
            "-w",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            &rule,
            "-d",
            &rule,
            "-j",
            "MASQUERADE",
        ],
    );
    assert!(masquerade.status.success(), "iptables: {masquerade:?}");
    let back = round_trip(&backend.netns, socket(ON_NODE, 80), b"myself")
        .expect("a pod reaching its own Service");
    assert_eq!(back, b"myself");
    let back = udp_round_trip(&client.netns, 0, socket(ON_NODE, 53), b"dns?")
        .expect("UDP to a ClusterIP: the reply comes from the address asked (connected socket)");
    assert_eq!(back, b"dns?");
    // Larger than the MTU: the backend's reply leaves it in fragments, which must all
    // take the stack's way back, as the first one does.
    let big: Vec<u8> = (0..4000u32).map(|n| (n % 251) as u8).collect();
    let back = udp_round_trip(&client.netns, 0, socket(ON_NODE, 53), &big)
        .expect("a 4,000-byte datagram to a ClusterIP and its reply");
    assert_eq!(back, big, "reassembled whole both ways");

    let ips = |peers: Vec<SocketAddr>| -> BTreeSet<String> {
        peers.iter().map(|peer| peer.ip().to_string()).collect()
    };
    assert_eq!(
        ips(outside.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "leaving the node, the Service's traffic is source-NATed as any other"
    );
    assert_eq!(
        ips(on_node.peers()),
        BTreeSet::from([client.ip.to_string(), NODE_ADDR.to_owned()]),
        "inside the node, it keeps the pod's address (the hairpin aside)"
    );
    assert_eq!(
        ips(on_node_udp.peers()),
        BTreeSet::from([client.ip.to_string()])
    );

    // Pods' own traffic still takes the datapath both ways.
    let direct =
        round_trip(&client.netns, socket(&backend_ip, TCP_PORT), b"direct").expect("pod to pod");
    assert_eq!(direct, b"direct");
    let out = round_trip(&client.netns, socket(EXTERNAL_ADDR, TCP_PORT), b"out")
        .expect("pod to the outside");
    assert_eq!(out, b"out");
}

#[test]
fn services_on_the_node_work_without_source_nat() {
    require_root();
    let mut node = Node::start("10.244.72.0/24");
    let client = node.add_pod("svc-nonat-client");
    let backend = node.add_pod("svc-nonat-backend");
    let backend_ip = backend.ip.to_string();
    let server = EchoServer::start(&backend.netns, TCP_PORT);
    on_node_service(&node.netns, &backend_ip);
    // No default route: source NAT is off, and with it the forwarding it turned on.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.netns.ip(&["route", "del", "default"]);
    let sysctl = node.netns.run("sysctl", &["-qw", "net.ipv4.ip_forward=0"]);
    assert!(sysctl.status.success(), "{sysctl:?}");
    node.daemon = ebpf_cni_tests::daemon::Daemon::start_with(
        &node.netns,
        &node.instance,
        &[],
        &["--service-cidr", SERVICE_RANGE],
    );
    assert_eq!(
        node.instance.cli_json(&["status"])["nat_enabled"],
        false,
        "no source NAT"
    );
    let back = round_trip(&client.netns, socket(ON_NODE, 80), b"no nat")
        .expect("a ClusterIP with its endpoint on the node, routed by the stack");
    assert_eq!(back, b"no nat");
    assert_eq!(server.peers().len(), 1);
}

#[test]
fn external_clients_reach_a_node_port_and_a_load_balancer_ip_keeping_their_address() {
    require_root();
    let node = Node::start_with(
        "10.244.76.0/24",
        &[],
        &["--service-cidr", &format!("{SERVICE_RANGE},{LB_RANGE}")],
    );
    let backend = node.add_pod("svc-lb-backend");
    let backend_ip = backend.ip.to_string();
    let tcp = EchoServer::start(&backend.netns, TCP_PORT);
    let udp = UdpEcho::start(&backend.netns, UDP_PORT);
    // externalTrafficPolicy: Local, as kube-proxy writes it: DNAT without masquerade,
    // so that the backend sees the client's address and answers it directly.
    node_port(&node.netns, "tcp", &backend_ip, TCP_PORT);
    node_port(&node.netns, "udp", &backend_ip, UDP_PORT);
    dnat(&node.netns, "tcp", LB_IP, 80, socket(&backend_ip, TCP_PORT));
    // The load balancer's address is routed to the node, as a cloud's or MetalLB's.
    node.external
        .ip(&["route", "add", &format!("{LB_IP}/32"), "via", NODE_ADDR]);

    for (to, what) in [
        (socket(NODE_ADDR, NODE_PORT), "a NodePort"),
        (socket(LB_IP, 80), "a LoadBalancer IP"),
    ] {
        let payload = format!("to {what}").into_bytes();
        let back =
            round_trip(&node.external, to, &payload).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            back, payload,
            "{what}: the reply comes from the address asked"
        );
    }
    let back = udp_round_trip(&node.external, 0, socket(NODE_ADDR, NODE_PORT), b"udp")
        .expect("a UDP NodePort: the reply comes from the address asked (connected socket)");
    assert_eq!(back, b"udp");
    let peers: Vec<SocketAddr> = [tcp.peers(), udp.peers()].concat();
    assert_eq!(peers.len(), 3);
    assert!(
        peers
            .iter()
            .all(|peer| peer.ip().to_string() == EXTERNAL_ADDR),
        "the backend sees the client's own address: {peers:?}"
    );
}
