//! hostPort on the uplink: a connection to a mapped node address and port is handed to
//! the pod (destination rewritten, delivered with `bpf_redirect_peer`), and the pod's
//! replies get the node address and port back on the way out. No iptables DNAT chain:
//! one hash lookup, whatever the number of mappings.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap},
    programs::TcContext,
};
use cni_ebpf_common::{HostPortFlow, NatKey, PortKey, PortTarget};
use network_types::ip::Ipv4Hdr;

use crate::{
    csum::{self, IP_CSUM, IP_DST, IP_SRC, L4Csum},
    endpoints, forward,
};
use network_types::eth::EthHdr;

/// Mappings per node: 5,000 must fit with room to spare.
const MAX_MAPPINGS: u32 = 16384;
const MAX_FLOWS: u32 = 65536;

#[map(name = "HOSTPORTS")]
static HOSTPORTS: HashMap<PortKey, PortTarget> = HashMap::pinned(MAX_MAPPINGS, 0);

#[map(name = "HOSTPORT_FLOWS")]
static HOSTPORT_FLOWS: LruHashMap<NatKey, HostPortFlow> = LruHashMap::pinned(MAX_FLOWS, 0);

/// The mapping of (`proto`, `addr`, `port`): for that address, else a mapping without
/// hostIP, which covers the node's uplink address (the address the datapath knows).
#[inline(always)]
fn mapping(proto: u8, addr: [u8; 4], port: u16, node_addr: [u8; 4]) -> Option<PortTarget> {
    let key = PortKey {
        host_addr: addr,
        host_port: port,
        proto,
        pad: 0,
    };
    // SAFETY: values are copied at once.
    if let Some(target) = unsafe { HOSTPORTS.get(&key) } {
        return Some(*target);
    }
    if addr != node_addr {
        return None;
    }
    let any = PortKey {
        host_addr: [0; 4],
        ..key
    };
    unsafe { HOSTPORTS.get(&any) }.copied()
}

/// Whether `port` is a host port of `proto` on the node address (source NAT skips it).
#[inline(always)]
pub fn is_host_port(proto: u8, port: u16, node_addr: [u8; 4]) -> bool {
    mapping(proto, node_addr, port, node_addr).is_some()
}

/// A TCP/UDP packet arriving on the uplink for a mapped host port: rewritten to the pod
/// and delivered. `Ok(None)` when no mapping matches.
#[inline(always)]
pub fn inbound(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    l4: usize,
    l4_csum: L4Csum,
    node_addr: [u8; 4],
) -> Result<Option<i32>, i64> {
    let ports: [u8; 4] = ctx.load(l4)?;
    let client_port = u16::from_be_bytes([ports[0], ports[1]]);
    let host_port = u16::from_be_bytes([ports[2], ports[3]]);
    let proto = ip.proto as u8;
    let Some(target) = mapping(proto, ip.dst_addr, host_port, node_addr) else {
        return Ok(None);
    };
    let Some(pod) = endpoints::lookup(target.pod_addr) else {
        return Ok(None);
    };
    let flow = NatKey {
        pod_addr: target.pod_addr,
        remote_addr: ip.src_addr,
        pod_port: target.pod_port,
        remote_port: client_port,
        proto,
        pad: [0; 3],
    };
    let host = HostPortFlow {
        host_addr: ip.dst_addr,
        host_port,
        pad: [0; 2],
    };
    let _ = HOSTPORT_FLOWS.insert(&flow, &host, 0);
    csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, target.pod_addr, l4_csum)?;
    csum::set_port(ctx, l4 + 2, host_port, target.pod_port, l4_csum)?;
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    forward::deliver(ctx, eth, &ip, &pod).map(Some)
}

/// A pod's reply leaving by the uplink on a hostPort connection: source set back to the
/// host address and port. Returns whether it was one.
#[inline(always)]
pub fn outbound(ctx: &TcContext, ip: &Ipv4Hdr, l4: usize, l4_csum: L4Csum) -> Result<bool, i64> {
    let ports: [u8; 4] = ctx.load(l4)?;
    let pod_port = u16::from_be_bytes([ports[0], ports[1]]);
    let flow = NatKey {
        pod_addr: ip.src_addr,
        remote_addr: ip.dst_addr,
        pod_port,
        remote_port: u16::from_be_bytes([ports[2], ports[3]]),
        proto: ip.proto as u8,
        pad: [0; 3],
    };
    // SAFETY: the value is copied at once.
    let Some(host) = (unsafe { HOSTPORT_FLOWS.get(&flow) }).copied() else {
        return Ok(false);
    };
    csum::set_addr(ctx, IP_SRC, IP_CSUM, ip.src_addr, host.host_addr, l4_csum)?;
    csum::set_port(ctx, l4, pod_port, host.host_port, l4_csum)?;
    Ok(true)
}
