//! Node port allocation by `uplink_egress`, run by the kernel through BPF_PROG_TEST_RUN
//! with narrow port ranges: new flows to one destination take consecutive node ports
//! from a cursor (jumping over a run of held ones, to anywhere in the range), flows
//! that share a pod port get distinct node ports, a new flow finding every port held by
//! live flows is dropped and counted, an expired flow's port is taken over without
//! harming any live flow (the expired flow's `NAT_OUT` entry is left for the daemon's
//! sweep).

use std::time::Duration;

use cni_ebpf_common::{DropReason, NatConfig, NatCounter, tcp_state};
use ebpf_cni_tests::{
    bpf_object::BpfObject,
    frames::{TC_ACT_OK, TC_ACT_SHOT, all_drops, no_drops},
    nat_frames::{
        MASQ, MASQ_2, NODE_ADDR, POD_PORT, PORT_MIN, REMOTE, REMOTE_PORT, SPORT, TCP, TCP_ACK,
        TCP_SYN, UDP, assert_checksums_valid, assert_delivered, coarse_ns_ago, egress, entry,
        in_key, inbound, ingress, nat_config, out_key, outbound, port, tcp, udp, uplink_with,
    },
    require_root,
};

/// Ports [`PORT_MIN`]..[`PORT_MIN`] + `count`.
fn ports(count: u16) -> BpfObject {
    ports_established_for(count, nat_config().tcp_established_secs)
}

/// Ports [`PORT_MIN`]..[`PORT_MIN`] + `count`, established TCP flows expiring after
/// `established_secs`.
fn ports_established_for(count: u16, established_secs: u32) -> BpfObject {
    uplink_with(NatConfig {
        port_max: PORT_MIN + count - 1,
        tcp_established_secs: established_secs,
        ..nat_config()
    })
}

/// The datapath's timestamp of `secs` seconds ago (waiting, on a machine up for less
/// than that, until there is such a time: see [`coarse_ns_ago`]).
fn seconds_ago(secs: u64) -> u64 {
    coarse_ns_ago(Duration::from_secs(secs))
}

/// The TCP established timeout of the tests that need an expired established flow:
/// short, so that a flow idle past it dates from after the boot of a guest that has
/// just started (CLOCK_MONOTONIC counts from boot; `cargo xtask vm-test` reaches these
/// tests within minutes, sooner than the default timeout plus a margin).
const SHORT_ESTABLISHED_SECS: u32 = 10;

fn syn(pod_ip: [u8; 4], pod_port: u16) -> Vec<u8> {
    outbound(pod_ip, REMOTE, TCP, &tcp(pod_port, REMOTE_PORT, TCP_SYN))
}

/// One port, held by [`MASQ_2`]'s established flow to [`REMOTE`], idle `idle_secs`.
fn one_port_held(idle_secs: u64) -> BpfObject {
    one_port_held_in(tcp_state::ESTABLISHED, idle_secs)
}

/// One port, held by [`MASQ_2`]'s flow to [`REMOTE`] in TCP `state`, idle `idle_secs`.
fn one_port_held_in(state: u8, idle_secs: u64) -> BpfObject {
    hold_the_port(ports(1), state, idle_secs)
}

/// `object` (one port) with that port held by [`MASQ_2`]'s flow to [`REMOTE`] in TCP
/// `state`, idle `idle_secs`.
fn hold_the_port(mut object: BpfObject, state: u8, idle_secs: u64) -> BpfObject {
    let key = out_key(MASQ_2.ip, POD_PORT, REMOTE_PORT, TCP);
    let held = entry(&key, PORT_MIN, state, seconds_ago(idle_secs));
    object.insert_nat_out(key, held);
    object.insert_nat_in(in_key(REMOTE, PORT_MIN, REMOTE_PORT, TCP), held);
    object
}

#[test]
fn a_new_flow_whose_only_port_is_held_by_a_live_flow_is_dropped_and_counted() {
    require_root();
    let object = one_port_held(0);
    let (holder_out, holder_in) = (object.nat_out_entries(), object.nat_in_entries());
    let syn = syn(MASQ.ip, POD_PORT + 7);
    let mut drops = no_drops();
    drops[DropReason::NatPortsExhausted as usize] = 1;
    let run = egress(&object, &syn);
    assert_eq!(
        run.verdict, TC_ACT_SHOT,
        "no port: the packet must not leave"
    );
    assert_eq!(run.frame, syn, "a dropped packet is not rewritten");
    assert_eq!(all_drops(&object), drops, "one drop, nat_ports_exhausted");
    assert_eq!(object.nat_counter(NatCounter::AllocationFailures), 1);
    assert_eq!(
        object.nat_refused(MASQ.ip).no_port,
        1,
        "counted for the pod that was refused, as no port"
    );
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 0);
    assert_eq!(object.nat_counter(NatCounter::TranslatedOut), 0);
    assert_eq!(
        object.nat_out_entries(),
        holder_out,
        "NAT_OUT: the holder alone"
    );
    assert_eq!(
        object.nat_in_entries(),
        holder_in,
        "NAT_IN: the holder alone"
    );
}

