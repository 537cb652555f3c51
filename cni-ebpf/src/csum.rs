//! Rewriting header fields with incremental checksum updates (RFC 1624) through the
//! kernel's csum helpers, which also handle CHECKSUM_PARTIAL and CHECKSUM_COMPLETE skbs.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use network_types::eth::EthHdr;

/// Offset of the (outer) IPv4 header checksum.
pub const IP_CSUM: usize = EthHdr::LEN + 10;
pub const IP_SRC: usize = EthHdr::LEN + 12;
pub const IP_DST: usize = EthHdr::LEN + 16;

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;

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
    /// The checksum of a `proto` header starting at `l4`, if we translate that protocol.
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
            ICMP => Some(Self {
                at: l4 + 2,
                pseudo: false,
                flags: 0,
            }),
            _ => None,
        }
    }
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
    if l4.pseudo {
        let flags = BPF_F_PSEUDO_HDR as u64 | l4.flags | 4;
        ctx.l4_csum_replace(l4.at, word32(old), word32(new), flags)?;
    }
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
