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
//! Without ranges each check is one array read.

use aya_ebpf::{
    maps::{LruHashMap, lpm_trie::Key},
    programs::TcContext,
};
use cni_ebpf_common::{
    FragmentKey, NatKey, ServiceClient,
    ip_proto::{ICMP, TCP, UDP},
    tcp_flags,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    features::fragments,
    primitives::{
        maps::{
            self, SERVICE_CIDRS, SERVICE_CLIENTS, SERVICE_FLOWS, SERVICE_PEERS, SERVICE_RANGES,
        },
        packet,
    },
};

/// Whether Service ranges are configured.
#[inline(always)]
fn enabled() -> bool {
    SERVICE_RANGES.get(0).is_some_and(|ranges| *ranges != 0)
}

/// `SERVICE_FLOWS`' values: a flow the stack translated (its replies go back through
/// the stack), or a TCP connection a Service client's socket opened directly to a pod
/// of the node (its replies keep the datapath's way).
const TRANSLATED: u8 = 1;
const DIRECT: u8 = 2;

#[inline(always)]
fn client(addr: [u8; 4], port: u16, proto: u8) -> ServiceClient {
    ServiceClient {
        addr,
        port,
        proto,
        pad: 0,
    }
}

/// The (source, destination) ports of `ip`'s TCP or UDP header, if it has one.
#[inline(always)]
fn ports(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<Option<(u16, u16)>, i64> {
    ports_at(ctx, ip, EthHdr::LEN)
}

/// [`ports`] of an IPv4 header `ip` that starts at `ip_at` in the frame.
#[inline(always)]
fn ports_at(ctx: &TcContext, ip: &Ipv4Hdr, ip_at: usize) -> Result<Option<(u16, u16)>, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(None);
    }
    let l4 = ip_at + ip.ihl() as usize;
    let (source, destination, _) = packet::ports_and_flags(ctx, proto, l4)?;
    Ok(Some((source, destination)))
}

/// Whether `addr` is a Service's: in a Service range, or a node address (NodePorts).
#[inline(always)]
fn is_service_addr(addr: [u8; 4]) -> bool {
    SERVICE_CIDRS.get(Key::new(32, addr)).is_some() || maps::is_node_addr(addr)
}

/// Whether `ip`, a pod's packet for no local pod, is for a Service (a Service range or a
/// node address), or a backend's answer to a Service's client outside the node: the
/// caller hands it to the stack. A Service's client socket is remembered.
#[inline(always)]
pub fn to_service(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<bool, i64> {
    if !enabled() {
        return Ok(false);
    }
    // Only clients address a Service range: every packet refreshes its socket. A node
    // address is also where a backend's answers to a masqueraded client go (a NodePort
    // reached from a pod, a node's own connection): there a TCP socket is remembered
    // from its SYN alone, so that a server's listening socket is never taken for a
    // Service client's.
    if SERVICE_CIDRS.get(Key::new(32, ip.dst_addr)).is_some() {
        remember_source(ctx, ip, &SERVICE_CLIENTS, false)?;
        return Ok(true);
    }
    if maps::is_node_addr(ip.dst_addr) {
        remember_source(ctx, ip, &SERVICE_CLIENTS, true)?;
        return Ok(true);
    }
    // An answer to a client outside the node on a Service connection the stack DNATed
    // (see [`from_outside`]).
    for_socket_in(ctx, ip, &SERVICE_PEERS)
}

/// Remembers the client of `ip`, a TCP or UDP packet arriving on an uplink that no
/// translation took and that goes to the stack: when it is for a Service address (a
/// NodePort, a LoadBalancer or external IP), the stack DNATs it to a pod, whose
/// answers must come back through the stack (see [`to_service`]).
#[inline(always)]
pub fn from_outside(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<(), i64> {
    if !enabled() || !is_service_addr(ip.dst_addr) {
        return Ok(());
    }
    // A TCP client from its SYN alone: a node address also receives the answers to
    // the node's own connections (and to those it masqueraded), whose sources are
    // servers, not Service clients.
    remember_source(ctx, ip, &SERVICE_PEERS, true)
}

/// Whether `ip`, a pod's packet for the local pod at its destination, is a backend's
/// reply on a Service connection of that pod's (a packet for a socket with a Service
/// connection, other than on a direct connection of that socket: see below), to go back
/// through the stack's un-DNAT. A TCP connection a socket with a Service connection opens
/// directly to a pod of the node is recorded (`DIRECT` in `SERVICE_FLOWS`) as its SYN
/// passes: its replies keep the datapath's way. (No program sees the stack's delivery of
/// a translated connection into a local pod, so the translated flow is not recorded
/// here as it is where the stack forwards out of the node. A UDP flow of such a socket
/// sent directly gets its replies through the stack: conntrack takes them as new flows.)
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
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(false);
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let (source, destination, seg) = packet::ports_and_flags(ctx, proto, l4)?;
    let flow = NatKey::new((ip.src_addr, source), (ip.dst_addr, destination), proto);
    if proto == TCP && tcp_flags::opens(seg.flags) && is_remembered(ip.src_addr, source, proto) {
        let _ = SERVICE_FLOWS.insert(&flow, &DIRECT, 0);
        return Ok(false);
    }
    if !is_remembered(ip.dst_addr, destination, proto) {
        return Ok(false);
    }
    let reply = NatKey::new((ip.dst_addr, destination), (ip.src_addr, source), proto);
    // SAFETY: the value is copied out at once.
    if unsafe { SERVICE_FLOWS.get(&reply) }.copied() == Some(DIRECT) {
        return Ok(false);
    }
    fragments::went_to_stack(ip);
    Ok(true)
}

/// Adds the source socket of `ip` (TCP or UDP, a first fragment or whole) to `sockets`,
/// writing only when it is not there yet (a full table evicts the least recently used);
/// with `tcp_openings_only`, a TCP socket only from a SYN.
#[inline(always)]
fn remember_source(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    sockets: &LruHashMap<ServiceClient, u8>,
    tcp_openings_only: bool,
) -> Result<(), i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(());
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let (port, _, seg) = packet::ports_and_flags(ctx, proto, l4)?;
    if proto == TCP && tcp_openings_only && !tcp_flags::opens(seg.flags) {
        return Ok(());
    }
    {
        let key = client(ip.src_addr, port, proto);
        // SAFETY: only the presence is read.
        if unsafe { sockets.get(&key) }.is_none() {
            let _ = sockets.insert(&key, &1, 0);
        }
    }
    Ok(())
}

