//! Kubernetes Services implemented by the node's netfilter (kube-proxy in iptables or
//! nftables mode, see `cni_ebpf_common::services`). The datapath otherwise keeps pods'
//! traffic away from the node's stack, and with it from the Services' DNAT: a packet for
//! a ClusterIP would be routed out as it is. With Service ranges configured:
//! - a pod's packet for a Service range, or for a node address (a NodePort), goes to the
//!   stack, and the pod's socket is remembered ([`to_service`]);
//! - a packet for such a socket from a backend on this node goes to the stack too, where
//!   the DNAT is undone, unless it is on a TCP connection that socket opened directly
//!   to that pod ([`is_reply`], pod to pod);
//! - the stack's translation of such a connection, forwarded out of the node (to a
//!   backend on another node, through the overlay or natively routed, or outside the
//!   cluster), is seen by the egress program of the uplink or the overlay device, which
//!   records it whole, the pod's socket and the backend's ([`left_through_stack`]); a
//!   packet of that very flow arriving for the pod, from the overlay, the native routes
//!   or translated back by the uplink, goes to the stack ([`is_translated_reply`]).
//!   Decided by the whole flow: the pod's other connections to the same backend, or from
//!   the same port to other hosts, keep the datapath's way;
//! - a client outside the node reaching a Service (a NodePort, or a LoadBalancer or
//!   external IP in the ranges) arrives on the uplink for the stack, which DNATs it to a
//!   pod; its socket is remembered ([`from_outside`]), and the backend's answers to it go
//!   to the stack too ([`to_service`]), where the DNAT is undone. Without that they left
//!   by the uplink from the pod's address, or translated to a new node port, whenever
//!   the client's address is kept (`externalTrafficPolicy: Local`).
//!
//! Only what can need it is recorded: a connection to a Service range, or to a node
//! address on a NodePort (`--service-node-port-range`); for TCP, from its SYN. The
//! tables are plain hashes with a budget for each party (`service_tables`): see
//! `cni_ebpf_common::services`.
//!
//! Without ranges each check is one array read.

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::{
    FragmentKey, NatKey, Segment, ServiceClient, ServiceTable,
    ip_proto::{ICMP, TCP, UDP},
    services::flow_kind::{DIRECT, TRANSLATED},
    tcp_flags,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    features::{fragments, service_tables},
    primitives::{
        maps::{self, SERVICE_CLIENTS, SERVICE_FLOWS, SERVICE_RANGES},
        packet,
    },
};

/// Whether Service ranges are configured.
#[inline(always)]
fn enabled() -> bool {
    SERVICE_RANGES.get(0).is_some_and(|ranges| *ranges != 0)
}

/// What a pod's packet for no local pod is to the Services.
pub enum Service {
    /// Not a Service's: the datapath's way.
    No,
    /// A Service's, or an answer to a Service's client outside: to the node's stack.
    ToStack,
    /// A new Service connection over its pod's budget or meeting a full table: dropped
    /// (counted).
    Refused,
}

#[inline(always)]
fn client(addr: [u8; 4], port: u16, proto: u8) -> ServiceClient {
    ServiceClient {
        addr,
        port,
        proto,
        pad: 0,
    }
}

/// The (source, destination) ports and TCP segment of `ip`'s TCP or UDP header (its IPv4
/// header at `ip_at` in the frame), if it has one: not a later fragment.
#[inline(always)]
fn l4_at(ctx: &TcContext, ip: &Ipv4Hdr, ip_at: usize) -> Result<Option<(u16, u16, Segment)>, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(None);
    }
    let l4 = ip_at + ip.ihl() as usize;
    packet::ports_and_flags(ctx, proto, l4).map(Some)
}

/// The (source, destination) ports alone of what [`l4_at`] reads (4 bytes loaded, not a
/// whole TCP header: the reply checks run deep in the uplink's chain of calls).
#[inline(always)]
fn ports_at(ctx: &TcContext, ip: &Ipv4Hdr, ip_at: usize) -> Result<Option<(u16, u16)>, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(None);
    }
    let ports: [u8; 4] = ctx.load(ip_at + ip.ihl() as usize)?;
    Ok(Some((
        u16::from_be_bytes([ports[0], ports[1]]),
        u16::from_be_bytes([ports[2], ports[3]]),
    )))
}

