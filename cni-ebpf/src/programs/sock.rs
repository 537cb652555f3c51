//! The cgroup sock_addr entries: hostPort for the node's own processes
//! (`hostport::sock`). connect4 and sendmsg4 point a socket that dials a host port at
//! the pod; recvmsg4 and getpeername4 show it the address it dialled. The hooks never
//! refuse a call.

use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::features::hostport::sock::{as_dialled, to_pod};

/// The hooks' verdict: 1 lets the call go on (0 would fail it with EPERM).
const ALLOW: i32 = 1;

#[cgroup_sock_addr(connect4)]
pub fn hostport_connect4(ctx: SockAddrContext) -> i32 {
    to_pod(&ctx);
    ALLOW
}

#[cgroup_sock_addr(sendmsg4)]
pub fn hostport_sendmsg4(ctx: SockAddrContext) -> i32 {
    to_pod(&ctx);
    ALLOW
}

#[cgroup_sock_addr(recvmsg4)]
pub fn hostport_recvmsg4(ctx: SockAddrContext) -> i32 {
    as_dialled(&ctx);
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn hostport_getpeername4(ctx: SockAddrContext) -> i32 {
    as_dialled(&ctx);
    ALLOW
}
