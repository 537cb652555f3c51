//! NetworkPolicy: whether a packet may leave the pod that sent it, or enter the pod it
//! is for (see `cni_ebpf_common::policy` for the maps and the questions a flow's
//! verdicts answer).
//!
//! A pod isolated in no direction costs one hash lookup (`POLICY_ENDPOINTS`). At a pod
//! isolated either way every flow is tracked, even in the direction it is not isolated
//! in, so that replies pass the other: the verdicts of a known flow cost one or two
//! hash lookups; a new flow adds one lookup of the peer's identity and two of the pod's
//! ways (for that identity, then for any).
//!
//! The port a flow is judged by is the responder's. A fragment after its datagram's
//! first has no ports: it is judged as the flow its first fragment was admitted as, whose
//! ports a record in `NAT_FRAGMENTS` keeps (as the source NAT keeps its translation), so
//! a large UDP datagram or ping passes a way open on its port, a reply's fragments as
//! replies. Without a record (its first fragment refused, not yet seen, or over
//! `FRAGMENT_SECS` ago) it is judged on port 0: only ways open on every port of its
//! protocol let it through. An ICMP echo is keyed by its identifier on the requester's
//! side, so its reply matches it. An ICMP error (unreachable, time exceeded, parameter
//! problem) belongs to the flow it quotes, the way it goes being the way back of the
//! quoted packet's; quoting no flow known here, it is ICMP of its own.
//! Other ICMP messages have no ports.

use core::ptr::write_volatile;

use aya_ebpf::{helpers::generated::bpf_skb_load_bytes, maps::lpm_trie::Key, programs::TcContext};
use cni_ebpf_common::{
    AddrKey, DropReason, FlowKey, FlowVerdict, FragmentKey, PolicyCounters, PolicyEndpoint,
    RuleKey, ip_proto,
    policy::{
        ANY_IDENTITY, FAMILY_IPV4, RULE_ANY_PROTOCOL_BITS, WORLD_IDENTITY, allowed, direction,
        isolated, mode,
    },
};
use network_types::eth::{EthHdr, EtherType};

use super::{
    clock, counters, maps,
    maps::{
        FRAGMENT_SECS, NAT_FRAGMENTS, POLICY_CONFIG, POLICY_ENDPOINTS, POLICY_FLOWS, POLICY_IDS,
        POLICY_RULES, POLICY_SCRATCH, POLICY_STATS, PolicyScratch,
    },
    packet::{ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IP_SRC, is_icmp_error},
};

/// Where a check stands: at the pod that sent the packet, or the one it is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Sender,
    Receiver,
}

/// Whether the IPv4 packet in the frame may pass the pod whose host-side ifindex is
/// `endpoint`, in `role`. A refused packet is counted (by reason and by policy); the
/// caller drops it. At an isolated pod, a packet too short for the ports it should have
/// is refused. A call of its own, the whole check in one frame (see [`checked`]).
#[inline(never)]
pub fn admits(ctx: &TcContext, endpoint: u32, role: Role) -> bool {
    checked(ctx, endpoint, role)
}

/// Whether the egress policies of the pod whose host-side ifindex is `endpoint` let its
/// packet for `destination` out (as [`admits`]). They judge it by the address it was
/// sent to, except in a Service range: by the backend the stack's DNAT chose, where the
/// stack hands it on ([`stack_sender_admits`]). The range's lookup, asked only for an
/// isolated pod, is in this call's frame, not from_pod's.
#[inline(never)]
pub fn sender_admits(ctx: &TcContext, endpoint: u32, destination: [u8; 4]) -> bool {
    let Some(pod) = isolated(endpoint) else {
        return true;
    };
    maps::in_service_range(destination) || judged(ctx, endpoint, pod, Role::Sender)
}

