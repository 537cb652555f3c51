//! Connection tracking on the flow tables: a flow's entries refreshed as its packets
//! pass, the notes of flows opened from outside, and when an entry has expired. The
//! states and the timeout rule are `cni_ebpf_common::flow`'s, which the daemon's sweep
//! follows too.

use aya_ebpf::{bindings::BPF_NOEXIST, maps::HashMap, programs::TcContext};
use cni_ebpf_common::{
    FlowTable, FragmentKey, NatConfig, NatEntry, NatKey, NatReverseKey, Refusal, Segment, Timeouts,
    Way,
    flow::{Followed, follow, opening_seq, opening_state, twin_seen},
    ip_proto::TCP,
    tcp_flags,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    features::{budget, fragments},
    primitives::{
        clock,
        maps::{self, NAT_IN, NAT_INBOUND, NAT_OUT},
        packet,
    },
};

/// An entry's timestamp is refreshed at most this often, to spare map writes on the
/// fast path.
pub const REFRESH_NS: u64 = 1_000_000_000;

/// Refreshes a flow in both tables, in place: `this` (the entry just looked up, which
/// follows the side `way` of a packet with `flags`) and the other table's entry at
/// `other`, with the time, the TCP state (`followed`, with the sequence marks: the twin
/// gets those of `way`'s side) and the address the flow leaves with. A map update would
/// take a free element and the map's locks, twice per TCP state change (about eight times per
/// connection); a write through the lookup's pointer does neither. Two CPUs refreshing
/// the same flow at once write the same kind of values: whichever lands is right. An
/// entry missing from the other table (removed by a sweep while this one saw a packet)
/// is written back whole, and `true` returned for the caller to count it; one that now
/// belongs to another flow (its port taken over) is left alone.
#[inline(always)]
pub fn refresh<K>(
    this: *mut NatEntry,
    other_table: &HashMap<K, NatEntry>,
    other: &K,
    now: u64,
    followed: &Followed,
    (way, flags): (Way, u8),
    node_addr: [u8; 4],
) -> bool {
    // SAFETY: `this` points into a map value, valid for the program run.
    let entry = unsafe {
        (*this).last_seen_ns = now;
        (*this).state = followed.state;
        (*this).seq_seen = followed.seq_seen;
        (*this).seq = followed.seq;
        (*this).node_addr = node_addr;
        *this
    };
    let side = match way {
        Way::Out => 0,
        Way::In => 1,
    };
    match other_table.get_ptr_mut(other) {
        // SAFETY: as above.
        Some(twin) => unsafe {
            let same_flow = (*twin).pod_addr == entry.pod_addr
                && (*twin).pod_port == entry.pod_port
                && (*twin).node_port == entry.node_port;
            if same_flow {
                (*twin).last_seen_ns = now;
                (*twin).state = followed.state;
                (*twin).seq_seen = twin_seen((*twin).seq_seen, followed.seq_seen, flags, way);
                (*twin).seq[side] = followed.seq[side];
                (*twin).node_addr = node_addr;
            }
            false
        },
        None => other_table
            .insert(other, &entry, BPF_NOEXIST as u64)
            .is_ok(),
    }
}

/// The live entry of the flow to `node_addr` a packet belongs to, its timestamp, state
/// and sequence marks refreshed: `reply` holds the TCP header fields (0 for other
/// protocols) of a reply of the flow, and is `None` for an ICMP error about it, which
/// changes no state (as
/// conntrack's related packets do not). A flow that left with another address (by
/// another uplink) is not this packet's.
#[inline(always)]
pub fn live_entry(
    key: &NatReverseKey,
    config: &NatConfig,
    node_addr: [u8; 4],
    reply: Option<Segment>,
) -> Option<NatEntry> {
    let slot = NAT_IN.get_ptr_mut(key)?;
    let now = clock::now_ns();
    // SAFETY: a pointer into the map value, valid for the program run; copied at once.
    let entry = unsafe { *slot };
    if entry.node_addr != node_addr {
        return None;
    }
    if expired(&entry, key.proto, config, now) {
        return None;
    }
    let (followed, flags) = match reply {
        // An ICMP error only refreshes the timestamp.
        None => (
            Followed {
                state: entry.state,
                seq_seen: entry.seq_seen,
                seq: entry.seq,
            },
            0,
        ),
        // A reply makes a UDP (or SCTP, GRE...) flow replied, and a stream (the longer
        // timeout) once it goes on two seconds after it began.
        Some(seg) => (
            follow(&entry, key.proto, &seg, Way::In, false, now),
            seg.flags,
        ),
    };
    // A side first seen, or a held SYN's note, goes to the twin at once.
    if followed.state != entry.state
        || followed.seq_seen != entry.seq_seen
        || now.saturating_sub(entry.last_seen_ns) > REFRESH_NS
    {
        let forward = key.forward(&entry);
        let packet = (Way::In, flags);
        if refresh(slot, &NAT_OUT, &forward, now, &followed, packet, node_addr) {
            budget::added(entry.pod_addr, FlowTable::Out);
        }
    } else if followed.changes_seq(&entry) {
        mark(slot, &followed);
    }
    Some(entry)
}

