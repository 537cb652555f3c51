//! TC entries on the node's uplink: source NAT on the way out, reverse NAT (and
//! delivery straight into the pod) on the way in.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};

use crate::{
    features::{rev_nat, snat},
    primitives::packet,
};

#[classifier]
pub fn uplink_egress(ctx: TcContext) -> i32 {
    match snat::egress(&ctx, packet::ifindex(&ctx)) {
        Ok(verdict) => verdict,
        // A frame too short for the headers it announces, or a helper failure: not a
        // flow we translate; the packet goes on as it is.
        Err(_) => TC_ACT_OK,
    }
}

#[classifier]
pub fn uplink_ingress(ctx: TcContext) -> i32 {
    match rev_nat::ingress(&ctx, packet::ifindex(&ctx)) {
        Ok(verdict) => verdict,
        Err(_) => TC_ACT_OK,
    }
}
