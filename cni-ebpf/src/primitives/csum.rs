//! Rewriting header fields with incremental checksum updates (RFC 1624) through the
//! kernel's csum helpers, which also handle CHECKSUM_PARTIAL and CHECKSUM_COMPLETE skbs.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use cni_ebpf_common::ip_proto::{DCCP, ICMP, TCP, UDP, UDPLITE};
use network_types::ip::Ipv4Hdr;

use super::packet::{IP_CSUM, IP_TTL};

/// Where a packet's L4 checksum is, and how it reacts to address changes.
#[derive(Clone, Copy)]
pub struct L4Csum {
    /// Absolute offset of the checksum field.
    pub at: usize,
    /// TCP and UDP checksums cover the IP addresses (pseudo header); ICMP's does not.
    pub pseudo: bool,
    /// UDP: a zero checksum means "none" and must stay zero.
    pub flags: u64,
}

impl L4Csum {
    /// No L4 header to fix: a fragment after the first of its datagram.
    pub const NONE: Self = Self {
        at: 0,
        pseudo: false,
        flags: 0,
    };

    /// The checksum of a `proto` header starting at `l4`, if we translate that protocol
    /// (DCCP and UDP-Lite as UDP, their checksum always set).
    #[inline(always)]
    pub fn of(proto: u8, l4: usize) -> Option<Self> {
        match proto {
            TCP => Some(Self {
                at: l4 + 16,
                pseudo: true,
                flags: 0,
            }),
            UDP => Some(Self {
                at: l4 + 6,
                pseudo: true,
                flags: BPF_F_MARK_MANGLED_0 as u64,
            }),
            DCCP | UDPLITE => Some(Self {
                at: l4 + 6,
                pseudo: true,
                flags: 0,
            }),
            ICMP => Some(Self {
                at: l4 + 2,
                pseudo: false,
                flags: 0,
            }),
            _ => None,
        }
    }
}

/// The IPv4 header checksum `check` after the 16-bit words `old` became `new` (RFC 1624,
/// eqn. 3: HC' = ~(~HC + ~m + m')), all as on the wire.
///
/// Computed here so that a header rewrite is one `bpf_skb_store_bytes` of the changed
/// bytes and their checksum, where `bpf_l3_csum_replace` is a call (and a writability
/// check) of its own per field; the header checksum covers the header only, whatever
/// the skb's checksum state, so nothing else needs the kernel's help. With the checksum
/// right, the header's one's complement sum does not change, nor does a
/// CHECKSUM_COMPLETE sum over it.
#[inline(always)]
pub fn ipv4_check<const N: usize>(check: [u8; 2], old: [[u8; 2]; N], new: [[u8; 2]; N]) -> [u8; 2] {
    let mut sum = u32::from(!u16::from_be_bytes(check));
    for word in 0..N {
        sum += u32::from(!u16::from_be_bytes(old[word])) + u32::from(u16::from_be_bytes(new[word]));
    }
    // At most 2N + 1 terms below 2^16: two folds bring it under 2^16.
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}

/// The checksum of a new IPv4 header (`header` with its checksum field zero, as on the
/// wire): the one's complement of the one's complement sum of its ten 16-bit words.
#[inline(always)]
pub fn ipv4_header(header: &[u8; 20]) -> [u8; 2] {
    let mut sum = 0u32;
    for word in 0..10 {
        sum += u32::from(u16::from_be_bytes([header[2 * word], header[2 * word + 1]]));
    }
    // Ten terms below 2^16: two folds bring it under 2^16.
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}

/// An IPv4 address as its two 16-bit checksum words.
#[inline(always)]
fn words(addr: [u8; 4]) -> [[u8; 2]; 2] {
    [[addr[0], addr[1]], [addr[2], addr[3]]]
}

/// Replaces the source address of `ip` (the header as it is in the frame) with `new`:
/// the header checksum and the address in one store, then the L4 checksum.
#[inline(always)]
pub fn set_source(ctx: &TcContext, ip: &Ipv4Hdr, new: [u8; 4], l4: L4Csum) -> Result<(), i64> {
    let [w0, w1] = words(new);
    let check = ipv4_check(ip.check, words(ip.src_addr), words(new));
    let bytes = [check[0], check[1], w0[0], w0[1], w1[0], w1[1]];
    ctx.store(IP_CSUM, &bytes, 0)?;
    set_l4_addr(ctx, ip.src_addr, new, l4)
}

/// Replaces the destination address of `ip` (the header as it is in the frame) with
/// `new` and sets its TTL to `ttl` (the same, or one less before a delivery): TTL,
/// protocol, header checksum and both addresses in one store, then the L4 checksum.
#[inline(always)]
pub fn set_destination(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    new: [u8; 4],
    ttl: u8,
    l4: L4Csum,
) -> Result<(), i64> {
    let mut old_words = [[ip.ttl, ip.proto]; 3];
    let mut new_words = [[ttl, ip.proto]; 3];
    [old_words[1], old_words[2]] = words(ip.dst_addr);
    [new_words[1], new_words[2]] = words(new);
    let check = ipv4_check(ip.check, old_words, new_words);
    let src = ip.src_addr;
    let bytes = [
        ttl, ip.proto, check[0], check[1], src[0], src[1], src[2], src[3], new[0], new[1], new[2],
        new[3],
    ];
    ctx.store(IP_TTL, &bytes, 0)?;
    set_l4_addr(ctx, ip.dst_addr, new, l4)
}

