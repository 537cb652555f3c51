//! hostPort: a connection to a mapped node address and port is handed to the pod
//! (destination rewritten, delivered with `bpf_redirect_peer`), and the pod's replies get
//! the node address and port back. No iptables DNAT chain: one hash lookup, whatever the
//! number of mappings. Three ways in:
//! - from another host, on the uplink's ingress ([`inbound`]; replies: [`outbound`] on
//!   the uplink's egress);
//! - from a pod of this node, on its veth ([`from_pod`]; replies to that pod:
//!   [`reply_to_pod`]); a pod reaching its own hostPort (hairpin) is also given
//!   [`HAIRPIN_ADDR`] as source, else it would receive a packet from itself;
//! - from the node's own processes, at the socket level (`crate::sock`), which uses
//!   [`local_mapping`].

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::{
    HAIRPIN_ADDR, HostPortFlow, NatEntry, NatKey, PortKey, PortTarget, TARGET_COUNT, flow,
    ip_proto::{TCP, UDP},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    conntrack, fragments,
    primitives::{
        clock,
        csum::{self, L4Csum},
        deliver,
        maps::{self, HOSTPORT_FLOWS, HOSTPORT_TARGETS, HOSTPORTS, is_node_addr},
        packet::{self, IP_CSUM, IP_DST, IP_SRC},
    },
};

/// The mapping of (`proto`, `addr`, `port`) when `addr` is a node address: for exactly
/// that address, else a mapping without hostIP.
#[inline(always)]
fn mapping(proto: u8, addr: [u8; 4], port: u16) -> Option<PortTarget> {
    if !is_node_addr(addr) {
        return None;
    }
    lookup(proto, addr, port)
}

/// Like [`mapping`] for the node's own sockets, where loopback addresses (127.0.0.0/8)
/// count as node addresses too.
#[inline(always)]
pub fn local_mapping(proto: u8, addr: [u8; 4], port: u16) -> Option<PortTarget> {
    if addr[0] != 127 && !is_node_addr(addr) {
        return None;
    }
    lookup(proto, addr, port)
}

#[inline(always)]
fn lookup(proto: u8, addr: [u8; 4], port: u16) -> Option<PortTarget> {
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
    let any = PortKey {
        host_addr: [0; 4],
        ..key
    };
    unsafe { HOSTPORTS.get(&any) }.copied()
}

/// Whether `port` is a host port of `proto` on the node address (source NAT skips it).
/// On a node without mappings, an array read instead of two hash lookups per port a
/// new flow tries.
#[inline(always)]
pub fn is_host_port(proto: u8, port: u16, node_addr: [u8; 4]) -> bool {
    any_mapping() && lookup(proto, node_addr, port).is_some()
}

/// The flow of a connection from `client_addr`:`client_port` to the pod behind `target`,
/// keyed from the pod's side as `HOSTPORT_FLOWS` is.
#[inline(always)]
fn flow_to(target: &PortTarget, client_addr: [u8; 4], client_port: u16, proto: u8) -> NatKey {
    NatKey {
        pod_addr: target.pod_addr,
        remote_addr: client_addr,
        pod_port: target.pod_port,
        remote_port: client_port,
        proto,
        pad: [0, 0, 0],
    }
}

/// Notes a packet of `flow` from its client (TCP `flags`, 0 for UDP) through the
/// mapping `host_addr`:`host_port`: the connection's state moves on, in place (no map
/// update: that takes the bucket's lock and recycles an LRU node); one that expired, or
/// went through another mapping, opens anew.
#[inline(always)]
fn remember(flow: &NatKey, host_addr: [u8; 4], host_port: u16, flags: u8) {
    let now = clock::now_ns();
    if let Some(slot) = HOSTPORT_FLOWS.get_ptr_mut(flow) {
        // SAFETY: a pointer into the map value, valid for the program run; copied at once.
        let entry = unsafe { *slot };
        if entry.node_addr == host_addr
            && entry.node_port == host_port
            && !is_expired(&entry, flow.proto, now)
        {
            let state = flow::inbound_state(flow.proto, entry.state, flags, false);
            conntrack::touch(slot, &entry, state, now);
            return;
        }
    }
    let entry = NatEntry {
        node_addr: host_addr,
        node_port: host_port,
        ..NatEntry::from_outside(flow, flow::opening_state(flow.proto, flags), now)
    };
    let _ = HOSTPORT_FLOWS.insert(flow, &entry, 0);
}

