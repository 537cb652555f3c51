//! An ICMP error arriving on the uplink about a translated flow or about a pod's reply
//! on a hostPort connection.

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::{
    NatConfig,
    ip_proto::{ICMP, TCP, UDP},
};
use network_types::ip::Ipv4Hdr;

use super::reverse;
use crate::{
    features::{conntrack::live_entry, hostport},
    primitives::{
        csum::{self, IcmpErrorSide},
        packet::{self, ICMP_ECHO_REQUEST, IP_DST},
    },
};

/// An ICMP error about a translated flow, or about a pod's reply on a hostPort
/// connection: the outer destination and the quoted (inner) source are given back to
/// the pod, with the outer IP, inner IP and ICMP checksums fixed. Returns the pod's
/// address, or `None` when the error is not about one of those.
#[inline(always)]
pub(super) fn icmp_error(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    config: &NatConfig,
    node_addr: [u8; 4],
) -> Result<Option<[u8; 4]>, i64> {
    let inner = l4 + 8;
    let inner_ip: Ipv4Hdr = ctx.load(inner)?;
    if inner_ip.frag_offset() != 0 || !packet::quoted_ipv4_well_formed(&inner_ip) {
        return Ok(None);
    }
    let inner_l4 = inner + inner_ip.ihl() as usize;
    let inner_proto = inner_ip.proto as u8;
    // Where the node port (or echo identifier) sits in the quoted header, and the
    // flow's key. Protocols without ports have none to rewrite (a pod's GRE or ESP
    // tunnel told the path's MTU).
    let (port_at, key) = if inner_proto == ICMP {
        if ctx.load::<u8>(inner_l4)? != ICMP_ECHO_REQUEST {
            return Ok(None);
        }
        let id = u16::from_be_bytes(ctx.load(inner_l4 + 4)?);
        (inner_l4 + 4, reverse(inner_ip.dst_addr, id, 0, ICMP))
    } else {
        let Some((node_port, remote_port)) = packet::flow_ports(ctx, inner_proto, inner_l4)? else {
            return Ok(None);
        };
        let key = reverse(inner_ip.dst_addr, node_port, remote_port, inner_proto);
        (inner_l4, key)
    };
    // A translated flow of a pod's, else a pod's reply on a hostPort connection (PMTU
    // discovery must reach the pod serving it).
    let nat = if inner_ip.src_addr == node_addr {
        live_entry(&key, config, node_addr, None)
    } else {
        None
    };
    let (pod_addr, pod_port) = match nat {
        Some(entry) => (entry.pod_addr, entry.pod_port),
        None if inner_proto == TCP || inner_proto == UDP => {
            let quoted = hostport::uplink::quoted(
                inner_proto,
                inner_ip.src_addr,
                key.node_port,
                inner_ip.dst_addr,
                key.remote_port,
            );
            let Some(found) = quoted else {
                return Ok(None);
            };
            found
        }
        None => return Ok(None),
    };
    let node_side = IcmpErrorSide {
        icmp: l4,
        inner,
        outer_at: IP_DST,
        outer_addr: ip.dst_addr,
        inner_at: inner + 12,
        inner_addr: inner_ip.src_addr,
        port_at,
        port: key.node_port,
    };
    csum::translate_icmp_error(ctx, &node_side, pod_addr, pod_port)?;
    Ok(Some(pod_addr))
}
