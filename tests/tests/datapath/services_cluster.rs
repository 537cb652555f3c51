//! Kubernetes Services across nodes, with kube-proxy's own rules on every node
//! (`kube_proxy`: its iptables chains, or its nftables table) and `--service-cidr` set
//! as docs/services.md says, in both routing modes. Three nodes: in the overlay, the third
//! behind a router; natively routed, all on one segment. Pod `a` and a local backend
//! `l` on node 1, backends `b` on node 2 and `c` on node 3. Every case gets its answer
//! from the address it asked, and kube-proxy's KUBE-FORWARD (which drops what
//! conntrack calls invalid) stays on every node:
//! - pod -> ClusterIP, TCP and UDP, the backend on the same node, on another node, on
//!   the node behind the router; a ClusterIP spread over backends on two nodes, every
//!   backend reached;
//! - ICMP errors of those connections (a UDP Service whose backend port is closed:
//!   the client's connected socket is refused);
//! - the node itself -> a ClusterIP whose backend is on another node;
//! - an outside host -> a NodePort of node 1 whose backend is on node 2
//!   (`externalTrafficPolicy: Cluster`), and of node 2 with `Local` (the client's
//!   address kept);
//! - hairpin: a backend reaching its own Service;
//! - the flow decides, not the addresses: from the very port its Service connection
//!   uses, pod `a` reaches the backend (`b`, and `l` on its own node) directly, and that
//!   connection's replies skip node 1's stack (a FORWARD rule dropping them changes
//!   nothing);
//! - a backend's own connections (to another pod, to the outside) are unaffected;
//! - the DNS race: A and AAAA queries sent back to back from one socket, many times,
//!   to a ClusterIP whose backends are on other nodes: none lost.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    cluster::{SEGMENT_HOST, TestCluster, last_peer, node_addr},
    kube_proxy::{Endpoint, KubeProxy, Mode, Service},
    node::Pod,
    require_root,
    traffic::{EchoServer, UdpEcho, round_trip, round_trip_from, run_in, udp_round_trip},
};

const SERVICE_RANGE: &str = "10.96.0.0/12";
const TCP_PORT: u16 = 8080;
/// The port pod `b` answers direct connections on.
const DIRECT_PORT: u16 = 9090;
const DNS_PORT: u16 = 5353;
/// A port nothing listens on.
const CLOSED_PORT: u16 = 5999;
const NODE_PORT: u16 = 30080;
const LOCAL_NODE_PORT: u16 = 30081;

/// The Services' addresses.
const ON_NODE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const BEHIND_ROUTER: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 40);
const SPREAD: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
const CLOSED: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 50);

/// The cluster's pods and the Services kube-proxy writes for them.
struct Pods {
    a: Pod,
    l: Pod,
    b: Pod,
    c: Pod,
}

fn services(pods: &Pods, node: usize) -> Vec<Service> {
    let on = |pod: &Pod, pod_node: usize, port: u16| {
        if pod_node == node {
            Endpoint::local(pod.ip, port)
        } else {
            Endpoint::remote(pod.ip, port)
        }
    };
    vec![
        Service::tcp(
            "default",
            "on-node",
            ON_NODE,
            80,
            vec![on(&pods.l, 1, TCP_PORT)],
        ),
        Service::tcp(
            "default",
            "remote",
            REMOTE,
            80,
            vec![on(&pods.b, 2, TCP_PORT)],
        )
        .with_node_port(NODE_PORT),
        Service::tcp(
            "default",
            "remote-local",
            REMOTE,
            81,
            vec![on(&pods.b, 2, TCP_PORT)],
        )
        .with_node_port(LOCAL_NODE_PORT)
        .with_external_local(),
        Service::udp(
            "kube-system",
            "kube-dns",
            DNS,
            53,
            // CoreDNS's two replicas, on two other nodes.
            vec![on(&pods.b, 2, DNS_PORT), on(&pods.c, 3, DNS_PORT)],
        )
        .named("dns"),
        Service::tcp(
            "default",
            "behind-router",
            BEHIND_ROUTER,
            80,
            vec![on(&pods.c, 3, TCP_PORT)],
        ),
        Service::tcp(
            "default",
            "spread",
            SPREAD,
            80,
            vec![on(&pods.b, 2, TCP_PORT), on(&pods.c, 3, TCP_PORT)],
        ),
        Service::udp(
            "default",
            "closed",
            CLOSED,
            53,
            vec![on(&pods.b, 2, CLOSED_PORT)],
        ),
    ]
}

