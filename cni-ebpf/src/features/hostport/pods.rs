//! hostPort from the pods of this node, on their veth: a connection to a node address
//! and host port goes to the mapped pod ([`from_pod`]), a pod reaching its own hostPort
//! (hairpin) from [`HAIRPIN_ADDR`]; the target pod's replies get the host address and
//! port back ([`reply_to_pod`]).

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::{
    HAIRPIN_ADDR, NatKey,
    ip_proto::{TCP, UDP},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use super::{any_mapping, flow_to, host_of, lookup, outbound, remember};
use crate::{
    features::budget,
    primitives::{
        csum::{self, L4Csum},
        deliver,
        maps::{self, is_node_addr},
        packet::{self, IP_CSUM, IP_DST, IP_SRC},
    },
};

/// A pod's TCP/UDP packet for an address that is not a pod's: a connection to a node
/// address and host port goes to the mapped pod (from [`HAIRPIN_ADDR`] when that pod is
/// the sender), and a reply on a hairpin connection goes back to the pod as coming from
/// the host address and port. `Ok(None)`: neither.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, eth: &EthHdr, ip: &Ipv4Hdr) -> Result<Option<i32>, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 || !any_mapping() {
        return Ok(None);
    }
    // Checked before reading the ports: a pod's traffic to the outside pays one lookup.
    if ip.dst_addr != HAIRPIN_ADDR && !is_node_addr(ip.dst_addr) {
        return Ok(None);
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let Some(l4_csum) = L4Csum::of(proto, l4) else {
        return Ok(None);
    };
    let (src_port, dst_port, seg) = packet::ports_and_flags(ctx, proto, l4)?;
    if ip.dst_addr == HAIRPIN_ADDR {
        let flow = NatKey::new((ip.src_addr, src_port), (HAIRPIN_ADDR, dst_port), proto);
        let Some(host) = host_of(&flow, Some(&seg)) else {
            return Ok(None);
        };
        let Some(pod) = maps::endpoint(ip.src_addr) else {
            return Ok(None);
        };
        csum::set_addr(ctx, IP_SRC, IP_CSUM, ip.src_addr, host.host_addr, l4_csum)?;
        csum::set_port(ctx, l4, src_port, host.host_port, l4_csum)?;
        csum::set_addr(ctx, IP_DST, IP_CSUM, HAIRPIN_ADDR, ip.src_addr, l4_csum)?;
        let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
        return deliver::deliver(ctx, eth, &ip, &pod).map(Some);
    }
    // A node address (checked above): straight to the mappings.
    let Some(target) = lookup(proto, ip.dst_addr, dst_port) else {
        return Ok(None);
    };
    let Some(pod) = maps::endpoint(target.pod_addr) else {
        return Ok(None);
    };
    let hairpin = target.pod_addr == ip.src_addr;
    let client = if hairpin { HAIRPIN_ADDR } else { ip.src_addr };
    let flow = flow_to(&target, client, src_port, proto);
    match remember(ctx, &flow, ip.dst_addr, dst_port, &seg, false) {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(why) => return Ok(Some(budget::refuse(target.pod_addr, why))),
    }
    if hairpin {
        csum::set_addr(ctx, IP_SRC, IP_CSUM, ip.src_addr, HAIRPIN_ADDR, l4_csum)?;
    }
    csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, target.pod_addr, l4_csum)?;
    csum::set_port(ctx, l4 + 2, dst_port, target.pod_port, l4_csum)?;
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    deliver::deliver(ctx, eth, &ip, &pod).map(Some)
}

/// A pod's packet for another pod of this node: when it leaves a port some mapping
/// leads to and belongs to a hostPort connection from that pod, its source becomes the
/// host address and port. Returns whether it was rewritten. Other packets cost one
/// array read (in [`outbound`]).
#[inline(always)]
pub fn reply_to_pod(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<bool, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(false);
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let Some(l4_csum) = L4Csum::of(proto, l4) else {
        return Ok(false);
    };
    let (pod_port, remote_port, seg) = packet::ports_and_flags(ctx, proto, l4)?;
    Ok(outbound(ctx, ip, l4, l4_csum, pod_port, remote_port, &seg)?.is_some())
}
