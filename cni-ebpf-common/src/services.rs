//! Kubernetes Services implemented by the node's netfilter (kube-proxy in iptables or
//! nftables mode): the datapath hands pods' Service traffic, and the replies of those
//! connections, to the node's stack, where the Service's DNAT and its undoing happen.
//!
//! - `SERVICE_CIDRS`: LPM trie ([`crate::CidrKey`] -> `u8`) of the Service ranges;
//! - `SERVICE_RANGES`: array of one `u32`, how many ranges there are (0: none, and the
//!   datapath spends nothing on Services);
//! - `SERVICE_CONFIG`: array of one [`ServiceConfig`], the NodePort range and each
//!   party's budget;
//! - `SERVICE_CLIENTS`: hash [`ServiceClient`] -> [`crate::NatEntry`], the pod sockets
//!   that opened a connection to a Service range or a NodePort;
//! - `SERVICE_FLOWS`: hash [`crate::NatKey`] -> [`crate::NatEntry`], the connections of
//!   those sockets as the stack translated them (the pod's socket, the backend's;
//!   [`flow_kind::TRANSLATED`]), seen leaving the node after the stack forwarded them:
//!   their replies, from whichever way they arrive, go back through the stack; and the
//!   TCP connections those sockets open directly to a pod of the node
//!   ([`flow_kind::DIRECT`]), whose replies keep the datapath's way;
//! - `SERVICE_PEERS`: hash [`ServiceClient`] -> [`crate::NatEntry`], the sockets of
//!   clients outside the node whose connections arrived on an uplink for a Service (a
//!   NodePort, a LoadBalancer or external IP) and went to the stack, which DNATs them
//!   to a pod;
//! - `SERVICE_COUNTS`: hash of a party's address -> [`ServiceCounts`], its entries in
//!   each of the three tables. A party is counted before its first entry is made (a
//!   full `SERVICE_COUNTS` refuses the entry, so that no party goes uncounted), and the
//!   sweep removes the counts of a party that holds nothing any more: addresses an
//!   outside host forged come and go.
//!
//! The three tables are plain hashes, as the NAT tables are (see [`crate::budget`]): an
//! entry leaves only when the daemon's sweep removes it (idle past its timeout, its pod
//! gone, or, when its party or its table nears the brim, unanswered and closing ones
//! first), never to make room for another, so that nobody can flush a live Service
//! connection's entry by filling a table. What is recorded is only what can need it: a
//! connection to a Service range, or to a node address on a port of the NodePort range
//! ([`ServiceConfig::is_node_port`]); for TCP, only from its SYN. Each party (a pod for
//! its sockets and flows, an outside address for its sockets) holds at most
//! [`ServiceConfig::party_budget`] entries in each table; a new connection over it, or
//! meeting a full table, is dropped (`service_refused`) and calls a sweep at once,
//! which early-drops that party's own unanswered and closing entries first.
//!
//! Each entry is a [`crate::NatEntry`] whose `pod_addr` and `pod_port` are the socket
//! of the party that opened it (the pod's, or the outside client's), `state` the
//! connection's state as that party's own packets tell it ([`opener_state`]) and, in
//! `SERVICE_FLOWS`, `node_port` its [`flow_kind`]; it expires by the NAT timeouts
//! ([`crate::Timeouts`]).

use crate::{NatEntry, Segment, flow::seq_seen, ip_proto::TCP, tcp_flags, tcp_state, udp_state};

/// A socket (address, port, protocol): a pod's that opened a connection to a Service, or
/// an outside client's of a Service.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceClient {
    pub addr: [u8; 4],
    /// Host byte order.
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
}

/// What the daemon tells the datapath of Services (`SERVICE_CONFIG`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceConfig {
    /// The NodePort range, inclusive (kube-apiserver's `--service-node-port-range`): a
    /// connection to a node address is a Service's only on these ports.
    pub node_port_min: u16,
    pub node_port_max: u16,
    /// Entries one party may hold in each Service table; 0 while the daemon wrote none
    /// (then no connection to a node address is recorded either).
    pub party_budget: u32,
}

impl ServiceConfig {
    /// Whether `port` is in the NodePort range.
    #[inline(always)]
    #[must_use]
    pub const fn is_node_port(&self, port: u16) -> bool {
        self.node_port_min <= port && port <= self.node_port_max && self.party_budget != 0
    }
}

/// A party's entries in each Service table (`SERVICE_COUNTS`, keyed by its address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceCounts {
    pub clients: u32,
    pub flows: u32,
    pub peers: u32,
    pub pad: u32,
}

/// The Service tables a party's budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceTable {
    Clients,
    Flows,
    Peers,
}