/// [`l4_at`] of a packet whose IPv4 header follows the Ethernet header.
#[inline(always)]
fn l4(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<Option<(u16, u16, Segment)>, i64> {
    l4_at(ctx, ip, EthHdr::LEN)
}

/// Whether a packet with `seg` of `proto` may open a Service entry: a TCP SYN, or any
/// UDP datagram.
#[inline(always)]
fn may_open(proto: u8, seg: &Segment) -> bool {
    proto != TCP || tcp_flags::opens(seg.flags)
}

/// The flow key of `pod` and `remote` (address and port each) of `proto`, as
/// `NatKey::new` makes it, built of two aligned words: field by field, LLVM zeroes the
/// 3 unaligned bytes of padding with a call to `memset`, a BPF function whose frame
/// would take the uplink's ingress chain past the 512 bytes of stack Linux 6.1 allows.
#[inline(always)]
fn flow_key(pod: ([u8; 4], u16), remote: ([u8; 4], u16), proto: u8) -> NatKey {
    let addrs =
        u64::from(u32::from_ne_bytes(pod.0)) | u64::from(u32::from_ne_bytes(remote.0)) << 32;
    let rest = u64::from(pod.1) | u64::from(remote.1) << 16 | u64::from(proto) << 32;
    // SAFETY: `NatKey` is #[repr(C)], 16 bytes without implicit padding: the two
    // addresses in the first word, the ports, the protocol and zero padding in the
    // second (little-endian, as BPF on x86 and arm64).
    unsafe { core::mem::transmute::<[u64; 2], NatKey>([addrs, rest]) }
}

/// Whether `ip`, for a node address, is for a NodePort (a TCP or UDP destination port
/// in the range the daemon wrote).
#[inline(always)]
fn is_node_port(destination: u16) -> bool {
    service_tables::config().is_node_port(destination)
}

/// What `ip`, a pod's packet for no local pod, is: for a Service (a Service range, or a
/// NodePort of a node address), or a backend's answer to a Service's client outside the
/// node, the caller hands it to the stack. A Service's client socket is remembered (for
/// TCP, from its SYN), within its pod's budget.
#[inline(always)]
pub fn to_service(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<Service, i64> {
    if !enabled() {
        return Ok(Service::No);
    }
    let in_range = maps::in_service_range(ip.dst_addr);
    let node = !in_range && maps::is_node_addr(ip.dst_addr);
    if in_range || node {
        // A node address is also where a backend's answers to a masqueraded client go,
        // and where node services listen: only its NodePorts are Services.
        if let Some((source, destination, seg)) = l4(ctx, ip)?
            && (in_range || is_node_port(destination))
        {
            let proto = ip.proto as u8;
            let key = client(ip.src_addr, source, proto);
            let open = may_open(proto, &seg);
            if service_tables::opener_socket(ServiceTable::Clients, &key, &seg, open) {
                return Ok(Service::Refused);
            }
        }
        return Ok(Service::ToStack);
    }
    // An answer to a client outside the node on a Service connection the stack DNATed
    // (see [`from_outside`]).
    if fragments::is_later(ip) {
        let first = fragments::first_of(ip, FragmentKey::TO_STACK).is_some();
        return Ok(if first { Service::ToStack } else { Service::No });
    }
    let Some((_, destination, seg)) = l4(ctx, ip)? else {
        return Ok(Service::No);
    };
    let peer = client(ip.dst_addr, destination, ip.proto as u8);
    if service_tables::answerer_socket(ServiceTable::Peers, &peer, &seg) {
        fragments::went_to_stack(ip);
        return Ok(Service::ToStack);
    }
    Ok(Service::No)
}

/// Remembers the client of `ip`, a TCP or UDP packet arriving on an uplink that no
/// translation took and that goes to the stack, when it is for a Service (a NodePort
/// of a node address, a LoadBalancer or external IP in a Service range): the stack
/// DNATs it to a pod, whose answers must come back through the stack (see
/// [`to_service`]). For TCP from its SYN, within the client address's budget: whether
/// it is refused (the caller drops it).
#[inline(always)]
pub fn from_outside(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<bool, i64> {
    if !enabled() {
        return Ok(false);
    }
    let Some((source, destination, seg)) = l4(ctx, ip)? else {
        return Ok(false);
    };
    let in_range = maps::in_service_range(ip.dst_addr);
    if !in_range && !(maps::is_node_addr(ip.dst_addr) && is_node_port(destination)) {
        return Ok(false);
    }
    let proto = ip.proto as u8;
    let key = client(ip.src_addr, source, proto);
    let open = may_open(proto, &seg);
    Ok(service_tables::opener_socket(
        ServiceTable::Peers,
        &key,
        &seg,
        open,
    ))
}

/// Whether `ip`, a pod's packet for the local pod at its destination, is a backend's
/// reply on a Service connection of that pod's (a packet for a socket with a Service
/// connection, other than on a direct connection of that socket: see below), to go back
/// through the stack's un-DNAT. A TCP connection a socket with a Service connection opens
/// directly to a pod of the node is recorded (`DIRECT` in `SERVICE_FLOWS`) as its SYN
/// passes (its FIN and RST follow it): its replies keep the datapath's way. (No program
/// sees the stack's delivery of a translated connection into a local pod, so the
/// translated flow is not recorded here as it is where the stack forwards out of the
/// node. A UDP flow of such a socket sent directly, or a direct connection over its
/// pod's budget, gets its replies through the stack: conntrack takes them as new
/// flows.)
///
/// A function of its own (a BPF call), so that its frame is not the caller's: see
/// [`is_translated_reply_at`]. A packet it cannot read goes to the stack.
#[inline(never)]
pub fn is_reply(ctx: &TcContext, ip: &Ipv4Hdr) -> bool {
    enabled() && reply_on_node(ctx, ip).unwrap_or(true)
}

#[inline(always)]
fn reply_on_node(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<bool, i64> {
    if fragments::is_later(ip) {
        return Ok(fragments::first_of(ip, FragmentKey::TO_STACK).is_some());
    }
    let Some((source, destination, seg)) = l4(ctx, ip)? else {
        return Ok(false);
    };
    let proto = ip.proto as u8;
    let moves = tcp_flags::SYN | tcp_flags::FIN | tcp_flags::RST;
    if proto == TCP && seg.flags & moves != 0 && is_remembered(ip.src_addr, source, proto) {
        let flow = flow_key((ip.src_addr, source), (ip.dst_addr, destination), proto);
        let kind = if tcp_flags::opens(seg.flags) {
            DIRECT
        } else {
            0
        };
        // Over its budget, the direct connection goes unrecorded (see above).
        let _ = service_tables::opener_flow(&flow, &seg, kind);
        return Ok(false);
    }
    let socket = client(ip.dst_addr, destination, proto);
    if !service_tables::answered_socket(ServiceTable::Clients, &socket, &seg) {
        return Ok(false);
    }
    let reply = flow_key((ip.dst_addr, destination), (ip.src_addr, source), proto);
    if service_tables::answerer_flow(&reply) == DIRECT {
        return Ok(false);
    }
    fragments::went_to_stack(ip);
    Ok(true)
}

/// Records the flow of `ip`, a packet the node's stack forwarded out of the node (not one
/// the datapath redirected: see `deliver::take_redirected`), when its source is a pod
/// socket with a Service connection: the stack's translation of that connection, whose
/// replies must come back through the stack ([`is_translated_reply`]). Created from a
/// TCP SYN or any UDP datagram, within the pod's budget; whether the packet is refused
/// (the caller drops it).
/// A function of its own (a BPF call): see [`is_translated_reply_at`].
#[inline(never)]
pub fn left_through_stack(ctx: &TcContext, ip: &Ipv4Hdr) -> bool {
    enabled() && record_translated(ctx, ip).unwrap_or(false)
}

#[inline(always)]
fn record_translated(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<bool, i64> {
    let Some((source, destination, seg)) = l4(ctx, ip)? else {
        return Ok(false);
    };
    let proto = ip.proto as u8;
    if !is_remembered(ip.src_addr, source, proto) {
        return Ok(false);
    }
    let flow = flow_key((ip.src_addr, source), (ip.dst_addr, destination), proto);
    let kind = if may_open(proto, &seg) { TRANSLATED } else { 0 };
    Ok(service_tables::opener_flow(&flow, &seg, kind))
}

/// Whether `ip`, arriving from another node or the overlay for the local pod at its
/// destination, is a reply of a Service connection the stack translated (see
/// [`left_through_stack`]): the caller hands it to the stack, which undoes the
/// translation. A fragment after the first goes where its first fragment went.
#[inline(always)]
pub fn is_translated_reply(ctx: &TcContext, ip: &Ipv4Hdr) -> bool {
    is_translated_reply_at(ctx, ip, EthHdr::LEN)
}

/// [`is_translated_reply`] for an IPv4 header `ip` that starts at `ip_at` in the frame
/// (the inner packet of a VXLAN frame). A function of its own (a BPF call, its
/// arguments in registers): inlined, its frame would join the uplink program's and take
/// it past the 512 bytes of stack Linux 6.1's verifier allows a chain of calls (see
/// docs/decisions.md). A packet it cannot read goes to the stack.
#[inline(never)]
pub fn is_translated_reply_at(ctx: &TcContext, ip: &Ipv4Hdr, ip_at: usize) -> bool {
    enabled() && translated_reply_at(ctx, ip, ip_at).unwrap_or(true)
}

#[inline(always)]
fn translated_reply_at(ctx: &TcContext, ip: &Ipv4Hdr, ip_at: usize) -> Result<bool, i64> {
    if fragments::is_later(ip) {
        return Ok(fragments::first_of(ip, FragmentKey::TO_STACK).is_some());
    }
    if ip.proto as u8 == ICMP {
        return is_translated_error(ctx, ip, ip_at);
    }
    let Some((source, destination)) = ports_at(ctx, ip, ip_at)? else {
        return Ok(false);
    };
    let flow = flow_key(
        (ip.dst_addr, destination),
        (ip.src_addr, source),
        ip.proto as u8,
    );
    let found = service_tables::answerer_flow(&flow) == TRANSLATED;
    if found {
        fragments::went_to_stack(ip);
    }
    Ok(found)
}

/// Whether `ip` (ICMP, its header at `ip_at`) is an error about a packet of a Service
/// connection the stack translated (the packet it quotes left the pod as the stack
/// forwarded it): the stack translates the quoted headers back, as conntrack's related
/// packets are.
#[inline(always)]
fn is_translated_error(ctx: &TcContext, ip: &Ipv4Hdr, ip_at: usize) -> Result<bool, i64> {
    let l4 = ip_at + ip.ihl() as usize;
    if !packet::is_icmp_error(ctx.load::<u8>(l4)?) {
        return Ok(false);
    }
    let quoted: Ipv4Hdr = ctx.load(l4 + ICMP_HEADER)?;
    if !packet::quoted_ipv4_well_formed(&quoted) {
        return Ok(false);
    }
    let Some((source, destination)) = ports_at(ctx, &quoted, l4 + ICMP_HEADER)? else {
        return Ok(false);
    };
    Ok(translated(
        (quoted.src_addr, source),
        (quoted.dst_addr, destination),
        quoted.proto as u8,
    ))
}

/// The ICMP header before an error's quoted packet.
const ICMP_HEADER: usize = 8;

/// Whether the flow of the pod socket `pod` with the remote socket `remote` (`proto`) is
/// a Service connection the stack translated: a reply translated back by the uplink's
/// reverse NAT (a backend outside the cluster) goes to the stack.
#[inline(always)]
pub fn translated(pod: ([u8; 4], u16), remote: ([u8; 4], u16), proto: u8) -> bool {
    let flow = flow_key(pod, remote, proto);
    // SAFETY: the field is copied out at once.
    enabled()
        && unsafe { SERVICE_FLOWS.get(&flow) }.map(|entry| entry.node_port) == Some(TRANSLATED)
}

#[inline(always)]
fn is_remembered(addr: [u8; 4], port: u16, proto: u8) -> bool {
    // SAFETY: only the presence is read.
    unsafe { SERVICE_CLIENTS.get(&client(addr, port, proto)) }.is_some()
}