/// Where the node's stack forwarded or delivered a packet (an uplink's, the overlay
/// device's or a pod veth's egress): whether the policies of the pod of this node that
/// sent it, if one did, let it out. The stack may have translated it (a Service's
/// DNAT), so this is where a pod's egress meets the Service's backend. A call of its
/// own, the whole check in one frame (see [`checked`]).
#[inline(never)]
pub fn stack_sender_admits(ctx: &TcContext) -> bool {
    // The EtherType and the IPv4 source alone: two small reads.
    if ctx.load::<u16>(ETHER_TYPE) != Ok(EtherType::Ipv4 as u16) {
        return true;
    }
    let Ok(source) = ctx.load::<[u8; 4]>(IP_SRC) else {
        return true;
    };
    match maps::endpoint(source) {
        Some(pod) => checked(ctx, pod.host_ifindex, Role::Sender),
        None => true,
    }
}

/// Where the EtherType is in an Ethernet frame.
const ETHER_TYPE: usize = 12;

/// The check, inlined into the calls above so that it takes one frame beside its
/// callers' and calls nothing (not even `memset`: see [`verdict`]). Linux 6.1's
/// verifier allows 512 bytes for the frames of a chain of calls, each rounded up to 32:
/// from_pod's and the uplink's egress program's leave room for one frame of the check's
/// size and no more (`datapath::frames` in the daemon checks every chain).
#[inline(always)]
fn checked(ctx: &TcContext, endpoint: u32, role: Role) -> bool {
    match isolated(endpoint) {
        Some(pod) => judged(ctx, endpoint, pod, role),
        None => true,
    }
}

/// The policy record of the pod on `endpoint` when it is isolated in some direction.
#[inline(always)]
fn isolated(endpoint: u32) -> Option<&'static PolicyEndpoint> {
    let pod = POLICY_ENDPOINTS.get_ptr(&endpoint)?;
    // SAFETY: the map's value, valid under the program's RCU read lock while it runs.
    let pod = unsafe { &*pod };
    (pod.isolated != 0).then_some(pod)
}

/// A packet at the isolated pod `pod`: its verdict; a frame too short for the ports it
/// should have is refused, counted as truncated.
#[inline(always)]
fn judged(ctx: &TcContext, endpoint: u32, pod: &PolicyEndpoint, role: Role) -> bool {
    match verdict(ctx, endpoint, pod, role) {
        Ok(admitted) => admitted,
        Err(_) => {
            counters::drop_packet(DropReason::TruncatedFrame);
            false
        }
    }
}

#[inline(always)]
fn verdict(ctx: &TcContext, endpoint: u32, pod: &PolicyEndpoint, role: Role) -> Result<bool, i64> {
    // The flow's key lives in this CPU's scratch value, not on the stack: the check is
    // called from programs whose own frames leave it little room.
    // Its pads and the bytes of its addresses past an IPv4 address are never written:
    // zero, as the map's value starts. Zeros written the compiler makes a call of
    // `memset`, which would add a frame to the chain.
    let scratch = POLICY_SCRATCH.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: this CPU's value, which only this program run touches.
    let scratch = unsafe { &mut *scratch };
    let key = &mut scratch.flow;
    let header = &mut scratch.header;
    let related = flow(
        ctx,
        key,
        header,
        &mut scratch.fragment,
        &mut scratch.first_fragment,
    )?;
    let config = POLICY_CONFIG.get(0).ok_or(0)?;
    // The flow as it was first seen: this packet goes its way, or is a reply.
    let (mut known, mut forward) = seen(key);
    if related && known.is_none() {
        // An ICMP error quoting no flow known here is judged as ICMP of its own.
        flow_of_headers(ctx, key, header, None, false)?;
        (known, forward) = seen(key);
    }
    let at_opener = (role == Role::Sender) == forward;
    let (bit, way, isolating, slot) = if at_opener {
        (
            allowed::OPENER_EGRESS,
            direction::EGRESS,
            isolated::EGRESS,
            pod.egress_policy,
        )
    } else {
        (
            allowed::RESPONDER_INGRESS,
            direction::INGRESS,
            isolated::INGRESS,
            pod.ingress_policy,
        )
    };
    // The verdicts still in force (none from another generation).
    let mut bits = 0;
    if let Some(verdict) = known {
        // SAFETY: a valid pointer into the map's value, read once.
        let verdict = unsafe { *verdict };
        if verdict.generation == config.generation {
            bits = verdict.allowed;
        }
    }
    if bits & bit != 0 {
        // A reply, or a packet of a flow answered here before.
        if !related && scratch.first_fragment != 0 {
            remember_first_fragment(scratch, forward);
        }
        return Ok(true);
    }
    let admitted = if pod.isolated & isolating == 0 {
        true
    } else {
        // The peer is the far end of the flow, the port the responder's.
        let peer = if at_opener { key.responder } else { key.opener };
        let (protocol, port) = (key.protocol, key.responder_port);
        match way_through(
            &mut scratch.addr,
            &mut scratch.rule,
            endpoint,
            way,
            peer,
            protocol,
            port,
        ) {
            Some(policy) => {
                count(&mut scratch.counted, policy, Counted::Allowed);
                true
            }
            None if config.mode == mode::AUDIT => {
                count(&mut scratch.counted, slot, Counted::Audited);
                true
            }
            None => {
                count(&mut scratch.counted, slot, Counted::Denied);
                counters::drop_packet(DropReason::PolicyDenied);
                false
            }
        }
    };
    if admitted && !related && scratch.first_fragment != 0 {
        remember_first_fragment(scratch, forward);
    }
    if admitted {
        let verdict = FlowVerdict {
            generation: config.generation,
            allowed: bits | bit,
        };
        match known {
            // SAFETY: as above; a racing writer loses a bit, asked again later.
            Some(known) => unsafe { *known = verdict },
            // A full table forgets its least recently seen flow; a failed insert only
            // means the next packet is asked again.
            None => {
                scratch.verdict = verdict;
                let _ = POLICY_FLOWS.insert(&scratch.flow, &scratch.verdict, 0);
            }
        }
    }
    Ok(admitted)
}

