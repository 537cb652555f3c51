//! Source NAT on an uplink's egress: a masqueraded pod's packet to a destination
//! outside the cluster ranges leaves with that uplink's address and a node port (or ICMP
//! echo identifier) taken from the configured range ([`ports`]), recorded in both NAT
//! tables. SCTP keeps its ports and protocols without ports change address alone
//! ([`ports::keep_port`]). A pod's ICMP error about a translated flow leaves as the
//! node's ([`icmp_error`]).

mod icmp_error;
mod ports;

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST, TC_ACT_OK},
    programs::TcContext,
};
use cni_ebpf_common::{
    DropReason, FlowTable, FragmentKey, NatConfig, NatCounter, NatKey, Refusal, Segment, Way,
    endpoint_flags,
    flow::{Followed, follow, opening_seq, opening_state},
    ip_proto::{ICMP, TCP, UDP},
    tcp_flags,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use self::{
    icmp_error::icmp_error,
    ports::{allocate, flow_entry, keep_port, rewrites_port},
};
use crate::{
    features::{budget, conntrack, fragments, hostport},
    primitives::{
        clock, counters,
        csum::{self, L4Csum},
        maps::{self, NAT_IN, NAT_OUT},
        packet::{self, ICMP_ECHO_REQUEST},
    },
};

/// Translates `ip`, a packet (no later fragment) leaving by an uplink whose address is
/// `node_addr`, under NAT's `config`. Fails closed: a masqueraded pod's packet whose
/// layer-4 header is cut short of what source NAT reads, or that a helper could not
/// rewrite, is dropped (`NatUnparsable`), never let out with the pod's address.
#[inline(always)]
pub fn egress(
    ctx: &TcContext,
    config: &NatConfig,
    node_addr: [u8; 4],
    ip: &Ipv4Hdr,
) -> Result<i32, i64> {
    let translated = if packet::l4_header_fits(ip) {
        translate(ctx, config, node_addr, ip)
    } else {
        Err(0)
    };
    match translated {
        Ok(verdict) => Ok(verdict),
        Err(_) if to_translate(ip) => Ok(counters::drop_packet(DropReason::NatUnparsable)),
        Err(error) => Err(error),
    }
}

fn translate(
    ctx: &TcContext,
    config: &NatConfig,
    node_addr: [u8; 4],
    ip: &Ipv4Hdr,
) -> Result<i32, i64> {
    let has_address = NatConfig::is_address(node_addr);
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    // Other protocols than TCP, UDP and ICMP have no checksum over the addresses.
    let l4_csum = L4Csum::of(ip.proto, l4).unwrap_or(L4Csum::NONE);
    // The pod-side port (or echo identifier) and where it sits.
    let (pod_port, remote_port, port_at, seg) = match ip.proto {
        TCP | UDP => {
            let (pod_port, remote_port, seg) = packet::ports_and_flags(ctx, ip.proto, l4)?;
            // A pod's reply on a hostPort connection leaves with the host address and
            // port.
            if let Some(host_addr) =
                hostport::outbound(ctx, ip, l4, l4_csum, pod_port, remote_port, &seg)?
            {
                fragments::left(ip, host_addr);
                return Ok(TC_ACT_OK);
            }
            (pod_port, remote_port, l4, seg)
        }
        ICMP => match ctx.load::<u8>(l4)? {
            // Only echo requests open flows.
            ICMP_ECHO_REQUEST => {
                let id: [u8; 2] = ctx.load(l4 + 4)?;
                (u16::from_be_bytes(id), 0, l4 + 4, Segment::flags(0))
            }
            icmp_type if packet::is_icmp_error(icmp_type) => {
                return icmp_error(ctx, ip, l4, config, has_address);
            }
            // Other ICMP from a pod (an echo reply to a host that reached it) stays as it
            // is.
            _ => return Ok(TC_ACT_OK),
        },
        // DCCP and UDP-Lite, translated as UDP is; SCTP keeps its ports; protocols
        // without ports (GRE, ESP, IP in IP...) change address alone (see `keep_port`).
        _ => match packet::flow_ports(ctx, ip.proto, l4)? {
            Some((pod_port, remote_port)) => (pod_port, remote_port, l4, Segment::flags(0)),
            None => return Ok(TC_ACT_OK),
        },
    };
    let key = NatKey::new(
        (ip.src_addr, pod_port),
        (ip.dst_addr, remote_port),
        ip.proto as u8,
    );
    // A flow in the table was found to need translation when it began: its packets
    // skip the endpoint and cluster-range lookups (two more maps to touch per packet).
    let found = NAT_OUT.get_ptr_mut(&key);
    // A packet that needs no translation (for the cluster's ranges, or not a
    // masqueraded pod's) and has no flow in the table leaves as it is, without a
    // clock read.
    if found.is_none() && !to_translate(ip) {
        return Ok(TC_ACT_OK);
    }
    let now = clock::now_ns();
    let existing = found.filter(|entry| {
        // SAFETY: a pointer into the map value, valid for the program run.
        !conntrack::expired(unsafe { &**entry }, key.proto, config, now)
    });
    let node_port = match existing {
        Some(_) if !has_address => {
            return Ok(counters::drop_packet(DropReason::NatNoAddress));
        }
        Some(slot) => {
            // SAFETY: as above; copied at once.
            let entry = unsafe { *slot };
            let followed = follow(&entry, key.proto, &seg, Way::Out, false, now);
            // A flow goes on from its uplink's address as it is now (see
            // `Nat::follow_uplink` in the daemon).
            // A side first seen, or a held SYN's note, goes to the twin at once.
            if followed.state != entry.state
                || followed.seq_seen != entry.seq_seen
                || entry.node_addr != node_addr
                || now.saturating_sub(entry.last_seen_ns) > conntrack::REFRESH_NS
            {
                let reverse = key.reverse(entry.node_port);
                let packet = (Way::Out, seg.flags);
                if conntrack::refresh(slot, &NAT_IN, &reverse, now, &followed, packet, node_addr) {
                    budget::port_added(&key);
                }
            } else if followed.changes_seq(&entry) {
                conntrack::mark(slot, &followed);
            }
            entry.node_port
        }
        None => {
            // A flow whose entry expired is checked as a new one here (one without an
            // entry was checked above).
            if found.is_some() && !to_translate(ip) {
                return Ok(TC_ACT_OK);
            }
            // An answer on a flow a host outside opened to the pod's own address (a
            // pod's SYN opens a connection of its own: no lookup on that hot path).
            let syn = key.proto == TCP && tcp_flags::opens(seg.flags);
            if !syn && conntrack::opened_from_outside(&key, &seg, config, now) {
                fragments::left(ip, ip.src_addr);
                return Ok(TC_ACT_OK);
            }
            // No address to give it: dropped before a port is taken (see
            // `NatConfig::NO_ADDRESS`).
            if !has_address {
                return Ok(counters::drop_packet(DropReason::NatNoAddress));
            }
            let (seq_seen, seq) = opening_seq(key.proto, &seg, now);
            let opening = Followed {
                state: opening_state(key.proto, seg.flags),
                seq_seen,
                seq,
            };
            // A flow whose expired entry is still there is counted already; its pod's
            // budget of ports toward the destination is the port search's.
            if found.is_none() && !budget::within(key.pod_addr, FlowTable::Out, config) {
                return Ok(budget::refuse(key.pod_addr, Refusal::FlowBudget));
            }
            let port = if rewrites_port(key.proto) {
                allocate(&key, config, node_addr, now, &opening)
            } else {
                keep_port(&key, config, node_addr, now)
            };
            let port = match port {
                Ok(port) => port,
                Err(why) => return Ok(budget::refuse(key.pod_addr, why)),
            };
            let entry = flow_entry(&key, port, node_addr, now, &opening);
            match found {
                // The flow's expired entry (a pod reusing a port after a close) is
                // rewritten in place: no room taken, none freed.
                // SAFETY: a pointer into the map value, valid for the program run.
                Some(slot) => unsafe { *slot = entry },
                None => match NAT_OUT.insert(&key, &entry, BPF_NOEXIST as u64) {
                    Ok(()) => budget::added(key.pod_addr, FlowTable::Out),
                    Err(error) if budget::is_full(error) => {
                        // The port claimed goes back: no half of a flow stays.
                        if NAT_IN.remove(&key.reverse(port)).is_ok() {
                            budget::port_removed(key.pod_addr, &key);
                        }
                        return Ok(budget::refuse(key.pod_addr, Refusal::TableFull));
                    }
                    // A packet of the same flow on another CPU wrote it meanwhile:
                    // this one's port stands.
                    Err(_) => {
                        let _ = NAT_OUT.insert(&key, &entry, BPF_ANY as u64);
                    }
                },
            }
            counters::nat(NatCounter::NewFlows);
            port
        }
    };

    csum::set_source(ctx, ip, node_addr, l4_csum)?;
    if node_port != pod_port {
        csum::set_port(ctx, port_at, pod_port, node_port, l4_csum)?;
    }
    fragments::left(ip, node_addr);
    counters::nat(NatCounter::TranslatedOut);
    Ok(TC_ACT_OK)
}

/// A fragment after the first of a pod's datagram (no ports): it leaves with the
/// source its first fragment was given. Without a record (see `fragments`) a fragment
/// to translate is dropped, as it would leak the pod's address.
#[inline(always)]
pub fn later_fragment(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<i32, i64> {
    match fragments::first_of(ip, FragmentKey::LEAVING) {
        Some(first) => {
            csum::set_source(ctx, ip, first.addr, L4Csum::NONE)?;
            counters::nat(NatCounter::FragmentsOut);
            Ok(TC_ACT_OK)
        }
        None if to_translate(ip) => Ok(counters::drop_packet(DropReason::NatFragment)),
        None => Ok(TC_ACT_OK),
    }
}

/// Whether `ip` is a masqueraded pod's packet for outside the cluster ranges.
#[inline(always)]
fn to_translate(ip: &Ipv4Hdr) -> bool {
    maps::endpoint(ip.src_addr).is_some_and(|pod| pod.flags & endpoint_flags::MASQUERADE != 0)
        && !maps::in_cluster(ip.dst_addr)
}
