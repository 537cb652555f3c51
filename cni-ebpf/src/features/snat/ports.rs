//! Node ports for new flows: a search per destination from a shared cursor, each port
//! claimed in `NAT_IN`; or, for protocols whose port is not rewritten, the pod's own.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    cty::c_void,
    helpers::generated::{bpf_get_prandom_u32, bpf_loop},
};
use cni_ebpf_common::{
    NatConfig, NatCounter, NatEntry, NatKey, Refusal, Segment,
    flow::{Followed, opening_seq, reclaimable, tcp_state},
    ip_proto::{DCCP, ICMP, TCP, UDP, UDPLITE},
};

use crate::{
    features::{budget, conntrack, hostport},
    primitives::{
        counters,
        maps::{self, CURSOR_BITS, NAT_CURSORS, NAT_IN, NAT_OUT, PORT_SEARCH},
    },
};

/// Ports probed for a new flow before giving up (see `allocate`).
const MAX_PROBES: u32 = 128;
/// Consecutive ports tried before the search jumps ahead.
const LINEAR_PROBES: u32 = 8;
/// How far the search jumps, as a fraction of the range in 32-bit fixed point: the
/// golden ratio's 0.618..., whose multiples spread evenly over the range whatever its
/// size (the 16 blocks of a search land at least 3% of the range apart, none twice in
/// one place), so any free stretch longer than a tenth of the range is found wherever
/// the search starts (see docs/decisions.md, "Node ports for new flows").
const GOLDEN_STRIDE: u64 = 0x9E37_79B9;