impl ServiceCounts {
    /// The count of `table`.
    #[inline(always)]
    #[must_use]
    pub const fn of(&self, table: ServiceTable) -> u32 {
        match table {
            ServiceTable::Clients => self.clients,
            ServiceTable::Flows => self.flows,
            ServiceTable::Peers => self.peers,
        }
    }

    /// Whether the party holds no entry in any table: its counts may go.
    #[inline(always)]
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.clients == 0 && self.flows == 0 && self.peers == 0
    }
}

/// What a `SERVICE_FLOWS` entry is, in its `node_port`.
pub mod flow_kind {
    /// A flow the stack translated: its replies go back through the stack.
    pub const TRANSLATED: u16 = 1;
    /// A TCP connection a Service client's socket opened directly to a pod of the
    /// node: its replies keep the datapath's way.
    pub const DIRECT: u16 = 2;
}

/// The state of a Service entry after a packet of its opener (the pod's socket, or the
/// outside client's) with TCP `flags`: `state` 0 for a new entry. TCP: a SYN opens
/// (`SYN_SENT`), the opener's ACK after it (when `confirmed`: see [`confirms`]) shows
/// the other side answered (`ESTABLISHED`), a FIN starts the close (`CLOSING`, the
/// transitory timeout), a RST ends it (`CLOSED`); other protocols stay unanswered (the
/// short UDP timeout) until [`answered_state`].
#[inline(always)]
#[must_use]
pub const fn opener_state(proto: u8, state: u8, flags: u8, confirmed: bool) -> u8 {
    if proto != TCP {
        return state;
    }
    if flags & tcp_flags::RST != 0 {
        tcp_state::CLOSED
    } else if flags & tcp_flags::FIN != 0 {
        if state == tcp_state::CLOSED {
            state
        } else {
            tcp_state::CLOSING
        }
    } else if tcp_flags::opens(flags) || state == 0 {
        tcp_state::SYN_SENT
    } else if state == tcp_state::SYN_SENT && flags & tcp_flags::ACK != 0 && confirmed {
        tcp_state::ESTABLISHED
    } else {
        state
    }
}

/// Whether the opener's TCP segment `seg` acknowledges the SYN-ACK recorded in `entry`
/// ([`answerer_syn`]): an outside client's ACK establishes its entry only so, as
/// conntrack's does, so that a host forging SYNs and ACKs from addresses it does not
/// hold (it never sees the SYN-ACK) leaves only unanswered entries, the first to go.
/// A pod's entries count against its own budget alone: its ACK is taken at its word.
#[inline(always)]
#[must_use]
pub const fn confirms(entry: &NatEntry, seg: &Segment) -> bool {
    entry.seq_seen & seq_seen::ANSWERER != 0 && seg.ack == entry.seq[1].wrapping_add(1)
}

/// Records in `entry` the answerer's SYN-ACK `seg` (its initial sequence number), which
/// the opener's ACK must acknowledge ([`confirms`]); other segments change nothing.
/// Whether `entry` changed.
#[inline(always)]
pub const fn answerer_syn(entry: &mut NatEntry, seg: &Segment) -> bool {
    let syn_ack = tcp_flags::SYN | tcp_flags::ACK;
    if seg.flags & syn_ack != syn_ack || entry.state != tcp_state::SYN_SENT {
        return false;
    }
    entry.seq[1] = seg.seq;
    entry.seq_seen |= seq_seen::ANSWERER;
    true
}

/// The state of a Service entry in `state` after a reply to its opener: a non-TCP flow
/// becomes replied (the short UDP timeout), and a stream at a second reply (the longer
/// one); TCP follows its opener ([`opener_state`]).
#[inline(always)]
#[must_use]
pub const fn answered_state(proto: u8, state: u8) -> u8 {
    match (proto, state) {
        (TCP, _) => state,
        (_, 0) => udp_state::REPLIED,
        (_, udp_state::REPLIED) => udp_state::STREAM,
        _ => state,
    }
}

/// How long an entry's timestamp may lag before a packet rewrites it: every packet
/// writing the shared entry would bounce its cache line between CPUs, and timeouts
/// are counted in seconds.
pub const REFRESH_NS: u64 = 1_000_000_000;

/// Service ranges at most.
pub const MAX_SERVICE_CIDRS: u32 = 64;

/// Translated Service connections `SERVICE_FLOWS` holds at once: kube-proxy's smallest
/// conntrack table (`--conntrack-min`), so the table holds every connection the node's
/// conntrack does under kube-proxy's defaults.
pub const MAX_SERVICE_FLOWS: u32 = 131_072;

/// Sockets `SERVICE_CLIENTS` and `SERVICE_PEERS` each hold at once.
pub const MAX_SERVICE_SOCKETS: u32 = 131_072;