#[test]
fn a_port_the_pod_closed_first_serves_again_after_seconds_one_the_remote_closed_later() {
    require_root();
    let idle = u64::from(tcp_state::POD_CLOSED_SECS) + 1;
    let run = egress(
        &one_port_held_in(tcp_state::POD_CLOSED, idle),
        &syn(MASQ.ip, POD_PORT + 7),
    );
    assert_eq!(run.verdict, TC_ACT_OK, "the remote keeps no TIME_WAIT");
    assert_eq!(port(&run.frame, SPORT), PORT_MIN);
    // Closed by the remote first (it holds the TIME_WAIT): the closed timeout (10 s).
    let run = egress(
        &one_port_held_in(tcp_state::CLOSED, idle),
        &syn(MASQ.ip, POD_PORT + 7),
    );
    assert_eq!(run.verdict, TC_ACT_SHOT, "still held");
}

#[test]
fn a_new_flow_takes_over_the_port_of_an_expired_flow_which_never_gets_it_back() {
    require_root();
    let object = hold_the_port(
        ports_established_for(1, SHORT_ESTABLISHED_SECS),
        tcp_state::ESTABLISHED,
        u64::from(SHORT_ESTABLISHED_SECS) + 5,
    );
    let stale = out_key(MASQ_2.ip, POD_PORT, REMOTE_PORT, TCP);
    let stale_entry = object
        .nat_out(&stale)
        .expect("the expired flow's NAT_OUT entry");
    let run = egress(&object, &syn(MASQ.ip, POD_PORT + 7));
    assert_eq!(run.verdict, TC_ACT_OK, "the expired flow's port is free");
    let expected = outbound(NODE_ADDR, REMOTE, TCP, &tcp(PORT_MIN, REMOTE_PORT, TCP_SYN));
    assert_eq!(run.frame, expected, "translated to the only port");
    assert_checksums_valid(&run.frame, "the translated SYN");
    let new = object
        .nat_out(&out_key(MASQ.ip, POD_PORT + 7, REMOTE_PORT, TCP))
        .expect("NAT_OUT holds the new flow");
    assert_eq!(new.node_port, PORT_MIN);
    let reverse = object.nat_in(&in_key(REMOTE, PORT_MIN, REMOTE_PORT, TCP));
    assert_eq!(
        reverse,
        Some(new),
        "NAT_IN: the port belongs to the new flow"
    );
    // The expired flow's NAT_OUT entry is left for the daemon's sweep, untouched.
    assert_eq!(object.nat_out(&stale), Some(stale_entry));
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 1);
    assert_eq!(object.nat_counter(NatCounter::AllocationFailures), 0);
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");

    // The old flow's pod sends again on its 4-tuple: a new flow, and the only port is
    // the live new flow's, so it is dropped and counted, never sent from that port.
    let again = syn(MASQ_2.ip, POD_PORT);
    let run = egress(&object, &again);
    assert_eq!(run.verdict, TC_ACT_SHOT, "no free port for the old 4-tuple");
    assert_eq!(run.frame, again, "a dropped packet is not rewritten");
    assert_eq!(object.nat_counter(NatCounter::AllocationFailures), 1);
    assert_eq!(
        object.nat_in(&in_key(REMOTE, PORT_MIN, REMOTE_PORT, TCP)),
        Some(new),
        "NAT_IN: the port still belongs to the new flow"
    );
    // And the new flow's reply still reaches the new flow's pod.
    let reply = inbound(
        REMOTE,
        NODE_ADDR,
        TCP,
        &tcp(REMOTE_PORT, PORT_MIN, TCP_SYN | TCP_ACK),
    );
    let restored = inbound(
        REMOTE,
        MASQ.ip,
        TCP,
        &tcp(REMOTE_PORT, POD_PORT + 7, TCP_SYN | TCP_ACK),
    );
    assert_delivered(&ingress(&object, &reply), &restored, &MASQ, "the SYN-ACK");
}

