//! The TC entry on a pod's host-side veth, `from_pod`: its ingress is traffic leaving
//! the pod. The same program runs on a netkit pair's peer hook, inside the pod's own
//! transmit (`packet::at_tc_ingress` tells the two apart where it matters). Frames with a VLAN tag, of any EtherType but IPv4 and ARP (IPv6 is not a
//! supported family: a pod's Router Advertisement never reaches the node), and IPv4 or
//! ARP not sent as the pod itself, are dropped first (`pod_source`). ARP goes to the responder (`arp`). IPv4 for another pod of this node is
//! handed straight to it with `bpf_redirect_peer`, never crossing the node's IP stack,
//! netfilter or a bridge: as it is when the sender addressed it to that pod's MAC (an
//! on-link neighbour, see `arp`), routed (TTL decremented, MACs rewritten) when it was
//! sent to the gateway. hostPort connections and their replies, Service connections,
//! traffic for other nodes' pods (the overlay) and traffic for outside the node take
//! their features' ways (answers on connections from outside that came in through the
//! stack go back through it); any other IPv4 goes to the stack.
//!
//! NetworkPolicy judges a pod's packets as they leave it (here) and as they enter a pod
//! (`deliver`, and `to_pod` for what the node's stack delivers). `to_pod` runs on the
//! veth's egress (the shared block's egress, bound at ADD with the ingress: no grace
//! period) and on a netkit pair's primary hook. What the datapath delivers into a pod
//! from TC ingress it counts itself (`deliver`); what the stack sends, and what it
//! delivers from a netkit hook, is in the host veth's kernel TX counters, which the
//! daemon adds in `ebpf-cnid endpoints`.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use cni_ebpf_common::{DropReason, endpoint_flags};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::{
    features::{
        arp, conntrack, hostport, overlay, pod_source, pod_tunnel, rate, route,
        services::{self, Service},
    },
    primitives::{
        counters::{self, Direction},
        deliver::{self, deliver, switch},
        maps,
        packet::{self, EthIpv4},
        policy::{self, Role},
    },
};

#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    match try_from_pod(&ctx) {
        Ok(verdict) => verdict,
        // A helper failed on a frame we could parse: the stack decides, we never drop
        // silently.
        Err(_) => TC_ACT_OK,
    }
}

fn try_from_pod(ctx: &TcContext) -> Result<i32, i64> {
    let ifindex = packet::ifindex(ctx);
    counters::endpoint(ifindex, Direction::FromPod, ctx.len());
    if (ctx.len() as usize) < EthHdr::LEN {
        return Ok(counters::drop_packet(DropReason::TruncatedFrame));
    }
    if (ctx.len() as usize) < EthHdr::LEN + Ipv4Hdr::LEN {
        return short_frame(ctx);
    }
    // The Ethernet header and the IPv4 header's room after it, in one read (what
    // follows is read as IPv4 only for an IPv4 frame).
    let EthIpv4 { eth, ip } = ctx.load(0)?;
    if packet::vlan_tagged(ctx, &eth) {
        return Ok(counters::drop_packet(DropReason::VlanTagged));
    }
    if eth.ether_type == EtherType::Ipv4 as u16 {
        ipv4(ctx, &eth, &ip, ifindex)
    } else if eth.ether_type == EtherType::Arp as u16 {
        arp::from_pod(ctx, &eth, ifindex)
    } else {
        Ok(counters::drop_packet(DropReason::PodEtherType))
    }
}

/// A frame too short for an IPv4 header (an ARP packet is longer still): dropped, as
/// tagged, truncated IPv4 or ARP, or of an EtherType the datapath does not handle. Its own
/// path, so that every other frame reads both headers in one load (an `Option` for the
/// IPv4 header instead has LLVM read an unset register, which 6.1's verifier refuses).
#[inline(always)]
fn short_frame(ctx: &TcContext) -> Result<i32, i64> {
    let eth: EthHdr = ctx.load(0)?;
    if packet::vlan_tagged(ctx, &eth) {
        return Ok(counters::drop_packet(DropReason::VlanTagged));
    }
    if eth.ether_type == EtherType::Ipv4 as u16 || eth.ether_type == EtherType::Arp as u16 {
        return Ok(counters::drop_packet(DropReason::TruncatedFrame));
    }
    Ok(counters::drop_packet(DropReason::PodEtherType))
}

