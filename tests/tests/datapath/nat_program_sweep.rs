//! The NAT sweep's removals, done by the `nat_sweep` program, run by the kernel through
//! BPF_PROG_TEST_RUN as the daemon runs it: an item removes a flow's `NAT_OUT` entry and
//! its `NAT_IN` pair, or a `NAT_IN` orphan, unless the entry was stamped after the
//! sweep's decision (so too a note of a flow opened from outside, in `NAT_INBOUND`, and
//! a connection through a hostPort mapping, in `HOSTPORT_FLOWS`); the return value
//! counts flows, orphans, notes and hostPort connections, 8 bits each; a run takes at most 64 items. The frames are built here field by field, after the layout `SweepItem`
//! promises, not with the daemon's code.

use cni_ebpf_common::{
    NatEntry, NatKey, NatReverseKey, SweepItem, program_names, sweep, tcp_state,
};
use ebpf_cni_tests::{
    bpf_object::BpfObject,
    nat_frames::{MASQ, MASQ_2, REMOTE, REMOTE_PORT, TCP, UDP, entry, in_key, out_key},
    require_root,
};

/// The decision's stamp: any CLOCK_MONOTONIC-like value will do, the program compares.
const DECIDED: u64 = 1_000_000_000_000;

fn object() -> BpfObject {
    BpfObject::load("sweep", &[program_names::NAT_SWEEP])
}

struct Item {
    out: NatKey,
    inbound: NatReverseKey,
    kind: u8,
    decided_ns: u64,
}

/// The program's frame: 16 bytes of header, then 40 bytes an item.
fn frame(items: &[Item]) -> Vec<u8> {
    let mut frame = vec![0u8; sweep::HEADER];
    for item in items {
        let start = frame.len();
        frame.extend_from_slice(&item.out.pod_addr);
        frame.extend_from_slice(&item.out.remote_addr);
        frame.extend_from_slice(&item.out.pod_port.to_ne_bytes());
        frame.extend_from_slice(&item.out.remote_port.to_ne_bytes());
        frame.extend_from_slice(&[item.out.proto, 0, 0, 0]);
        frame.extend_from_slice(&item.inbound.remote_addr);
        frame.extend_from_slice(&item.inbound.node_port.to_ne_bytes());
        frame.extend_from_slice(&item.inbound.remote_port.to_ne_bytes());
        frame.extend_from_slice(&[item.inbound.proto, 0, 0, 0]);
        frame.extend_from_slice(&[item.kind, 0, 0, 0]);
        frame.extend_from_slice(&item.decided_ns.to_ne_bytes());
        assert_eq!(frame.len() - start, size_of::<SweepItem>());
    }
    frame
}

/// Runs `nat_sweep` on `items`: (flows removed, orphans removed), no note and no
/// hostPort connection removed.
fn sweep_run(object: &BpfObject, items: &[Item]) -> (u32, u32) {
    let (flows, orphans, notes, hostport) = counts(object, items);
    assert_eq!(notes, 0, "no note of a flow opened from outside");
    assert_eq!(hostport, 0, "no hostPort connection");
    (flows, orphans)
}

/// Runs `nat_sweep` on `items`: flows, orphans, notes and hostPort connections removed
/// (8 bits each, from the lowest).
fn counts(object: &BpfObject, items: &[Item]) -> (u32, u32, u32, u32) {
    let run = object.run(program_names::NAT_SWEEP, &frame(items));
    let field = |shift: u32| (run.verdict >> shift) & 0xff;
    (field(0), field(8), field(16), field(24))
}

/// A UDP flow of `pod` from `pod_port`, on node port `node_port`, stamped `last_seen`,
/// in both tables; its keys.
fn flow(
    object: &mut BpfObject,
    pod: [u8; 4],
    pod_port: u16,
    node_port: u16,
    last_seen: u64,
) -> (NatKey, NatReverseKey, NatEntry) {
    let key = out_key(pod, pod_port, REMOTE_PORT, UDP);
    let reverse = in_key(REMOTE, node_port, REMOTE_PORT, UDP);
    let entry = entry(&key, node_port, 0, last_seen);
    object.insert_nat_out(key, entry);
    object.insert_nat_in(reverse, entry);
    (key, reverse, entry)
}

fn pair(out: NatKey, inbound: NatReverseKey) -> Item {
    Item {
        out,
        inbound,
        kind: sweep::FLOW | sweep::PAIR,
        decided_ns: DECIDED,
    }
}

