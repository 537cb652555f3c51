//! Source NAT's flows over time: entries expire and their ports are reused, the notes of
//! connections opened from outside follow TCP, the sweep removes thousands of expired
//! flows and keeps the live one, and a deleted pod's flows go at once.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    thread,
    time::{Duration, Instant},
};

use cni_ebpf_common::{NatKey, NatReverseKey, map_names, tcp_state};
use ebpf_cni_tests::{
    daemon::eventually,
    nat_frames::{UDP, entry, monotonic_ns, out_key},
    node::{NODE_ADDR, Node},
    require_root,
    snat::{TCP_PORT, UDP_PORT, external, nat_table, notes},
    traffic::{EchoServer, UdpEcho, many_connections, round_trip, udp_round_trip},
};

#[test]
fn entries_expire_and_an_exhausted_range_drops_until_a_port_is_free_again() {
    require_root();
    // One node port, a 5 s timeout for UDP that is not a stream (no reply, or a query
    // and its answer) and 12 s for a stream, swept every second.
    let node = Node::start_with(
        "10.244.55.0/24",
        &[],
        &[
            "--nat-port-range",
            "61000-61000",
            "--nat-udp-timeout",
            "5",
            "--nat-udp-stream-timeout",
            "12",
            "--nat-gc-interval",
            "1",
        ],
    );
    let (a, b) = (node.add_pod("exp-a"), node.add_pod("exp-b"));
    let udp = UdpEcho::start(&node.external, UDP_PORT);

    let began = Instant::now();
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
    let per_pod = |pod: &ebpf_cni_tests::node::Pod| {
        let listed = table["endpoints"].as_array().expect("endpoints");
        let found = listed
            .iter()
            .find(|row| row["pod"] == pod.ip.to_string())
            .unwrap_or_else(|| panic!("{} not listed: {table}", pod.ip));
        (found["flows"].as_u64(), found["refused"].as_u64())
    };
    assert_eq!(per_pod(&a), (Some(1), Some(0)), "a holds the port");
    assert!(
        per_pod(&b).0 == Some(0) && per_pod(&b).1.is_some_and(|n| n >= 1),
        "b is refused, and counted as such: {table}"
    );
    assert_eq!(
        entries[0]["state"], "replied",
        "a's flow had a reply: {table}"
    );

    // Asked again more than two seconds after it began: a stream, as conntrack's
    // assured UDP flows.
    if let Some(wait) =
        (began + Duration::from_millis(2_500)).checked_duration_since(Instant::now())
    {
        thread::sleep(wait);
    }
    udp_round_trip(&a.netns, 5000, external(UDP_PORT), b"again").expect("a's flow goes on");
    assert_eq!(nat_table(&node)["entries"][0]["state"], "stream");
    // Past the short timeout, a's flow (a stream) keeps its port.
    thread::sleep(Duration::from_secs(6));
    assert_eq!(
        nat_table(&node)["entries"].as_array().map(Vec::len),
        Some(1),
        "a stream outlives the short timeout"
    );
    assert!(
        eventually(Duration::from_secs(15), || nat_table(&node)["entries"]
            .as_array()
            .is_some_and(Vec::is_empty)),
        "the idle entry expired and was swept"
    );
    udp_round_trip(&b.netns, 5001, external(UDP_PORT), b"third").expect("the port is reused");
    // A query and its answer, no more: gone after the short timeout, well before a
    // stream's.
    assert_eq!(nat_table(&node)["entries"][0]["state"], "replied");
    let answered = Instant::now();
    assert!(
        eventually(Duration::from_secs(15), || nat_table(&node)["entries"]
            .as_array()
            .is_some_and(Vec::is_empty)),
        "b's flow expired and was swept"
    );
    assert!(
        answered.elapsed() < Duration::from_secs(9),
        "within the short timeout and a sweep: {:?}",
        answered.elapsed()
    );
    let ports: BTreeSet<u16> = udp.peers().iter().map(SocketAddr::port).collect();
    assert_eq!(
        ports,
        BTreeSet::from([61000]),
        "both flows used the one port, in turn"
    );
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