#[test]
fn two_pods_with_the_same_source_port_to_the_same_remote_get_distinct_node_ports() {
    require_root();
    // Two ports for two flows: whichever the hash picks first, the second must probe.
    let object = ports(2);
    let mut node_ports = Vec::new();
    for pod in [&MASQ, &MASQ_2] {
        let run = egress(&object, &syn(pod.ip, POD_PORT));
        assert_eq!(run.verdict, TC_ACT_OK, "{:?} translated", pod.ip);
        assert_checksums_valid(&run.frame, "a translated SYN");
        node_ports.push((pod, port(&run.frame, SPORT)));
    }
    let mut sorted: Vec<u16> = node_ports.iter().map(|(_, node_port)| *node_port).collect();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [PORT_MIN, PORT_MIN + 1],
        "distinct ports from the range"
    );
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 2);
    // Each node port leads back to its own pod.
    let syn_ack = TCP_SYN | TCP_ACK;
    for (pod, node_port) in node_ports {
        let reply = inbound(
            REMOTE,
            NODE_ADDR,
            TCP,
            &tcp(REMOTE_PORT, node_port, syn_ack),
        );
        let restored = inbound(REMOTE, pod.ip, TCP, &tcp(REMOTE_PORT, POD_PORT, syn_ack));
        assert_delivered(&ingress(&object, &reply), &restored, pod, "the SYN-ACK");
    }
}

#[test]
fn new_flows_to_one_destination_take_consecutive_node_ports_not_their_own() {
    require_root();
    // A range around the pods' ports: keeping them would be possible, and is not done.
    let mut object = uplink_with(NatConfig {
        port_min: POD_PORT - 50,
        port_max: POD_PORT + 49,
        ..nat_config()
    });
    // Every cursor at the pod port's offset, so the first flow's port is known.
    object.set_nat_cursors(50);
    let node_ports: Vec<u16> = (0..4)
        .map(|flow| {
            let run = egress(&object, &syn(MASQ.ip, POD_PORT + 10 + flow));
            assert_eq!(run.verdict, TC_ACT_OK, "flow {flow}");
            port(&run.frame, SPORT)
        })
        .collect();
    assert_eq!(
        node_ports,
        [POD_PORT, POD_PORT + 1, POD_PORT + 2, POD_PORT + 3],
        "in sequence from the cursor, whichever CPU ran each"
    );
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 4);
}

#[test]
fn the_cursor_wraps_at_the_end_of_the_range_and_a_run_of_held_ports_is_jumped_over() {
    require_root();
    let mut object = ports(1000);
    // Ports PORT_MIN..PORT_MIN + 20 held by live flows of MASQ_2.
    for held in 0..20 {
        let key = out_key(MASQ_2.ip, POD_PORT + held, REMOTE_PORT, TCP);
        let entry = entry(
            &key,
            PORT_MIN + held,
            tcp_state::ESTABLISHED,
            seconds_ago(0),
        );
        object.insert_nat_out(key, entry);
        object.insert_nat_in(in_key(REMOTE, PORT_MIN + held, REMOTE_PORT, TCP), entry);
    }
    // The last port of the range is free; the search wraps to the held ones after it.
    object.set_nat_cursors(999);
    let last = egress(&object, &syn(MASQ.ip, POD_PORT));
    assert_eq!(
        port(&last.frame, SPORT),
        PORT_MIN + 999,
        "the range's last port"
    );
    assert_eq!(object.nat_counter(NatCounter::PortProbes), 0);
    // From the first port: eight held ports in a row, then a jump of the golden ratio's
    // fraction of the range.
    object.set_nat_cursors(0);
    let jumped = egress(&object, &syn(MASQ.ip, POD_PORT + 1));
    assert_eq!(
        port(&jumped.frame, SPORT),
        PORT_MIN + golden_jump(1000),
        "past the held run after eight probes"
    );
    assert_eq!(object.nat_counter(NatCounter::PortProbes), 8);
    assert_eq!(all_drops(&object), no_drops());
}

/// Where the search's second block of eight probes starts, from the first port of a
/// range of `size` ports: the golden ratio's fraction of the range, rounded down.
fn golden_jump(size: u32) -> u16 {
    (f64::from(size) * (5f64.sqrt() - 1.0) / 2.0) as u16
}

