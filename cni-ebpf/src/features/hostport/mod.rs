//! hostPort: a connection to a mapped node address and port is handed to the pod
//! (destination rewritten, delivered with `bpf_redirect_peer`), and the pod's replies get
//! the node address and port back ([`outbound`]). No iptables DNAT chain: one hash
//! lookup, whatever the number of mappings. Three ways in:
//! - from another host, on the uplink's ingress ([`uplink`]);
//! - from a pod of this node, on its veth ([`pods`]); a pod reaching its own hostPort
//!   (hairpin) is also given `HAIRPIN_ADDR` as source, else it would receive a packet
//!   from itself;
//! - from the node's own processes, at the socket level ([`sock`]).
//!
//! This module holds what they share: the mappings, and the connections through them
//! (`HOSTPORT_FLOWS`), whose state follows TCP as conntrack's notes do.

pub mod pods;
pub mod sock;
pub mod uplink;

use aya_ebpf::{bindings::BPF_NOEXIST, programs::TcContext};
use cni_ebpf_common::{
    FlowTable, HostPortFlow, NatEntry, NatKey, PortKey, PortTarget, Refusal, Segment, TARGET_COUNT,
    Way, flow,
};
use network_types::ip::Ipv4Hdr;

use crate::{
    features::{budget, conntrack},
    primitives::{
        clock,
        csum::{self, L4Csum},
        maps::{self, HOSTPORT_FLOWS, HOSTPORT_TARGETS, HOSTPORTS, is_node_addr},
        socket,
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
    NatKey::new(
        (target.pod_addr, target.pod_port),
        (client_addr, client_port),
        proto,
    )
}

/// Notes a packet of `flow` from its client (TCP header `seg`, 0 for UDP) through the
/// mapping `host_addr`:`host_port`: the connection's state moves on, in place (no map
/// update: that takes the bucket's lock); one that expired, or went through another
/// mapping, opens anew. With `node_sockets`, a packet of no live connection that a
/// socket of the node's own holds (the answer to a node process's query or connection
/// from the same port) is not the mapping's: `Ok(false)`, for the stack. (The pods' way
/// in asks none: the lookup's frame would take the pod program past the 512 bytes of
/// stack 6.1 allows a chain of calls, and a node's answer from a pod to a port of the
/// ephemeral range, where the node's own connections leave from, is never a mapping's
/// anyway: the daemon refuses those ports.) A new connection over its pod's budget,
/// or meeting a full table, is refused (the packet is to be dropped: the pod's replies
/// would find no way back).
#[inline(always)]
fn remember(
    ctx: &TcContext,
    flow: &NatKey,
    host_addr: [u8; 4],
    host_port: u16,
    seg: &Segment,
    node_sockets: bool,
) -> Result<bool, Refusal> {
    let now = clock::now_ns();
    let slot = HOSTPORT_FLOWS.get_ptr_mut(flow);
    if let Some(slot) = slot {
        // SAFETY: a pointer into the map value, valid for the program run; copied at once.
        let entry = unsafe { *slot };
        if entry.node_addr == host_addr
            && entry.node_port == host_port
            && !is_expired(&entry, flow.proto, now)
        {
            let followed = flow::follow(&entry, flow.proto, seg, Way::Out, true, now);
            conntrack::touch(slot, &entry, &followed, now);
            return Ok(true);
        }
    }
    if node_sockets && socket::node_holds(ctx, flow, host_addr, host_port) {
        return Ok(false);
    }
    if let Some(slot) = slot {
        // Counted already: opens anew in place.
        // SAFETY: as above.
        unsafe { *slot = opening(flow, host_addr, host_port, seg, now) };
        return Ok(true);
    }
    // Budgets as the daemon wrote them (none while it wrote no timeouts: NAT off).
    let config = maps::timeouts().unwrap_or_default();
    if !budget::within(flow.pod_addr, FlowTable::HostPort, &config) {
        return Err(Refusal::FlowBudget);
    }
    let entry = opening(flow, host_addr, host_port, seg, now);
    match HOSTPORT_FLOWS.insert(flow, &entry, BPF_NOEXIST as u64) {
        Ok(()) => {
            budget::added(flow.pod_addr, FlowTable::HostPort);
            Ok(true)
        }
        Err(error) if budget::is_full(error) => Err(Refusal::TableFull),
        // Another CPU opened it meanwhile.
        Err(_) => Ok(true),
    }
}

/// The entry of `flow`, a connection its client opens through `host_addr`:`host_port`
/// with `seg`.
#[inline(always)]
fn opening(flow: &NatKey, host_addr: [u8; 4], host_port: u16, seg: &Segment, now: u64) -> NatEntry {
    NatEntry {
        node_addr: host_addr,
        node_port: host_port,
        ..conntrack::opened(flow, seg, now)
    }
}

/// Whether the connection `entry` of `proto` idled past its timeout (never while the
/// daemon wrote no timeouts).
#[inline(always)]
fn is_expired(entry: &NatEntry, proto: u8, now: u64) -> bool {
    maps::timeouts().is_some_and(|config| conntrack::expired(entry, proto, &config, now))
}

/// The host address and port of the live hostPort connection `flow` (keyed from the
/// pod's side), if there is one. A packet of the pod's on it (`seg`: its TCP header)
/// moves its state on; an ICMP error's quote of it (`None`) only reads it.
#[inline(always)]
pub fn host_of(flow: &NatKey, seg: Option<&Segment>) -> Option<HostPortFlow> {
    let slot = HOSTPORT_FLOWS.get_ptr_mut(flow)?;
    // SAFETY: a pointer into the map value, valid for the program run; copied at once.
    let entry = unsafe { *slot };
    let now = clock::now_ns();
    if is_expired(&entry, flow.proto, now) {
        return None;
    }
    if let Some(seg) = seg {
        let followed = flow::follow(&entry, flow.proto, seg, Way::In, true, now);
        conntrack::touch(slot, &entry, &followed, now);
    }
    Some(HostPortFlow {
        host_addr: entry.node_addr,
        host_port: entry.node_port,
        pad: [0, 0],
    })
}

/// A pod's TCP/UDP reply (from `pod_port` to `remote_port`, TCP header `seg`, L4 header at
/// `l4`) on a hostPort connection, leaving by the uplink or for another pod of the node
/// ([`pods::reply_to_pod`]): source set back to the host address and port, the
/// connection's state moved on. Returns the host address when it was one.
#[inline(always)]
pub fn outbound(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    l4_csum: L4Csum,
    pod_port: u16,
    remote_port: u16,
    seg: &Segment,
) -> Result<Option<[u8; 4]>, i64> {
    // Most packets (every source-NATed one) leave other ports: one array read, no hash.
    if !is_target_port(pod_port) {
        return Ok(None);
    }
    let flow = NatKey::new(
        (ip.src_addr, pod_port),
        (ip.dst_addr, remote_port),
        ip.proto as u8,
    );
    let Some(host) = host_of(&flow, Some(seg)) else {
        return Ok(None);
    };
    csum::set_source(ctx, ip, host.host_addr, l4_csum)?;
    csum::set_port(ctx, l4, pod_port, host.host_port, l4_csum)?;
    Ok(Some(host.host_addr))
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
