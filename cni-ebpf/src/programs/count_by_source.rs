//! TC entry: counts packets and bytes per source IPv4 address, then lets the packet go on.

use aya_ebpf::{bindings::TC_ACT_UNSPEC, macros::classifier, programs::TcContext};
use aya_log_ebpf::info;
use cni_ebpf_common::SourceKey;
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::primitives::counters::{self, Counted};

/// Verdict of an observer: hand the packet to the next program, then the stack. It must
/// be TC_ACT_UNSPEC (TCX_NEXT): TCX stops its chain at any other value (TC_ACT_PIPE
/// would skip the NAT program attached after the counter on the same uplink), and
/// clsact in direct-action mode moves on to the next filter.
const CONTINUE: i32 = TC_ACT_UNSPEC;

#[classifier]
pub fn count_by_source(ctx: TcContext) -> i32 {
    match try_count_by_source(&ctx) {
        Ok(verdict) => verdict,
        // A counting failure (map full, short frame) must never affect the packet.
        Err(_) => CONTINUE,
    }
}

fn try_count_by_source(ctx: &TcContext) -> Result<i32, i64> {
    // bpf_skb_load_bytes copies with the kernel's own bounds check, so short frames
    // return an error instead of needing data/data_end comparisons.
    let eth: EthHdr = ctx.load(0)?;
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return Ok(CONTINUE);
    }
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    let key = SourceKey { addr: ip.src_addr };
    if let Counted::NewSource = counters::source(&key, u64::from(ctx.len()))? {
        info!(ctx, "counting a new source {:i}", ip.src_addr);
    }
    Ok(CONTINUE)
}
