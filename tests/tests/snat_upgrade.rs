//! Source NAT's tables across releases and sizes: an earlier release's pinned notes,
//! config and port cursors are carried into (or replaced by) this release's tables, and a new table size creates them anew
//! while flows keep going.

use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use aya::maps::MapType;
use cni_ebpf_common::{NatEntry, NatKey, NatReverseKey, map_names, tcp_state};
use ebpf_cni_tests::{
    daemon::{Daemon, eventually},
    nat_frames::{UDP, monotonic_ns, out_key},
    node::{NODE_ADDR, Node},
    require_root,
    snat::{TCP_PORT, UDP_PORT, external, nat_table, node_ips, notes},
    traffic::{EchoServer, Stream, UdpEcho, udp_round_trip},
};

/// A flow as releases before the sequence numbers kept it (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct EarlierNatEntry {
    last_seen_ns: u64,
    pod_addr: [u8; 4],
    pod_port: u16,
    node_port: u16,
    state: u8,
    pad: [u8; 3],
    node_addr: [u8; 4],
}

// SAFETY: #[repr(C)], fixed-width fields, explicit padding.
unsafe impl aya::Pod for EarlierNatEntry {}

fn earlier(entry: &NatEntry) -> EarlierNatEntry {
    EarlierNatEntry {
        last_seen_ns: entry.last_seen_ns,
        pod_addr: entry.pod_addr,
        pod_port: entry.pod_port,
        node_port: entry.node_port,
        state: entry.state,
        pad: [0; 3],
        node_addr: entry.node_addr,
    }
}

