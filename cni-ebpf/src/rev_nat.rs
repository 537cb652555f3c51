//! Reverse NAT on an uplink's ingress: replies to translated flows (TCP, UDP, ICMP echo
//! replies) and ICMP errors about them or about hostPort replies (destination
//! unreachable, fragmentation needed, time exceeded) get the pod's address and port back
//! and go straight into the pod, without crossing the node's stack.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use cni_ebpf_common::{
    FragmentKey, NatConfig, NatCounter, NatEntry, NatKey, NatReverseKey, Way, flow,
    ip_proto::{DCCP, ICMP, TCP, UDP, UDPLITE},
    udp_state,
};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::{
    conntrack, fragments, hostport,
    primitives::{
        clock, counters,
        csum::{self, IcmpErrorSide, L4Csum},
        deliver,
        maps::{self, NAT_IN, NAT_OUT},
        packet::{self, EthIpv4, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IP_CSUM, IP_DST},
    },
    services,
};

/// Translates back a packet arriving on the uplink `ifindex`.
pub fn ingress(ctx: &TcContext, ifindex: u32) -> Result<i32, i64> {
    // Parsed inline: a helper returning (config, eth, ip) made LLVM read an unset
    // register on its early-return path, which the verifier refuses.
    let Some(config) = maps::nat_config() else {
        return Ok(TC_ACT_OK);
    };
    let Some(node_addr) = maps::uplink_addr(ifindex) else {
        return Ok(TC_ACT_OK);
    };
    // Ethernet and IPv4 headers in one read (a frame too short for both is no IPv4
    // packet we translate: the error lets it go on).
    let EthIpv4 { eth, ip } = ctx.load(0)?;
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return Ok(TC_ACT_OK);
    }
    if fragments::is_later(&ip) {
        return later_fragment(ctx, &eth, &ip);
    }
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
        if maps::endpoint(ip.dst_addr).is_some() {
            if !maps::in_cluster(ip.src_addr) {
                remember_inbound(ctx, &ip, l4, &config)?;
            }
            return Ok(TC_ACT_OK);
        }
        // Another address of the node (or not ours at all): only hostPorts apply.
        if proto == TCP || proto == UDP {
            return host_port_or_stack(ctx, &eth, &ip, l4, l4_csum);
        }
        return Ok(TC_ACT_OK);
    }
    let pod_addr = match proto {
        TCP | UDP | DCCP | UDPLITE => {
            let (remote_port, node_port, flags) = packet::ports_and_flags(ctx, proto, l4)?;
            let key = reverse(ip.src_addr, node_port, remote_port, proto);
            let Some(entry) = live_entry(&key, &config, node_addr, Some(flags)) else {
                // Not a reply to a translated flow: maybe a connection to a hostPort.
                return host_port_or_stack(ctx, &eth, &ip, l4, l4_csum);
            };
            counters::nat(NatCounter::TranslatedIn);
            // Delivered into the pod (TTL decremented in the same store as the address),
            // or, when the pod is gone, the TTL runs out or the flow is a Service
            // connection (the stack undoes its DNAT), left to the stack translated.
            let pod = maps::endpoint(entry.pod_addr).filter(|_| {
                ip.ttl > 1 && !services::is_client(entry.pod_addr, entry.pod_port, proto)
            });
            let ttl = if pod.is_some() { ip.ttl - 1 } else { ip.ttl };
            csum::set_destination(ctx, &ip, entry.pod_addr, ttl, l4_csum)?;
            csum::set_port(ctx, l4 + 2, node_port, entry.pod_port, l4_csum)?;
            fragments::arrived(&ip, entry.pod_addr, pod.is_some());
            return match pod {
                Some(pod) => deliver::redirect(ctx, &eth, &pod),
                None => Ok(TC_ACT_OK),
            };
        }
        ICMP => match ctx.load::<u8>(l4)? {
            ICMP_ECHO_REPLY => {
                let id = u16::from_be_bytes(ctx.load(l4 + 4)?);
                let key = reverse(ip.src_addr, id, 0, ICMP);
                let Some(entry) = live_entry(&key, &config, node_addr, Some(0)) else {
                    return Ok(TC_ACT_OK);
                };
                csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, entry.pod_addr, l4_csum)?;
                csum::set_port(ctx, l4 + 4, id, entry.pod_port, l4_csum)?;
                counters::nat(NatCounter::TranslatedIn);
                entry.pod_addr
            }
            icmp_type if packet::is_icmp_error(icmp_type) => {
                let Some(pod_addr) = icmp_error(ctx, &ip, l4, &config, node_addr)? else {
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
            let Some(entry) = live_entry(&key, &config, node_addr, Some(0)) else {
                return Ok(TC_ACT_OK);
            };
            csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, entry.pod_addr, l4_csum)?;
            counters::nat(NatCounter::TranslatedIn);
            entry.pod_addr
        }
    };
    let pod = maps::endpoint(pod_addr);
    // `deliver` hands the packet over above TTL 1.
    fragments::arrived(&ip, pod_addr, pod.is_some() && ip.ttl > 1);
    let Some(pod) = pod else {
        // The pod is gone: the stack answers (or drops) as for any unknown address.
        return Ok(TC_ACT_OK);
    };
    // Headers as they are now (addresses rewritten), for delivery.
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    deliver::deliver(ctx, &eth, &ip, &pod)
}

/// A fragment after the first of a datagram (no ports): it gets the destination its
/// first fragment was given and goes the same way, into the pod or to the stack.
/// Without a record (see `fragments`) it is the stack's.
#[inline(always)]
fn later_fragment(ctx: &TcContext, eth: &EthHdr, ip: &Ipv4Hdr) -> Result<i32, i64> {
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
    if let Some(delivered) = hostport::inbound(ctx, eth, ip, l4, l4_csum)? {
        return Ok(delivered);
    }
    services::from_outside(ctx, ip)?;
    Ok(TC_ACT_OK)
}

