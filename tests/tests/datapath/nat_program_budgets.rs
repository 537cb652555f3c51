//! Each pod's share of the flow tables, in `uplink_egress` run by the kernel through
//! BPF_PROG_TEST_RUN: a full table refuses new flows (counted as `table_full`) and
//! keeps the established ones, where an LRU table evicted them; a pod past its budget
//! of flows, or of node ports toward one destination, is refused (counted for that pod
//! by reason) while other pods and destinations are not; a pod at its port budget goes
//! on with the ports of its own expired flows, and with those of its own closing flows
//! (closed by the pod first) past a quarter second when no other port is found, never
//! another pod's. Budgets and counts:
//! `cni_ebpf_common::budget`.

use std::time::Duration;

use cni_ebpf_common::{DropReason, NatConfig, NatCounter, NatEntry, NatKey, tcp_state};
use ebpf_cni_tests::{
    bpf_object::BpfObject,
    frames::{TC_ACT_OK, TC_ACT_SHOT},
    nat_frames::{
        MASQ, MASQ_2, NODE_ADDR, POD_PORT, REMOTE, REMOTE_PORT, TCP, TCP_ACK, TCP_SYN, UDP,
        coarse_ns_ago, egress, inbound, ingress, nat_config, out_key, outbound, port, tcp, udp,
        uplink_sized,
    },
    require_root,
};
use nix::{
    sched::{CpuSet, sched_setaffinity},
    unistd::Pid,
};

/// A UDP datagram of `pod` from `pod_port` to [`REMOTE`]`:remote_port`.
fn datagram(pod: [u8; 4], pod_port: u16, remote_port: u16) -> Vec<u8> {
    outbound(pod, REMOTE, UDP, &udp(pod_port, remote_port, b"x"))
}

/// Sends a datagram for each of `pod_ports` and returns the verdicts.
fn open_udp(
    object: &BpfObject,
    pod: [u8; 4],
    pod_ports: impl Iterator<Item = u16>,
    remote_port: u16,
) -> Vec<u32> {
    pod_ports
        .map(|pod_port| egress(object, &datagram(pod, pod_port, remote_port)).verdict)
        .collect()
}

/// [`MASQ_2`]'s TCP connection to [`REMOTE`], opened and answered: its node port.
fn established(object: &BpfObject) -> u16 {
    let syn = outbound(MASQ_2.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_SYN));
    let run = egress(object, &syn);
    assert_eq!(run.verdict, TC_ACT_OK, "the SYN leaves");
    let node_port = port(&run.frame, 34);
    let syn_ack = inbound(
        REMOTE,
        NODE_ADDR,
        TCP,
        &tcp(REMOTE_PORT, node_port, TCP_SYN | TCP_ACK),
    );
    let run = ingress(object, &syn_ack);
    assert_ne!(run.verdict, TC_ACT_SHOT, "the SYN-ACK is delivered");
    let key = out_key(MASQ_2.ip, POD_PORT, REMOTE_PORT, TCP);
    let entry = object.nat_out(&key).expect("the connection is in NAT_OUT");
    assert_eq!(entry.state, tcp_state::ESTABLISHED);
    node_port
}