fn socket(addr: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(addr.into(), port)
}

fn ranges(tag: u8) -> [String; 3] {
    [1, 2, 3].map(|n| format!("10.{tag}.{n}.0/24"))
}

/// Three nodes in `routing`, kube-proxy in `mode` on each (with `--cluster-cidr` when
/// `cluster_cidr`: the overlay needs it, see docs/services.md), and the cases of
/// the module's doc.
fn services_across_nodes(routing: &str, mode: Mode, cluster_cidr: bool, tag: u8) {
    require_root();
    let ranges = ranges(tag);
    let ranges: Vec<&str> = ranges.iter().map(String::as_str).collect();
    let flags = ["--routing", routing, "--service-cidr", SERVICE_RANGE];
    // The overlay reaches a node behind a router; native routes need one segment.
    let routed = usize::from(routing == "vxlan");
    let cluster = TestCluster::start_routed(&ranges, routed, &flags);
    let pods = Pods {
        a: cluster.node(1).add_pod(&format!("svc{tag}-a")),
        l: cluster.node(1).add_pod(&format!("svc{tag}-l")),
        b: cluster.node(2).add_pod(&format!("svc{tag}-b")),
        c: cluster.node(3).add_pod(&format!("svc{tag}-c")),
    };
    for n in 1..=3 {
        let proxy = KubeProxy {
            cluster_cidr: cluster_cidr.then(|| format!("10.{tag}.0.0/16")),
            ..KubeProxy::new(mode)
        };
        proxy.install(&cluster.node(n).netns, &services(&pods, n));
    }
    let l_tcp = EchoServer::start(&pods.l.netns, TCP_PORT);
    let b_tcp = EchoServer::start(&pods.b.netns, TCP_PORT);
    let b_dns = UdpEcho::start(&pods.b.netns, DNS_PORT);
    let c_dns = UdpEcho::start(&pods.c.netns, DNS_PORT);
    let c_tcp = EchoServer::start(&pods.c.netns, TCP_PORT);

    for (to, what) in [
        (ON_NODE, "a ClusterIP whose backend is on the node"),
        (REMOTE, "a ClusterIP whose backend is on another node"),
        (
            BEHIND_ROUTER,
            "a ClusterIP whose backend is on a node behind a router",
        ),
    ] {
        let payload = format!("{routing}: {what}").into_bytes();
        let back = round_trip(&pods.a.netns, socket(to, 80), &payload)
            .unwrap_or_else(|e| panic!("{routing}, {mode:?}: {what}: {e}"));
        assert_eq!(back, payload, "{what}");
    }
    assert_eq!(last_peer(&l_tcp.peers()), IpAddr::from(pods.a.ip));
    assert_eq!(
        last_peer(&b_tcp.peers()),
        IpAddr::from(pods.a.ip),
        "b sees a"
    );
    assert_eq!(
        last_peer(&c_tcp.peers()),
        IpAddr::from(pods.a.ip),
        "c sees a"
    );

    let back = udp_round_trip(&pods.a.netns, 0, socket(DNS, 53), b"dns?")
        .unwrap_or_else(|e| panic!("{routing}, {mode:?}: UDP to a remote ClusterIP: {e}"));
    assert_eq!(back, b"dns?");
    let dns_peers = [b_dns.peers(), c_dns.peers()].concat();
    assert_eq!(last_peer(&dns_peers), IpAddr::from(pods.a.ip));
    // Larger than the MTU: the reply comes back in fragments, all through the stack.
    let big: Vec<u8> = (0..4000u32).map(|n| (n % 251) as u8).collect();
    let back = udp_round_trip(&pods.a.netns, 0, socket(DNS, 53), &big)
        .unwrap_or_else(|e| panic!("{routing}, {mode:?}: a 4,000-byte datagram: {e}"));
    assert_eq!(back, big, "reassembled whole both ways");

    // Spread over two nodes: both backends answer within a few dozen connections.
    let before = (b_tcp.peers().len(), c_tcp.peers().len());
    for n in 0..40 {
        let back = round_trip(&pods.a.netns, socket(SPREAD, 80), b"spread")
            .unwrap_or_else(|e| panic!("{routing}, {mode:?}: spread, connection {n}: {e}"));
        assert_eq!(back, b"spread");
    }
    let spread = (
        b_tcp.peers().len() - before.0,
        c_tcp.peers().len() - before.1,
    );
    assert_eq!(
        spread.0 + spread.1,
        40,
        "every connection reached a backend"
    );
    assert!(
        spread.0 > 0 && spread.1 > 0,
        "both nodes' backends were chosen: {spread:?}"
    );

    // An ICMP error of a Service connection is translated back too: the client's
    // connected socket learns the port is closed.
    let refused = udp_round_trip(&pods.a.netns, 0, socket(CLOSED, 53), b"anyone?")
        .expect_err("nothing listens behind the closed Service");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{routing}, {mode:?}: the port unreachable reaches the socket: {refused}"
    );

    // The node itself.
    let node1 = &cluster.node(1).netns;
    let back = round_trip(node1, socket(REMOTE, 80), b"from node 1")
        .unwrap_or_else(|e| panic!("{routing}, {mode:?}: node 1 -> remote ClusterIP: {e}"));
    assert_eq!(back, b"from node 1");
    // The backend's answers reached node 1's address: its server socket is no Service
    // client for node 1, whose pods still reach it directly past the stack.
    let back = round_trip(&pods.a.netns, socket(pods.b.ip, TCP_PORT), b"a to b")
        .unwrap_or_else(|e| panic!("{routing}, {mode:?}: a -> b directly after node 1: {e}"));
    assert_eq!(back, b"a to b");

    // From outside: node 1's NodePort (Cluster), node 2's (Local, the client's address
    // kept).
    let node1_addr: Ipv4Addr = node_addr(1).parse().expect("an address");
    let back = round_trip(&cluster.segment, socket(node1_addr, NODE_PORT), b"np")
        .unwrap_or_else(|e| panic!("{routing}, {mode:?}: a NodePort, backend elsewhere: {e}"));
    assert_eq!(back, b"np");
    let node2_addr: Ipv4Addr = node_addr(2).parse().expect("an address");
    let back = round_trip(
        &cluster.segment,
        socket(node2_addr, LOCAL_NODE_PORT),
        b"np local",
    )
    .unwrap_or_else(|e| panic!("{routing}, {mode:?}: a Local NodePort: {e}"));
    assert_eq!(back, b"np local");
    assert_eq!(
        last_peer(&b_tcp.peers()),
        SEGMENT_HOST.parse::<IpAddr>().expect("an address"),
        "Local: the backend sees the client"
    );

    // Hairpin: b reaches its own Service.
    let back = round_trip(&pods.b.netns, socket(REMOTE, 80), b"myself")
        .unwrap_or_else(|e| panic!("{routing}, {mode:?}: hairpin: {e}"));
    assert_eq!(back, b"myself");

    flows_decide(&cluster, &pods, routing, mode);

    // A backend's own connections: to a pod of another node, and to the outside
    // (translated to its node's address).
    let a_tcp = EchoServer::start(&pods.a.netns, TCP_PORT);
    let back = round_trip(&pods.b.netns, socket(pods.a.ip, TCP_PORT), b"b to a")
        .expect("b reaches a directly");
    assert_eq!(back, b"b to a");
    assert_eq!(last_peer(&a_tcp.peers()), IpAddr::from(pods.b.ip));
    let outside = EchoServer::start(&cluster.segment, TCP_PORT);
    let host: Ipv4Addr = SEGMENT_HOST.parse().expect("an address");
    round_trip(&pods.b.netns, socket(host, TCP_PORT), b"out").expect("b reaches the outside");
    assert_eq!(
        last_peer(&outside.peers()),
        node_addr(2).parse::<IpAddr>().expect("an address")
    );

    dns_race(&pods.a, routing, mode);
}