/// Parties `SERVICE_COUNTS` counts: every pod of the node and every outside address
/// holding an entry of `SERVICE_PEERS`.
pub const MAX_SERVICE_PARTIES: u32 = MAX_SERVICE_SOCKETS + 4096;

/// The default [`ServiceConfig::party_budget`]: a quarter of a table, so that no two
/// parties take a whole table, and more than the 28,232 ports of Linux's default
/// ephemeral range, so that a client cycling through all of them (thousands of short
/// connections a second) never meets its budget.
pub const DEFAULT_PARTY_BUDGET: u32 = MAX_SERVICE_SOCKETS / 4;

const _: () = assert!(core::mem::size_of::<ServiceClient>() == 8);
const _: () = assert!(core::mem::size_of::<ServiceConfig>() == 8);
const _: () = assert!(core::mem::size_of::<ServiceCounts>() == 16);
const _: () = assert!(DEFAULT_PARTY_BUDGET <= MAX_SERVICE_FLOWS / 4);

#[cfg(feature = "user")]
mod user {
    // SAFETY (all): #[repr(C)], fixed-width fields, explicit padding, sizes asserted.
    unsafe impl aya::Pod for super::ServiceClient {}
    unsafe impl aya::Pod for super::ServiceConfig {}
    unsafe impl aya::Pod for super::ServiceCounts {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip_proto::UDP;

    const SYN: u8 = tcp_flags::SYN;
    const ACK: u8 = tcp_flags::ACK;

    fn udp_entry() -> NatEntry {
        NatEntry {
            last_seen_ns: 10_000_000_000,
            pod_addr: [203, 0, 113, 9],
            pod_port: 40000,
            node_port: 0,
            state: 0,
            seq_seen: 0,
            pad: [0; 2],
            node_addr: [0; 4],
            seq: [0; 2],
        }
    }

    #[test]
    fn tcp_follows_its_openers_packets() {
        let opened = opener_state(TCP, 0, SYN, true);
        assert_eq!(opened, tcp_state::SYN_SENT);
        // An ACK that acknowledges no SYN-ACK seen leaves it opening.
        assert_eq!(opener_state(TCP, opened, ACK, false), opened);
        let up = opener_state(TCP, opened, ACK, true);
        assert_eq!(up, tcp_state::ESTABLISHED);
        assert_eq!(opener_state(TCP, up, ACK | 0x08, true), up);
        let closing = opener_state(TCP, up, ACK | tcp_flags::FIN, true);
        assert_eq!(closing, tcp_state::CLOSING);
        assert_eq!(
            opener_state(TCP, closing, tcp_flags::RST, true),
            tcp_state::CLOSED
        );
        assert_eq!(
            opener_state(TCP, tcp_state::CLOSED, SYN, true),
            tcp_state::SYN_SENT
        );
        // A retransmitted SYN leaves it opening.
        assert_eq!(opener_state(TCP, opened, SYN, true), tcp_state::SYN_SENT);
    }

    #[test]
    fn an_outside_clients_ack_must_acknowledge_the_syn_ack() {
        let mut entry = udp_entry();
        entry.state = tcp_state::SYN_SENT;
        let ack = |ack| Segment {
            flags: ACK,
            seq: 1,
            ack,
        };
        assert!(!confirms(&entry, &ack(1)), "no SYN-ACK seen yet");
        // The backend's plain ACK is no SYN-ACK.
        assert!(!answerer_syn(&mut entry, &ack(7)));
        let syn_ack = Segment {
            flags: SYN | ACK,
            seq: u32::MAX,
            ack: 2,
        };
        assert!(answerer_syn(&mut entry, &syn_ack));
        assert!(confirms(&entry, &ack(0)), "the ISN plus one, wrapping");
        assert!(!confirms(&entry, &ack(1)));
    }

    #[test]
    fn udp_is_answered_by_a_reply_and_a_stream_by_a_second() {
        assert_eq!(opener_state(UDP, 0, 0, false), 0);
        let replied = answered_state(UDP, 0);
        assert_eq!(replied, udp_state::REPLIED);
        assert_eq!(answered_state(UDP, replied), udp_state::STREAM);
        assert_eq!(answered_state(UDP, udp_state::STREAM), udp_state::STREAM);
        assert_eq!(
            answered_state(TCP, tcp_state::SYN_SENT),
            tcp_state::SYN_SENT,
            "TCP follows its opener"
        );
    }

    #[test]
    fn node_ports_are_the_configured_range_only() {
        let config = ServiceConfig {
            node_port_min: 30000,
            node_port_max: 32767,
            party_budget: 8,
        };
        assert!(config.is_node_port(30000) && config.is_node_port(32767));
        assert!(!config.is_node_port(29999) && !config.is_node_port(40000));
        assert!(!ServiceConfig::default().is_node_port(30000));
    }
}
