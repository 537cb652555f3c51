//! The TC entry on a pod's host-side veth: its ingress is traffic leaving the pod.
//!
//! There is no program on the veth's egress (what the node's own stack sends to the
//! pod): each TCX attach waits for an RCU grace period under the rtnl lock, and a second
//! one made ADD twice as slow. What the datapath delivers into a pod it counts itself
//! (`deliver`); what the stack sends is in the veth's kernel TX counters, which
//! the daemon adds in `ebpf-cnid endpoints`.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use network_types::eth::{EthHdr, EtherType};

use crate::{
    features::arp,
    forward,
    primitives::{
        counters::{self, Direction},
        packet,
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
        return Ok(counters::drop_packet(
            cni_ebpf_common::DropReason::TruncatedFrame,
        ));
    }
    let eth: EthHdr = ctx.load(0)?;
    if eth.ether_type == EtherType::Ipv4 as u16 {
        forward::from_pod(ctx, &eth, ifindex)
    } else if eth.ether_type == EtherType::Arp as u16 {
        arp::from_pod(ctx, &eth, ifindex)
    } else {
        Ok(TC_ACT_OK)
    }
}
