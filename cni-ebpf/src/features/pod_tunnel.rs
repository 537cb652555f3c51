//! No tunnels out of a pod into a node. A node takes a tunnel packet out of its tunnel
//! as if a node sent it; a pod's, source-NATed to its node's address on the way out,
//! would come out of another node's tunnel as that node's pods' or the node's own
//! traffic. So a pod's IP-in-IP, IPv6-in-IPv4 and GRE packets, and its UDP to a VXLAN
//! or Geneve port (the overlay's, 4789, 8472, 6081), are dropped when they are for an
//! address of a node of the cluster (this one included), before anything translates or
//! forwards them, as Calico does on its workload interfaces. To other hosts they go on
//! (a pod may run a tunnel of its own to the outside).

use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use aya_ebpf::programs::TcContext;

use crate::{features::fragments, primitives::maps};

const IPIP: u8 = 4;
const IPV6_IN_IPV4: u8 = 41;
const GRE: u8 = 47;
const UDP: u8 = 17;

/// VXLAN's IANA port, Linux's default VXLAN port (flannel's) and Geneve's.
const TUNNEL_PORTS: [u16; 3] = [4789, 8472, 6081];

/// Whether `ip`, a pod's packet, is a tunnel packet for a node of the cluster.
#[inline(always)]
pub fn into_node(ctx: &TcContext, ip: &Ipv4Hdr) -> bool {
    let tunnel = match ip.proto as u8 {
        IPIP | IPV6_IN_IPV4 | GRE => true,
        // A later fragment has no ports: its first fragment was dropped, so the
        // datagram is never reassembled. A header too short for its ports is no
        // tunnel packet any receiver would take.
        UDP if !fragments::is_later(ip) => ctx
            .load::<[u8; 4]>(EthHdr::LEN + ip.ihl() as usize)
            .is_ok_and(|ports| is_tunnel_port(u16::from_be_bytes([ports[2], ports[3]]))),
        _ => false,
    };
    tunnel && maps::is_cluster_node(ip.dst_addr)
}

#[inline(always)]
fn is_tunnel_port(port: u16) -> bool {
    TUNNEL_PORTS.contains(&port) || maps::overlay_config().is_some_and(|config| config.port == port)
}
