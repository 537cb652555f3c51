//! Pod traffic leaving the node: when the node's FIB sends a pod's packet out of an
//! uplink, hand it to the uplink directly (`bpf_redirect` with the neighbour's MAC
//! from the FIB), skipping the node's IP stack. The uplink's egress program then
//! source-NATs it. The FIB lookup honours the node's forwarding setting: with
//! forwarding off it answers "not forwarded" and the stack decides.
//!
//! MTU: the lookup gets no `tot_len`, so the kernel checks the packet itself against
//! the uplink's MTU, and a GSO packet (a TCP sender's burst of up to 64 KiB, or more
//! with BIG TCP) is checked segment by segment with `bpf_check_mtu` (the IPv4 header's
//! total length is the whole burst's, or 0 above 64 KiB: see docs/decisions.md, "The
//! FIB lookup's MTU check"). A packet whose segments do not fit goes to the stack,
//! which answers with ICMP "fragmentation needed" as a router must.

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, bpf_check_mtu_flags::BPF_MTU_CHK_SEGS,
        bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS, bpf_fib_lookup as FibParams,
    },
    helpers::generated::{bpf_check_mtu, bpf_fib_lookup, bpf_redirect},
    programs::TcContext,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::primitives::{deliver, maps, zeroed::Words};

const AF_INET: u8 = 2;

/// Sends `ip` (a pod's packet for no local pod) straight out of an uplink when the FIB
/// says that is its way and the neighbour is known; otherwise the stack takes it.
#[inline(always)]
pub fn to_uplink(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    ingress_ifindex: u32,
) -> Result<i32, i64> {
    if maps::nat_config().is_none() || ip.ttl <= 1 {
        return Ok(TC_ACT_OK);
    }
    // A plain C struct of integers; all-zero is its "unset" state.
    let mut room = Words::<FibParams>::uninit();
    let params = room.zeroed();
    params.family = AF_INET;
    params.l4_protocol = ip.proto as u8;
    params.ifindex = ingress_ifindex;
    // tot_len stays 0: the kernel checks the packet against the MTU (see the module).
    params.__bindgen_anon_2.tos = ip.tos;
    params.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(ip.src_addr);
    params.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(ip.dst_addr);
    // SAFETY: the helper reads and writes `params`, of the size given.
    let found = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb.cast(),
            params,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    // Anything but a resolved route out of an uplink (local addresses, no neighbour
    // yet, forwarding off, other devices) is the stack's business.
    if found != i64::from(BPF_FIB_LKUP_RET_SUCCESS) || maps::uplink_addr(params.ifindex).is_none() {
        return Ok(TC_ACT_OK);
    }
    if !segments_fit(ctx, params.ifindex) {
        return Ok(TC_ACT_OK);
    }
    deliver::decrement_ttl(ctx, ip)?;
    let rewritten = EthHdr {
        dst_addr: params.dmac,
        src_addr: params.smac,
        ether_type: eth.ether_type,
    };
    ctx.store(0, &rewritten, 0)?;
    // SAFETY: a plain helper call with an ifindex and no flags (egress of the uplink).
    Ok(unsafe { bpf_redirect(params.ifindex, 0) } as i32)
}

/// Whether each segment of a GSO packet fits the MTU of `ifindex` (a packet that is not
/// GSO was checked whole by the FIB lookup).
#[inline(always)]
fn segments_fit(ctx: &TcContext, ifindex: u32) -> bool {
    // SAFETY: `skb` is the program's context; gso_size is a readable field of it.
    if unsafe { (*ctx.skb.skb).gso_size } == 0 {
        return true;
    }
    // 0 in, with BPF_MTU_CHK_SEGS: check the skb itself, segment by segment.
    let mut mtu_len: u32 = 0;
    // SAFETY: a plain helper call with the context and a u32 it writes.
    let checked = unsafe {
        bpf_check_mtu(
            ctx.skb.skb.cast(),
            ifindex,
            &mut mtu_len,
            0,
            u64::from(BPF_MTU_CHK_SEGS),
        )
    };
    checked == i64::from(BPF_MTU_CHK_RET_SUCCESS)
}