/// The slot of the policy whose way lets `endpoint` reach (`way` egress) or be reached
/// by (ingress) the address `peer` on `protocol` and `port`, if one does.
#[inline(always)]
fn way_through(
    addr: &mut Key<AddrKey>,
    rule: &mut Key<RuleKey>,
    endpoint: u32,
    way: u8,
    peer: [u8; 16],
    protocol: u8,
    port: u16,
) -> Option<u32> {
    addr.prefix_len = AddrKey::prefix_len(32);
    addr.data.family = FAMILY_IPV4;
    addr.data.addr[..4].copy_from_slice(&peer[..4]);
    let identity = POLICY_IDS.get(&*addr).copied().unwrap_or(WORLD_IDENTITY);
    rule.prefix_len = RULE_ANY_PROTOCOL_BITS + 32;
    rule.data.endpoint = endpoint.to_be_bytes();
    rule.data.direction = way;
    rule.data.identity = identity.to_be_bytes();
    rule.data.protocol = protocol;
    rule.data.port = port.to_be_bytes();
    if let Some(found) = POLICY_RULES.get(&*rule) {
        return Some(found.policy);
    }
    rule.data.identity = ANY_IDENTITY.to_be_bytes();
    POLICY_RULES.get(&*rule).map(|found| found.policy)
}

/// Which counter of a policy a check adds to.
#[derive(Clone, Copy)]
enum Counted {
    Allowed,
    Denied,
    Audited,
}

/// Adds one to the `counter` of the policy in `slot`; `first` is where a policy's first
/// counters are made (a map value, not the stack).
#[inline(always)]
fn count(first: &mut (u32, PolicyCounters), slot: u32, counter: Counted) {
    let add = |counters: &mut PolicyCounters| match counter {
        Counted::Allowed => counters.allowed += 1,
        Counted::Denied => counters.denied += 1,
        Counted::Audited => counters.audited += 1,
    };
    if let Some(counters) = POLICY_STATS.get_ptr_mut(slot) {
        // SAFETY: a valid pointer into this CPU's value, which only this run touches.
        add(unsafe { &mut *counters });
        return;
    }
    first.0 = slot;
    // One store each: zeros the compiler would otherwise gather into a call of `memset`.
    // SAFETY: valid, aligned pointers to fields of `first`.
    unsafe {
        let counters = &mut first.1;
        write_volatile(
            &mut counters.allowed,
            u64::from(matches!(counter, Counted::Allowed)),
        );
        write_volatile(
            &mut counters.denied,
            u64::from(matches!(counter, Counted::Denied)),
        );
        write_volatile(
            &mut counters.audited,
            u64::from(matches!(counter, Counted::Audited)),
        );
    }
    // A full map only loses counting.
    let _ = POLICY_STATS.insert(&first.0, &first.1, 0);
}

