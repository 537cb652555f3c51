//! Per-endpoint counters and drop counters, in per-CPU maps (no atomics needed; user
//! space sums the CPUs).

use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    macros::map,
    maps::{PerCpuArray, PerCpuHashMap},
};
use cni_ebpf_common::{DropReason, EndpointCounters};

const MAX_ENDPOINTS: u32 = 4096;

#[map(name = "ENDPOINT_COUNTERS")]
static ENDPOINT_COUNTERS: PerCpuHashMap<u32, EndpointCounters> =
    PerCpuHashMap::pinned(MAX_ENDPOINTS, 0);

#[map(name = "DROPS")]
static DROPS: PerCpuArray<u64> = PerCpuArray::pinned(DropReason::SLOTS, 0);

/// Which way a packet crossed the endpoint's veth.
#[derive(Clone, Copy)]
pub enum Direction {
    FromPod,
    ToPod,
}

/// Counts one packet of `bytes` for the endpoint whose host veth is `ifindex`.
#[inline(always)]
pub fn count(ifindex: u32, direction: Direction, bytes: u32) {
    let bytes = u64::from(bytes);
    if let Some(counters) = ENDPOINT_COUNTERS.get_ptr_mut(ifindex) {
        // SAFETY: a valid pointer into this CPU's slot, which only this program run
        // touches.
        let counters = unsafe { &mut *counters };
        match direction {
            Direction::FromPod => {
                counters.from_pod_packets += 1;
                counters.from_pod_bytes += bytes;
            }
            Direction::ToPod => {
                counters.to_pod_packets += 1;
                counters.to_pod_bytes += bytes;
            }
        }
        return;
    }
    let mut first = EndpointCounters::default();
    match direction {
        Direction::FromPod => (first.from_pod_packets, first.from_pod_bytes) = (1, bytes),
        Direction::ToPod => (first.to_pod_packets, first.to_pod_bytes) = (1, bytes),
    }
    // A full map only loses counting, never the packet.
    let _ = ENDPOINT_COUNTERS.insert(ifindex, first, 0);
}

/// Counts a drop for `reason` and returns the verdict that drops the packet.
#[inline(always)]
pub fn drop_packet(reason: DropReason) -> i32 {
    if let Some(slot) = DROPS.get_ptr_mut(reason as u32) {
        // SAFETY: a valid pointer into this CPU's array slot.
        unsafe { *slot += 1 };
    }
    TC_ACT_SHOT as i32
}
