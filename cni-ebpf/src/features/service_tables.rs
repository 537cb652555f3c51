//! The Service tables' entries (see `cni_ebpf_common::services`): a party's packets
//! create and refresh them within its budget ([`opener_socket`], [`opener_flow`]), the
//! answers to them refresh and answer them ([`answerer_socket`], [`answerer_flow`]),
//! and a party's counts follow what is created here and what the sweep removes
//! ([`removed`]). The entry points are functions of their own (a BPF call, arguments in
//! registers), so that their frames are not the programs': each program's frame and
//! theirs together stay within the 512 bytes of stack Linux 6.1's verifier allows.

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_coarse_ns, maps::HashMap};
use cni_ebpf_common::{
    DropReason, NatCounter, NatEntry, NatKey, Segment, ServiceClient, ServiceConfig, ServiceCounts,
    ServiceTable,
    services::{REFRESH_NS, answered_state, answerer_syn, confirms, opener_state},
    tcp_state,
};

use crate::{
    features::budget,
    primitives::{
        counters,
        maps::{SERVICE_CLIENTS, SERVICE_CONFIG, SERVICE_COUNTS, SERVICE_FLOWS, SERVICE_PEERS},
    },
};

/// What the daemon wrote of Services (all zeros before it has: no budget, no NodePort
/// range).
#[inline(always)]
pub fn config() -> ServiceConfig {
    SERVICE_CONFIG.get(0).copied().unwrap_or_default()
}

/// The table of sockets `table` names (`SERVICE_CLIENTS` or `SERVICE_PEERS`).
#[inline(always)]
fn sockets(table: ServiceTable) -> &'static HashMap<ServiceClient, NatEntry> {
    match table {
        ServiceTable::Peers => &SERVICE_PEERS,
        _ => &SERVICE_CLIENTS,
    }
}

/// A packet with `seg` from the socket `key`, the opener of its entry in `table`
/// (`Clients`: a pod's socket; `Peers`: an outside client's): refreshes its entry and
/// follows its state or, when there is none and `may_open`, creates it within its
/// party's budget. Whether the packet is refused (counted; the caller drops it).
#[inline(never)]
pub fn opener_socket(
    table: ServiceTable,
    key: &ServiceClient,
    seg: &Segment,
    may_open: bool,
) -> bool {
    let map = sockets(table);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if let Some(entry) = map.get_ptr_mut(key) {
        // SAFETY: a pointer into the map value, valid for the program run.
        let entry = unsafe { &mut *entry };
        // A pod is taken at its word; an outside client must acknowledge the SYN-ACK.
        let confirmed = table == ServiceTable::Clients || confirms(entry, seg);
        follow_opener(entry, key.proto, seg.flags, confirmed, now);
        return false;
    }
    may_open
        && !create(
            map, key, key.addr, key.port, key.proto, 0, seg.flags, table, now,
        )
}

/// An answer with `seg` to the socket `key` in `table`: whether it has an entry, which
/// is refreshed, its answer noted.
#[inline(never)]
pub fn answerer_socket(table: ServiceTable, key: &ServiceClient, seg: &Segment) -> bool {
    answered_socket(table, key, seg)
}

/// [`answerer_socket`] inlined, for a caller that is a call of its own already: a call
/// from it would add a frame to the chain of calls from the pod program, which 6.1's
/// verifier holds to 512 bytes.
#[inline(always)]
pub fn answered_socket(table: ServiceTable, key: &ServiceClient, seg: &Segment) -> bool {
    let Some(entry) = sockets(table).get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: as in `opener_socket`.
    follow_answerer(unsafe { &mut *entry }, key.proto, seg);
    true
}

/// A pod's packet with `seg` on `flow`, the opener of its `SERVICE_FLOWS` entry: as
/// [`opener_socket`], creating the entry as a flow of `kind` (0: never).
#[inline(always)]
pub fn opener_flow(flow: &NatKey, seg: &Segment, kind: u16) -> bool {
    // SAFETY: as in `opener_socket`.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if let Some(entry) = SERVICE_FLOWS.get_ptr_mut(flow) {
        // SAFETY: as in `opener_socket`.
        let entry = unsafe { &mut *entry };
        if kind != 0 && entry.node_port != kind {
            // The same 4-tuple, now the other kind of flow.
            entry.node_port = kind;
        }
        follow_opener(entry, flow.proto, seg.flags, true, now);
        return false;
    }
    kind != 0
        && !create(
            &SERVICE_FLOWS,
            flow,
            flow.pod_addr,
            flow.pod_port,
            flow.proto,
            kind,
            seg.flags,
            ServiceTable::Flows,
            now,
        )
}

