//! The node's FIB, asked as a router would for a packet arriving on a device
//! ([`forward`]), and the MTU of the way out ([`fits`]).

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_SUCCESS, bpf_check_mtu_flags::BPF_MTU_CHK_SEGS,
        bpf_check_mtu_ret::BPF_MTU_CHK_RET_SUCCESS, bpf_fib_lookup as FibParams,
    },
    helpers::generated::{bpf_check_mtu, bpf_fib_lookup},
    programs::TcContext,
};

use super::zeroed::Words;

const AF_INET: u8 = 2;

/// Where the FIB sends a packet: out of `ifindex`, in a frame from `smac` to `dmac` (the
/// next hop's, known to the neighbour table).
pub struct NextHop {
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// The next hop of an IPv4 packet (`proto`, `tos`, `src` to `dst`) arriving on
/// `ingress_ifindex`, when the FIB forwards it to a resolved neighbour. `None` for
/// anything else: local addresses, no route, no neighbour yet, forwarding off on that
/// device (the stack decides, and resolves the neighbour for the packets after).
///
/// `tot_len` stays 0: the kernel checks the packet itself against the MTU of the way
/// out, whole (a GSO packet passes that check: see [`fits`]).
#[inline(always)]
pub fn forward(
    ctx: &TcContext,
    ingress_ifindex: u32,
    proto: u8,
    tos: u8,
    src: [u8; 4],
    dst: [u8; 4],
) -> Option<NextHop> {
    // A plain C struct of integers; all-zero is its "unset" state.
    let mut room = Words::<FibParams>::uninit();
    let params = room.zeroed();
    params.family = AF_INET;
    params.l4_protocol = proto;
    params.ifindex = ingress_ifindex;
    params.__bindgen_anon_2.tos = tos;
    params.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(src);
    params.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
    // SAFETY: the helper reads and writes `params`, of the size given.
    let found = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb.cast(),
            params,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    (found == i64::from(BPF_FIB_LKUP_RET_SUCCESS)).then_some(NextHop {
        ifindex: params.ifindex,
        smac: params.smac,
        dmac: params.dmac,
    })
}

/// Whether the packet fits the MTU of `ifindex`: whole, or for a GSO packet each of its
/// segments.
#[inline(always)]
pub fn fits(ctx: &TcContext, ifindex: u32) -> bool {
    // 0 in, with BPF_MTU_CHK_SEGS: check the skb itself (segment by segment when GSO).
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
