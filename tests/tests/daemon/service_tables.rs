//! The Service tables cannot be flushed from outside: a live Service connection keeps
//! its replies' way through the node's stack however many new connections a host
//! outside or another pod opens meanwhile. Each flood sends a SYN from every port of
//! one address (65,535 sockets, as a host or a pod with CAP_NET_RAW can): to a node
//! address on a port that is no NodePort (not recorded at all), to a NodePort (recorded
//! up to the address's budget, the rest refused), to a ClusterIP from a pod (the same,
//! for the pod). The live connection was idle through the flood, the entry a table of
//! least recently used entries would have given up first.

use std::{
    collections::HashSet,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    time::Duration,
};

use ebpf_cni_tests::{
    kube_proxy::{Endpoint, KubeProxy, Mode, Service},
    netns::Netns,
    node::{NODE_ADDR, Node},
    require_root,
    traffic::{
        EchoServer, run_in,
        spoof::{syn_flood, udp_flood},
    },
};
use serde_json::Value;

const SERVICE_RANGE: &str = "10.96.0.0/12";
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 21);
const NODE_PORT: u16 = 30081;
const TCP_PORT: u16 = 8080;
/// Whom the outside floods claim to be: addresses of no host, as a forger's; two for
/// each flood, twice the sockets the tables of least recently used entries held.
const FLOODERS: [[Ipv4Addr; 2]; 2] = [
    [Ipv4Addr::new(192, 0, 2, 77), Ipv4Addr::new(192, 0, 2, 78)],
    [Ipv4Addr::new(192, 0, 2, 87), Ipv4Addr::new(192, 0, 2, 88)],
];