/// From one port of pod `a`: a Service connection to a backend (`b` on another node,
/// `l` on a's own), then a direct one to that backend's [`DIRECT_PORT`]. The direct
/// connection's replies must skip node 1's stack, where a FORWARD rule drops them.
fn flows_decide(cluster: &TestCluster, pods: &Pods, routing: &str, mode: Mode) {
    let node1 = &cluster.node(1).netns;
    for (backend, service, port, where_) in [
        (&pods.b, REMOTE, 41_000, "another node"),
        (&pods.l, ON_NODE, 41_001, "the client's node"),
    ] {
        let ip = backend.ip.to_string();
        let direct = DIRECT_PORT.to_string();
        let rule = [
            "FORWARD", "-s", &ip, "-p", "tcp", "--sport", &direct, "-j", "DROP",
        ];
        let insert = node1.run("iptables", &[&["-w", "-I"][..], &rule[..]].concat());
        assert!(insert.status.success(), "iptables: {insert:?}");
        let back = round_trip_from(&pods.a.netns, port, socket(service, 80), b"service")
            .unwrap_or_else(|e| {
                panic!("{routing}, {mode:?}: a Service on {where_} from port {port}: {e}")
            });
        assert_eq!(back, b"service");
        let server = EchoServer::start(&backend.netns, DIRECT_PORT);
        let back = round_trip_from(
            &pods.a.netns,
            port,
            socket(backend.ip, DIRECT_PORT),
            b"direct",
        )
        .unwrap_or_else(|e| {
            panic!(
                "{routing}, {mode:?}: its backend on {where_} directly, from the Service \
                 connection's port: {e}"
            )
        });
        assert_eq!(back, b"direct");
        assert_eq!(
            server.peers(),
            [socket(pods.a.ip, port)],
            "the backend on {where_} saw a's port, untranslated"
        );
        let delete = node1.run("iptables", &[&["-w", "-D"][..], &rule[..]].concat());
        assert!(delete.status.success(), "iptables: {delete:?}");
    }
}