#[test]
fn a_full_table_refuses_new_flows_and_keeps_the_established_one() {
    require_root();
    let object = uplink_sized(nat_config(), Some(64));
    let node_port = established(&object);
    // Another pod opens 200 one-packet UDP flows into a table of 64.
    let verdicts = open_udp(&object, MASQ.ip, 1000..1200, 53);
    let passed = verdicts.iter().filter(|&&v| v == TC_ACT_OK).count();
    assert_eq!(
        passed, 63,
        "the table holds 64 flows, one of them the connection"
    );
    assert!(
        verdicts[passed..].iter().all(|&v| v == TC_ACT_SHOT),
        "every flow past the brim is refused: {verdicts:?}"
    );
    let refused = object.nat_refused(MASQ.ip);
    assert_eq!(
        refused.table_full, 137,
        "counted for the pod, as table_full"
    );
    assert_eq!(object.drops(DropReason::NatTableFull), 137);
    assert_eq!(object.nat_counter(NatCounter::TableFull), 137);
    assert_eq!(
        object.flow_counts(MASQ.ip).out,
        63,
        "its budget counts its 63"
    );
    assert_eq!(
        object.nat_in_entries().len(),
        object.nat_out_entries().len(),
        "no half of a refused flow stays in NAT_IN"
    );
    // The established connection was not evicted: its next segment leaves from its port.
    let ack = outbound(MASQ_2.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_ACK));
    let run = egress(&object, &ack);
    assert_eq!(run.verdict, TC_ACT_OK);
    assert_eq!(
        port(&run.frame, 34),
        node_port,
        "the same node port as before"
    );
}

#[test]
fn a_pod_past_its_flow_budget_is_refused_and_another_pod_is_not() {
    require_root();
    let object = uplink_sized(
        NatConfig {
            pod_flow_budget: 10,
            ..nat_config()
        },
        None,
    );
    let verdicts = open_udp(&object, MASQ.ip, 1000..1012, 53);
    assert_eq!(
        verdicts[..10],
        [TC_ACT_OK; 10],
        "ten flows within the budget"
    );
    assert_eq!(
        verdicts[10..],
        [TC_ACT_SHOT; 2],
        "the eleventh and twelfth refused"
    );
    assert_eq!(object.nat_refused(MASQ.ip).flow_budget, 2);
    assert_eq!(object.drops(DropReason::NatFlowBudget), 2);
    assert_eq!(object.flow_counts(MASQ.ip).out, 10);
    // A flow already open goes on; another pod opens new ones.
    assert_eq!(
        open_udp(&object, MASQ.ip, 1000..1001, 53),
        [TC_ACT_OK],
        "an open flow is no new flow"
    );
    assert_eq!(
        open_udp(&object, MASQ_2.ip, 1000..1005, 53),
        [TC_ACT_OK; 5],
        "the other pod's budget is its own"
    );
    assert_eq!(object.nat_refused(MASQ_2.ip).total(), 0);
}

#[test]
fn a_pod_past_its_port_budget_toward_a_destination_is_refused_there_only() {
    require_root();
    let object = uplink_sized(
        NatConfig {
            dest_port_budget: 5,
            ..nat_config()
        },
        None,
    );
    let dns = out_key(MASQ.ip, 0, 53, UDP);
    let verdicts = open_udp(&object, MASQ.ip, 1000..1007, 53);
    assert_eq!(verdicts[..5], [TC_ACT_OK; 5]);
    assert_eq!(verdicts[5..], [TC_ACT_SHOT; 2]);
    assert_eq!(object.nat_refused(MASQ.ip).port_budget, 2);
    assert_eq!(object.drops(DropReason::NatPortBudget), 2);
    assert_eq!(object.dest_ports(&dns), 5, "five node ports held toward it");
    assert_eq!(
        open_udp(&object, MASQ.ip, 2000..2003, 123),
        [TC_ACT_OK; 3],
        "another destination has its own budget"
    );
    assert_eq!(
        open_udp(&object, MASQ_2.ip, 1000..1003, 53),
        [TC_ACT_OK; 3],
        "another pod reaches the same destination"
    );
}

