//! Reverse NAT on an uplink's ingress: replies to translated flows (TCP, UDP, ICMP echo
//! replies) and ICMP errors about them or about hostPort replies (destination
//! unreachable, fragmentation needed, time exceeded) get the pod's address and port back
//! and go straight into the pod, without crossing the node's stack.

mod icmp_error;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use cni_ebpf_common::{
    DropReason, FragmentKey, NatConfig, NatCounter, NatKey, NatReverseKey, Refusal, Segment,
    ip_proto::{DCCP, ICMP, TCP, UDP, UDPLITE},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use self::icmp_error::icmp_error;
use crate::{
    features::{
        budget,
        conntrack::{self, live_entry},
        fragments, hostport, services, underlay,
    },
    primitives::{
        clock, counters,
        csum::{self, L4Csum},
        deliver, maps,
        packet::{self, ICMP_ECHO_REPLY, IP_CSUM, IP_DST},
    },
};

/// Translates back `ip` (no later fragment), arriving in `eth` on an uplink whose
/// address is `node_addr`, under NAT's `config`. Inlined: its five arguments and its
/// result would not fit the registers of a BPF call.
#[inline(always)]
pub fn ingress(
    ctx: &TcContext,
    config: &NatConfig,
    node_addr: [u8; 4],
    eth: &EthHdr,
    ip: &Ipv4Hdr,
) -> Result<i32, i64> {
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let proto = ip.proto as u8;
    // Other protocols than TCP, UDP and ICMP have no checksum over the addresses.
    let l4_csum = L4Csum::of(proto, l4).unwrap_or(L4Csum::NONE);
    // Without a node address (`NatConfig::NO_ADDRESS`, the broadcast address) nothing
    // arrives for translated flows.
    if ip.dst_addr != node_addr || !NatConfig::is_address(node_addr) {
        // A pod's own address (a routed pod network): the stack routes it to the pod,
        // whose answers must keep that address. From inside the cluster ranges (another
        // node's pod) nothing is noted: answers there are never translated.
        if let Some(pod) = maps::endpoint(ip.dst_addr) {
            // Another node's pod over native routes (`--routing native`: no overlay):
            // straight into the pod, as the overlay delivers what it decapsulates.
            // Asked first: other nodes' pod ranges lie inside the cluster ranges.
            // A reply of a Service connection the stack translated goes back through
            // it, which undoes the translation.
            if maps::overlay_config().is_none() && maps::remote_node(ip.src_addr).is_some() {
                if services::is_translated_reply(ctx, ip) {
                    return Ok(TC_ACT_OK);
                }
                // Only a frame tied to the node whose pods it claims to come from, and
                // with `--underlay-trust relaxed`: else the node's stack (its netfilter)
                // takes it.
                let ifindex = packet::ifindex(ctx);
                if underlay::strict()
                    || underlay::claim(ctx, eth, ifindex, node_addr, ip.src_addr)
                        != underlay::Claim::Tied
                {
                    counters::nat(NatCounter::UnderlayToStack);
                    return Ok(TC_ACT_OK);
                }
                // The fragments after a first one follow it into the pod: the stack,
                // reassembling for conntrack, would wait for a first fragment forever.
                fragments::arrived(ip, ip.dst_addr, ip.ttl > 1);
                return deliver::deliver(ctx, eth, ip, &pod);
            }
            if !maps::in_cluster(ip.src_addr) {
                if let Err(why) = remember_inbound(ctx, ip, l4, config)? {
                    return Ok(budget::refuse(ip.dst_addr, why));
                }
            }
            return Ok(TC_ACT_OK);
        }
        // A pods' gateway is the node's for its own pods only.
        if maps::is_gateway(ip.dst_addr) {
            return Ok(counters::drop_packet(DropReason::GatewayFromOutside));
        }
        // Another address of the node (or not ours at all): only hostPorts apply.
        if proto == TCP || proto == UDP {
            return host_port_or_stack(ctx, eth, ip, l4, l4_csum);
        }
        return Ok(TC_ACT_OK);
    }
    let pod_addr = match proto {
        TCP | UDP | DCCP | UDPLITE => {
            let (remote_port, node_port, seg) = packet::ports_and_flags(ctx, proto, l4)?;
            let key = reverse(ip.src_addr, node_port, remote_port, proto);
            let Some(entry) = live_entry(&key, config, node_addr, Some(seg)) else {
                // Not a reply to a translated flow: maybe a connection to a hostPort.
                return host_port_or_stack(ctx, eth, ip, l4, l4_csum);
            };
            counters::nat(NatCounter::TranslatedIn);
            // Delivered into the pod (TTL decremented in the same store as the address),
            // or, when the pod is gone, the TTL runs out or the flow is a Service
            // connection (the stack undoes its DNAT), left to the stack translated.
            let pod = maps::endpoint(entry.pod_addr).filter(|_| {
                ip.ttl > 1
                    && !services::translated(
                        (entry.pod_addr, entry.pod_port),
                        (ip.src_addr, remote_port),
                        proto,
                    )
            });
            let ttl = if pod.is_some() { ip.ttl - 1 } else { ip.ttl };
            csum::set_destination(ctx, ip, entry.pod_addr, ttl, l4_csum)?;
            csum::set_port(ctx, l4 + 2, node_port, entry.pod_port, l4_csum)?;
            fragments::arrived(ip, entry.pod_addr, pod.is_some());
            return match pod {
                Some(pod) => deliver::redirect(ctx, eth, &pod),
                None => Ok(TC_ACT_OK),
            };
        }
        ICMP => match ctx.load::<u8>(l4)? {
            ICMP_ECHO_REPLY => {
                let id = u16::from_be_bytes(ctx.load(l4 + 4)?);
                let key = reverse(ip.src_addr, id, 0, ICMP);
                let Some(entry) = live_entry(&key, config, node_addr, Some(Segment::flags(0)))
                else {
                    return Ok(TC_ACT_OK);
                };
                csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, entry.pod_addr, l4_csum)?;
                csum::set_port(ctx, l4 + 4, id, entry.pod_port, l4_csum)?;
                counters::nat(NatCounter::TranslatedIn);
                entry.pod_addr
            }
            icmp_type if packet::is_icmp_error(icmp_type) => {
                let Some(pod_addr) = icmp_error(ctx, ip, l4, config, node_addr)? else {
                    return Ok(TC_ACT_OK);
                };
                counters::nat(NatCounter::IcmpErrorsIn);
                pod_addr
            }
            _ => return Ok(TC_ACT_OK),
        },
        // SCTP, its ports kept, and protocols without ports: the address alone.
        _ => {
            let Some((remote_port, node_port)) = packet::flow_ports(ctx, proto, l4)? else {
                return Ok(TC_ACT_OK);
            };
            let key = reverse(ip.src_addr, node_port, remote_port, proto);
            let Some(entry) = live_entry(&key, config, node_addr, Some(Segment::flags(0))) else {
                return Ok(TC_ACT_OK);
            };
            csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, entry.pod_addr, l4_csum)?;
            counters::nat(NatCounter::TranslatedIn);
            entry.pod_addr
        }
    };
    let pod = maps::endpoint(pod_addr);
    // `deliver` hands the packet over above TTL 1.
    fragments::arrived(ip, pod_addr, pod.is_some() && ip.ttl > 1);
    let Some(pod) = pod else {
        // The pod is gone: the stack answers (or drops) as for any unknown address.
        return Ok(TC_ACT_OK);
    };
    // Headers as they are now (addresses rewritten), for delivery.
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    deliver::deliver(ctx, eth, &ip, &pod)
}