/// Finds a free node port for `key` (same remote address, port and protocol) and claims
/// it in `NAT_IN`. A port whose flow has expired is taken over. Refused with
/// [`Refusal::NoPort`] when every port probed is held, [`Refusal::TableFull`] when
/// `NAT_IN` has no room for the claim.
///
/// Ports are handed out in sequence per destination, from a cursor that starts at a
/// random port (after RFC 6056's double-hash selection, which Linux uses for its own
/// ports: a table of counters indexed by a hash of the destination, here with random
/// starts in place of a keyed offset): an off-path host cannot guess the next port
/// without a connection to that same destination, and the ports of closed flows, which
/// stay held a little while (`tcp_state::POD_CLOSED`), are the ones right behind the
/// cursor, so at a high connection rate to one service the next port is nearly always
/// free at the first lookup. The pod's own source port is not kept, as with the
/// `--random-fully` MASQUERADE rules Kubernetes writes: a pod's ports inside the range
/// and those folded into it from outside would land on each other.
///
/// Cursors are in 2^[`CURSOR_BITS`] slots chosen by a hash of the destination, shared by
/// the CPUs and read and written without atomics, as Linux keeps its own table of
/// counters (`table_perturb`): two CPUs that read a cursor at once start at the same
/// port, and the one whose claim comes second finds it held and takes the next. Shared,
/// not per CPU, because a pod's flows toward one destination leave from whatever CPU
/// its sender runs on: with a cursor per CPU, the ports a pod at its budget can take
/// back (below) would lie behind another CPU's cursor, and its SYNs would be refused
/// while it holds closing ports of its own (docs/decisions.md, "Port cursors shared by
/// the CPUs"). On a held port the next one is tried; after
/// [`LINEAR_PROBES`] in a row the search jumps ahead (block k starts k times
/// [`GOLDEN_STRIDE`] of the range past the first port tried), so a block of ports held
/// by long-lived flows (which a cursor hands out in a row) is not walked port by port.
/// Each probe is a lookup, which takes no lock; only a port that looks free is claimed,
/// with an insert that fails if another CPU claimed it meanwhile.
///
/// A block that finds no port but one the same pod's closing flow holds past
/// `tcp_state::POD_CLOSED_RECLAIM_MS` ends the search with that port (see [`reclaim`]):
/// a pod opening short connections to one service faster than its budget of ports per
/// second goes on with its own closing ports rather than have SYNs refused.
#[inline(always)]
pub(super) fn allocate(
    key: &NatKey,
    config: &NatConfig,
    node_addr: [u8; 4],
    now: u64,
    opening: &Followed,
) -> Result<u16, Refusal> {
    let span = config.port_max.checked_sub(config.port_min);
    let size = u32::from(span.ok_or(Refusal::NoPort)?) + 1;
    let cursor = NAT_CURSORS
        .get_ptr_mut(cursor_slot(key))
        .ok_or(Refusal::NoPort)?;
    // SAFETY: a pointer into the map value, valid for the program run; another CPU's
    // write meanwhile only moves the start (the `% size` below keeps it in range).
    let mut start = match unsafe { *cursor } {
        // Not used yet: a random start.
        // SAFETY: a helper without arguments.
        0 => unsafe { bpf_get_prandom_u32() },
        next => next - 1,
    } % size;
    // A pod at its budget of ports toward the destination can only take over its own
    // expired ones: the cursor handed them out in a row, the oldest about a budget
    // behind it, so the search starts there (and the cursor moves on as far as the
    // search went, below: it stays ahead, and the next search starts right after the
    // port taken now).
    let cursor_at = start;
    let over_budget = !budget::ports_within(key, config);
    if over_budget {
        start = (start + size - config.dest_port_budget.min(size)) % size;
    }
    let mut search = Search {
        flow: NewFlow {
            key: *key,
            config,
            node_addr,
            now,
            opening: *opening,
        },
        start,
        size,
        stride: ((u64::from(size) * GOLDEN_STRIDE) >> 32) as u32,
        port: 0,
        full: false,
        over_budget: false,
    };
    let fallback = PORT_SEARCH.get_ptr_mut(0).ok_or(Refusal::NoPort)?;
    // SAFETY: a pointer into this CPU's value, valid for the program run (a run that
    // interrupts this one there is harmless, see `PORT_SEARCH`).
    unsafe { *fallback = 0 };
    // SAFETY: `probe` has the callback signature bpf_loop expects and reads `search`,
    // which outlives the call, as the `Search` it is.
    unsafe {
        bpf_loop(
            MAX_PROBES,
            probe as *mut c_void,
            (&raw mut search).cast(),
            0,
        )
    };
    if search.full {
        return Err(Refusal::TableFull);
    }
    // SAFETY: as above.
    let closing = unsafe { *fallback };
    if search.port == 0 && closing != 0 && reclaim(&search.flow, closing) {
        search.port = closing;
    }
    if search.port == 0 {
        return Err(if search.over_budget {
            Refusal::PortBudget
        } else {
            Refusal::NoPort
        });
    }
    let taken = u32::from(search.port - config.port_min);
    let next = if over_budget {
        (cursor_at + (taken + size - start) % size + 1) % size
    } else {
        (taken + 1) % size
    };
    // SAFETY: as above; the next offset, plus one (0 means "not used yet").
    unsafe { *cursor = next + 1 };
    Ok(search.port)
}

/// Whether flows of `proto` get a node port (or identifier) of their own: those whose
/// port (and checksum over it, if any) is rewritten in place.
#[inline(always)]
pub(super) fn rewrites_port(proto: u8) -> bool {
    matches!(proto, TCP | UDP | ICMP | DCCP | UDPLITE)
}

