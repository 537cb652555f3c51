//! The NAT sweep's removals, done in the kernel, each counted off its pod's budgets: the `nat_sweep` program, never
//! attached, which the daemon runs with BPF_PROG_TEST_RUN on a frame of [`SweepItem`]s
//! it decided on (`cni-daemon/src/nat/sweep/`), [`sweep::MAX_ITEMS`] a run.
//!
//! Each entry is read and, unless it saw a packet after the decision, deleted right
//! after, in the same run: the datapath rewrites expired entries in place (a flow back
//! on its 4-tuple, a new flow taking an expired port over), so a delete must follow its
//! check closely; here that is one syscall per 64 flows (docs/decisions.md, "The NAT
//! sweep's removals in the kernel"). The check and the delete are still two steps (no
//! map operation deletes on a condition): a datapath rewrite in the few hundred
//! nanoseconds between them is lost, and that flow's replies go to the node's stack
//! until a later packet out restores its entry (`conntrack::refresh`).

use aya_ebpf::{
    bindings::__sk_buff, cty::c_void, helpers::generated::bpf_loop, maps::HashMap,
    programs::TcContext,
};
use cni_ebpf_common::{
    FlowTable, NatEntry, NatKey, NatReverseKey, ServiceClient, ServiceTable, SweepItem, sweep,
};

use crate::{
    features::{budget, service_tables},
    primitives::maps::{
        HOSTPORT_FLOWS, NAT_IN, NAT_INBOUND, NAT_OUT, SERVICE_CLIENTS, SERVICE_FLOWS, SERVICE_PEERS,
    },
};

/// Removes the frame's items; returns how many of each kind went, packed as
/// [`sweep`] says.
#[inline(always)]
pub fn run(ctx: &TcContext) -> i32 {
    let items = (ctx.len() as usize).saturating_sub(sweep::HEADER) / size_of::<SweepItem>();
    let mut run = Run {
        skb: ctx.skb.skb,
        flows: 0,
        orphans: 0,
        notes: 0,
        hostport: 0,
    };
    // SAFETY: `remove` has the callback signature bpf_loop expects and reads `run`,
    // which outlives the call, as the `Run` it is.
    unsafe {
        bpf_loop(
            items.min(sweep::MAX_ITEMS) as u32,
            remove as *mut c_void,
            (&raw mut run).cast(),
            0,
        )
    };
    (run.flows
        | run.orphans << sweep::ORPHAN_SHIFT
        | run.notes << sweep::FROM_OUTSIDE_SHIFT
        | run.hostport << sweep::HOSTPORT_SHIFT) as i32
}

/// A run of `nat_sweep`, shared with its [`remove`] callback.
#[repr(C)]
struct Run {
    skb: *mut __sk_buff,
    flows: u32,
    orphans: u32,
    notes: u32,
    hostport: u32,
}

/// Item `index` of a [`Run`]: removed as the daemon's `Flows::sweep` decided. Stops the
/// loop (1) only on a frame shorter than its items.
extern "C" fn remove(index: u64, run: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the pointer `run` gave it.
    let run = unsafe { &mut *run.cast::<Run>() };
    let ctx = TcContext::new(run.skb);
    let at = sweep::HEADER + index as usize * size_of::<SweepItem>();
    let Ok(item) = ctx.load::<SweepItem>(at) else {
        return 1;
    };
    if item.kind & sweep::SERVICE_PARTY == sweep::SERVICE_PARTY {
        // A party's counts, not counted as a removal.
        service_tables::forget_if_empty(item.out.pod_addr);
    } else if item.kind & sweep::SERVICE != 0 {
        if remove_service_if_idle(&item) {
            run.flows += 1;
        }
    } else if item.kind & sweep::HOSTPORT != 0 {
        if remove_if_idle(
            &HOSTPORT_FLOWS,
            &item.out,
            item.decided_ns,
            FlowTable::HostPort,
        ) {
            run.hostport += 1;
        }
    } else if item.kind & sweep::FROM_OUTSIDE != 0 {
        if remove_if_idle(
            &NAT_INBOUND,
            &item.out,
            item.decided_ns,
            FlowTable::FromOutside,
        ) {
            run.notes += 1;
        }
    } else if item.kind & sweep::ORPHAN != 0 {
        if remove_port_if_idle(&item.inbound, item.decided_ns) {
            run.orphans += 1;
        }
    } else if item.kind & sweep::FLOW != 0
        && remove_if_idle(&NAT_OUT, &item.out, item.decided_ns, FlowTable::Out)
    {
        // NAT_OUT first: a port is never free in NAT_IN while NAT_OUT still hands it out.
        if item.kind & sweep::PAIR != 0 {
            remove_port_if_idle(&item.inbound, item.decided_ns);
        }
        run.flows += 1;
    }
    0
}

