//! TC entries on a pod's host-side veth. Ingress there is traffic leaving the pod;
//! egress is what the node's stack sends to the pod.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use network_types::eth::{EthHdr, EtherType};

use crate::{
    arp, forward,
    metrics::{self, Direction},
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
    let ifindex = ifindex(ctx);
    metrics::count(ifindex, Direction::FromPod, ctx.len());
    if (ctx.len() as usize) < EthHdr::LEN {
        return Ok(metrics::drop_packet(
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

#[classifier]
pub fn to_pod(ctx: TcContext) -> i32 {
    metrics::count(ifindex(&ctx), Direction::ToPod, ctx.len());
    TC_ACT_OK
}

/// The device the program runs on (the host-side veth).
#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: the context pointer is valid for the whole program run.
    unsafe { (*ctx.skb.skb).ifindex }
}