/// Whether the connection `entry` of `proto` idled past its timeout (never while the
/// daemon wrote no timeouts).
#[inline(always)]
fn is_expired(entry: &NatEntry, proto: u8, now: u64) -> bool {
    maps::timeouts().is_some_and(|config| conntrack::expired(entry, proto, &config, now))
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
) -> Result<Option<i32>, i64> {
    let proto = ip.proto as u8;
    let (client_port, host_port, flags) = packet::ports_and_flags(ctx, proto, l4)?;
    let Some(target) = mapping(proto, ip.dst_addr, host_port) else {
        return Ok(None);
    };
    let Some(pod) = maps::endpoint(target.pod_addr) else {
        return Ok(None);
    };
    let flow = flow_to(&target, ip.src_addr, client_port, proto);
    remember(&flow, ip.dst_addr, host_port, flags);
    csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, target.pod_addr, l4_csum)?;
    csum::set_port(ctx, l4 + 2, host_port, target.pod_port, l4_csum)?;
    // The fragments after a first one follow it (`deliver` hands it over above TTL 1).
    fragments::arrived(ip, target.pod_addr, ip.ttl > 1);
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    deliver::deliver(ctx, eth, &ip, &pod).map(Some)
}

/// The pod address and port behind a hostPort connection, from what an ICMP error
/// quotes of the reply that left the node: its source (`host_addr`:`host_port`) and
/// destination (the client). `None` when no such connection is known.
#[inline(always)]
pub fn quoted(
    proto: u8,
    host_addr: [u8; 4],
    host_port: u16,
    client_addr: [u8; 4],
    client_port: u16,
) -> Option<([u8; 4], u16)> {
    let target = mapping(proto, host_addr, host_port)?;
    let flow = flow_to(&target, client_addr, client_port, proto);
    let host = host_of(&flow, None)?;
    (host.host_addr == host_addr && host.host_port == host_port)
        .then_some((target.pod_addr, target.pod_port))
}

/// The host address and port of the live hostPort connection `flow` (keyed from the
/// pod's side), if there is one. A packet of the pod's on it (`flags`: its TCP flags)
/// moves its state on; an ICMP error's quote of it (`None`) only reads it.
#[inline(always)]
pub fn host_of(flow: &NatKey, flags: Option<u8>) -> Option<HostPortFlow> {
    let slot = HOSTPORT_FLOWS.get_ptr_mut(flow)?;
    // SAFETY: a pointer into the map value, valid for the program run; copied at once.
    let entry = unsafe { *slot };
    let now = clock::now_ns();
    if is_expired(&entry, flow.proto, now) {
        return None;
    }
    if let Some(flags) = flags {
        let state = flow::inbound_state(flow.proto, entry.state, flags, true);
        conntrack::touch(slot, &entry, state, now);
    }
    Some(HostPortFlow {
        host_addr: entry.node_addr,
        host_port: entry.node_port,
        pad: [0, 0],
    })
}

/// A pod's TCP/UDP reply (from `pod_port` to `remote_port`, TCP `flags`, L4 header at
/// `l4`) leaving by the uplink on a hostPort connection: source set back to the host
/// address and port, the connection's state moved on. Returns the host address when it
/// was one.
#[inline(always)]
pub fn outbound(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    l4_csum: L4Csum,
    pod_port: u16,
    remote_port: u16,
    flags: u8,
) -> Result<Option<[u8; 4]>, i64> {
    // Most packets (every source-NATed one) leave other ports: one array read, no hash.
    if !is_target_port(pod_port) {
        return Ok(None);
    }
    let flow = NatKey {
        pod_addr: ip.src_addr,
        remote_addr: ip.dst_addr,
        pod_port,
        remote_port,
        proto: ip.proto as u8,
        pad: [0, 0, 0],
    };
    let Some(host) = host_of(&flow, Some(flags)) else {
        return Ok(None);
    };
    csum::set_source(ctx, ip, host.host_addr, l4_csum)?;
    csum::set_port(ctx, l4, pod_port, host.host_port, l4_csum)?;
    Ok(Some(host.host_addr))
}