/// Notes the flow of `ip`, arriving from outside for a pod's own address (see
/// `conntrack::opened_from_outside`). ICMP needs nothing: a pod's echo replies and errors
/// open no translated flow.
#[inline(always)]
fn remember_inbound(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    config: &NatConfig,
) -> Result<(), i64> {
    let proto = ip.proto as u8;
    let Some((remote_port, pod_port)) = packet::flow_ports(ctx, proto, l4)? else {
        return Ok(());
    };
    let flags = if proto == TCP {
        packet::ports_and_flags(ctx, proto, l4)?.2
    } else {
        0
    };
    let flow = NatKey::new((ip.dst_addr, pod_port), (ip.src_addr, remote_port), proto);
    conntrack::saw_inbound(&flow, flags, config, clock::now_ns());
    Ok(())
}

fn reverse(remote_addr: [u8; 4], node_port: u16, remote_port: u16, proto: u8) -> NatReverseKey {
    NatReverseKey {
        remote_addr,
        node_port,
        remote_port,
        proto,
        pad: [0, 0, 0],
    }
}

/// The live entry of the flow to `node_addr` a packet belongs to, its timestamp and
/// state refreshed: `reply` holds the TCP flags (0 for other protocols) of a reply of
/// the flow, and is `None` for an ICMP error about it, which changes no state (as
/// conntrack's related packets do not). A flow that left with another address (by
/// another uplink) is not this packet's; an entry without one (written by an earlier
/// datapath) matches any.
#[inline(always)]
fn live_entry(
    key: &NatReverseKey,
    config: &NatConfig,
    node_addr: [u8; 4],
    reply: Option<u8>,
) -> Option<NatEntry> {
    let now = clock::now_ns();
    let slot = NAT_IN.get_ptr_mut(key)?;
    // SAFETY: a pointer into the map value, valid for the program run; copied at once.
    let entry = unsafe { *slot };
    if entry.node_addr != node_addr && entry.node_addr != [0; 4] {
        return None;
    }
    if conntrack::expired(&entry, key.proto, config, now) {
        return None;
    }
    let state = match (key.proto, reply) {
        (_, None) => entry.state,
        (TCP, Some(tcp_flags)) => flow::next_state(entry.state, tcp_flags, Way::In),
        (ICMP, Some(_)) => entry.state,
        // A reply makes a UDP (or SCTP, GRE...) flow a stream (the longer timeout).
        (_, Some(_)) => udp_state::REPLIED,
    };
    if state != entry.state || now.saturating_sub(entry.last_seen_ns) > conntrack::REFRESH_NS {
        let forward = key.forward(&entry);
        conntrack::refresh(slot, &NAT_OUT, &forward, now, state, node_addr);
    }
    Some(entry)
}

/// An ICMP error about a translated flow, or about a pod's reply on a hostPort
/// connection: the outer destination and the quoted (inner) source are given back to
/// the pod, with the outer IP, inner IP and ICMP checksums fixed. Returns the pod's
/// address, or `None` when the error is not about one of those.
#[inline(always)]
fn icmp_error(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    config: &NatConfig,
    node_addr: [u8; 4],
) -> Result<Option<[u8; 4]>, i64> {
    let inner = l4 + 8;
    let inner_ip: Ipv4Hdr = ctx.load(inner)?;
    if inner_ip.frag_offset() != 0 {
        return Ok(None);
    }
    let inner_l4 = inner + inner_ip.ihl() as usize;
    let inner_proto = inner_ip.proto as u8;
    // Where the node port (or echo identifier) sits in the quoted header, and the
    // flow's key. Protocols without ports have none to rewrite (a pod's GRE or ESP
    // tunnel told the path's MTU).
    let (port_at, key) = if inner_proto == ICMP {
        if ctx.load::<u8>(inner_l4)? != ICMP_ECHO_REQUEST {
            return Ok(None);
        }
        let id = u16::from_be_bytes(ctx.load(inner_l4 + 4)?);
        (inner_l4 + 4, reverse(inner_ip.dst_addr, id, 0, ICMP))
    } else {
        let Some((node_port, remote_port)) = packet::flow_ports(ctx, inner_proto, inner_l4)? else {
            return Ok(None);
        };
        let key = reverse(inner_ip.dst_addr, node_port, remote_port, inner_proto);
        (inner_l4, key)
    };
    // A translated flow of a pod's, else a pod's reply on a hostPort connection (PMTU
    // discovery must reach the pod serving it).
    let nat = if inner_ip.src_addr == node_addr {
        live_entry(&key, config, node_addr, None)
    } else {
        None
    };
    let (pod_addr, pod_port) = match nat {
        Some(entry) => (entry.pod_addr, entry.pod_port),
        None if inner_proto == TCP || inner_proto == UDP => {
            let quoted = hostport::quoted(
                inner_proto,
                inner_ip.src_addr,
                key.node_port,
                inner_ip.dst_addr,
                key.remote_port,
            );
            let Some(found) = quoted else {
                return Ok(None);
            };
            found
        }
        None => return Ok(None),
    };
    let node_side = IcmpErrorSide {
        icmp: l4,
        inner,
        outer_at: IP_DST,
        outer_addr: ip.dst_addr,
        inner_at: inner + 12,
        inner_addr: inner_ip.src_addr,
        port_at,
        port: key.node_port,
    };
    csum::translate_icmp_error(ctx, &node_side, pod_addr, pod_port)?;
    Ok(Some(pod_addr))
}