/// Notes a packet of `flow` (keyed from the pod's side, `seg` its TCP header fields, 0
/// for other protocols) arriving from a host outside for the pod's own address: the stack
/// routes it to the pod, and the pod's answers keep its address (see
/// [`opened_from_outside`]). A flow whose note expired (or that has none) opens anew.
/// Written when the state changes, else at most once a second per flow. A new note over
/// its pod's budget, or meeting a full table, is refused: the packet must then be
/// dropped, as the pod's answers would leave translated.
#[inline(always)]
pub fn saw_inbound(
    flow: &NatKey,
    seg: &Segment,
    config: &NatConfig,
    now: u64,
) -> Result<(), Refusal> {
    let Some(slot) = NAT_INBOUND.get_ptr_mut(flow) else {
        if !budget::within(flow.pod_addr, FlowTable::FromOutside, config) {
            return Err(Refusal::FlowBudget);
        }
        return match NAT_INBOUND.insert(flow, &opened(flow, seg, now), BPF_NOEXIST as u64) {
            Ok(()) => {
                budget::added(flow.pod_addr, FlowTable::FromOutside);
                Ok(())
            }
            Err(error) if budget::is_full(error) => Err(Refusal::TableFull),
            // Another CPU noted it meanwhile.
            Err(_) => Ok(()),
        };
    };
    // SAFETY: a pointer into the map value, valid for the program run; copied at once.
    let note = unsafe { *slot };
    if expired(&note, flow.proto, config, now) {
        // SAFETY: as above.
        unsafe { *slot = opened(flow, seg, now) };
        return Ok(());
    }
    touch(
        slot,
        &note,
        &follow(&note, flow.proto, seg, Way::Out, true, now),
        now,
    );
    Ok(())
}

/// The note of `flow`, a flow a host outside opens with `seg` (its first packet).
#[inline(always)]
pub fn opened(flow: &NatKey, seg: &Segment, now: u64) -> NatEntry {
    let (seq_seen, seq) = opening_seq(flow.proto, seg, now);
    NatEntry {
        seq_seen,
        seq,
        ..NatEntry::from_outside(flow, opening_state(flow.proto, seg.flags), now)
    }
}

/// Whether `flow`, a pod's packet with no translated flow (`seg` its TCP header),
/// answers a flow a host outside opened to the pod's own address whose note has not
/// expired: such answers keep the pod's address, as under MASQUERADE, which translates
/// only connections that began leaving. The note follows the packet: TCP's state, a
/// reply for the others (a stream, with the longer timeout, once it goes on two
/// seconds after it began, as conntrack's assured flows).
#[inline(always)]
pub fn opened_from_outside(flow: &NatKey, seg: &Segment, config: &NatConfig, now: u64) -> bool {
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
        &follow(&note, flow.proto, seg, Way::In, true, now),
        now,
    );
    true
}

/// Whether `ip`, a pod's packet for outside the node that is no SYN, answers a flow a
/// host outside opened to the pod's own address whose note is live (see
/// [`saw_inbound`]): that flow's packets from outside went through the node's stack, so
/// its answers do too, and the stack's conntrack (kube-proxy's KUBE-FORWARD drops what
/// it calls invalid) and the node's firewall see the connection both ways. A fragment
/// after the first goes where its first fragment went.
///
/// A function of its own (a BPF call), so that its frame is not the pod program's. A
/// packet it cannot read goes to the stack.
#[inline(never)]
pub fn answers_inbound(ctx: &TcContext, ip: &Ipv4Hdr) -> bool {
    match maps::timeouts() {
        Some(config) => inbound_answer(ctx, ip, &config).unwrap_or(true),
        None => false,
    }
}

#[inline(always)]
fn inbound_answer(ctx: &TcContext, ip: &Ipv4Hdr, config: &NatConfig) -> Result<bool, i64> {
    if fragments::is_later(ip) {
        return Ok(fragments::first_of(ip, FragmentKey::TO_STACK).is_some());
    }
    let proto = ip.proto as u8;
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let Some((pod_port, remote_port)) = packet::flow_ports(ctx, proto, l4)? else {
        return Ok(false);
    };
    if proto == TCP && tcp_flags::opens(ctx.load::<[u8; 14]>(l4)?[13]) {
        return Ok(false);
    }
    let flow = NatKey::new((ip.src_addr, pod_port), (ip.dst_addr, remote_port), proto);
    // SAFETY: the value is copied out at once.
    let Some(note) = (unsafe { NAT_INBOUND.get(&flow) }).copied() else {
        return Ok(false);
    };
    let live = !expired(&note, proto, config, clock::now_ns());
    if live {
        fragments::went_to_stack(ip);
    }
    Ok(live)
}

/// Writes `followed` and `now` into the entry at `slot` (read as `note`: a note of
/// `NAT_INBOUND` or a hostPort connection) when the state changes or a second has passed
/// since it was stamped; the sequence marks alone when only they moved.
#[inline(always)]
pub fn touch(slot: *mut NatEntry, note: &NatEntry, followed: &Followed, now: u64) {
    if followed.state != note.state || now.saturating_sub(note.last_seen_ns) > REFRESH_NS {
        // SAFETY: a pointer into the map value, valid for the program run.
        unsafe {
            (*slot).last_seen_ns = now;
            (*slot).state = followed.state;
        }
    }
    if followed.changes_seq(note) {
        mark(slot, followed);
    }
}

/// Writes the sequence marks of `followed` into the entry at `slot`: a TCP packet that
/// moved its side's highest sequence number (most data packets), one store.
#[inline(always)]
pub fn mark(slot: *mut NatEntry, followed: &Followed) {
    // SAFETY: a pointer into the map value, valid for the program run.
    unsafe {
        (*slot).seq_seen = followed.seq_seen;
        (*slot).seq = followed.seq;
    }
}

/// Whether `entry` of protocol `proto` has been idle longer than its timeout (the rule
/// the daemon's sweep applies too, `cni_ebpf_common::Timeouts::expired`).
#[inline(always)]
pub fn expired(entry: &NatEntry, proto: u8, config: &NatConfig, now: u64) -> bool {
    Timeouts::from_config(config).expired(entry, proto, now)
}