/// Claims the pod's own port for `key`, a flow of a protocol whose port is not rewritten
/// (see below): refused when another pod's live flow holds it, or `NAT_IN` is full.
///
/// Decision: SCTP keeps its ports, since rewriting one means recomputing
/// the CRC32c over the whole packet, and protocols without ports (GRE, ESP, IP in IP)
/// are translated by address alone (port 0), as MASQUERADE's generic protocol handling
/// does: one pod at a time per (remote address, protocol), or per (remote address and
/// port, pod port) for SCTP; another pod's flow meanwhile is dropped and counted as
/// `nat_ports_exhausted`.
#[inline(always)]
pub(super) fn keep_port(
    key: &NatKey,
    config: &NatConfig,
    node_addr: [u8; 4],
    now: u64,
) -> Result<u16, Refusal> {
    let flow = NewFlow {
        key: *key,
        config,
        node_addr,
        now,
        opening: {
            let (seq_seen, seq) = opening_seq(key.proto, &Segment::flags(0), now);
            Followed {
                state: 0,
                seq_seen,
                seq,
            }
        },
    };
    match claim(&flow, key.pod_port) {
        Claim::Taken => Ok(key.pod_port),
        Claim::Held | Claim::Reclaimable => Err(Refusal::NoPort),
        Claim::OverBudget => Err(Refusal::PortBudget),
        Claim::Full => Err(Refusal::TableFull),
    }
}

/// A port search of [`allocate`], shared with its [`probe`] callback.
///
/// The search runs under `bpf_loop`, whose callback the verifier checks once: a plain
/// loop is walked once per iteration and per path into it, which puts `uplink_egress`
/// at the verifier's million-instruction limit.
#[repr(C)]
struct Search<'a> {
    flow: NewFlow<'a>,
    start: u32,
    size: u32,
    /// How far apart blocks of [`LINEAR_PROBES`] start ([`GOLDEN_STRIDE`] of `size`).
    stride: u32,
    /// The port claimed; 0 while none (node ports are 1024 and above).
    port: u16,
    /// Whether the search stopped on a full `NAT_IN`.
    full: bool,
    /// Whether a free port was passed over for the pod's budget of ports toward the
    /// destination.
    over_budget: bool,
}

/// The node port translated flows of `proto` never get: the overlay's UDP port
/// (`--routing vxlan`), where every node's tunnel packets arrive. A flow holding it
/// would make another node's tunnel packets look like its replies, or its replies
/// like tunnel packets (`overlay::decap` takes those without asking the NAT). Read in
/// each probe, not once into [`Search`]: a value set before the search (the port or 0)
/// would make the verifier walk the rest of `uplink_egress` once for each. A call of
/// its own, so that the probe's frame stays within 6.1's 512-byte combined stack.
#[inline(never)]
fn reserved_port(proto: u8) -> u16 {
    match maps::overlay_config() {
        Some(overlay) if proto == UDP => overlay.port,
        _ => 0,
    }
}

/// A new flow claiming a node port (see [`claim`]). The configuration is the
/// caller's, by reference: a copy would cost the program's frame 44 bytes, and with the
/// port search's it must stay within 512.
#[repr(C)]
struct NewFlow<'a> {
    key: NatKey,
    config: &'a NatConfig,
    /// The uplink's address, which the flow leaves with.
    node_addr: [u8; 4],
    now: u64,
    /// Its state and sequence marks in the tables.
    opening: Followed,
}

