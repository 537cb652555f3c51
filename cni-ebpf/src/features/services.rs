//! Kubernetes Services implemented by the node's netfilter (kube-proxy in iptables or
//! nftables mode, see `cni_ebpf_common::services`). The datapath otherwise keeps pods'
//! traffic away from the node's stack, and with it from the Services' DNAT: a packet for
//! a ClusterIP would be routed out as it is. With Service ranges configured:
//! - a pod's packet for a Service range, or for a node address (a NodePort), goes to the
//!   stack, and the pod's socket is remembered ([`to_service`]);
//! - a packet for such a socket goes to the stack too, where the DNAT is undone: a reply
//!   from a backend on this node ([`is_reply`], pod to pod) or, translated back by the
//!   uplink, from one outside ([`is_client`]);
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
    FragmentKey, ServiceClient,
    ip_proto::{TCP, UDP},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    features::fragments,
    primitives::{
        maps::{self, SERVICE_CIDRS, SERVICE_CLIENTS, SERVICE_PEERS, SERVICE_RANGES},
        packet,
    },
};

/// Whether Service ranges are configured.
#[inline(always)]
fn enabled() -> bool {
    SERVICE_RANGES.get(0).is_some_and(|ranges| *ranges != 0)
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

/// The (source, destination) ports of `ip`'s TCP or UDP header, if it has one.
#[inline(always)]
fn ports(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<Option<(u16, u16)>, i64> {
    let proto = ip.proto as u8;
    if (proto != TCP && proto != UDP) || ip.frag_offset() != 0 {
        return Ok(None);
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
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
    if !is_service_addr(ip.dst_addr) {
        // An answer to a client outside the node on a Service connection the stack
        // DNATed (see [`from_outside`]).
        return for_socket_in(ctx, ip, &SERVICE_PEERS);
    }
    remember_source(ctx, ip, &SERVICE_CLIENTS)?;
    Ok(true)
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
    remember_source(ctx, ip, &SERVICE_PEERS)
}

/// Whether `ip`, for the local pod at its destination, is for a socket of that pod with a
/// Service connection (a backend's reply, to go back through the stack's un-DNAT).
#[inline(always)]
pub fn is_reply(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<bool, i64> {
    if !enabled() {
        return Ok(false);
    }
    for_socket_in(ctx, ip, &SERVICE_CLIENTS)
}

/// Adds the source socket of `ip` (TCP or UDP, a first fragment or whole) to `sockets`,
/// writing only when it is not there yet (a full table evicts the least recently used).
#[inline(always)]
fn remember_source(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    sockets: &LruHashMap<ServiceClient, u8>,
) -> Result<(), i64> {
    if let Some((port, _)) = ports(ctx, ip)? {
        let key = client(ip.src_addr, port, ip.proto as u8);
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

/// Whether the pod socket `addr`:`port` (`proto`) has a Service connection.
#[inline(always)]
pub fn is_client(addr: [u8; 4], port: u16, proto: u8) -> bool {
    enabled() && is_remembered(addr, port, proto)
}

#[inline(always)]
fn is_remembered(addr: [u8; 4], port: u16, proto: u8) -> bool {
    // SAFETY: only the presence is read.
    unsafe { SERVICE_CLIENTS.get(&client(addr, port, proto)) }.is_some()
}
