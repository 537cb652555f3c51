//! TC entries on the node's uplinks: source NAT on the way out (`uplink_egress`, which
//! first judges what the stack forwarded from a pod by its egress policies, and records the Service connections the stack translated: `services`),
//! reverse NAT (and delivery straight into the pod) on the way in (`uplink_ingress`,
//! for frames to this host's MAC),
//! where ARP requests and packets for the pods' gateways are dropped (they are the
//! node's addresses for its pods only, see `rev_nat`), and the overlay's single packets
//! for this node's pods are taken out of the tunnel (`overlay::decap`).
//! Both start alike ([`on_uplink`]); a fragment after its datagram's first one, which
//! has no ports to find its flow by, follows what its first fragment was given.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use cni_ebpf_common::{DropReason, NatConfig};
use network_types::{
    arp::ArpHdr,
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::{
    features::{fragments, overlay, rev_nat, services, snat},
    primitives::{
        counters, deliver, maps,
        packet::{self, EthIpv4},
        policy,
    },
};

#[classifier]
pub fn uplink_egress(ctx: TcContext) -> i32 {
    match try_uplink_egress(&ctx) {
        Ok(verdict) => verdict,
        // A frame too short for the headers it announces, or a helper failure: not a
        // flow we translate; the packet goes on as it is.
        Err(_) => TC_ACT_OK,
    }
}

#[classifier]
pub fn uplink_ingress(ctx: TcContext) -> i32 {
    match try_uplink_ingress(&ctx) {
        Ok(verdict) => verdict,
        Err(_) => TC_ACT_OK,
    }
}

fn try_uplink_egress(ctx: &TcContext) -> Result<i32, i64> {
    // What the pod program sent here itself did not cross the stack; what did may be a
    // Service connection the stack translated, recorded before source NAT.
    let redirected = deliver::take_redirected(ctx);
    if !redirected && !policy::stack_sender_admits(ctx) {
        return Ok(TC_ACT_SHOT as i32);
    }
    on_uplink(
        ctx,
        |config, node_addr, _, ip| {
            if fragments::is_later(ip) {
                return snat::later_fragment(ctx, ip);
            }
            if !redirected && services::left_through_stack(ctx, ip) {
                return Ok(TC_ACT_SHOT as i32);
            }
            snat::egress(ctx, config, node_addr, ip)
        },
        |_| Ok(TC_ACT_OK),
    )
}

fn try_uplink_ingress(ctx: &TcContext) -> Result<i32, i64> {
    // A frame for another host's MAC is the stack's to drop: never translated nor
    // delivered into a pod.
    if packet::for_other_host(ctx) {
        return Ok(TC_ACT_OK);
    }
    // Inlined: its arguments and result would not fit the registers of a BPF call.
    on_uplink(
        ctx,
        #[inline(always)]
        |config, node_addr, eth, ip| {
            // The overlay's packets for this node's pods, out of the tunnel here.
            if let Some(verdict) = overlay::decap::from_uplink(ctx, node_addr, eth, ip)? {
                return Ok(verdict);
            }
            if fragments::is_later(ip) {
                rev_nat::later_fragment(ctx, eth, ip)
            } else {
                rev_nat::ingress(ctx, config, node_addr, eth, ip)
            }
        },
        // ARP: a request for a pods' gateway goes unanswered (the node would answer it
        // as for any of its addresses).
        #[inline(always)]
        |_| {
            let arp: ArpHdr = ctx.load(EthHdr::LEN)?;
            if arp.oper() == ARP_REQUEST && maps::is_gateway(arp.tpa()) {
                return Ok(counters::drop_packet(DropReason::GatewayFromOutside));
            }
            Ok(TC_ACT_OK)
        },
    )
}

const ARP_REQUEST: u16 = 1;

/// Runs `translate` on an IPv4 packet crossing the uplink, with NAT's configuration and
/// the uplink's address, and `arp` on an ARP frame; anything else goes on as it is.
///
/// `translate` runs inside this call rather than after it: a helper that returns
/// (config, eth, ip) instead gets LLVM to read an unset register on its early-return
/// path, which the verifier refuses.
#[inline(always)]
fn on_uplink(
    ctx: &TcContext,
    translate: impl FnOnce(&NatConfig, [u8; 4], &EthHdr, &Ipv4Hdr) -> Result<i32, i64>,
    arp: impl FnOnce(&EthHdr) -> Result<i32, i64>,
) -> Result<i32, i64> {
    let Some(config) = maps::nat_config() else {
        return Ok(TC_ACT_OK);
    };
    // What crosses this device is translated to or from its address (a device no
    // longer an uplink, whose programs are on their way off, translates nothing).
    let Some(node_addr) = maps::uplink_addr(packet::ifindex(ctx)) else {
        return Ok(TC_ACT_OK);
    };
    // Ethernet and IPv4 headers in one read (a frame too short for both is no IPv4
    // packet we translate: the error lets it go on).
    let EthIpv4 { eth, ip } = ctx.load(0)?;
    if eth.ether_type == EtherType::Arp as u16 {
        return arp(&eth);
    }
    // A tagged frame belongs to a VLAN, never to a pod's flow, and a malformed header
    // is never translated: both are left as they are (pods' malformed packets never get
    // here: `from_pod` drops them; the stack drops what arrives malformed).
    if eth.ether_type != EtherType::Ipv4 as u16
        || packet::vlan_tagged(ctx, &eth)
        || !packet::ipv4_well_formed(&ip, ctx.len())
    {
        return Ok(TC_ACT_OK);
    }
    translate(&config, node_addr, &eth, &ip)
}
