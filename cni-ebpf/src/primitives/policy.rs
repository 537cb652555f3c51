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
//! first has no ports: it is judged on port 0, so only ways open on every port of its
//! protocol let it through. An ICMP echo is keyed by its identifier on the requester's
//! side, so its reply matches it; other ICMP messages have no ports.

use aya_ebpf::{maps::lpm_trie::Key, programs::TcContext};
use cni_ebpf_common::{
    AddrKey, DropReason, FlowKey, FlowVerdict, PolicyConfig, PolicyCounters, PolicyEndpoint,
    RuleKey, ip_proto,
    policy::{
        ANY_IDENTITY, FAMILY_IPV4, RULE_ANY_PROTOCOL_BITS, WORLD_IDENTITY, allowed, direction,
        isolated, mode,
    },
};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use super::{
    counters, maps,
    maps::{
        POLICY_CONFIG, POLICY_ENDPOINTS, POLICY_FLOWS, POLICY_IDS, POLICY_RULES, POLICY_SCRATCH,
        POLICY_STATS,
    },
    packet::{EthIpv4, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST},
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
/// is refused.
#[inline(always)]
pub fn admits(ctx: &TcContext, endpoint: u32, role: Role) -> bool {
    // SAFETY: the value is copied out at once, under the program's RCU read lock.
    let Some(pod) = (unsafe { POLICY_ENDPOINTS.get(&endpoint) }).copied() else {
        return true;
    };
    if pod.isolated == 0 {
        return true;
    }
    judge(ctx, endpoint, &pod, role)
}

/// Where the node's stack forwarded or delivered a packet (an uplink's, the overlay
/// device's or a pod veth's egress): whether the policies of the pod of this node that
/// sent it, if one did, let it out. The stack may have translated it (a Service's
/// DNAT), so this is where a pod's egress meets the Service's backend.
#[inline(always)]
pub fn stack_sender_admits(ctx: &TcContext) -> bool {
    let Ok(EthIpv4 { eth, ip }) = ctx.load::<EthIpv4>(0) else {
        return true;
    };
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return true;
    }
    match maps::endpoint(ip.src_addr) {
        Some(pod) => admits(ctx, pod.host_ifindex, Role::Sender),
        None => true,
    }
}

/// The check of a packet at an isolated pod: a call of its own rather than inlined at
/// every place a packet is delivered.
#[inline(never)]
fn judge(ctx: &TcContext, endpoint: u32, pod: &PolicyEndpoint, role: Role) -> bool {
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
    let key = POLICY_SCRATCH.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: this CPU's value, which only this program run touches.
    let key = unsafe { &mut *key };
    flow(ctx, key)?;
    let config = POLICY_CONFIG
        .get(0)
        .copied()
        .unwrap_or(PolicyConfig::default());
    // The flow as it was first seen: this packet goes its way, or is a reply.
    let mut forward = true;
    let mut known = POLICY_FLOWS.get_ptr_mut(&*key);
    if known.is_none() {
        reverse(key);
        known = POLICY_FLOWS.get_ptr_mut(&*key);
        if known.is_some() {
            forward = false;
        } else {
            reverse(key);
        }
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
        return Ok(true);
    }
    let admitted = if pod.isolated & isolating == 0 {
        true
    } else {
        // The peer is the far end of the flow, the port the responder's.
        let peer = if at_opener { key.responder } else { key.opener };
        match way_through(endpoint, way, peer, key.protocol, key.responder_port) {
            Some(policy) => {
                count(policy, |counters| counters.allowed += 1);
                true
            }
            None if config.mode == mode::AUDIT => {
                count(slot, |counters| counters.audited += 1);
                true
            }
            None => {
                count(slot, |counters| counters.denied += 1);
                counters::drop_packet(DropReason::PolicyDenied);
                false
            }
        }
    };
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
                let _ = POLICY_FLOWS.insert(&*key, &verdict, 0);
            }
        }
    }
    Ok(admitted)
}

/// The slot of the policy whose way lets `endpoint` reach (`way` egress) or be reached
/// by (ingress) the address `peer` on `protocol` and `port`, if one does.
#[inline(always)]
fn way_through(endpoint: u32, way: u8, peer: [u8; 16], protocol: u8, port: u16) -> Option<u32> {
    let addr = AddrKey {
        family: FAMILY_IPV4,
        pad: [0; 3],
        addr: peer,
    };
    let identity = POLICY_IDS
        .get(Key::new(AddrKey::prefix_len(32), addr))
        .copied()
        .unwrap_or(WORLD_IDENTITY);
    let full = RULE_ANY_PROTOCOL_BITS + 32;
    let rule = POLICY_RULES
        .get(Key::new(
            full,
            RuleKey::new(endpoint, way, identity, protocol, port),
        ))
        .or_else(|| {
            POLICY_RULES.get(Key::new(
                full,
                RuleKey::new(endpoint, way, ANY_IDENTITY, protocol, port),
            ))
        })?;
    Some(rule.policy)
}

/// Adds to the counters of the policy in `slot`.
#[inline(always)]
fn count(slot: u32, add: impl FnOnce(&mut PolicyCounters)) {
    if let Some(counters) = POLICY_STATS.get_ptr_mut(slot) {
        // SAFETY: a valid pointer into this CPU's value, which only this run touches.
        add(unsafe { &mut *counters });
        return;
    }
    let mut first = PolicyCounters::default();
    add(&mut first);
    // A full map only loses counting.
    let _ = POLICY_STATS.insert(slot, first, 0);
}

/// Turns `key` to the flow's other side.
#[inline(always)]
fn reverse(key: &mut FlowKey) {
    core::mem::swap(&mut key.opener, &mut key.responder);
    core::mem::swap(&mut key.opener_port, &mut key.responder_port);
}

/// Writes into `key` the flow of the packet in the frame as it goes, sender first.
#[inline(always)]
fn flow(ctx: &TcContext, key: &mut FlowKey) -> Result<(), i64> {
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let (source_port, destination_port) = if ip.frag_offset() != 0 {
        (0, 0)
    } else {
        match ip.proto as u8 {
            ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP => {
                let ports: [u8; 4] = ctx.load(l4)?;
                (
                    u16::from_be_bytes([ports[0], ports[1]]),
                    u16::from_be_bytes([ports[2], ports[3]]),
                )
            }
            ip_proto::ICMP => {
                // Type, code, checksum, identifier.
                let head: [u8; 6] = ctx.load(l4)?;
                let id = u16::from_be_bytes([head[4], head[5]]);
                match head[0] {
                    ICMP_ECHO_REQUEST => (id, 0),
                    ICMP_ECHO_REPLY => (0, id),
                    _ => (0, 0),
                }
            }
            _ => (0, 0),
        }
    };
    key.family = FAMILY_IPV4;
    key.protocol = ip.proto as u8;
    key.pad = [0; 2];
    key.opener_port = source_port;
    key.responder_port = destination_port;
    key.opener = AddrKey::ipv4(ip.src_addr).addr;
    key.responder = AddrKey::ipv4(ip.dst_addr).addr;
    Ok(())
}
