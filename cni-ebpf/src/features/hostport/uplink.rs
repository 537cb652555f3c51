//! hostPort from other hosts, on the uplink's ingress: a connection to a mapped node
//! address and port is rewritten to the pod and delivered ([`inbound`]); the pod's
//! replies leave through `hostport::outbound` on the uplink's egress, and an ICMP error
//! quoting one finds the pod through [`quoted`].

use aya_ebpf::programs::TcContext;
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use super::{any_mapping, flow_to, host_of, mapping, remember};
use crate::{
    features::{budget, fragments},
    primitives::{
        csum::{self, L4Csum},
        deliver, maps,
        packet::{self, IP_CSUM, IP_DST},
    },
};

/// A TCP/UDP packet arriving on the uplink for a mapped host port: rewritten to the pod
/// and delivered. `Ok(None)` when no mapping matches.
#[inline(always)]
pub fn inbound(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    l4: usize,
    l4_csum: L4Csum,
) -> Result<Option<i32>, i64> {
    // A node without mappings: an array read, no header read or hash lookup.
    if !any_mapping() {
        return Ok(None);
    }
    let proto = ip.proto as u8;
    let (client_port, host_port, seg) = packet::ports_and_flags(ctx, proto, l4)?;
    let Some(target) = mapping(proto, ip.dst_addr, host_port) else {
        return Ok(None);
    };
    let Some(pod) = maps::endpoint(target.pod_addr) else {
        return Ok(None);
    };
    let flow = flow_to(&target, ip.src_addr, client_port, proto);
    match remember(ctx, &flow, ip.dst_addr, host_port, &seg, true) {
        Ok(true) => {}
        // The answer to a node socket on the same port: the stack's.
        Ok(false) => return Ok(None),
        Err(why) => return Ok(Some(budget::refuse(target.pod_addr, why))),
    }
    csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, target.pod_addr, l4_csum)?;
    csum::set_port(ctx, l4 + 2, host_port, target.pod_port, l4_csum)?;
    // The fragments after a first one follow it (`deliver` hands it over above TTL 1).
    fragments::arrived(ip, target.pod_addr, ip.ttl > 1);
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    deliver::deliver(ctx, eth, &ip, &pod).map(Some)
}

/// The pod address and port behind a hostPort connection, from what an ICMP error
/// quotes of the reply that left the node: its source (`host_addr`:`host_port`) and
/// destination (the client). `None` when no such connection is known.
#[inline(always)]
pub fn quoted(
    proto: u8,
    host_addr: [u8; 4],
    host_port: u16,
    client_addr: [u8; 4],
    client_port: u16,
) -> Option<([u8; 4], u16)> {
    let target = mapping(proto, host_addr, host_port)?;
    let flow = flow_to(&target, client_addr, client_port, proto);
    let host = host_of(&flow, None)?;
    (host.host_addr == host_addr && host.host_port == host_port)
        .then_some((target.pod_addr, target.pod_port))
}
