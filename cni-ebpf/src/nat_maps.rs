//! The NAT tables, configuration and counters (types in `cni_ebpf_common::nat`).

use aya_ebpf::{
    helpers::generated::bpf_ktime_get_coarse_ns,
    macros::map,
    maps::{Array, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
};
use cni_ebpf_common::{
    NatConfig, NatCounter, NatEntry, NatKey, NatReverseKey, Timeouts, Uplinks,
    flow::{inbound_state, opening_state},
};

use crate::snat;

/// Flows tracked at once, unless the daemon asks for another size (`--nat-max-flows`,
/// set at load); the LRU evicts the oldest when full.
const MAX_FLOWS: u32 = 262_144;
const MAX_CIDRS: u32 = 256;

#[map(name = "NAT_OUT")]
pub static NAT_OUT: LruHashMap<NatKey, NatEntry> = LruHashMap::pinned(MAX_FLOWS, 0);

#[map(name = "NAT_IN")]
pub static NAT_IN: LruHashMap<NatReverseKey, NatEntry> = LruHashMap::pinned(MAX_FLOWS, 0);

/// log2 of the number of per-destination port cursors (see `snat::allocate`).
pub const CURSOR_BITS: u32 = 10;

/// Per CPU, per destination hash: the next node port's offset in the range, plus one (0:
/// not used yet).
#[map(name = "NAT_CURSORS")]
pub static NAT_CURSORS: PerCpuArray<u32> = PerCpuArray::pinned(1 << CURSOR_BITS, 0);

#[map(name = "NAT_CONFIG")]
static NAT_CONFIG: Array<NatConfig> = Array::pinned(1, 0);

#[map(name = "UPLINKS")]
static UPLINKS: Array<Uplinks> = Array::pinned(1, 0);

#[map(name = "CLUSTER_CIDRS")]
static CLUSTER_CIDRS: LpmTrie<[u8; 4], u8> = LpmTrie::pinned(MAX_CIDRS, 0);

/// Flows a host outside opened to a pod's own address (a routed pod network), keyed
/// from the pod's side as `NAT_OUT` is: their TCP state (or whether the pod answered)
/// and when a packet of theirs last passed, in a [`NatEntry`] that "translates" the pod
/// to itself (see [`opened_from_outside`]). As many as the NAT tables hold (resized
/// with them at load, `--nat-max-flows`), swept with them by the daemon.
#[map(name = "NAT_INBOUND")]
pub static NAT_INBOUND: LruHashMap<NatKey, NatEntry> = LruHashMap::pinned(MAX_FLOWS, 0);

#[map(name = "NAT_STATS")]
static NAT_STATS: PerCpuArray<u64> = PerCpuArray::pinned(NatCounter::SLOTS, 0);

/// The daemon's NAT configuration, when NAT is enabled.
#[inline(always)]
pub fn config() -> Option<NatConfig> {
    NAT_CONFIG
        .get(0)
        .copied()
        .filter(|config| config.node_addr != [0; 4])
}

/// The timeouts the daemon wrote, whether or not NAT is on (hostPort connections expire
/// by them too, see `hostport`); `None` while there are none (NAT off writes zeros, and
/// then nothing sweeps either).
#[inline(always)]
pub fn timeouts() -> Option<NatConfig> {
    NAT_CONFIG.get(0).copied().filter(NatConfig::has_timeouts)
}

/// The address of the uplink `ifindex` (`NatConfig::NO_ADDRESS` while it has none), or
/// `None` when `ifindex` is no uplink.
#[inline(always)]
pub fn uplink_addr(ifindex: u32) -> Option<[u8; 4]> {
    UPLINKS.get(0)?.find(ifindex)
}

/// Whether `addr` is inside the cluster's pod ranges (kept untranslated).
#[inline(always)]
pub fn in_cluster(addr: [u8; 4]) -> bool {
    CLUSTER_CIDRS.get(Key::new(32, addr)).is_some()
}

#[inline(always)]
pub fn count(counter: NatCounter) {
    add(counter, 1);
}

#[inline(always)]
pub fn add(counter: NatCounter, amount: u64) {
    if let Some(slot) = NAT_STATS.get_ptr_mut(counter as u32) {
        // SAFETY: a valid pointer into this CPU's slot.
        unsafe { *slot += amount };
    }
}

/// CLOCK_MONOTONIC at the last tick (the timestamps the daemon and `expired` compare
/// with): timeouts are whole seconds, and the coarse clock is a memory read where the
/// precise one reads the clock source (in a VM, a paravirtual clock read per packet).
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// Refreshes a flow in both tables, in place: `this` (the entry just looked up) and the
/// other table's entry at `other`, with the time, the TCP state and the address the
/// flow leaves with. A map update would allocate a new LRU element and
/// take the map's locks, twice per TCP state change (about eight times per
/// connection); a write through the lookup's pointer does neither. Two CPUs refreshing
/// the same flow at once write the same kind of values: whichever lands is right. An
/// entry missing from the other table (evicted) is written back whole; one that now
/// belongs to another flow (its port taken over) is left alone.
#[inline(always)]
pub fn refresh<K>(
    this: *mut NatEntry,
    other_table: &LruHashMap<K, NatEntry>,
    other: &K,
    now: u64,
    state: u8,
    node_addr: [u8; 4],
) {
    // SAFETY: `this` points into a map value, valid for the program run.
    let entry = unsafe {
        (*this).last_seen_ns = now;
        (*this).state = state;
        (*this).node_addr = node_addr;
        *this
    };
    match other_table.get_ptr_mut(other) {
        // SAFETY: as above.
        Some(twin) => unsafe {
            let same_flow = (*twin).pod_addr == entry.pod_addr
                && (*twin).pod_port == entry.pod_port
                && (*twin).node_port == entry.node_port;
            if same_flow {
                (*twin).last_seen_ns = now;
                (*twin).state = state;
                (*twin).node_addr = node_addr;
            }
        },
        None => {
            let _ = other_table.insert(other, &entry, 0);
        }
    }
}

/// Notes a packet of `flow` (keyed from the pod's side, `flags` its TCP flags, 0 for
/// other protocols) arriving from a host outside for the pod's own address: the stack
/// routes it to the pod, and the pod's answers keep its address (see
/// [`opened_from_outside`]). A flow whose note expired (or that has none) opens anew.
/// Written when the state changes, else at most once a second per flow.
#[inline(always)]
pub fn saw_inbound(flow: &NatKey, flags: u8, config: &NatConfig, now: u64) {
    let Some(slot) = NAT_INBOUND.get_ptr_mut(flow) else {
        let note = NatEntry::from_outside(flow, opening_state(flow.proto, flags), now);
        let _ = NAT_INBOUND.insert(flow, &note, 0);
        return;
    };
    // SAFETY: a pointer into the map value, valid for the program run; copied at once.
    let note = unsafe { *slot };
    let state = if expired(&note, flow.proto, config, now) {
        opening_state(flow.proto, flags)
    } else {
        inbound_state(flow.proto, note.state, flags, false)
    };
    touch(slot, &note, state, now);
}

/// Whether `flow`, a pod's packet with no translated flow (`flags` its TCP flags),
/// answers a flow a host outside opened to the pod's own address whose note has not
/// expired: such answers keep the pod's address, as under MASQUERADE, which translates
/// only connections that began leaving. The note follows the packet: TCP's state, a
/// reply for the others (which then keep it the stream timeout, as conntrack's assured
/// flows do).
#[inline(always)]
pub fn opened_from_outside(flow: &NatKey, flags: u8, config: &NatConfig, now: u64) -> bool {
    let Some(slot) = NAT_INBOUND.get_ptr_mut(flow) else {
        return false;
    };
    // SAFETY: a pointer into the map value, valid for the program run; copied at once.
    let note = unsafe { *slot };
    if expired(&note, flow.proto, config, now) {
        return false;
    }
    touch(
        slot,
        &note,
        inbound_state(flow.proto, note.state, flags, true),
        now,
    );
    true
}

/// Writes `state` and `now` into the entry at `slot` (read as `note`: a note of
/// `NAT_INBOUND` or a hostPort connection) when the state changes or a second has passed
/// since it was stamped.
#[inline(always)]
pub fn touch(slot: *mut NatEntry, note: &NatEntry, state: u8, now: u64) {
    if state != note.state || now.saturating_sub(note.last_seen_ns) > snat::REFRESH_NS {
        // SAFETY: a pointer into the map value, valid for the program run.
        unsafe {
            (*slot).last_seen_ns = now;
            (*slot).state = state;
        }
    }
}

/// Whether `entry` of protocol `proto` has been idle longer than its timeout (the rule
/// the daemon's sweep applies too, `cni_ebpf_common::Timeouts::expired`).
#[inline(always)]
pub fn expired(entry: &NatEntry, proto: u8, config: &NatConfig, now: u64) -> bool {
    Timeouts::from_config(config).expired(entry, proto, now)
}