#[test]
fn a_pod_at_its_port_budget_goes_on_with_its_own_expired_ports() {
    require_root();
    let mut object = uplink_sized(
        NatConfig {
            dest_port_budget: 5,
            ..nat_config()
        },
        None,
    );
    assert_eq!(open_udp(&object, MASQ.ip, 1000..1005, 53), [TC_ACT_OK; 5]);
    // Their node ports expire (idle past the UDP timeout, 30 s).
    let long_ago = coarse_ns_ago(Duration::from_secs(60));
    rewrite_all(&mut object, |entry| entry.last_seen_ns = long_ago);
    let probes = object.nat_counter(NatCounter::PortProbes);
    let verdicts = open_udp(&object, MASQ.ip, 3000..3005, 53);
    assert_eq!(
        verdicts, [TC_ACT_OK; 5],
        "new flows take the expired ports over"
    );
    assert_eq!(
        object.nat_counter(NatCounter::PortProbes),
        probes,
        "each takes the pod's oldest port at its first probe: the cursor moved on, not \
         back to the port taken"
    );
    let dns: NatKey = out_key(MASQ.ip, 0, 53, UDP);
    assert_eq!(object.dest_ports(&dns), 5, "still five ports held");
    assert_eq!(object.nat_refused(MASQ.ip).total(), 0);
}

/// Opens a TCP flow of `pod` from `pod_port` to [`REMOTE`] with a SYN: its verdict and,
/// if it left, its node port.
fn syn(object: &BpfObject, pod: [u8; 4], pod_port: u16) -> (u32, u16) {
    let run = egress(
        object,
        &outbound(pod, REMOTE, TCP, &tcp(pod_port, REMOTE_PORT, TCP_SYN)),
    );
    (run.verdict, port(&run.frame, 34))
}

/// Rewrites every entry of `NAT_IN` and `NAT_OUT` with `change`.
fn rewrite_all(object: &mut BpfObject, change: impl Fn(&mut NatEntry)) {
    for (key, mut entry) in object.nat_in_entries() {
        change(&mut entry);
        object.insert_nat_in(key, entry);
    }
    for (key, mut entry) in object.nat_out_entries() {
        change(&mut entry);
        object.insert_nat_out(key, entry);
    }
}

/// Makes every flow in both tables a closing flow the pod's TIME_WAIT holds
/// (`POD_CLOSED`), last seen `idle_ms` ago.
fn close_all(object: &mut BpfObject, idle_ms: u64) {
    let when = coarse_ns_ago(Duration::from_millis(idle_ms));
    rewrite_all(object, |entry| {
        (entry.state, entry.last_seen_ns) = (tcp_state::POD_CLOSED, when);
    });
}

#[test]
fn a_pod_at_its_port_budget_takes_its_own_closing_ports_once_past_the_reclaim_hold() {
    require_root();
    let mut object = uplink_sized(
        NatConfig {
            dest_port_budget: 5,
            ..nat_config()
        },
        None,
    );
    let opened: Vec<(u32, u16)> = (1000..1005).map(|p| syn(&object, MASQ.ip, p)).collect();
    assert!(opened.iter().all(|(verdict, _)| *verdict == TC_ACT_OK));

    close_all(&mut object, 100);
    assert_eq!(
        syn(&object, MASQ.ip, 2000).0,
        TC_ACT_SHOT,
        "closed 100 ms ago: within the reclaim hold, still the pod's"
    );
    assert_eq!(object.nat_refused(MASQ.ip).port_budget, 1);

    close_all(&mut object, 500);
    let (verdict, taken) = syn(&object, MASQ.ip, 2001);
    assert_eq!(
        verdict, TC_ACT_OK,
        "closed 500 ms ago: the pod's closing port is taken"
    );
    assert!(
        opened.iter().any(|(_, node_port)| *node_port == taken),
        "{taken} is one of the closing flows' ports {opened:?}"
    );
    assert_eq!(object.nat_counter(NatCounter::ClosingReclaimed), 1);
    let dns = out_key(MASQ.ip, 0, REMOTE_PORT, TCP);
    assert_eq!(object.dest_ports(&dns), 5, "still five ports held");

    // The closing flow that lost its port: the pod reusing its 4-tuple opens a new
    // flow on another port, never the one the new flow holds.
    let (old_pod_port, _) = (1000..1005)
        .zip(&opened)
        .map(|(pod_port, (_, node_port))| (pod_port, *node_port))
        .find(|(_, node_port)| *node_port == taken)
        .expect("the flow that held it");
    let (verdict, again) = syn(&object, MASQ.ip, old_pod_port);
    assert_eq!(verdict, TC_ACT_OK);
    assert_ne!(again, taken, "the reclaimed port stays with the new flow");
    let holder = object
        .nat_out(&out_key(MASQ.ip, 2001, REMOTE_PORT, TCP))
        .expect("the new flow");
    assert_eq!(holder.node_port, taken);
    assert_eq!(holder.state, tcp_state::SYN_SENT);
}