#[test]
fn a_free_tenth_of_the_range_is_found_wherever_the_cursor_stands() {
    require_root();
    // The default range's size, 31,744 ports; a jump of a fixed 7919 ports (a quarter
    // of it) sent the search's 16 blocks to four places a quarter apart.
    let size: u16 = 31_744;
    let port_min = POD_PORT + 1;
    let mut object = uplink_with(NatConfig {
        port_min,
        port_max: port_min + (size - 1),
        ..nat_config()
    });
    // Every port held by a live flow of MASQ_2 but a stretch of a tenth of the range.
    let free = 10_000..10_000 + size / 10;
    for offset in (0..size).filter(|offset| !free.contains(offset)) {
        let key = out_key(MASQ_2.ip, offset, REMOTE_PORT, TCP);
        let held = entry(
            &key,
            port_min + offset,
            tcp_state::ESTABLISHED,
            seconds_ago(0),
        );
        object.insert_nat_in(in_key(REMOTE, port_min + offset, REMOTE_PORT, TCP), held);
    }
    for (flow, start) in (0..16u16).map(|flow| (flow, u32::from(flow) * 1987 + 123)) {
        object.set_nat_cursors(start);
        let run = egress(&object, &syn(MASQ.ip, POD_PORT + flow));
        assert_eq!(run.verdict, TC_ACT_OK, "flow {flow}, cursor at {start}");
        let node_port = port(&run.frame, SPORT);
        assert!(
            free.contains(&(node_port - port_min)),
            "flow {flow}, cursor at {start}: port {node_port} is outside the free stretch"
        );
    }
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 16);
    assert_eq!(object.nat_counter(NatCounter::AllocationFailures), 0);
    assert_eq!(all_drops(&object), no_drops());
}

#[test]
fn a_flow_back_after_its_entry_expired_gets_a_fresh_entry_in_both_tables() {
    require_root();
    let mut object = ports_established_for(100, SHORT_ESTABLISHED_SECS);
    let flow = out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP);
    let long_ago = seconds_ago(u64::from(SHORT_ESTABLISHED_SECS) + 5);
    // Its old entries: on another port than the one it prefers now.
    let old_port = PORT_MIN + 50;
    let old = entry(&flow, old_port, tcp_state::ESTABLISHED, long_ago);
    object.insert_nat_out(flow, old);
    object.insert_nat_in(in_key(REMOTE, old_port, REMOTE_PORT, TCP), old);
    let run = egress(&object, &syn(MASQ.ip, POD_PORT));
    assert_eq!(run.verdict, TC_ACT_OK);
    let node_port = port(&run.frame, SPORT);
    let out = object.nat_out(&flow).expect("NAT_OUT holds the flow");
    assert_eq!(
        (out.node_port, out.state),
        (node_port, tcp_state::SYN_SENT),
        "the expired entry was replaced"
    );
    assert!(out.last_seen_ns > long_ago, "and its time is now");
    let back = object.nat_in(&in_key(REMOTE, node_port, REMOTE_PORT, TCP));
    assert_eq!(back, Some(out), "NAT_IN: the same entry");
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 1);
}

/// A flow that re-allocated after expiring may move to another port and leave its old
/// `NAT_IN` entry behind (until the daemon's sweep): a flow taking that old port over
/// must leave the live flow's `NAT_OUT` entry alone (a takeover removes no `NAT_OUT`
/// entry: expired ones are the sweep's, see `claim` in snat.rs).
#[test]
fn taking_over_a_port_never_removes_a_live_flow_that_moved_to_another_port() {
    require_root();
    let udp_to = |pod_ip| outbound(pod_ip, REMOTE, UDP, &udp(POD_PORT, 53, b"query"));
    // MASQ's flow lives on `usual` and left its old port `other` behind, expired.
    let (usual, other) = (PORT_MIN, PORT_MIN + 1);
    let mut object = ports(2);
    let flow = out_key(MASQ.ip, POD_PORT, 53, UDP);
    let live = entry(&flow, usual, 0, seconds_ago(0));
    object.insert_nat_out(flow, live);
    object.insert_nat_in(in_key(REMOTE, usual, 53, UDP), live);
    let long_ago = seconds_ago(u64::from(nat_config().udp_secs) + 5);
    object.insert_nat_in(
        in_key(REMOTE, other, 53, UDP),
        entry(&flow, other, 0, long_ago),
    );
    // MASQ_2's new flow to the same remote takes the expired `other` over.
    let run = egress(&object, &udp_to(MASQ_2.ip));
    assert_eq!((run.verdict, port(&run.frame, SPORT)), (TC_ACT_OK, other));

    let live = object.nat_out(&flow).map(|out| out.node_port);
    assert_eq!(live, Some(usual), "MASQ's live NAT_OUT entry must survive");
    let again = egress(&object, &udp_to(MASQ.ip));
    assert_eq!(
        (again.verdict, port(&again.frame, SPORT)),
        (TC_ACT_OK, usual),
        "MASQ's flow keeps its node port; drops: {:?}",
        all_drops(&object)
    );
}