#[test]
fn an_idle_flow_goes_with_its_pair_and_a_flow_already_gone_counts_as_gone() {
    require_root();
    let mut object = object();
    let (key, reverse, _) = flow(&mut object, MASQ.ip, 1000, 40000, DECIDED);
    let (kept_key, kept_reverse, kept) = flow(&mut object, MASQ_2.ip, 1001, 40001, DECIDED);
    // Evicted meanwhile: nothing to remove, and the flow is gone all the same.
    let evicted = out_key(MASQ.ip, 1002, REMOTE_PORT, UDP);
    let items = [
        pair(key, reverse),
        pair(evicted, in_key(REMOTE, 40002, REMOTE_PORT, UDP)),
    ];
    assert_eq!(sweep_run(&object, &items), (2, 0));
    assert_eq!(object.nat_out(&key), None, "NAT_OUT entry removed");
    assert_eq!(object.nat_in(&reverse), None, "its NAT_IN pair removed");
    assert_eq!(
        object.nat_out_entries(),
        [(kept_key, kept)],
        "a flow not in the run stays"
    );
    assert_eq!(object.nat_in_entries(), [(kept_reverse, kept)]);
}

#[test]
fn an_entry_stamped_after_the_decision_stays() {
    require_root();
    let mut object = object();
    // A packet since the decision refreshed both entries: the flow stays whole.
    let (live_key, live_reverse, live) = flow(&mut object, MASQ.ip, 1000, 40000, DECIDED + 1);
    // The flow's NAT_OUT entry is idle, but its port went to a new flow (stamped later)
    // in NAT_IN: NAT_OUT goes, the new flow's NAT_IN entry stays.
    let (idle_key, taken_reverse, _) = flow(&mut object, MASQ_2.ip, 1001, 40001, DECIDED);
    let new_flow = out_key(MASQ.ip, 2000, REMOTE_PORT, UDP);
    let taken = entry(&new_flow, 40001, 0, DECIDED + 5);
    object.insert_nat_in(taken_reverse, taken);
    let items = [pair(live_key, live_reverse), pair(idle_key, taken_reverse)];
    assert_eq!(
        sweep_run(&object, &items),
        (1, 0),
        "only the idle flow went"
    );
    assert_eq!(object.nat_out(&live_key), Some(live));
    assert_eq!(object.nat_in(&live_reverse), Some(live));
    assert_eq!(object.nat_out(&idle_key), None);
    assert_eq!(
        object.nat_in(&taken_reverse),
        Some(taken),
        "the new flow keeps its port"
    );
}

#[test]
fn a_flow_without_a_pair_leaves_nat_in_alone() {
    require_root();
    let mut object = object();
    let (key, reverse, inbound) = flow(&mut object, MASQ.ip, 1000, 40000, DECIDED);
    let item = Item {
        kind: sweep::FLOW,
        ..pair(key, reverse)
    };
    assert_eq!(sweep_run(&object, &[item]), (1, 0));
    assert_eq!(object.nat_out(&key), None);
    assert_eq!(
        object.nat_in(&reverse),
        Some(inbound),
        "not this flow's pair"
    );
}

#[test]
fn an_idle_orphan_goes_and_a_refreshed_one_stays() {
    require_root();
    let mut object = object();
    let idle_key = out_key(MASQ.ip, 1000, 80, TCP);
    let idle_reverse = in_key(REMOTE, 40000, 80, TCP);
    object.insert_nat_in(
        idle_reverse,
        entry(&idle_key, 40000, tcp_state::CLOSED, DECIDED),
    );
    let live_key = out_key(MASQ.ip, 1001, 80, TCP);
    let live_reverse = in_key(REMOTE, 40001, 80, TCP);
    let live = entry(&live_key, 40001, tcp_state::ESTABLISHED, DECIDED + 1);
    object.insert_nat_in(live_reverse, live);
    let orphan = |out, inbound| Item {
        out,
        inbound,
        kind: sweep::ORPHAN,
        decided_ns: DECIDED,
    };
    let items = [
        orphan(idle_key, idle_reverse),
        orphan(live_key, live_reverse),
    ];
    assert_eq!(sweep_run(&object, &items), (0, 1), "one orphan went");
    assert_eq!(object.nat_in_entries(), [(live_reverse, live)]);
}

#[test]
fn a_run_takes_64_items_and_no_more() {
    require_root();
    let mut object = object();
    let flows: Vec<_> = (0..65)
        .map(|i| flow(&mut object, MASQ.ip, 1000 + i, 40000 + i, DECIDED))
        .collect();
    let items: Vec<_> = flows
        .iter()
        .map(|(key, reverse, _)| pair(*key, *reverse))
        .collect();
    assert_eq!(sweep_run(&object, &items), (64, 0));
    let (last_key, last_reverse, last) = flows[64];
    assert_eq!(
        object.nat_out_entries(),
        [(last_key, last)],
        "the 65th item is not run"
    );
    assert_eq!(object.nat_in_entries(), [(last_reverse, last)]);
}

