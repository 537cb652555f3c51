//! Each pod's share of the flow tables (see `cni_ebpf_common::budget`): whether a new
//! flow fits its pod's budgets ([`within`], [`ports_within`]), counting the entries
//! created ([`added`], [`port_added`]) and removed ([`removed`], [`port_removed`]), and
//! refusing a flow, counted by reason ([`refuse`]). All but the checks are functions of
//! their own (one or two arguments, in registers): off the fast path, and off the stack
//! of the programs, whose frame and the port search's together stay within the 512
//! bytes BPF allows.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::bindings::BPF_NOEXIST;
use cni_ebpf_common::{
    DropReason, FlowCounts, FlowTable, NatConfig, NatCounter, NatKey, Refusal, RefusedFlows,
};

use crate::primitives::{
    counters,
    maps::{DEST_PORTS, FLOW_COUNTS, NAT_REFUSED},
};

/// `-E2BIG`: what a map insert returns when the map is full.
const E2BIG: i32 = -7;

/// Whether a map insert failed with `error` because the map is full.
#[inline(always)]
pub fn is_full(error: i32) -> bool {
    error == E2BIG
}

/// Whether the pod at `pod` may open one more flow in `table` under `config`'s budget
/// (always, while the daemon wrote none).
#[inline(always)]
pub fn within(pod: [u8; 4], table: FlowTable, config: &NatConfig) -> bool {
    let budget = config.pod_flow_budget;
    // SAFETY: the value is copied out at once.
    budget == 0 || unsafe { FLOW_COUNTS.get(&pod) }.is_none_or(|counts| counts.of(table) < budget)
}

/// Whether the pod of `flow` may take one more node port toward its destination.
#[inline(never)]
pub fn ports_within(flow: &NatKey, config: &NatConfig) -> bool {
    let budget = config.dest_port_budget;
    // SAFETY: as above.
    budget == 0 || unsafe { DEST_PORTS.get(&flow.destination()) }.is_none_or(|held| *held < budget)
}

/// Counts an entry the pod at `pod` just created in `table`.
#[inline(never)]
pub fn added(pod: [u8; 4], table: FlowTable) {
    if let Some(counts) = FLOW_COUNTS.get_ptr_mut(&pod) {
        increment(count_of(counts, table));
        return;
    }
    // A pod's first entry. Another CPU creating it meanwhile makes this insert fail:
    // then this one adds to that.
    if FLOW_COUNTS
        .insert(&pod, &FlowCounts::one(table), BPF_NOEXIST as u64)
        .is_err()
        && let Some(counts) = FLOW_COUNTS.get_ptr_mut(&pod)
    {
        increment(count_of(counts, table));
    }
}

/// Counts a node port the pod of `flow` just took toward its destination (see
/// `snat::ports`: a port taken over from the pod's own expired flow is not new).
#[inline(never)]
pub fn port_added(flow: &NatKey) {
    let key = flow.destination();
    if let Some(held) = DEST_PORTS.get_ptr_mut(&key) {
        increment(held);
        return;
    }
    // As in `added`; a full map leaves that destination uncounted (its flows are still
    // bound by the pod's flow budget).
    if DEST_PORTS.insert(&key, &1, BPF_NOEXIST as u64).is_err()
        && let Some(held) = DEST_PORTS.get_ptr_mut(&key)
    {
        increment(held);
    }
}

/// Counts an entry of the pod at `pod` gone from `table`.
#[inline(never)]
pub fn removed(pod: [u8; 4], table: FlowTable) {
    if let Some(counts) = FLOW_COUNTS.get_ptr_mut(&pod) {
        decrement(count_of(counts, table));
    }
}

/// Counts a node port the pod at `pod` no longer holds toward the destination of
/// `flow` (any flow to that destination: its pod port is not read).
#[inline(never)]
pub fn port_removed(pod: [u8; 4], flow: &NatKey) {
    let key = NatKey {
        pod_addr: pod,
        ..flow.destination()
    };
    if let Some(held) = DEST_PORTS.get_ptr_mut(&key) {
        decrement(held);
    }
}

/// The count of `table` in the pod's counts at `counts` (a pointer into `FLOW_COUNTS`).
#[inline(always)]
fn count_of(counts: *mut FlowCounts, table: FlowTable) -> *mut u32 {
    // SAFETY: a pointer into the map value, valid for the program run; only a field's
    // address is taken.
    unsafe {
        match table {
            FlowTable::Out => &raw mut (*counts).out,
            FlowTable::FromOutside => &raw mut (*counts).from_outside,
            FlowTable::HostPort => &raw mut (*counts).hostport,
        }
    }
}

/// Adds one to the count at `count`, atomically: the counts are shared by every CPU.
#[inline(always)]
pub fn increment(count: *mut u32) {
    // SAFETY: `count` points into a map value, aligned, valid for the program run; every
    // writer of it adds atomically.
    unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(count, 1) };
}

/// Takes one from the count at `count`, atomically, unless it is 0 already (an entry
/// that was never counted: carried into a table created anew at another size). Two CPUs
/// taking the last one at once could wrap it; the only remover of most entries is the
/// sweep, one program run at a time.
#[inline(always)]
pub fn decrement(count: *mut u32) {
    // SAFETY: as in `increment`.
    unsafe {
        // A plain read (the instruction set has no atomic load): a count read as it was
        // a moment ago is all the check needs.
        if count.read_volatile() != 0 {
            // Adding 2^32 - 1 takes one: the instruction set's atomic add, where a
            // subtraction would need the fetching atomics of a later BPF ISA.
            atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(count, u32::MAX);
        }
    }
}

/// Counts a new flow of the pod at `pod` refused for `why` (per pod in `NAT_REFUSED`, in
/// `NAT_STATS` and under its drop reason) and returns the verdict that drops it.
#[inline(never)]
pub fn refuse(pod: [u8; 4], why: Refusal) -> i32 {
    match NAT_REFUSED.get_ptr_mut(&pod) {
        // SAFETY: a valid pointer into this CPU's slot.
        Some(refused) => unsafe { *(*refused).slot(why) += 1 },
        // A full map evicts another pod's count, never loses the packet's verdict.
        None => {
            let _ = NAT_REFUSED.insert(&pod, &RefusedFlows::one(why), 0);
        }
    }
    let (counter, reason) = match why {
        Refusal::NoPort => (
            NatCounter::AllocationFailures,
            DropReason::NatPortsExhausted,
        ),
        Refusal::FlowBudget => (NatCounter::OverBudget, DropReason::NatFlowBudget),
        Refusal::PortBudget => (NatCounter::OverBudget, DropReason::NatPortBudget),
        Refusal::TableFull => (NatCounter::TableFull, DropReason::NatTableFull),
    };
    counters::nat(counter);
    counters::drop_packet(reason)
}