/// An answer on `flow` (keyed from the pod's side): its `SERVICE_FLOWS` kind (0: none),
/// the entry refreshed. A pod's flow follows its pod alone (no SYN-ACK to record):
/// the segment is not read, which keeps the callers' frames small.
#[inline(always)]
pub fn answerer_flow(flow: &NatKey) -> u16 {
    let Some(entry) = SERVICE_FLOWS.get_ptr_mut(flow) else {
        return 0;
    };
    // SAFETY: as in `opener_socket`.
    let entry = unsafe { &mut *entry };
    refresh_answered(entry, flow.proto, false);
    entry.node_port
}

/// Moves `entry`'s state by its opener's packet, and its timestamp when due: written
/// only when either changes, so a busy connection writes its entry once a second.
#[inline(always)]
fn follow_opener(entry: &mut NatEntry, proto: u8, flags: u8, confirmed: bool, now: u64) {
    let state = opener_state(proto, entry.state, flags, confirmed);
    if state != entry.state {
        if state == tcp_state::SYN_SENT {
            // A new connection on the socket: the last one's SYN-ACK is no answer.
            entry.seq_seen = 0;
        }
        entry.state = state;
        entry.last_seen_ns = now;
    } else if now.saturating_sub(entry.last_seen_ns) > REFRESH_NS {
        entry.last_seen_ns = now;
    }
}

/// Notes an answer with `seg` in `entry`, and refreshes it when due.
#[inline(always)]
fn follow_answerer(entry: &mut NatEntry, proto: u8, seg: &Segment) {
    let syn = answerer_syn(entry, seg);
    refresh_answered(entry, proto, syn);
}

/// Notes an answer in `entry` (`changed`: the caller changed it already), and
/// refreshes it when due.
#[inline(always)]
fn refresh_answered(entry: &mut NatEntry, proto: u8, changed: bool) {
    // SAFETY: as in `opener_socket`.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let state = answered_state(proto, entry.state);
    if state != entry.state || changed || now.saturating_sub(entry.last_seen_ns) > REFRESH_NS {
        entry.state = state;
        entry.last_seen_ns = now;
    }
}

/// Creates the entry `key` in `map` (counted in `table` for `party`) for its opener's
/// socket (`party`, `port`, `proto`), whose first packet had TCP `flags`, with `kind`
/// (`SERVICE_FLOWS`' kind, 0 elsewhere); unless the party holds its budget or the
/// table is full. Whether it was created (or another CPU created it meanwhile).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn create<K>(
    map: &HashMap<K, NatEntry>,
    key: &K,
    party: [u8; 4],
    port: u16,
    proto: u8,
    kind: u16,
    flags: u8,
    table: ServiceTable,
    now: u64,
) -> bool {
    if !within(party, table) {
        refuse(DropReason::ServiceBudget);
        return false;
    }
    // The party is counted before its entry exists: a party the counts cannot hold
    // would hold entries without a budget.
    let Some(counts) = counts_of(party) else {
        refuse(DropReason::ServiceTableFull);
        return false;
    };
    let entry = fresh_entry(now, party, port, kind, opener_state(proto, 0, flags, false));
    match map.insert(key, &entry, BPF_NOEXIST as u64) {
        Ok(()) => {
            budget::increment(count_of(counts, table));
            true
        }
        Err(error) if budget::is_full(error as i32) => {
            refuse(DropReason::ServiceTableFull);
            false
        }
        // Another CPU created it meanwhile.
        Err(_) => true,
    }
}

