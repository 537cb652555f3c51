//! The node's own sockets, as the stack would find them for a packet arriving on TC
//! ingress (`bpf_skc_lookup_tcp`, `bpf_sk_lookup_udp` in the node's namespace).

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_NETNS, bpf_sock, bpf_sock_tuple},
    helpers::generated::{bpf_sk_lookup_udp, bpf_sk_release, bpf_skc_lookup_tcp},
    programs::TcContext,
};
use cni_ebpf_common::{
    NatKey,
    ip_proto::{TCP, UDP},
};

/// The IPv4 half of `bpf_sock_tuple`, as the lookups read it (addresses and ports in
/// network order; the packet's source first).
#[repr(C)]
struct Ipv4Tuple {
    saddr: [u8; 4],
    daddr: [u8; 4],
    sport: [u8; 2],
    dport: [u8; 2],
}

/// `TCP_LISTEN` of the kernel's TCP states.
const TCP_LISTEN: u32 = 10;

/// Whether a packet of `flow`'s protocol from its remote side to `local_addr`:
/// `local_port` belongs to a socket of the node's own: a TCP connection in any state but
/// listening (connecting, established, closing, in TIME_WAIT), or a UDP socket
/// connected to the remote side. A listening or unconnected socket on the port does not
/// count: a hostPort takes its new connections, as portmap's DNAT before the stack does.
/// A function of its own (a BPF call): its tuple stays out of the callers' frames.
#[inline(never)]
pub fn node_holds(ctx: &TcContext, flow: &NatKey, local_addr: [u8; 4], local_port: u16) -> bool {
    let proto = flow.proto;
    let mut tuple = Ipv4Tuple {
        saddr: flow.remote_addr,
        daddr: local_addr,
        sport: flow.remote_port.to_be_bytes(),
        dport: local_port.to_be_bytes(),
    };
    let skb = ctx.skb.skb.cast();
    let tuple_ptr = core::ptr::from_mut(&mut tuple).cast::<bpf_sock_tuple>();
    let size = core::mem::size_of::<Ipv4Tuple>() as u32;
    let netns = BPF_F_CURRENT_NETNS as u64;
    // SAFETY: helper calls on the program's context with a tuple of the size given;
    // every socket found is released before returning.
    unsafe {
        let sk: *mut bpf_sock = match proto {
            TCP => bpf_skc_lookup_tcp(skb, tuple_ptr, size, netns, 0),
            UDP => bpf_sk_lookup_udp(skb, tuple_ptr, size, netns, 0),
            _ => return false,
        };
        if sk.is_null() {
            return false;
        }
        let holds = if proto == TCP {
            (*sk).state != TCP_LISTEN
        } else {
            (*sk).dst_port != 0
        };
        bpf_sk_release(sk.cast());
        holds
    }
}
