//! How far packets from other nodes' pods are trusted (`ebpf-cnid run --underlay-trust`,
//! in `OVERLAY_CONFIG`). Any host on the underlay can send a frame claiming a node's
//! address, or a source in another node's pod range; what can be checked is that the
//! frame comes from where the node's FIB reaches what it claims to come from: the same
//! device, and the neighbour (a node on the segment, or the router towards it) whose
//! MAC sent it ([`claim`]). With `relaxed`, only a frame so tied goes straight into a
//! pod; with `strict`, none does ([`strict`]): they go through the node's stack, where
//! its netfilter applies. Neither stops a host that forges a node's MAC too: only an
//! encrypted underlay does.

use cni_ebpf_common::underlay_trust;
use network_types::eth::EthHdr;

use aya_ebpf::programs::TcContext;

use crate::primitives::{fib, maps};

/// What a frame's claim to come from an address is worth.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The FIB reaches the address by the device the frame came in by, through the
    /// neighbour that sent it.
    Tied,
    /// The FIB reaches it another way, or through another neighbour: forged.
    Forged,
    /// Nothing to check against (no route, the neighbour not resolved yet).
    Unknown,
}

/// Whether `eth`, arriving on `ingress_ifindex` (whose address is `local`), comes from
/// where the node's FIB sends packets for `peer`. A function of its own (a BPF call,
/// its arguments in registers): the FIB's parameters stay out of the uplink program's
/// frame, which 6.1's 512 bytes of stack for a chain of calls leave no room for.
#[inline(never)]
pub fn claim(
    ctx: &TcContext,
    eth: &EthHdr,
    ingress_ifindex: u32,
    local: [u8; 4],
    peer: [u8; 4],
) -> Claim {
    match fib::forward(ctx, ingress_ifindex, 0, 0, local, peer) {
        Some(next) if next.ifindex == ingress_ifindex && next.dmac == eth.src_addr => Claim::Tied,
        Some(_) => Claim::Forged,
        None => Claim::Unknown,
    }
}

/// Whether every packet from other nodes' pods goes through the node's stack.
#[inline(always)]
pub fn strict() -> bool {
    maps::underlay_trust() == underlay_trust::STRICT
}
