//! TC entries on the overlay device (`--routing vxlan`): `overlay_egress` sets the
//! tunnel key of what leaves by it, `overlay_ingress` checks and delivers what comes out
//! of the tunnel (see `features::overlay`).

use aya_ebpf::{macros::classifier, programs::TcContext};
use cni_ebpf_common::{DropReason, OverlayConfig};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::{
    features::overlay,
    primitives::{
        counters, maps,
        packet::{self, EthIpv4},
    },
};

#[classifier]
pub fn overlay_egress(ctx: TcContext) -> i32 {
    // A packet whose key cannot be set would leave with none, or another's: dropped.
    on_overlay(
        &ctx,
        #[inline(always)]
        |ctx, config, _, ip| overlay::egress(ctx, config, ip),
    )
    .unwrap_or_else(|_| counters::drop_packet(DropReason::OverlayNotLocal))
}

#[classifier]
pub fn overlay_ingress(ctx: TcContext) -> i32 {
    on_overlay(
        &ctx,
        #[inline(always)]
        |ctx, config, eth, ip| overlay::ingress(ctx, config, eth, ip),
    )
    .unwrap_or_else(|_| counters::drop_packet(DropReason::OverlayNotLocal))
}

/// Runs `then` on a well-formed IPv4 frame crossing the overlay device while the
/// overlay is on; everything else through that device is dropped (it carries IPv4
/// between pods and nodes only: no ARP, no tags, no other protocol).
#[inline(always)]
fn on_overlay(
    ctx: &TcContext,
    then: impl FnOnce(&TcContext, &OverlayConfig, &EthHdr, &Ipv4Hdr) -> Result<i32, i64>,
) -> Result<i32, i64> {
    let Some(config) = maps::overlay_config() else {
        return Ok(counters::drop_packet(DropReason::OverlayNotLocal));
    };
    if (ctx.len() as usize) < EthHdr::LEN + Ipv4Hdr::LEN {
        return Ok(counters::drop_packet(DropReason::TruncatedFrame));
    }
    let EthIpv4 { eth, ip } = ctx.load(0)?;
    if eth.ether_type != EtherType::Ipv4 as u16 || packet::vlan_tagged(ctx, &eth) {
        return Ok(counters::drop_packet(DropReason::OverlayNotLocal));
    }
    if !packet::ipv4_well_formed(&ip, ctx.len()) {
        return Ok(counters::drop_packet(DropReason::MalformedIpv4));
    }
    then(ctx, &config, &eth, &ip)
}
