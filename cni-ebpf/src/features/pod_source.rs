//! What a pod may send as: frames from its own MAC, IPv4 from one of its own addresses,
//! ARP about itself, and nothing tagged for a VLAN. A pod runs code we do not control,
//! with CAP_NET_RAW: everything else it sends is dropped here, before anything forwards,
//! translates, delivers or remembers it, and counted under its own drop reason.
//!
//! The check is one lookup in the endpoints map, keyed by the packet's source address:
//! the address must belong to the endpoint behind the very veth the frame came in by.

use cni_ebpf_common::{DropReason, EndpointInfo};
use network_types::eth::EthHdr;

use crate::primitives::maps;

/// The endpoint that `source` belongs to, when it is the one behind the host veth
/// `ifindex` and `mac` is its MAC; else why the frame is refused (`spoofed` is the
/// reason for a source address that is not the pod's).
#[inline(always)]
pub fn endpoint(
    ifindex: u32,
    source: [u8; 4],
    mac: [u8; 6],
    spoofed: DropReason,
) -> Result<EndpointInfo, DropReason> {
    let Some(pod) = maps::endpoint(source).filter(|pod| pod.host_ifindex == ifindex) else {
        return Err(spoofed);
    };
    if mac != pod.pod_mac {
        return Err(DropReason::SpoofedMac);
    }
    Ok(pod)
}

/// The IPv4 packet in `eth` left the pod behind `ifindex` with source `source`: its
/// endpoint, or why it is refused.
#[inline(always)]
pub fn ipv4(ifindex: u32, eth: &EthHdr, source: [u8; 4]) -> Result<EndpointInfo, DropReason> {
    endpoint(ifindex, source, eth.src_addr, DropReason::SpoofedIpv4Source)
}

/// An ARP packet from the pod behind `ifindex`, sent from `eth`'s source with sender
/// address `spa` and MAC `sha`: its endpoint, or why it is refused. Probes (sender
/// 0.0.0.0) are refused too: a pod's address is its IPAM's to guarantee, and a probe
/// left unanswered tells the pod its address is free.
#[inline(always)]
pub fn arp(
    ifindex: u32,
    eth: &EthHdr,
    spa: [u8; 4],
    sha: [u8; 6],
) -> Result<EndpointInfo, DropReason> {
    if sha != eth.src_addr {
        return Err(DropReason::SpoofedArp);
    }
    endpoint(ifindex, spa, sha, DropReason::SpoofedArp).map_err(|_| DropReason::SpoofedArp)
}
