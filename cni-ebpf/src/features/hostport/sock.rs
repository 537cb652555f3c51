//! hostPort for the node's own processes, at the socket level (cgroup sock_addr hooks):
//! a socket of the daemon's network namespace that connects or sends to a node address
//! or 127.0.0.0/8 and a host port is pointed at the pod's address and port before any
//! packet exists ([`to_pod`]), so no packet is ever translated and loopback needs no
//! `route_localnet`; receiving and asking for its peer, the socket gets back the
//! address it dialled ([`as_dialled`]). Sockets of other namespaces (pods, other nodes
//! simulated on the machine) are left alone: the hooks compare the socket's netns
//! cookie with the daemon's.

use aya_ebpf::{
    EbpfContext,
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use cni_ebpf_common::{
    HostPortFlow, PortTarget, SockRevKey,
    ip_proto::{TCP, UDP},
};

use super::lookup;
use crate::primitives::maps::{SOCK_CONFIG, SOCK_REV, is_node_addr};

/// Like `mapping` for the node's own sockets, where loopback addresses (127.0.0.0/8)
/// count as node addresses too.
#[inline(always)]
fn local_mapping(proto: u8, addr: [u8; 4], port: u16) -> Option<PortTarget> {
    if addr[0] != 127 && !is_node_addr(addr) {
        return None;
    }
    lookup(proto, addr, port)
}

/// Whether the socket lives in the daemon's network namespace.
#[inline(always)]
fn in_node_netns(ctx: &SockAddrContext) -> bool {
    let Some(config) = SOCK_CONFIG.get(0) else {
        return false;
    };
    // SAFETY: the helper only reads the context.
    config.netns_cookie != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } == config.netns_cookie
}

/// connect4 / sendmsg4: a host port's address becomes the pod's, remembered per socket.
#[inline(always)]
pub fn to_pod(ctx: &SockAddrContext) {
    if !in_node_netns(ctx) {
        return;
    }
    // SAFETY: the kernel hands a valid context for the whole run; these fields are
    // readable and writable in connect4 and sendmsg4.
    let addr = unsafe { &mut *ctx.sock_addr };
    let proto = match addr.protocol {
        p if p == u32::from(TCP) => TCP,
        p if p == u32::from(UDP) => UDP,
        _ => return,
    };
    let host_addr = addr.user_ip4.to_ne_bytes();
    let host_port = u16::from_be(addr.user_port as u16);
    let Some(target) = local_mapping(proto, host_addr, host_port) else {
        return;
    };
    addr.user_ip4 = u32::from_ne_bytes(target.pod_addr);
    addr.user_port = u32::from(target.pod_port.to_be());
    let key = SockRevKey {
        // SAFETY: the helper only reads the context.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        pod_addr: target.pod_addr,
        pod_port: target.pod_port,
        pad: [0, 0],
    };
    let dialled = HostPortFlow {
        host_addr,
        host_port,
        pad: [0, 0],
    };
    let _ = SOCK_REV.insert(&key, &dialled, 0);
}

/// recvmsg4 / getpeername4: the pod's address shown as the one the socket dialled.
#[inline(always)]
pub fn as_dialled(ctx: &SockAddrContext) {
    if !in_node_netns(ctx) {
        return;
    }
    // SAFETY: as in `to_pod`; user_ip4 and user_port are writable in recvmsg4 and
    // getpeername4.
    let addr = unsafe { &mut *ctx.sock_addr };
    let key = SockRevKey {
        // SAFETY: the helper only reads the context.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        pod_addr: addr.user_ip4.to_ne_bytes(),
        pod_port: u16::from_be(addr.user_port as u16),
        pad: [0, 0],
    };
    // SAFETY: the value is copied at once.
    let Some(dialled) = (unsafe { SOCK_REV.get(&key) }).copied() else {
        return;
    };
    addr.user_ip4 = u32::from_ne_bytes(dialled.host_addr);
    addr.user_port = u32::from(dialled.host_port.to_be());
}