/// Folds an address change into the L4 checksum (TCP and UDP cover the addresses in
/// their pseudo header; ICMP does not).
#[inline(always)]
fn set_l4_addr(ctx: &TcContext, old: [u8; 4], new: [u8; 4], l4: L4Csum) -> Result<(), i64> {
    if l4.pseudo {
        let flags = BPF_F_PSEUDO_HDR as u64 | l4.flags | 4;
        ctx.l4_csum_replace(l4.at, word32(old), word32(new), flags)?;
    }
    Ok(())
}

#[inline(always)]
fn word32(bytes: [u8; 4]) -> u64 {
    u64::from(u32::from_ne_bytes(bytes))
}

#[inline(always)]
fn word16(value: u16) -> u64 {
    u64::from(u16::from_ne_bytes(value.to_be_bytes()))
}

/// Replaces the IPv4 address at `at` (whose header checksum is at `ip_csum`), fixing
/// that checksum and the L4 one.
#[inline(always)]
pub fn set_addr(
    ctx: &TcContext,
    at: usize,
    ip_csum: usize,
    old: [u8; 4],
    new: [u8; 4],
    l4: L4Csum,
) -> Result<(), i64> {
    ctx.l3_csum_replace(ip_csum, word32(old), word32(new), 4)?;
    set_l4_addr(ctx, old, new, l4)?;
    ctx.store(at, &new, 0)?;
    Ok(())
}

/// Replaces the 16-bit port (or ICMP identifier) at `at`, given in host order.
#[inline(always)]
pub fn set_port(ctx: &TcContext, at: usize, old: u16, new: u16, l4: L4Csum) -> Result<(), i64> {
    ctx.l4_csum_replace(l4.at, word16(old), word16(new), l4.flags | 2)?;
    ctx.store(at, &new.to_be_bytes(), 0)?;
    Ok(())
}

/// One side of a flow, as an ICMP error shows it: the outer header's address field
/// (`IP_SRC` or `IP_DST`) and the quoted packet's field for the same side, with their
/// values, and the quoted port of that side.
#[derive(Clone, Copy)]
pub struct IcmpErrorSide {
    /// Offset of the ICMP header.
    pub icmp: usize,
    /// Offset of the quoted IPv4 header.
    pub inner: usize,
    pub outer_at: usize,
    pub outer_addr: [u8; 4],
    /// Offset in the frame of the quoted address (`inner` + 12 or + 16).
    pub inner_at: usize,
    pub inner_addr: [u8; 4],
    /// Offset of the quoted port (or echo identifier), and its value.
    pub port_at: usize,
    pub port: u16,
}

/// Translates one side of an ICMP error and of the packet it quotes to `addr`:`port`
/// (NAT of the error along with its flow): outer address, quoted address and port, with
/// the outer IPv4, quoted IPv4 and ICMP checksums fixed. Everything in the quote is
/// ICMP payload, so each change there is folded into the ICMP checksum; the quoted L4
/// checksum is left, as routers' quotes are often too short to hold it whole.
#[inline(always)]
pub fn translate_icmp_error(
    ctx: &TcContext,
    side: &IcmpErrorSide,
    addr: [u8; 4],
    port: u16,
) -> Result<(), i64> {
    let icmp_csum = side.icmp + 2;
    // ICMP's checksum does not cover the outer header.
    set_addr(
        ctx,
        side.outer_at,
        IP_CSUM,
        side.outer_addr,
        addr,
        L4Csum::NONE,
    )?;
    let inner_csum_at = side.inner + 10;
    let old_inner_csum: [u8; 2] = ctx.load(inner_csum_at)?;
    ctx.l3_csum_replace(inner_csum_at, word32(side.inner_addr), word32(addr), 4)?;
    let new_inner_csum: [u8; 2] = ctx.load(inner_csum_at)?;
    set_icmp_payload2(
        ctx,
        inner_csum_at,
        icmp_csum,
        old_inner_csum,
        new_inner_csum,
    )?;
    set_icmp_payload4(ctx, side.inner_at, icmp_csum, side.inner_addr, addr)?;
    // Kept ports (SCTP, and 0 for protocols without) need no rewrite.
    if side.port != port {
        set_icmp_payload2(
            ctx,
            side.port_at,
            icmp_csum,
            side.port.to_be_bytes(),
            port.to_be_bytes(),
        )?;
    }
    Ok(())
}

/// Folds a change of 4 bytes inside an ICMP payload (an inner header) into the ICMP
/// checksum at `icmp_csum`, then writes the bytes.
#[inline(always)]
pub fn set_icmp_payload4(
    ctx: &TcContext,
    at: usize,
    icmp_csum: usize,
    old: [u8; 4],
    new: [u8; 4],
) -> Result<(), i64> {
    ctx.l4_csum_replace(icmp_csum, word32(old), word32(new), 4)?;
    ctx.store(at, &new, 0)?;
    Ok(())
}

/// The same for 2 bytes, given as they are on the wire.
#[inline(always)]
pub fn set_icmp_payload2(
    ctx: &TcContext,
    at: usize,
    icmp_csum: usize,
    old: [u8; 2],
    new: [u8; 2],
) -> Result<(), i64> {
    ctx.l4_csum_replace(
        icmp_csum,
        u64::from(u16::from_ne_bytes(old)),
        u64::from(u16::from_ne_bytes(new)),
        2,
    )?;
    ctx.store(at, &new, 0)?;
    Ok(())
}
