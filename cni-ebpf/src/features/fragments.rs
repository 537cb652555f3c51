//! IPv4 fragments of translated datagrams. A NAT flow is found by its ports (or ICMP
//! echo identifier), which only a datagram's first fragment carries; the fragments after
//! it have the IP header alone. What the translation of a first fragment did (the source
//! it left with, or the pod it was given to) is recorded under the datagram's identity
//! (addresses, IP identification, protocol, way), and the fragments after it get the same
//! address: a large UDP datagram (a DNS answer with EDNS, say) or a large ping crosses
//! the source NAT both ways, as it crosses MASQUERADE. hostPort connections from outside
//! are handled alike, and the fragments of a Service backend's reply to a pod of the
//! node follow their first one to the stack (where the DNAT is undone).
//!
//! The reference chain reassembles each datagram before NAT (conntrack's
//! defragmentation) and fragments it again after; a TC program cannot reassemble.
//! Decision: the record of the first fragment, as Cilium's IPv4 fragment tracking does.
//! Its limit: a fragment that arrives before its datagram's first one (reordered on the
//! way) finds no record. On the way in it is left to the stack, which cannot place it,
//! and the datagram is lost as on a lossy path (the application's retry goes through,
//! the first fragment usually leads). On the way out it is dropped and counted
//! (`nat_fragment`), never sent with the pod's address; a pod's stack sends a datagram's
//! fragments in order, so that happens only when its first fragment was itself dropped.
//! Records expire after [`FRAGMENT_SECS`] or when the LRU needs room.
//! The policy check keeps its own records in the same table (`primitives::policy`).

use cni_ebpf_common::{FragmentKey, FragmentTarget};
use network_types::ip::Ipv4Hdr;

use crate::primitives::{
    clock,
    maps::{FRAGMENT_SECS, NAT_FRAGMENTS},
};

/// The "more fragments" bit of the IPv4 flags.
const MORE_FRAGMENTS: u8 = 1;

/// Whether `ip` is a fragment after the first of its datagram (it carries no L4 header).
#[inline(always)]
pub fn is_later(ip: &Ipv4Hdr) -> bool {
    ip.frag_offset() != 0
}

#[inline(always)]
fn key(ip: &Ipv4Hdr, way: u8) -> FragmentKey {
    FragmentKey {
        src_addr: ip.src_addr,
        dst_addr: ip.dst_addr,
        id: ip.id,
        proto: ip.proto as u8,
        way,
    }
}

/// Records what `ip` (the headers before translation) was given, when it is the first
/// fragment of a datagram: one flag test for every other packet.
#[inline(always)]
fn record(ip: &Ipv4Hdr, way: u8, addr: [u8; 4], deliver: bool) {
    if ip.frag_flags() & MORE_FRAGMENTS == 0 || ip.frag_offset() != 0 {
        return;
    }
    // Two aligned words: built field by field, LLVM zeroes the 3 unaligned bytes of
    // padding with a call to `memset`, a BPF function whose frame, added to the callers'
    // (the uplink's Service reply checks), would pass the 512 bytes of stack Linux 6.1
    // allows a chain of calls.
    let tail = u64::from(u32::from_ne_bytes(addr)) | u64::from(u8::from(deliver)) << 32;
    // SAFETY: `FragmentTarget` is #[repr(C)], 16 bytes without implicit padding:
    // `seen_ns`, then `addr`, `deliver` and zero padding (little-endian, as BPF on x86
    // and arm64).
    let target =
        unsafe { core::mem::transmute::<[u64; 2], FragmentTarget>([clock::now_ns(), tail]) };
    // A full table evicts the oldest record; a failed write only costs this datagram.
    let _ = NAT_FRAGMENTS.insert(&key(ip, way), &target, 0);
}

/// A pod's first fragment left with the source `source`.
#[inline(always)]
pub fn left(ip: &Ipv4Hdr, source: [u8; 4]) {
    record(ip, FragmentKey::LEAVING, source, false);
}

/// An arriving first fragment was given the destination `destination` (a pod's
/// address), and went straight into the pod (`delivered`) or to the stack.
#[inline(always)]
pub fn arrived(ip: &Ipv4Hdr, destination: [u8; 4], delivered: bool) {
    record(ip, FragmentKey::ARRIVING, destination, delivered);
}

/// A pod's first fragment for a pod of the node went to the stack (see
/// `services::is_reply`).
#[inline(always)]
pub fn went_to_stack(ip: &Ipv4Hdr) {
    record(ip, FragmentKey::TO_STACK, ip.dst_addr, false);
}

/// What the first fragment of `ip`'s datagram (`ip` a later fragment, headers before
/// translation) was given going `way`, if it passed within [`FRAGMENT_SECS`].
#[inline(always)]
pub fn first_of(ip: &Ipv4Hdr, way: u8) -> Option<FragmentTarget> {
    // SAFETY: the value is copied out at once.
    let target = unsafe { NAT_FRAGMENTS.get(&key(ip, way)) }.copied()?;
    let age = clock::now_ns().saturating_sub(target.seen_ns);
    (age <= FRAGMENT_SECS * 1_000_000_000).then_some(target)
}
