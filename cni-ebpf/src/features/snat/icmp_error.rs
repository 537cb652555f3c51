//! A pod's ICMP error about a packet of a translated flow or of a hostPort connection,
//! leaving by the uplink.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use cni_ebpf_common::{DropReason, NatConfig, NatCounter, NatKey};
use network_types::ip::Ipv4Hdr;

use crate::{
    features::{conntrack, hostport},
    primitives::{
        clock, counters,
        csum::{self, IcmpErrorSide},
        maps::NAT_OUT,
        packet::{self, IP_SRC},
    },
};

/// An ICMP error a pod sends about a packet it got on a translated flow (a datagram to a
/// socket it closed, say) or on a hostPort connection: it leaves as the node's, quoting
/// the packet as the remote sent it (node address and port), as conntrack translates
/// such errors along with their flow; sent as it was, it would carry the pod's address
/// and a quote the remote cannot match. Errors about anything else stay as they are.
#[inline(always)]
pub(super) fn icmp_error(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    config: &NatConfig,
    has_address: bool,
) -> Result<i32, i64> {
    let inner = l4 + 8;
    let inner_ip: Ipv4Hdr = ctx.load(inner)?;
    // The quote is of a packet the pod received: from the remote, to the pod.
    if inner_ip.frag_offset() != 0
        || inner_ip.dst_addr != ip.src_addr
        || !packet::quoted_ipv4_well_formed(&inner_ip)
    {
        return Ok(TC_ACT_OK);
    }
    let inner_l4 = inner + inner_ip.ihl() as usize;
    let proto = inner_ip.proto as u8;
    let Some((remote_port, pod_port)) = packet::flow_ports(ctx, proto, inner_l4)? else {
        return Ok(TC_ACT_OK);
    };
    let flow = NatKey::new(
        (inner_ip.dst_addr, pod_port),
        (inner_ip.src_addr, remote_port),
        proto,
    );
    let now = clock::now_ns();
    // SAFETY: the value is copied at once.
    let translated = unsafe { NAT_OUT.get(&flow) }
        .copied()
        .filter(|entry| !conntrack::expired(entry, proto, config, now));
    let (addr, port) = match translated {
        Some(entry) => (entry.node_addr, entry.node_port),
        None => match hostport::host_of(&flow, None) {
            Some(host) => (host.host_addr, host.host_port),
            None => return Ok(TC_ACT_OK),
        },
    };
    if !has_address || !NatConfig::is_address(addr) {
        return Ok(counters::drop_packet(DropReason::NatNoAddress));
    }
    let pod_side = IcmpErrorSide {
        icmp: l4,
        inner,
        outer_at: IP_SRC,
        outer_addr: ip.src_addr,
        inner_at: inner + 16,
        inner_addr: inner_ip.dst_addr,
        port_at: inner_l4 + 2,
        port: pod_port,
    };
    csum::translate_icmp_error(ctx, &pod_side, addr, port)?;
    counters::nat(NatCounter::TranslatedOut);
    Ok(TC_ACT_OK)
}