/// Pins the calling thread to `cpu`: `BPF_PROG_TEST_RUN` runs the program there.
fn run_on_cpu(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).expect("a CPU number within the set");
    sched_setaffinity(Pid::from_raw(0), &set)
        .unwrap_or_else(|error| panic!("cannot pin the test to CPU {cpu}: {error}"));
}

#[test]
fn a_pod_at_its_port_budget_finds_its_closing_ports_from_another_cpu() {
    require_root();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(
        cpus >= 2,
        "this test needs two CPUs to run the program on (has {cpus})"
    );
    let mut object = uplink_sized(
        NatConfig {
            dest_port_budget: 5,
            ..nat_config()
        },
        None,
    );
    // The pod's flows leave from CPU 0, its next connection from CPU 1 (its sender
    // moved): the ports it can take back are found all the same, oldest first.
    run_on_cpu(0);
    let opened: Vec<(u32, u16)> = (1000..1005).map(|p| syn(&object, MASQ.ip, p)).collect();
    assert!(opened.iter().all(|(verdict, _)| *verdict == TC_ACT_OK));
    close_all(&mut object, 500);
    run_on_cpu(1);
    for (round, pod_port) in (2000..2005).enumerate() {
        let (verdict, taken) = syn(&object, MASQ.ip, pod_port);
        assert_eq!(
            verdict, TC_ACT_OK,
            "connection {round} from CPU 1 is refused"
        );
        assert_eq!(
            taken, opened[round].1,
            "connection {round} takes the oldest closing port left {opened:?}"
        );
    }
    assert_eq!(object.nat_counter(NatCounter::ClosingReclaimed), 5);
    assert_eq!(object.nat_refused(MASQ.ip).port_budget, 0);
}

#[test]
fn free_ports_go_before_closing_ones_and_another_pods_closing_ports_are_not_taken() {
    require_root();
    let mut object = uplink_sized(nat_config(), None);
    object.set_nat_cursors(0);
    let opened: Vec<(u32, u16)> = (1000..1003).map(|p| syn(&object, MASQ.ip, p)).collect();
    assert!(opened.iter().all(|(verdict, _)| *verdict == TC_ACT_OK));
    close_all(&mut object, 500);
    // The search starts at the first closing port again: the free one after them goes.
    object.set_nat_cursors(0);
    let (verdict, taken) = syn(&object, MASQ.ip, 2000);
    assert_eq!(verdict, TC_ACT_OK);
    assert!(
        opened.iter().all(|(_, node_port)| *node_port != taken),
        "a free port, {taken}, not a closing one {opened:?}"
    );
    assert_eq!(object.nat_counter(NatCounter::ClosingReclaimed), 0);

    // Every port of a three-port range held by the first pod's closing flows.
    let mut object = uplink_sized(
        NatConfig {
            port_max: nat_config().port_min + 2,
            ..nat_config()
        },
        None,
    );
    assert!((1000..1003).all(|p| syn(&object, MASQ.ip, p).0 == TC_ACT_OK));
    close_all(&mut object, 500);
    assert_eq!(
        syn(&object, MASQ_2.ip, 2000).0,
        TC_ACT_SHOT,
        "another pod's closing flows keep their ports the whole hold"
    );
    assert_eq!(object.nat_refused(MASQ_2.ip).no_port, 1);
    assert_eq!(
        syn(&object, MASQ.ip, 2000).0,
        TC_ACT_OK,
        "the pod itself takes one over"
    );
}