/// Probe `index` of a [`Search`]: claims its port and stops the loop (1), or counts a
/// held port and goes on (0); stops on a full `NAT_IN` (no other port would fit either),
/// and at the end of a block once a reclaimable closing port is noted: the first one
/// probed that holds a closing flow of the same pod (see [`Claim::Reclaimable`]), in
/// `PORT_SEARCH` (0 while none).
extern "C" fn probe(index: u64, search: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the pointer `allocate` gave it.
    let search = unsafe { &mut *search.cast::<Search<'_>>() };
    let Some(fallback) = PORT_SEARCH.get_ptr_mut(0) else {
        return 1;
    };
    if search.size == 0 {
        // Never so (`allocate` sets one or more); tells the compiler the division
        // below cannot panic, which would leave the callback without an exit.
        return 1;
    }
    let index = index as u32;
    // 128 probes: 16 blocks, each offset under 65,536; no overflow.
    let offset = (search.start + index % LINEAR_PROBES + index / LINEAR_PROBES * search.stride)
        % search.size;
    let port = search.flow.config.port_min + offset as u16;
    if port == reserved_port(search.flow.key.proto) {
        counters::nat(NatCounter::PortProbes);
        return 0;
    }
    match claim(&search.flow, port) {
        Claim::Taken => {
            search.port = port;
            return 1;
        }
        Claim::Full => {
            search.full = true;
            return 1;
        }
        Claim::Held => counters::nat(NatCounter::PortProbes),
        Claim::OverBudget => {
            search.over_budget = true;
            counters::nat(NatCounter::PortProbes);
        }
        Claim::Reclaimable => {
            // SAFETY: a pointer into this CPU's value, valid for the program run.
            unsafe {
                if *fallback == 0 {
                    *fallback = port;
                }
            }
            counters::nat(NatCounter::PortProbes);
        }
    }
    // With a closing port to fall back on, the search ends with its block: at a rate
    // that keeps the pod at its budget the jumps beyond land on live ports.
    // SAFETY: as above.
    if unsafe { *fallback } != 0 && index % LINEAR_PROBES == LINEAR_PROBES - 1 {
        1
    } else {
        0
    }
}

/// Takes node `port`, found [`Claim::Reclaimable`] by the search, for `flow` when its
/// block held no other: if it still holds a closing flow of the same pod past
/// `tcp_state::POD_CLOSED_RECLAIM_MS` (or an expired one), it changes flows in place and
/// no count changes (the pod's port toward the same destination either way). A call
/// of its own: inlined, its keys would add to the frame under the port search's, which
/// must stay within 512 bytes with it.
#[inline(never)]
fn reclaim(flow: &NewFlow<'_>, port: u16) -> bool {
    let key = &flow.key;
    let Some(holder) = NAT_IN.get_ptr_mut(&key.reverse(port)) else {
        return false;
    };
    // SAFETY: a pointer into the map value, valid for the program run.
    let old = unsafe { *holder };
    let closing = reclaimable(&old, key.proto, flow.now)
        || conntrack::expired(&old, key.proto, flow.config, flow.now);
    if old.pod_addr != key.pod_addr || !closing {
        return false;
    }
    // SAFETY: as above.
    unsafe { *holder = flow_entry(key, port, flow.node_addr, flow.now, &flow.opening) };
    // The closing flow's own entry, not expired yet, is made so: a packet on its
    // 4-tuple (the pod reusing it) then opens a flow of its own and never takes this
    // port. The sweep removes it as any expired entry.
    let closed = NatKey::new(
        (old.pod_addr, old.pod_port),
        (key.remote_addr, key.remote_port),
        key.proto,
    );
    if let Some(stale) = NAT_OUT.get_ptr_mut(&closed) {
        // SAFETY: a pointer into the map value, valid for the program run.
        unsafe {
            if (*stale).node_port == port {
                // Idle just past its timeout (as `ebpf-cnid nat` then shows it).
                (*stale).state = tcp_state::POD_CLOSED;
                (*stale).last_seen_ns = flow
                    .now
                    .saturating_sub((u64::from(tcp_state::POD_CLOSED_SECS) + 1) * 1_000_000_000);
            }
        }
    }
    counters::nat(NatCounter::ClosingReclaimed);
    true
}

/// What [`claim`] made of a port.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Claimed for the new flow.
    Taken,
    /// Held by another live flow (or a host port).
    Held,
    /// Held by a closing flow of the same pod that the pod's TIME_WAIT holds
    /// (`tcp_state::POD_CLOSED`) idle past `tcp_state::POD_CLOSED_RECLAIM_MS`: taken only
    /// when the search finds no other port.
    Reclaimable,
    /// Free, but the pod holds its budget of ports toward the destination: only a port
    /// of its own expired flows would do.
    OverBudget,
    /// Free, but `NAT_IN` has no room for its entry.
    Full,
}