#[test]
fn a_note_of_a_flow_opened_from_outside_goes_unless_seen_since_and_nat_out_stays() {
    require_root();
    let mut object = object();
    let idle_key = out_key(MASQ.ip, 8080, 50000, TCP);
    let live_key = out_key(MASQ_2.ip, 8080, 50001, TCP);
    let note = |key: &NatKey, state, seen| NatEntry {
        node_addr: key.pod_addr,
        ..entry(key, key.pod_port, state, seen)
    };
    object.insert_nat_inbound(idle_key, note(&idle_key, tcp_state::CLOSED, DECIDED));
    let live = note(&live_key, tcp_state::ESTABLISHED, DECIDED + 1);
    object.insert_nat_inbound(live_key, live);
    // A translated flow on the same 4-tuple: a note's item must not touch it.
    let translated = entry(&idle_key, 40000, tcp_state::ESTABLISHED, DECIDED);
    object.insert_nat_out(idle_key, translated);
    let item = |out: NatKey| Item {
        out,
        inbound: in_key(REMOTE, 0, 0, TCP),
        kind: sweep::FROM_OUTSIDE,
        decided_ns: DECIDED,
    };
    assert_eq!(
        counts(&object, &[item(idle_key), item(live_key)]),
        (0, 0, 1, 0),
        "the idle note went, the one seen since stays"
    );
    assert_eq!(object.nat_inbound(), [(live_key, live)]);
    assert_eq!(object.nat_out_entries(), [(idle_key, translated)]);
}

#[test]
fn a_hostport_connection_goes_unless_seen_since_and_the_other_tables_stay() {
    require_root();
    let mut object = object();
    let idle_key = out_key(MASQ.ip, 8080, 50000, TCP);
    let live_key = out_key(MASQ_2.ip, 8080, 50001, TCP);
    // The host address and port the client reached, in the node fields.
    let connection = |key: &NatKey, state, seen| NatEntry {
        node_addr: [198, 18, 0, 1],
        ..entry(key, 8000, state, seen)
    };
    object.insert_hostport_flow(idle_key, connection(&idle_key, tcp_state::CLOSED, DECIDED));
    let live = connection(&live_key, tcp_state::ESTABLISHED, DECIDED + 1);
    object.insert_hostport_flow(live_key, live);
    // A note and a translated flow on the same 4-tuple: the item touches neither.
    let note = NatEntry {
        node_addr: idle_key.pod_addr,
        ..entry(&idle_key, idle_key.pod_port, tcp_state::CLOSED, DECIDED)
    };
    object.insert_nat_inbound(idle_key, note);
    let translated = entry(&idle_key, 40000, tcp_state::ESTABLISHED, DECIDED);
    object.insert_nat_out(idle_key, translated);
    let item = |out: NatKey| Item {
        out,
        inbound: in_key(REMOTE, 0, 0, TCP),
        kind: sweep::HOSTPORT,
        decided_ns: DECIDED,
    };
    assert_eq!(
        counts(&object, &[item(idle_key), item(live_key)]),
        (0, 0, 0, 1),
        "the idle connection went, the one seen since stays"
    );
    assert_eq!(object.hostport_flows(), [(live_key, live)]);
    assert_eq!(object.nat_inbound(), [(idle_key, note)]);
    assert_eq!(object.nat_out_entries(), [(idle_key, translated)]);
}

#[test]
fn all_four_counts_come_back_at_once() {
    require_root();
    let mut object = object();
    let (key, reverse, _) = flow(&mut object, MASQ.ip, 1000, 40000, DECIDED);
    let note_key = out_key(MASQ.ip, 8080, 50000, TCP);
    object.insert_nat_inbound(note_key, entry(&note_key, 8080, tcp_state::CLOSED, DECIDED));
    let hostport_key = out_key(MASQ_2.ip, 8080, 50001, TCP);
    object.insert_hostport_flow(
        hostport_key,
        entry(&hostport_key, 8000, tcp_state::CLOSED, DECIDED),
    );
    let only = |out, inbound, kind| Item {
        out,
        inbound,
        kind,
        decided_ns: DECIDED,
    };
    // An orphan already gone counts as removed, as a flow already gone does.
    let orphan = in_key(REMOTE, 40009, REMOTE_PORT, UDP);
    let items = [
        pair(key, reverse),
        only(
            out_key(MASQ.ip, 1009, REMOTE_PORT, UDP),
            orphan,
            sweep::ORPHAN,
        ),
        only(note_key, in_key(REMOTE, 0, 0, TCP), sweep::FROM_OUTSIDE),
        only(hostport_key, in_key(REMOTE, 0, 0, TCP), sweep::HOSTPORT),
    ];
    assert_eq!(counts(&object, &items), (1, 1, 1, 1));
    assert!(object.hostport_flows().is_empty());
    assert!(object.nat_inbound().is_empty());
}