/// Turns `key` to the flow's other side.
#[inline(always)]
fn reverse(key: &mut FlowKey) {
    core::mem::swap(&mut key.opener, &mut key.responder);
    core::mem::swap(&mut key.opener_port, &mut key.responder_port);
}

/// Looks `key` up as it is and the other way round; leaves it as the flow was first
/// seen. Returns the flow's verdicts, if known, and whether the packet goes the way the
/// flow's first packet went.
#[inline(always)]
fn seen(key: &mut FlowKey) -> (Option<*mut FlowVerdict>, bool) {
    if let Some(verdict) = POLICY_FLOWS.get_ptr_mut(&*key) {
        return (Some(verdict), true);
    }
    reverse(key);
    if let Some(verdict) = POLICY_FLOWS.get_ptr_mut(&*key) {
        return (Some(verdict), false);
    }
    reverse(key);
    (None, true)
}

/// Writes into `key` the flow of the packet in the frame as it goes, sender first; for
/// an ICMP error, the flow it quotes, turned the way the error goes (it answers the
/// quoted packet): then `true`. `header` holds what is read of the headers; `fragment`
/// and `first` what [`addresses_and_ports`] notes of a fragmented datagram.
#[inline(always)]
fn flow(
    ctx: &TcContext,
    key: &mut FlowKey,
    header: &mut [u8; IPV4_HEADER],
    fragment: &mut FragmentKey,
    first: &mut u8,
) -> Result<bool, i64> {
    flow_of_headers(ctx, key, header, Some((fragment, first)), true)
}

/// [`flow`]; with `quoted` false an ICMP error is taken as ICMP of its own; without
/// `fragment`, a later fragment is judged on port 0.
#[inline(always)]
fn flow_of_headers(
    ctx: &TcContext,
    key: &mut FlowKey,
    header: &mut [u8; IPV4_HEADER],
    fragment: Option<(&mut FragmentKey, &mut u8)>,
    quoted: bool,
) -> Result<bool, i64> {
    let Some(l4) = addresses_and_ports(ctx, key, header, EthHdr::LEN, fragment)? else {
        return Ok(false);
    };
    if key.protocol != ip_proto::ICMP {
        return Ok(false);
    }
    // Type, code, checksum, identifier, sequence.
    load::<ICMP_HEADER>(ctx, l4, header)?;
    let icmp_type = header[0];
    if quoted && is_icmp_error(icmp_type) {
        if addresses_and_ports(ctx, key, header, l4 + ICMP_HEADER, None)?.is_none() {
            // A quoted later fragment has no ports: the error quotes no flow, and is
            // ICMP of its own.
            addresses_and_ports(ctx, key, header, EthHdr::LEN, None)?;
            return Ok(false);
        }
        reverse(key);
        return Ok(true);
    }
    let id = u16::from_be_bytes([header[4], header[5]]);
    match icmp_type {
        ICMP_ECHO_REQUEST => key.opener_port = id,
        ICMP_ECHO_REPLY => key.responder_port = id,
        _ => {}
    }
    Ok(false)
}

/// Bytes of an IPv4 header without options, and of an ICMP header before the packet an
/// error quotes.
const IPV4_HEADER: usize = 20;
const ICMP_HEADER: usize = 8;