/// An IPv4 frame (headers `eth`, `ip`) that left the pod behind the host veth `ifindex`.
#[inline(always)]
fn ipv4(ctx: &TcContext, eth: &EthHdr, ip: &Ipv4Hdr, ifindex: u32) -> Result<i32, i64> {
    if !packet::ipv4_well_formed(ip, ctx.len()) {
        return Ok(counters::drop_packet(DropReason::MalformedIpv4));
    }
    let pod = match pod_source::ipv4(ifindex, eth, ip.src_addr) {
        Ok(pod) => pod,
        Err(reason) => return Ok(counters::drop_packet(reason)),
    };
    // Its egress limit, held here whatever way the pod sent the packet.
    if pod.flags & endpoint_flags::LIMITED != 0 && !rate::admit(ifindex, ctx.len()) {
        return Ok(counters::drop_packet(DropReason::PodRateLimited));
    }
    if pod_tunnel::into_node(ctx, ip) {
        return Ok(counters::drop_packet(DropReason::PodTunnel));
    }
    if !policy::sender_admits(ctx, ifindex, ip.dst_addr) {
        return Ok(TC_ACT_SHOT as i32);
    }
    match maps::endpoint(ip.dst_addr) {
        Some(destination) => {
            if hostport::pods::reply_to_pod(ctx, ip)? {
                // Source rewritten: deliver with the headers as they are now.
                let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
                return deliver(ctx, eth, &ip, &destination);
            }
            // A backend's reply on a Service connection: the stack undoes the DNAT.
            if services::is_reply(ctx, ip) {
                return Ok(deliver::to_stack(ctx));
            }
            if eth.dst_addr == destination.pod_mac {
                return Ok(switch(ctx, &destination));
            }
            deliver(ctx, eth, ip, &destination)
        }
        None => match hostport::pods::from_pod(ctx, eth, ip)? {
            Some(verdict) => Ok(verdict),
            // A Service (kube-proxy's DNAT is in the stack).
            None => match services::to_service(ctx, ip)? {
                Service::ToStack => Ok(deliver::to_stack(ctx)),
                Service::Refused => Ok(TC_ACT_SHOT as i32),
                // Another node's pod, through the overlay (`--routing vxlan`).
                Service::No => match overlay::to_remote(ctx, eth, ip, ifindex)? {
                    Some(verdict) => Ok(verdict),
                    // An answer on a connection from outside that came in through the
                    // stack.
                    None if conntrack::answers_inbound(ctx, ip) => Ok(deliver::to_stack(ctx)),
                    None => route::to_uplink(ctx, eth, ip, ifindex),
                },
            },
        },
    }
}

/// What the node's stack hands to a pod (a Service connection it translated, the node's
/// own traffic, what the datapath sent through the veth's qdisc): judged by the
/// policies of the pod of this node that sent it, if one did, and of the pod it is for,
/// unless the node itself sent it (kubelet's probes: the stack drops a packet from
/// outside that claims a node address). Anything but IPv4 goes on.
#[classifier]
pub fn to_pod(ctx: TcContext) -> i32 {
    match try_to_pod(&ctx) {
        Ok(verdict) => verdict,
        Err(_) => TC_ACT_OK,
    }
}

fn try_to_pod(ctx: &TcContext) -> Result<i32, i64> {
    if (ctx.len() as usize) < EthHdr::LEN + Ipv4Hdr::LEN {
        return Ok(TC_ACT_OK);
    }
    let EthIpv4 { eth, ip } = ctx.load(0)?;
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return Ok(TC_ACT_OK);
    }
    if !policy::stack_sender_admits(ctx) {
        return Ok(TC_ACT_SHOT as i32);
    }
    if maps::is_node_addr(ip.src_addr) || maps::is_gateway(ip.src_addr) {
        return Ok(TC_ACT_OK);
    }
    if !policy::admits(ctx, packet::ifindex(ctx), Role::Receiver) {
        return Ok(TC_ACT_SHOT as i32);
    }
    Ok(TC_ACT_OK)
}
