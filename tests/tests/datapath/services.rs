//! Kubernetes Services implemented by kube-proxy in iptables mode, next to the datapath,
//! on one node with kube-proxy's own rules (`kube_proxy`: KUBE-SERVICES, KUBE-SVC-*,
//! KUBE-SEP-* with the hairpin mark, KUBE-NODEPORTS, KUBE-EXT-*, KUBE-POSTROUTING,
//! KUBE-FORWARD): with `--service-cidr`, pods reach ClusterIPs (a backend outside the
//! node, one on the node, over TCP and UDP, the backend itself through its own Service)
//! and a NodePort, and get the replies from the address they asked; so do clients
//! outside the node reaching a NodePort or a LoadBalancer IP whose backend sees their
//! own address. Across nodes: `services_cluster.rs`.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr},
};

use ebpf_cni_tests::{
    kube_proxy::{Endpoint, KubeProxy, Mode, Service},
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    traffic::{EchoServer, UdpEcho, round_trip, udp_round_trip},
};

const SERVICE_RANGE: &str = "10.96.0.0/12";
/// A Service whose endpoint is outside the cluster (the external host).
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// A Service whose endpoint is a pod of this node, over TCP and UDP.
const ON_NODE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const NODE_PORT: u16 = 30080;
/// LoadBalancer IPs (outside the ClusterIP range, routed to the node by the load
/// balancer), and one of them.
const LB_RANGE: &str = "203.0.113.0/24";
const LB_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 9053;

fn socket(addr: impl Into<std::net::IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(addr.into(), port)
}

fn ip(addr: &str) -> Ipv4Addr {
    addr.parse().expect("an address")
}

/// kube-proxy in iptables mode on `node`, without `--cluster-cidr`, writing `services`.
fn kube_proxy(node: &Netns, services: &[Service]) {
    KubeProxy::new(Mode::Iptables).install(node, services);
}

/// The TCP Service [`ON_NODE`]:80, its endpoint `backend`:[`TCP_PORT`] on the node.
fn on_node_service(backend: Ipv4Addr) -> Service {
    Service::tcp(
        "default",
        "on-node",
        ON_NODE,
        80,
        vec![Endpoint::local(backend, TCP_PORT)],
    )
}

#[test]
fn pods_reach_services_that_the_nodes_netfilter_dnats() {
    require_root();
    let node = Node::start_with("10.244.71.0/24", &[], &["--service-cidr", SERVICE_RANGE]);
    let client = node.add_pod("svc-client");
    let backend = node.add_pod("svc-backend");
    let outside = EchoServer::start(&node.external, TCP_PORT);
    let on_node = EchoServer::start(&backend.netns, TCP_PORT);
    let on_node_udp = UdpEcho::start(&backend.netns, UDP_PORT);
    kube_proxy(
        &node.netns,
        &[
            Service::tcp(
                "default",
                "outside",
                OUTSIDE,
                80,
                vec![Endpoint::remote(ip(EXTERNAL_ADDR), TCP_PORT)],
            ),
            on_node_service(backend.ip).with_node_port(NODE_PORT),
            Service::udp(
                "default",
                "on-node-udp",
                ON_NODE,
                53,
                vec![Endpoint::local(backend.ip, UDP_PORT)],
            ),
        ],
    );

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
            socket(ip(NODE_ADDR), NODE_PORT),
            "a NodePort on the node's address",
        ),
    ];
    for (to, what) in cases {
        let payload = format!("to {what}").into_bytes();
        let back =
            round_trip(&client.netns, to, &payload).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(back, payload, "{what}");
    }
    // The backend reaching its own Service (a single replica): kube-proxy's KUBE-SEP
    // chain marks such hairpin connections for masquerade, and the pod gets its answer
    // from the node's address.
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
        "inside the node, a ClusterIP connection keeps the pod's address; a NodePort's \
         (kube-proxy masquerades external destinations) and the hairpin take the node's"
    );
    assert_eq!(
        ips(on_node_udp.peers()),
        BTreeSet::from([client.ip.to_string()])
    );

    // Pods' own traffic still takes the datapath both ways.
    let direct =
        round_trip(&client.netns, socket(backend.ip, TCP_PORT), b"direct").expect("pod to pod");
    assert_eq!(direct, b"direct");
    let out = round_trip(&client.netns, socket(ip(EXTERNAL_ADDR), TCP_PORT), b"out")
        .expect("pod to the outside");
    assert_eq!(out, b"out");
}

#[test]
fn services_on_the_node_work_without_source_nat() {
    require_root();
    let mut node = Node::start("10.244.72.0/24");
    let client = node.add_pod("svc-nonat-client");
    let backend = node.add_pod("svc-nonat-backend");
    let server = EchoServer::start(&backend.netns, TCP_PORT);
    kube_proxy(&node.netns, &[on_node_service(backend.ip)]);
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
    let tcp = EchoServer::start(&backend.netns, TCP_PORT);
    let udp = UdpEcho::start(&backend.netns, UDP_PORT);
    // externalTrafficPolicy: Local, as kube-proxy writes it: no masquerade for outside
    // clients, so that the backend sees the client's address and answers it directly.
    let endpoint = |port| vec![Endpoint::local(backend.ip, port)];
    kube_proxy(
        &node.netns,
        &[
            Service::tcp("default", "lb", ON_NODE, 80, endpoint(TCP_PORT))
                .with_node_port(NODE_PORT)
                .with_external_ips(&[LB_IP])
                .with_external_local(),
            Service::udp("default", "lb-udp", ON_NODE, 53, endpoint(UDP_PORT))
                .with_node_port(NODE_PORT)
                .with_external_local(),
        ],
    );
    // The load balancer's address is routed to the node, as a cloud's or MetalLB's.
    node.external
        .ip(&["route", "add", &format!("{LB_IP}/32"), "via", NODE_ADDR]);

    for (to, what) in [
        (socket(ip(NODE_ADDR), NODE_PORT), "a NodePort"),
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
    let back = udp_round_trip(&node.external, 0, socket(ip(NODE_ADDR), NODE_PORT), b"udp")
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