/// glibc's parallel lookup: an A and an AAAA query sent back to back from one socket,
/// `ROUNDS` times from new sockets, to a ClusterIP whose two backends are on other
/// nodes (the two queries of a socket may each be given another backend: the race in
/// which conntrack's second insertion used to lose, the "5 s DNS timeouts").
fn dns_race(a: &Pod, routing: &str, mode: Mode) {
    const ROUNDS: usize = 300;
    let lost = run_in(&a.netns, move || {
        let mut lost = 0;
        for round in 0..ROUNDS {
            let udp = UdpSocket::bind(("0.0.0.0", 0)).expect("bind");
            udp.connect(socket(DNS, 53)).expect("connect");
            udp.set_read_timeout(Some(Duration::from_secs(1)))
                .expect("timeout");
            let queries = [format!("A {round}"), format!("AAAA {round}")];
            for query in &queries {
                udp.send(query.as_bytes()).expect("send");
            }
            let mut answered = BTreeSet::new();
            let mut buffer = [0u8; 64];
            while answered.len() < queries.len() {
                match udp.recv(&mut buffer) {
                    Ok(n) => {
                        answered.insert(buffer[..n].to_vec());
                    }
                    Err(_) => break,
                }
            }
            lost += queries.len() - answered.len();
        }
        lost
    });
    assert_eq!(
        lost,
        0,
        "{routing}, {mode:?}: {lost} of {} queries lost",
        2 * ROUNDS
    );
}

#[test]
fn services_across_nodes_in_the_overlay_with_kube_proxys_iptables_rules() {
    services_across_nodes("vxlan", Mode::Iptables, true, 61);
}

#[test]
fn services_across_nodes_natively_routed_with_kube_proxys_iptables_rules() {
    services_across_nodes("native", Mode::Iptables, true, 62);
}

#[test]
fn services_across_nodes_in_the_overlay_with_kube_proxys_nftables_rules() {
    services_across_nodes("vxlan", Mode::Nftables, true, 63);
}

#[test]
fn services_across_nodes_natively_routed_with_kube_proxys_nftables_rules() {
    services_across_nodes("native", Mode::Nftables, false, 64);
}