/// A pod's TCP/UDP packet for an address that is not a pod's: a connection to a node
/// address and host port goes to the mapped pod (from [`HAIRPIN_ADDR`] when that pod is
/// the sender), and a reply on a hairpin connection goes back to the pod as coming from
/// the host address and port. `Ok(None)`: neither.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, eth: &EthHdr, ip: &Ipv4Hdr) -> Result<Option<i32>, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 || !any_mapping() {
        return Ok(None);
    }
    // Checked before reading the ports: a pod's traffic to the outside pays one lookup.
    if ip.dst_addr != HAIRPIN_ADDR && !is_node_addr(ip.dst_addr) {
        return Ok(None);
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let Some(l4_csum) = L4Csum::of(proto, l4) else {
        return Ok(None);
    };
    let (src_port, dst_port, flags) = packet::ports_and_flags(ctx, proto, l4)?;
    if ip.dst_addr == HAIRPIN_ADDR {
        let flow = NatKey {
            pod_addr: ip.src_addr,
            remote_addr: HAIRPIN_ADDR,
            pod_port: src_port,
            remote_port: dst_port,
            proto,
            pad: [0, 0, 0],
        };
        let Some(host) = host_of(&flow, Some(flags)) else {
            return Ok(None);
        };
        let Some(pod) = maps::endpoint(ip.src_addr) else {
            return Ok(None);
        };
        csum::set_addr(ctx, IP_SRC, IP_CSUM, ip.src_addr, host.host_addr, l4_csum)?;
        csum::set_port(ctx, l4, src_port, host.host_port, l4_csum)?;
        csum::set_addr(ctx, IP_DST, IP_CSUM, HAIRPIN_ADDR, ip.src_addr, l4_csum)?;
        let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
        return deliver::deliver(ctx, eth, &ip, &pod).map(Some);
    }
    // A node address (checked above): straight to the mappings.
    let Some(target) = lookup(proto, ip.dst_addr, dst_port) else {
        return Ok(None);
    };
    let Some(pod) = maps::endpoint(target.pod_addr) else {
        return Ok(None);
    };
    let hairpin = target.pod_addr == ip.src_addr;
    let client = if hairpin { HAIRPIN_ADDR } else { ip.src_addr };
    let flow = flow_to(&target, client, src_port, proto);
    remember(&flow, ip.dst_addr, dst_port, flags);
    if hairpin {
        csum::set_addr(ctx, IP_SRC, IP_CSUM, ip.src_addr, HAIRPIN_ADDR, l4_csum)?;
    }
    csum::set_addr(ctx, IP_DST, IP_CSUM, ip.dst_addr, target.pod_addr, l4_csum)?;
    csum::set_port(ctx, l4 + 2, dst_port, target.pod_port, l4_csum)?;
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    deliver::deliver(ctx, eth, &ip, &pod).map(Some)
}

/// A pod's packet for another pod of this node: when it leaves a port some mapping
/// leads to and belongs to a hostPort connection from that pod, its source becomes the
/// host address and port. Returns whether it was rewritten. Other packets cost one
/// array read (in [`outbound`]).
#[inline(always)]
pub fn reply_to_pod(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<bool, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(false);
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let Some(l4_csum) = L4Csum::of(proto, l4) else {
        return Ok(false);
    };
    let (pod_port, remote_port, flags) = packet::ports_and_flags(ctx, proto, l4)?;
    Ok(outbound(ctx, ip, l4, l4_csum, pod_port, remote_port, flags)?.is_some())
}

/// Whether any mapping exists on the node (an array read the verifier inlines).
#[inline(always)]
fn any_mapping() -> bool {
    HOSTPORT_TARGETS
        .get(TARGET_COUNT)
        .is_some_and(|count| *count != 0)
}

/// Whether some mapping leads to container port `port` (the `HOSTPORT_TARGETS` bitmap):
/// only packets leaving such a port can be hostPort replies.
#[inline(always)]
fn is_target_port(port: u16) -> bool {
    let word = HOSTPORT_TARGETS
        .get(u32::from(port) / 32)
        .copied()
        .unwrap_or(0);
    word & (1 << (port % 32)) != 0
}
