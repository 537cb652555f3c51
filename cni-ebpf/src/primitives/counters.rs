//! Counting, in per-CPU maps (no atomics: bpfel-unknown-none has no 64-bit fetch_add;
//! user space sums the CPUs): each endpoint's traffic, drops by reason, source NAT's
//! counters, and traffic per source address.

use aya_ebpf::bindings::TC_ACT_SHOT;
use cni_ebpf_common::{DropReason, EndpointCounters, NatCounter, SourceKey, TrafficCounters};

use super::maps::{DROPS, ENDPOINT_COUNTERS, NAT_STATS, NODE_STATS, SOURCE_STATS};

/// Which way a packet crossed the endpoint's veth.
#[derive(Clone, Copy)]
pub enum Direction {
    FromPod,
    ToPod,
}

/// Counts one packet of `bytes` for the endpoint whose host veth is `ifindex`.
#[inline(always)]
pub fn endpoint(ifindex: u32, direction: Direction, bytes: u32) {
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

/// Adds one to source NAT's `counter`.
#[inline(always)]
pub fn nat(counter: NatCounter) {
    if let Some(slot) = NAT_STATS.get_ptr_mut(counter as u32) {
        // SAFETY: a valid pointer into this CPU's slot.
        unsafe { *slot += 1 };
    }
}

/// Adds one packet of `bytes` to what this node's pods sent to the node at `addr`, on
/// this CPU; a full map stops counting new nodes but never affects the packet.
#[inline(always)]
pub fn node(addr: [u8; 4], bytes: u32) {
    if let Some(counters) = NODE_STATS.get_ptr_mut(&addr) {
        // SAFETY: a valid pointer into this CPU's slot while the program runs.
        unsafe {
            (*counters).packets += 1;
            (*counters).bytes += u64::from(bytes);
        }
        return;
    }
    let first = TrafficCounters {
        packets: 1,
        bytes: u64::from(bytes),
    };
    let _ = NODE_STATS.insert(&addr, &first, 0);
}

/// What [`source`] did, so the caller can log the first packet of a new source.
pub enum Counted {
    Existing,
    NewSource,
}

/// Adds one packet of `bytes` to the counters of the source `key` on this CPU; a full
/// map stops counting new sources but never affects the packet.
#[inline(always)]
pub fn source(key: &SourceKey, bytes: u64) -> Result<Counted, i64> {
    if let Some(counters) = SOURCE_STATS.get_ptr_mut(key) {
        // SAFETY: the pointer comes from the map lookup and is valid for this CPU while
        // the program runs; no other CPU writes this per-CPU slot.
        unsafe {
            (*counters).packets += 1;
            (*counters).bytes += bytes;
        }
        return Ok(Counted::Existing);
    }
    let first = TrafficCounters { packets: 1, bytes };
    SOURCE_STATS.insert(key, &first, 0)?;
    Ok(Counted::NewSource)
}