/// Whether `ip` is for a socket (its destination address and port) in `sockets`: the
/// caller hands it to the stack. A fragment after the first (no ports) goes where its
/// first fragment went.
#[inline(always)]
fn for_socket_in(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    sockets: &LruHashMap<ServiceClient, u8>,
) -> Result<bool, i64> {
    if fragments::is_later(ip) {
        return Ok(fragments::first_of(ip, FragmentKey::TO_STACK).is_some());
    }
    let Some((_, port)) = ports(ctx, ip)? else {
        return Ok(false);
    };
    // SAFETY: only the presence is read.
    let found = unsafe { sockets.get(&client(ip.dst_addr, port, ip.proto as u8)) }.is_some();
    if found {
        fragments::went_to_stack(ip);
    }
    Ok(found)
}

/// Records the flow of `ip`, a packet the node's stack forwarded out of the node (not one
/// the datapath redirected: see `deliver::take_redirected`), when its source is a pod
/// socket with a Service connection: the stack's translation of that connection, whose
/// replies must come back through the stack ([`is_translated_reply`]). Written only when
/// missing (a full table evicts the least recently used; the flow's next packet out
/// writes it back).
/// A function of its own (a BPF call): see [`is_translated_reply_at`].
#[inline(never)]
pub fn left_through_stack(ctx: &TcContext, ip: &Ipv4Hdr) {
    if enabled() {
        let _ = record_translated(ctx, ip);
    }
}

#[inline(always)]
fn record_translated(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<(), i64> {
    let Some((source, destination)) = ports(ctx, ip)? else {
        return Ok(());
    };
    let proto = ip.proto as u8;
    if !is_remembered(ip.src_addr, source, proto) {
        return Ok(());
    }
    let flow = NatKey::new((ip.src_addr, source), (ip.dst_addr, destination), proto);
    // SAFETY: the value is copied out at once.
    if unsafe { SERVICE_FLOWS.get(&flow) }.copied() != Some(TRANSLATED) {
        let _ = SERVICE_FLOWS.insert(&flow, &TRANSLATED, 0);
    }
    Ok(())
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
    let found = translated(
        (ip.dst_addr, destination),
        (ip.src_addr, source),
        ip.proto as u8,
    );
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
    let flow = NatKey::new(pod, remote, proto);
    // SAFETY: the value is copied out at once.
    enabled() && unsafe { SERVICE_FLOWS.get(&flow) }.copied() == Some(TRANSLATED)
}

#[inline(always)]
fn is_remembered(addr: [u8; 4], port: u16, proto: u8) -> bool {
    // SAFETY: only the presence is read.
    unsafe { SERVICE_CLIENTS.get(&client(addr, port, proto)) }.is_some()
}