/// The cursor slot of `key`'s destination (remote address, port and protocol).
#[inline(always)]
fn cursor_slot(key: &NatKey) -> u32 {
    let mixed = u32::from_ne_bytes(key.remote_addr)
        ^ (u32::from(key.remote_port) << 16)
        ^ u32::from(key.proto);
    // Fibonacci hashing: the top bits of the product, spread over the slots.
    mixed.wrapping_mul(0x9E37_79B1) >> (32 - CURSOR_BITS)
}

/// The entry of `key`'s flow on node `port` of `node_addr`, opening as `opening` says.
#[inline(always)]
pub(super) fn flow_entry(
    key: &NatKey,
    port: u16,
    node_addr: [u8; 4],
    now: u64,
    opening: &Followed,
) -> NatEntry {
    NatEntry {
        last_seen_ns: now,
        pod_addr: key.pod_addr,
        pod_port: key.pod_port,
        node_port: port,
        state: opening.state,
        seq_seen: opening.seq_seen,
        pad: [0, 0],
        node_addr,
        seq: opening.seq,
    }
}

/// Claims node `port` for `flow` in `NAT_IN` if it is free, held by this
/// very flow, or held by an expired one (the caller writes `NAT_OUT`), and counts it
/// as its pod's toward the destination (`DEST_PORTS`, which counts exactly the
/// `NAT_IN` entries of each pod and destination): a free port, or another pod's
/// expired one, only while the pod is within its budget; a port of the pod's own
/// expired flow changes no count, so a pod at its budget goes on with the ports its
/// closed flows leave behind (where [`allocate`] then starts its search). Node ports are
/// one space for all uplinks (`NAT_IN` is keyed without the node address): a remote
/// reached by two uplinks never sees the same node port from both.
///
/// An expired flow's `NAT_OUT` entry stays when its port is taken over, for the
/// daemon's sweep to remove (it pairs entries by pod address and port, so it leaves the
/// new holder alone): the stale entry is expired, so a packet on the old flow's 4-tuple
/// opens a new flow (rewriting the entry in place) and never takes the port it lost.
/// Deleting it here would cost each SYN two more cold bucket walks (docs/decisions.md,
/// "Node ports for new flows").
#[inline(always)]
fn claim(flow: &NewFlow<'_>, port: u16) -> Claim {
    let (key, config, now) = (&flow.key, flow.config, flow.now);
    // Host ports belong to their mappings.
    if hostport::is_host_port(key.proto, port, flow.node_addr) {
        return Claim::Held;
    }
    let reverse = key.reverse(port);
    let entry = flow_entry(key, port, flow.node_addr, now, &flow.opening);
    match NAT_IN.get_ptr_mut(&reverse) {
        None => {
            if !budget::ports_within(key, config) {
                return Claim::OverBudget;
            }
            match NAT_IN.insert(&reverse, &entry, BPF_NOEXIST as u64) {
                Ok(()) => budget::port_added(key),
                Err(error) if budget::is_full(error) => return Claim::Full,
                // Another CPU claimed it meanwhile.
                Err(_) => return Claim::Held,
            }
        }
        Some(holder) => {
            // SAFETY: a pointer into the map value, valid for the program run.
            let old = unsafe { *holder };
            // This very flow already holds the port (its NAT_OUT entry was swept or
            // had expired): it keeps it.
            let same_flow = old.pod_addr == key.pod_addr && old.pod_port == key.pod_port;
            if !same_flow && !conntrack::expired(&old, key.proto, config, now) {
                return if old.pod_addr == key.pod_addr && reclaimable(&old, key.proto, now) {
                    Claim::Reclaimable
                } else {
                    Claim::Held
                };
            }
            let other_pod = old.pod_addr != key.pod_addr;
            if other_pod && !budget::ports_within(key, config) {
                return Claim::OverBudget;
            }
            // SAFETY: as above; the port changes hands in place.
            unsafe { *holder = entry };
            if other_pod {
                budget::port_removed(old.pod_addr, key);
                budget::port_added(key);
            }
        }
    }
    Claim::Taken
}