fn drops(status: &Value, reason: &str) -> u64 {
    status["drops"][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no {reason} counter in {status}"))
}

/// Every entry of the node's pinned map `name`, as bpftool dumps it in JSON, each key
/// once. A dump walks the map key by key, and when the sweep deletes the key it stands
/// on, the kernel walks on from the first bucket: a dump taken during sweeps lists
/// keys more than once.
fn dump(node: &Node, name: &str) -> Vec<Value> {
    let status = node.instance.cli_json(&["status"]);
    let dir = status["bpf_dir"]
        .as_str()
        .expect("the daemon's bpffs folder");
    let pin = format!("{dir}/{name}");
    let out = node
        .netns
        .run("bpftool", &["-j", "map", "dump", "pinned", &pin]);
    assert!(out.status.success(), "bpftool: {out:?}");
    let entries: Value = serde_json::from_slice(&out.stdout).expect("bpftool's JSON");
    let mut seen = HashSet::new();
    entries
        .as_array()
        .expect("a list of entries")
        .iter()
        .filter(|entry| seen.insert(entry["key"].to_string()))
        .cloned()
        .collect()
}

/// The entries of the node's pinned map `name` (keyed by an address first: a socket,
/// or a party) whose key starts with `addr`.
fn held_by(node: &Node, name: &str, addr: Ipv4Addr) -> usize {
    let address: Vec<String> = addr.octets().iter().map(|b| format!("0x{b:02x}")).collect();
    dump(node, name)
        .iter()
        .filter(|entry| {
            entry["key"].as_array().is_some_and(|key| {
                key.iter()
                    .take(4)
                    .map(|byte| byte.as_str().unwrap_or_default())
                    .eq(address.iter().map(String::as_str))
            })
        })
        .count()
}

const BUDGET: usize = cni_ebpf_common::DEFAULT_PARTY_BUDGET as usize;

fn node_addr() -> Ipv4Addr {
    NODE_ADDR.parse().expect("an address")
}

/// A connection to an echo server, opened inside a namespace and then used from here.
struct Held(TcpStream);

impl Held {
    fn open(netns: &Netns, to: SocketAddrV4) -> Self {
        let stream = run_in(netns, move || {
            TcpStream::connect_timeout(&SocketAddr::V4(to), Duration::from_secs(5))
        })
        .unwrap_or_else(|error| panic!("connect to {to}: {error}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("a read timeout");
        Self(stream)
    }

    /// One round trip on the connection: the echo of `payload`, or what went wrong.
    fn round_trip(&mut self, payload: &[u8]) -> Result<(), String> {
        self.0
            .write_all(payload)
            .map_err(|e| format!("write: {e}"))?;
        let mut back = vec![0u8; payload.len()];
        self.0
            .read_exact(&mut back)
            .map_err(|e| format!("read: {e}"))?;
        if back == payload {
            Ok(())
        } else {
            Err(format!("echoed {back:?}"))
        }
    }
}

#[test]
fn an_outsider_flooding_the_node_cannot_flush_a_live_node_port_connection() {
    require_root();
    let node = Node::start_with("10.244.81.0/24", &[], &["--service-cidr", SERVICE_RANGE]);
    let backend = node.add_pod("tables-backend");
    let _echo = EchoServer::start(&backend.netns, TCP_PORT);
    // externalTrafficPolicy: Local: the client's address is kept, and the backend's
    // answers come back through the stack only because the client is remembered.
    KubeProxy::new(Mode::Iptables).install(
        &node.netns,
        &[Service::tcp(
            "default",
            "tables",
            CLUSTER_IP,
            80,
            vec![Endpoint::local(backend.ip, TCP_PORT)],
        )
        .with_node_port(NODE_PORT)
        .with_external_local()],
    );
    let node_port = SocketAddrV4::new(node_addr(), NODE_PORT);
    let mut live = Held::open(&node.external, node_port);
    live.round_trip(b"before").expect("the NodePort answers");

    // Connections to a port of the node that is no NodePort are not the Services'.
    let elsewhere = SocketAddrV4::new(node_addr(), 9999);
    for flooder in FLOODERS[0] {
        let sent = syn_flood(&node.external, flooder, 1..=u16::MAX, elsewhere).expect("a flood");
        assert_eq!(sent, usize::from(u16::MAX));
    }
    for flooder in FLOODERS[0] {
        assert_eq!(
            held_by(&node, "SERVICE_PEERS", flooder),
            0,
            "connections to a port that is no NodePort are not recorded"
        );
    }
    live.round_trip(b"after a flood to another port")
        .expect("the live connection outlives a flood to a port that is no NodePort");
    let status = node.instance.cli_json(&["status"]);
    assert_eq!(
        drops(&status, "service_budget"),
        0,
        "nothing recorded: {status}"
    );

    // To the NodePort itself: each flooder's address holds its budget, no more; two
    // of them at most half the table.
    for flooder in FLOODERS[1] {
        syn_flood(&node.external, flooder, 1..=u16::MAX, node_port).expect("a flood");
    }
    // Each got to its budget (the sweeps its refusals called may have taken it back
    // to three quarters of it meanwhile), no further.
    for flooder in FLOODERS[1] {
        let held = held_by(&node, "SERVICE_PEERS", flooder);
        assert!(
            (BUDGET * 3 / 4..=BUDGET).contains(&held),
            "{flooder} holds {held} sockets: up to its budget of {BUDGET}, no more"
        );
    }
    // Within seconds of its refusals, the sweep leaves each no more than seven eighths
    // of its budget: its own unanswered entries went first.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while FLOODERS[1]
        .iter()
        .any(|flooder| held_by(&node, "SERVICE_PEERS", *flooder) > BUDGET * 7 / 8)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the flooders' unanswered sockets were not early-dropped"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    live.round_trip(b"after a flood to the NodePort")
        .expect("the live connection outlives a flood to its own NodePort");
    let status = node.instance.cli_json(&["status"]);
    // Past their budgets, the rest of the flood (what reached the node: a loaded
    // machine's veth backlog may drop some) was refused.
    assert!(drops(&status, "service_budget") > 0, "{status}");
    assert_eq!(drops(&status, "service_table_full"), 0, "{status}");
    // A new client still gets in.
    let mut fresh = Held::open(&node.external, node_port);
    fresh
        .round_trip(b"new")
        .expect("a new client reaches the NodePort after the flood");
}

#[test]
fn a_pod_flooding_a_service_cannot_flush_another_pods_live_connection() {
    require_root();
    let node = Node::start_with("10.244.82.0/24", &[], &["--service-cidr", SERVICE_RANGE]);
    let backend = node.add_pod("tables-pod-backend");
    let victim = node.add_pod("tables-victim");
    let hostile = node.add_pod("tables-hostile");
    let _echo = EchoServer::start(&backend.netns, TCP_PORT);
    KubeProxy::new(Mode::Iptables).install(
        &node.netns,
        &[Service::tcp(
            "default",
            "tables-pod",
            CLUSTER_IP,
            80,
            vec![Endpoint::local(backend.ip, TCP_PORT)],
        )],
    );
    let service = SocketAddrV4::new(CLUSTER_IP, 80);
    let mut live = Held::open(&victim.netns, service);
    live.round_trip(b"before").expect("the ClusterIP answers");

    // A SYN and a UDP datagram from each of its ports, each twice (an entry used again
    // is one a table of least recently used entries keeps over one used once): twice
    // the sockets that table held.
    for _ in 0..2 {
        syn_flood(&hostile.netns, hostile.ip, 1..=u16::MAX, service).expect("a flood");
    }
    for _ in 0..2 {
        udp_flood(&hostile.netns, hostile.ip, 1..=u16::MAX, service).expect("a flood");
    }
    let held = held_by(&node, "SERVICE_CLIENTS", hostile.ip);
    assert!(
        held <= BUDGET,
        "the hostile pod holds {held} sockets, past its budget"
    );
    assert_eq!(
        held_by(&node, "SERVICE_CLIENTS", victim.ip),
        1,
        "the victim's socket is still remembered"
    );
    live.round_trip(b"after")
        .expect("the victim's connection outlives another pod's flood of its Service");
    let status = node.instance.cli_json(&["status"]);
    assert!(
        drops(&status, "service_budget") > 0,
        "the hostile pod's SYNs past its budget are refused: {status}"
    );
    let mut fresh = Held::open(&victim.netns, service);
    fresh
        .round_trip(b"new")
        .expect("the victim opens new Service connections after the flood");
}

#[test]
fn forged_addresses_leave_nothing_behind_once_their_entries_expire() {
    require_root();
    let node = Node::start_with(
        "10.244.84.0/24",
        &[],
        &[
            "--service-cidr",
            SERVICE_RANGE,
            "--nat-tcp-transitory-timeout",
            "1",
            "--nat-gc-interval",
            "1",
        ],
    );
    let node_port = SocketAddrV4::new(node_addr(), NODE_PORT);
    // One SYN from each of 500 addresses no host holds: 500 parties, each counted.
    for i in 1..=250u8 {
        for address in [Ipv4Addr::new(192, 0, 2, i), Ipv4Addr::new(198, 51, 100, i)] {
            syn_flood(&node.external, address, 40000..=40000, node_port).expect("a SYN");
        }
    }
    let counted = dump(&node, "SERVICE_COUNTS").len();
    assert!(
        counted >= 450,
        "each forged address is a party of its own: {counted}"
    );
    // Unanswered (nothing listens), they expire after the transitory timeout, and their
    // parties with them, within a few sweeps.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (peers, parties) = (
            dump(&node, "SERVICE_PEERS").len(),
            dump(&node, "SERVICE_COUNTS").len(),
        );
        if peers == 0 && parties == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {peers} sockets, {parties} parties"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