/// A fragment after the first of a datagram (no ports): it gets the destination its
/// first fragment was given and goes the same way, into the pod or to the stack.
/// Without a record (see `fragments`) it is the stack's.
#[inline(always)]
pub fn later_fragment(ctx: &TcContext, eth: &EthHdr, ip: &Ipv4Hdr) -> Result<i32, i64> {
    let Some(first) = fragments::first_of(ip, FragmentKey::ARRIVING) else {
        return Ok(TC_ACT_OK);
    };
    let pod = maps::endpoint(first.addr).filter(|_| first.deliver != 0 && ip.ttl > 1);
    let ttl = if pod.is_some() { ip.ttl - 1 } else { ip.ttl };
    csum::set_destination(ctx, ip, first.addr, ttl, L4Csum::NONE)?;
    counters::nat(NatCounter::FragmentsIn);
    match pod {
        Some(pod) => deliver::redirect(ctx, eth, &pod),
        None => Ok(TC_ACT_OK),
    }
}

/// A TCP or UDP packet that is no reply to a translated flow: to the pod behind a
/// hostPort, else to the stack (a Service's client remembered on the way, see
/// `services::from_outside`).
#[inline(always)]
fn host_port_or_stack(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    l4: usize,
    l4_csum: L4Csum,
) -> Result<i32, i64> {
    if let Some(delivered) = hostport::uplink::inbound(ctx, eth, ip, l4, l4_csum)? {
        return Ok(delivered);
    }
    if services::from_outside(ctx, ip)? {
        return Ok(TC_ACT_SHOT as i32);
    }
    Ok(TC_ACT_OK)
}

/// Notes the flow of `ip`, arriving from outside for a pod's own address (see
/// `conntrack::opened_from_outside`); the refusal of a new note the pod has no room
/// for. ICMP needs nothing: a pod's echo replies and errors open no translated flow.
#[inline(always)]
fn remember_inbound(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    config: &NatConfig,
) -> Result<Result<(), Refusal>, i64> {
    let proto = ip.proto as u8;
    let Some((remote_port, pod_port)) = packet::flow_ports(ctx, proto, l4)? else {
        return Ok(Ok(()));
    };
    let seg = if proto == TCP {
        packet::ports_and_flags(ctx, proto, l4)?.2
    } else {
        Segment::flags(0)
    };
    let flow = NatKey::new((ip.dst_addr, pod_port), (ip.src_addr, remote_port), proto);
    Ok(conntrack::saw_inbound(&flow, &seg, config, clock::now_ns()))
}

/// The `NAT_IN` key of a packet from `remote_addr`:`remote_port` to `node_port`.
#[inline(always)]
fn reverse(remote_addr: [u8; 4], node_port: u16, remote_port: u16, proto: u8) -> NatReverseKey {
    NatReverseKey {
        remote_addr,
        node_port,
        remote_port,
        proto,
        pad: [0, 0, 0],
    }
}