/// Writes into `key` the addresses and protocol of the IPv4 header at `at` (read into
/// `header`), and the ports after it for the protocols that have them (else 0). Returns
/// where its payload starts, or `None` for a fragment after the first (no ports).
/// With `fragment` (the packet's own header, not one an ICMP error quotes), a
/// fragmented datagram's key is written there and `first` says whether this is its
/// first fragment; a later one takes the ports its first was admitted with, if
/// recorded ([`remember_first_fragment`]).
#[inline(always)]
fn addresses_and_ports(
    ctx: &TcContext,
    key: &mut FlowKey,
    header: &mut [u8; IPV4_HEADER],
    at: usize,
    fragment: Option<(&mut FragmentKey, &mut u8)>,
) -> Result<Option<usize>, i64> {
    load::<IPV4_HEADER>(ctx, at, header)?;
    key.family = FAMILY_IPV4;
    key.protocol = header[9];
    key.opener_port = 0;
    key.responder_port = 0;
    key.opener[..4].copy_from_slice(&header[12..16]);
    key.responder[..4].copy_from_slice(&header[16..20]);
    let flags_and_offset = u16::from_be_bytes([header[6], header[7]]);
    if let Some((fragment, first)) = fragment {
        *first = 0;
        if flags_and_offset & (MORE_FRAGMENTS | FRAGMENT_OFFSET) != 0 {
            fragment.src_addr.copy_from_slice(&header[12..16]);
            fragment.dst_addr.copy_from_slice(&header[16..20]);
            fragment.id = [header[4], header[5]];
            fragment.proto = header[9];
            fragment.way = FragmentKey::POLICY;
            if flags_and_offset & FRAGMENT_OFFSET == 0 {
                *first = 1;
            } else if let Some(record) = NAT_FRAGMENTS.get_ptr(&*fragment) {
                // SAFETY: a valid pointer into the map's value, read at once.
                let record = unsafe { *record };
                let age = clock::now_ns().saturating_sub(record.seen_ns);
                if age <= FRAGMENT_SECS * 1_000_000_000 {
                    let ports = record.addr;
                    key.opener_port = u16::from_be_bytes([ports[0], ports[1]]);
                    key.responder_port = u16::from_be_bytes([ports[2], ports[3]]);
                }
            }
        }
    }
    if flags_and_offset & FRAGMENT_OFFSET != 0 {
        return Ok(None);
    }
    let l4 = at + usize::from(header[0] & 0x0f) * 4;
    if matches!(key.protocol, ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP) {
        load::<4>(ctx, l4, header)?;
        key.opener_port = u16::from_be_bytes([header[0], header[1]]);
        key.responder_port = u16::from_be_bytes([header[2], header[3]]);
    }
    Ok(Some(l4))
}

/// The fragment offset's bits of an IPv4 header's flags and offset, and the flag that
/// more fragments follow.
const FRAGMENT_OFFSET: u16 = 0x1fff;
const MORE_FRAGMENTS: u16 = 0x2000;

/// Records the ports of the flow the first fragment in `scratch` was admitted as, in
/// the packet's own order (`forward`: the flow's key is as the packet goes), for the
/// fragments after it. A full table evicts its oldest record; a failed write leaves the
/// fragments judged on port 0.
#[inline(always)]
fn remember_first_fragment(scratch: &mut PolicyScratch, forward: bool) {
    let key = &scratch.flow;
    let (source, destination) = if forward {
        (key.opener_port, key.responder_port)
    } else {
        (key.responder_port, key.opener_port)
    };
    let [s0, s1] = source.to_be_bytes();
    let [d0, d1] = destination.to_be_bytes();
    // Field by field into a map value whose other bytes stay zero: no `memset`.
    scratch.fragment_record.seen_ns = clock::now_ns();
    scratch.fragment_record.addr = [s0, s1, d0, d1];
    let _ = NAT_FRAGMENTS.insert(&scratch.fragment, &scratch.fragment_record, 0);
}

/// Reads the `N` bytes at `offset` into the start of `to` (a map value: nothing on the
/// stack); fewer left in the frame is an error.
#[inline(always)]
fn load<const N: usize>(
    ctx: &TcContext,
    offset: usize,
    to: &mut [u8; IPV4_HEADER],
) -> Result<(), i64> {
    const { assert!(N <= IPV4_HEADER) };
    // SAFETY: `to` is writable memory of the length given; the helper checks the frame.
    let read = unsafe {
        bpf_skb_load_bytes(
            ctx.skb.skb as *const _,
            offset as u32,
            to.as_mut_ptr().cast(),
            N as u32,
        )
    };
    if read < 0 { Err(read) } else { Ok(()) }
}