/// Deletes `key` from `table` (which its pod's budget counts as `counted`) unless its
/// entry was stamped after `decided_ns`. Whether it is gone.
#[inline(always)]
fn remove_if_idle(
    table: &HashMap<NatKey, NatEntry>,
    key: &NatKey,
    decided_ns: u64,
    counted: FlowTable,
) -> bool {
    // SAFETY: the value is read at once.
    match unsafe { table.get(key) }.copied() {
        Some(entry) if entry.last_seen_ns > decided_ns => false,
        Some(entry) => {
            if table.remove(key).is_ok() {
                budget::removed(entry.pod_addr, counted);
            }
            true
        }
        None => true,
    }
}

/// Deletes the node port `key` from `NAT_IN` unless its entry was stamped after
/// `decided_ns`, and counts it off its pod's ports toward its destination. Whether it
/// is gone.
#[inline(always)]
fn remove_port_if_idle(key: &NatReverseKey, decided_ns: u64) -> bool {
    // SAFETY: the value is read at once.
    match unsafe { NAT_IN.get(key) }.copied() {
        Some(entry) if entry.last_seen_ns > decided_ns => false,
        Some(entry) => {
            if NAT_IN.remove(key).is_ok() {
                budget::port_removed(entry.pod_addr, &key.forward(&entry));
            }
            true
        }
        None => true,
    }
}

/// Deletes the Service entry of `item` (its kind says which table; a socket's key is
/// `out`'s pod address, port and protocol) unless it was stamped after the decision,
/// and counts it off its party's budget. Whether it went by this run.
#[inline(always)]
fn remove_service_if_idle(item: &SweepItem) -> bool {
    if item.kind & sweep::SERVICE_FLOW != 0 {
        return remove_entry_if_idle(
            &SERVICE_FLOWS,
            &item.out,
            item.decided_ns,
            ServiceTable::Flows,
        );
    }
    let socket = ServiceClient {
        addr: item.out.pod_addr,
        port: item.out.pod_port,
        proto: item.out.proto,
        pad: 0,
    };
    if item.kind & sweep::SERVICE_PEER != 0 {
        remove_entry_if_idle(
            &SERVICE_PEERS,
            &socket,
            item.decided_ns,
            ServiceTable::Peers,
        )
    } else {
        remove_entry_if_idle(
            &SERVICE_CLIENTS,
            &socket,
            item.decided_ns,
            ServiceTable::Clients,
        )
    }
}

/// Deletes `key` from the Service table `map` (counted as `table`) unless its entry was
/// stamped after `decided_ns`. Whether this run removed it.
#[inline(always)]
fn remove_entry_if_idle<K>(
    map: &HashMap<K, NatEntry>,
    key: &K,
    decided_ns: u64,
    table: ServiceTable,
) -> bool {
    // SAFETY: the value is read at once.
    match unsafe { map.get(key) }.copied() {
        Some(entry) if entry.last_seen_ns <= decided_ns && map.remove(key).is_ok() => {
            service_tables::removed(entry.pod_addr, table);
            true
        }
        _ => false,
    }
}