/// A new entry of its opener's socket (`party`, `port`) in `state` at `now`, of `kind`
/// (`SERVICE_FLOWS`' kind, 0 elsewhere), every other field zero. Made of four aligned
/// words: built field by field, LLVM zeroes the unaligned tail with a call to `memset`,
/// a BPF function whose frame would take the uplink's ingress chain past the 512 bytes
/// of stack Linux 6.1 allows.
#[inline(always)]
fn fresh_entry(now: u64, party: [u8; 4], port: u16, kind: u16, state: u8) -> NatEntry {
    let socket =
        u64::from(u32::from_ne_bytes(party)) | u64::from(port) << 32 | u64::from(kind) << 48;
    // SAFETY: `NatEntry` is #[repr(C)], 32 bytes without implicit padding: `last_seen_ns`,
    // then `pod_addr`, `pod_port` and `node_port` in the second word (little-endian,
    // as BPF on x86 and arm64), `state` the first byte of the third, zeros after.
    unsafe { core::mem::transmute::<[u64; 4], NatEntry>([now, socket, u64::from(state), 0]) }
}

/// The counts of `party` in `SERVICE_COUNTS`, made (all zero) when it has none; `None`
/// when the map is full.
#[inline(always)]
fn counts_of(party: [u8; 4]) -> Option<*mut ServiceCounts> {
    if let Some(counts) = SERVICE_COUNTS.get_ptr_mut(&party) {
        return Some(counts);
    }
    // Another CPU making it meanwhile makes this insert fail: its entry is found below.
    // Counts of nothing, written in place as two volatile words: a zero value made
    // otherwise becomes a call to `memset` (see [`fresh_entry`]).
    let mut zero = core::mem::MaybeUninit::<ServiceCounts>::uninit();
    let words = zero.as_mut_ptr().cast::<u64>();
    // SAFETY: `ServiceCounts` is four `u32`s (16 bytes, no padding, aligned for `u64`
    // on the stack), all zeros a value; both words are written before it is read.
    let zero = unsafe {
        words.write_volatile(0);
        words.add(1).write_volatile(0);
        zero.assume_init_ref()
    };
    let _ = SERVICE_COUNTS.insert(&party, zero, BPF_NOEXIST as u64);
    SERVICE_COUNTS.get_ptr_mut(&party)
}

/// Whether `party` may hold one more entry in `table` (always, while the daemon wrote
/// no budget).
#[inline(always)]
fn within(party: [u8; 4], table: ServiceTable) -> bool {
    let budget = config().party_budget;
    // SAFETY: the value is copied out at once.
    budget == 0 || unsafe { SERVICE_COUNTS.get(&party) }.is_none_or(|c| c.of(table) < budget)
}

/// Counts an entry of `party` gone from `table` (the sweep's removals).
#[inline(never)]
pub fn removed(party: [u8; 4], table: ServiceTable) {
    if let Some(counts) = SERVICE_COUNTS.get_ptr_mut(&party) {
        budget::decrement(count_of(counts, table));
    }
}

/// Removes the counts of `party` when they count nothing (the sweep's removals): the
/// check and the delete are two steps, and an entry made between them goes uncounted
/// (its party may then hold one more than its budget). Whether they went.
#[inline(never)]
pub fn forget_if_empty(party: [u8; 4]) -> bool {
    // SAFETY: the value is copied out at once.
    match unsafe { SERVICE_COUNTS.get(&party) }.copied() {
        Some(counts) if counts.is_empty() => SERVICE_COUNTS.remove(&party).is_ok(),
        _ => false,
    }
}

/// The count of `table` in the counts at `counts` (a pointer into `SERVICE_COUNTS`).
#[inline(always)]
fn count_of(counts: *mut ServiceCounts, table: ServiceTable) -> *mut u32 {
    // SAFETY: a pointer into the map value, valid for the program run; only a field's
    // address is taken.
    unsafe {
        match table {
            ServiceTable::Clients => &raw mut (*counts).clients,
            ServiceTable::Flows => &raw mut (*counts).flows,
            ServiceTable::Peers => &raw mut (*counts).peers,
        }
    }
}

/// Counts a new Service connection refused for `reason` (the sweeper looks at
/// `service_refused` every second and sweeps at once when it moved).
#[inline(always)]
fn refuse(reason: DropReason) {
    counters::nat(NatCounter::ServiceRefused);
    counters::drop_packet(reason);
}