#[test]
fn a_tcp_stream_keeps_its_node_port_when_the_nat_tables_come_from_the_layout_before_sequence_numbers()
 {
    require_root();
    let mut node = Node::start("10.244.83.0/24");
    let pod = node.add_pod("old-layout");
    let server = EchoServer::start(&node.external, TCP_PORT);
    let stream = Stream::start(&pod.netns, external(TCP_PORT));
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed() > 0),
        "the stream starts"
    );
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    // The same flow, as the release before kept it (the programs still attached go on
    // with the tables they have).
    let table = |name| {
        node.flow_table::<NatKey>(name)
            .iter()
            .map(|flow| flow.expect("a readable flow"))
            .map(|(key, entry)| (key, earlier(&entry)))
            .collect::<Vec<_>>()
    };
    let out = table(map_names::NAT_OUT);
    let replies: Vec<(NatReverseKey, EarlierNatEntry)> = node
        .flow_table::<NatReverseKey>(map_names::NAT_IN)
        .iter()
        .map(|flow| flow.expect("a readable flow"))
        .map(|(key, entry)| (key, earlier(&entry)))
        .collect();
    assert_eq!((out.len(), replies.len()), (1, 1), "test bug: one flow");
    node.pin_earlier_table(map_names::NAT_OUT, 262_144, &out);
    node.pin_earlier_table(map_names::NAT_IN, 262_144, &replies);

    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    for name in [map_names::NAT_OUT, map_names::NAT_IN] {
        assert_eq!(
            node.pinned_layout(name),
            (size_of::<NatEntry>(), 262_144),
            "{name} created anew at this release's layout"
        );
    }
    let carried = node.flow_table::<NatKey>(map_names::NAT_OUT);
    let (key, entry) = carried
        .iter()
        .next()
        .expect("the flow was carried")
        .expect("a readable flow");
    assert_eq!(
        (key, entry.node_port, entry.state),
        (out[0].0, out[0].1.node_port, tcp_state::ESTABLISHED),
        "carried with its node port and state"
    );
    let after = stream.echoed();
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed() > after),
        "the stream flows on"
    );
    stream.finish().expect("the stream never failed");
    assert_eq!(
        server.peers().len(),
        1,
        "one connection: {:?}",
        server.peers()
    );
    assert!(
        node.instance
            .log()
            .lines()
            .any(|line| line.contains("its flows are carried over") && line.contains("NAT_OUT")),
        "said in the log"
    );
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
                cni_ebpf_common::udp_state::STREAM,
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
fn a_nat_config_and_cursors_pinned_by_an_earlier_release_are_replaced_and_flows_keep_going() {
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

    // An earlier release's NAT_CONFIG: 32 bytes, before `udp_stream_secs`; and its
    // port cursors, one per CPU.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.pin_earlier_map(&pin, "array", 4, 32, 1);
    assert_eq!(value_size(&pin), 32, "test bug: the old size");
    let cursors = node.instance.bpf_dir.join(map_names::NAT_CURSORS);
    let kind = |pin: &std::path::Path| {
        aya::maps::MapInfo::from_pin(pin)
            .expect("a pinned NAT_CURSORS")
            .map_type()
            .expect("a known map type")
    };
    node.pin_earlier_map(&cursors, "percpu_array", 4, 4, 1024);
    assert_eq!(
        kind(&cursors),
        MapType::PerCpuArray,
        "test bug: the old kind"
    );

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
    assert_eq!(kind(&cursors), MapType::Array, "cursors shared by the CPUs");
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
fn cluster_ranges_pinned_by_an_earlier_release_are_carried_into_the_larger_table() {
    require_root();
    let mut node = Node::start("10.244.80.0/24");
    let pod = node.add_pod("old-ranges");
    let _udp = UdpEcho::start(&node.external, UDP_PORT);
    let pin = node.instance.bpf_dir.join(map_names::CLUSTER_CIDRS);
    let entries = |pin: &std::path::Path| {
        aya::maps::MapInfo::from_pin(pin)
            .expect("a pinned CLUSTER_CIDRS")
            .max_entries()
    };
    assert_eq!(entries(&pin), cni_ebpf_common::MAX_REMOTE_RANGES);

    // An earlier release's CLUSTER_CIDRS held 256 ranges.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.pin_earlier_trie(&pin, 256, &[(24, [10, 244, 80, 0]), (16, [10, 77, 0, 0])]);
    assert_eq!(entries(&pin), 256, "test bug: the old size");
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(
        entries(&pin),
        cni_ebpf_common::MAX_REMOTE_RANGES,
        "created anew at this release's size"
    );
    let log = node.instance.log();
    assert!(
        log.contains("CLUSTER_CIDRS pinned by an earlier release") && log.contains("ranges=2"),
        "carried, said in the log: {log}"
    );
    udp_round_trip(&pod.netns, 0, external(UDP_PORT), b"after").expect("UDP through NAT");
}

#[test]
fn service_tables_pinned_as_lru_hashes_are_carried_into_plain_hashes() {
    require_root();
    let mut node = Node::start("10.244.83.0/24");
    let pin = node.instance.bpf_dir.join(map_names::SERVICE_CLIENTS);
    let socket = cni_ebpf_common::ServiceClient {
        addr: [10, 244, 83, 5],
        port: 40000,
        proto: 6,
        pad: 0,
    };
    let mut key = socket.addr.to_vec();
    key.extend(socket.port.to_ne_bytes());
    key.extend([socket.proto, 0]);
    // An earlier release kept the sockets in an LRU hash of one byte a value.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.pin_earlier_lru(&pin, 8, 65_536, &[(&key, 1)]);
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    let info = aya::maps::MapInfo::from_pin(&pin).expect("a pinned SERVICE_CLIENTS");
    assert!(
        matches!(info.map_type(), Ok(MapType::Hash)),
        "created anew as a plain hash: {:?}",
        info.map_type()
    );
    let map = aya::maps::MapData::from_pin(&pin).expect("the new table");
    let table: aya::maps::HashMap<_, cni_ebpf_common::ServiceClient, NatEntry> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(map)).expect("sockets");
    let entry = table.get(&socket, 0).expect("the socket carried over");
    assert_eq!(
        (entry.pod_addr, entry.pod_port, entry.state),
        (socket.addr, socket.port, tcp_state::ESTABLISHED),
        "an answered entry of its socket"
    );
}
