//! IPv4 forwarding between pods of this node: the destination is looked up in the
//! endpoints map and the frame handed straight to the destination pod with
//! `bpf_redirect_peer`: it never crosses the node's IP stack, netfilter, or a bridge.
//! A frame the sender addressed to the destination pod's MAC (an on-link neighbour, see
//! `arp`) goes as it is; one addressed to the gateway is routed: TTL decremented, MACs
//! rewritten. Anything else goes to the stack, as do Service connections when Service
//! ranges are configured (see `services`).

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::DropReason;
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    features::{hostport, route, services},
    primitives::{
        counters,
        deliver::{self, deliver, switch},
        maps,
    },
};

/// Handles an IPv4 frame that left a pod.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, eth: &EthHdr, ifindex: u32) -> Result<i32, i64> {
    if (ctx.len() as usize) < EthHdr::LEN + Ipv4Hdr::LEN {
        return Ok(counters::drop_packet(DropReason::TruncatedFrame));
    }
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    if ip.version() != 4 || ip.ihl() < Ipv4Hdr::LEN as u8 {
        return Ok(counters::drop_packet(DropReason::MalformedIpv4));
    }
    match maps::endpoint(ip.dst_addr) {
        Some(destination) => {
            if hostport::pods::reply_to_pod(ctx, &ip)? {
                // Source rewritten: deliver with the headers as they are now.
                let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
                return deliver(ctx, eth, &ip, &destination);
            }
            // A backend's reply on a Service connection: the stack undoes the DNAT.
            if services::is_reply(ctx, &ip)? {
                return Ok(deliver::to_stack(ctx));
            }
            if eth.dst_addr == destination.pod_mac {
                return Ok(switch(ctx, &destination));
            }
            deliver(ctx, eth, &ip, &destination)
        }
        None => match hostport::pods::from_pod(ctx, eth, &ip)? {
            Some(verdict) => Ok(verdict),
            // A Service (kube-proxy's DNAT is in the stack).
            None if services::to_service(ctx, &ip)? => Ok(deliver::to_stack(ctx)),
            None => route::to_uplink(ctx, eth, &ip, ifindex),
        },
    }
}
