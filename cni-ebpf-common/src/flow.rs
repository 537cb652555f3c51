//! A flow's life as the datapath and the daemon both follow it: its states
//! ([`NatEntry::state`]), how each packet moves them, and how long an idle flow is kept.
//!
//! The datapath moves the state of the flows in `NAT_OUT` and `NAT_IN`, of the flows
//! opened from outside (`NAT_INBOUND`) and of hostPort connections (`HOSTPORT_FLOWS`),
//! and treats an entry idle past its timeout as gone; the daemon's sweep removes those
//! entries by the same rule ([`Timeouts::expired`]) and its views name the states.

use crate::{
    NatConfig, NatEntry,
    ip_proto::{ICMP, TCP},
    tcp_flags::{ACK, FIN, RST, opens},
};

/// [`NatEntry::state`] of a TCP flow: the states the timeouts follow.
pub mod tcp_state {
    /// A SYN went out, no reply yet.
    pub const SYN_SENT: u8 = 1;
    /// The remote answered: the connection is up.
    pub const ESTABLISHED: u8 = 2;
    /// The pod sent a FIN: the flow is ending.
    pub const CLOSING: u8 = 3;
    /// Both sides sent a FIN, or either sent a RST: the port can soon serve another
    /// flow (the short "closed" timeout).
    pub const CLOSED: u8 = 4;
    /// The remote sent a FIN first.
    pub const REMOTE_CLOSING: u8 = 5;
    /// The pod sent the first FIN and the remote's FIN followed: the pod holds the
    /// TIME_WAIT, the remote none, so the node port is free for another flow once
    /// [`POD_CLOSED_SECS`] (or the closed timeout, if shorter) have passed without a
    /// retransmitted FIN. Holding it for the full closed timeout would make a pod that
    /// opens thousands of short connections a second to one service run out of node
    /// ports.
    pub const POD_CLOSED: u8 = 6;
    /// Seconds a [`POD_CLOSED`] flow keeps its node port: a few retransmission timeouts
    /// of the remote's FIN, should the pod's last ACK be lost.
    pub const POD_CLOSED_SECS: u32 = 2;
}

/// [`NatEntry::state`] of a UDP flow, and of SCTP and protocols without ports (ICMP
/// flows stay 0).
pub mod udp_state {
    /// A reply came: the flow is a stream both ways, which keeps its translation the
    /// longer "stream" timeout (as conntrack's assured UDP flows do).
    pub const REPLIED: u8 = 1;
}

/// Which way a packet of a flow goes, seen from the side that opened it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// From the pod (for a flow the pod opened).
    Out,
    /// To the pod.
    In,
}

/// The state of a flow of `proto` at its first packet, with TCP `flags` (0 for other
/// protocols): a SYN opens it, a RST finds it closed (a stray RST takes a node port for
/// the closed timeout only, not the established one), anything else picks it up
/// mid-stream (an entry evicted, a connection older than the daemon).
#[inline(always)]
#[must_use]
pub const fn opening_state(proto: u8, flags: u8) -> u8 {
    match proto {
        TCP if flags & RST != 0 => tcp_state::CLOSED,
        TCP if opens(flags) => tcp_state::SYN_SENT,
        TCP => tcp_state::ESTABLISHED,
        _ => 0,
    }
}

/// TCP state after a packet with `flags` going `way` (non-TCP flows stay 0).
#[inline(always)]
#[must_use]
pub const fn next_state(state: u8, flags: u8, way: Way) -> u8 {
    if state == 0 {
        return 0;
    }
    if flags & RST != 0 {
        return tcp_state::CLOSED;
    }
    if flags & FIN != 0 {
        // A FIN each way closes the flow; the first one only starts closing it.
        return match (way, state) {
            (Way::Out, tcp_state::REMOTE_CLOSING) => tcp_state::CLOSED,
            (Way::In, tcp_state::CLOSING) => tcp_state::POD_CLOSED,
            (_, tcp_state::CLOSED | tcp_state::POD_CLOSED) => state,
            (Way::Out, _) => tcp_state::CLOSING,
            (Way::In, _) => tcp_state::REMOTE_CLOSING,
        };
    }
    if matches!(way, Way::Out) && opens(flags) {
        // The pod opens the same 4-tuple again (after a close).
        tcp_state::SYN_SENT
    } else if state == tcp_state::SYN_SENT && matches!(way, Way::In) && flags & ACK != 0 {
        tcp_state::ESTABLISHED
    } else {
        state
    }
}

/// The state of a flow the pod opened (translated: `NAT_OUT` and `NAT_IN`) after a
/// packet going `way` with TCP `flags` (0 for other protocols): TCP follows
/// [`next_state`]; another protocol's flow becomes [`udp_state::REPLIED`] at a reply,
/// except ICMP echo flows, which have no state.
#[inline(always)]
#[must_use]
pub const fn state_after(proto: u8, state: u8, flags: u8, way: Way) -> u8 {
    match (proto, way) {
        (TCP, _) => next_state(state, flags, way),
        (ICMP, _) | (_, Way::Out) => state,
        (_, Way::In) => udp_state::REPLIED,
    }
}

/// The state of a flow a host outside opened (to a pod's own address, or through a
/// hostPort) after a packet with TCP `flags`, from the pod or from the host outside.
/// TCP follows [`next_state`] with the ways mirrored (the host outside opened the flow),
/// except that a flow closed by its opener first takes the whole closed timeout:
/// `POD_CLOSED`'s short hold is for a pod in TIME_WAIT, and here the pod is the side
/// that may still retransmit its FIN. Other protocols become [`udp_state::REPLIED`] at
/// the pod's first answer.
#[inline(always)]
#[must_use]
pub const fn inbound_state(proto: u8, state: u8, flags: u8, from_pod: bool) -> u8 {
    if proto != TCP {
        return if from_pod { udp_state::REPLIED } else { state };
    }
    let way = if from_pod { Way::In } else { Way::Out };
    match next_state(state, flags, way) {
        tcp_state::POD_CLOSED => tcp_state::CLOSED,
        next => next,
    }
}

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Idle timeouts in seconds, per kind of flow: what the daemon is configured with and
/// writes into [`NatConfig`], which the datapath reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct Timeouts {
    pub tcp_established: u32,
    /// SYN sent, or a FIN one way.
    pub tcp_transitory: u32,
    /// FIN each way, or RST.
    pub tcp_closed: u32,
    /// UDP without a reply yet.
    pub udp: u32,
    /// UDP that has had a reply.
    pub udp_stream: u32,
    pub icmp: u32,
}

impl Timeouts {
    /// The timeouts `config` carries.
    #[inline(always)]
    #[must_use]
    pub const fn from_config(config: &NatConfig) -> Self {
        Self {
            tcp_established: config.tcp_established_secs,
            tcp_transitory: config.tcp_transitory_secs,
            tcp_closed: config.tcp_closed_secs,
            udp: config.udp_secs,
            udp_stream: config.udp_stream_secs,
            icmp: config.icmp_secs,
        }
    }

    /// The idle timeout of a flow of `proto` in `state`. A TCP flow in no known state
    /// counts as transitory; other protocols than TCP, UDP and ICMP (SCTP, and those
    /// translated by address alone: GRE, ESP...) take UDP's: the stream timeout once
    /// they had a reply.
    #[inline(always)]
    #[must_use]
    pub const fn secs(&self, proto: u8, state: u8) -> u32 {
        match (proto, state) {
            (TCP, tcp_state::ESTABLISHED) => self.tcp_established,
            (TCP, tcp_state::CLOSED) => self.tcp_closed,
            (TCP, tcp_state::POD_CLOSED) => min(self.tcp_closed, tcp_state::POD_CLOSED_SECS),
            (TCP, _) => self.tcp_transitory,
            (ICMP, _) => self.icmp,
            (_, udp_state::REPLIED) => self.udp_stream,
            _ => self.udp,
        }
    }

    /// Whether `entry`, a flow of `proto`, has been idle longer than its timeout at
    /// `now_ns` (`CLOCK_MONOTONIC`, the clock of `bpf_ktime_get_coarse_ns`).
    #[inline(always)]
    #[must_use]
    pub const fn expired(&self, entry: &NatEntry, proto: u8, now_ns: u64) -> bool {
        idle_ns(entry.last_seen_ns, now_ns) > self.secs(proto, entry.state) as u64 * NANOS_PER_SEC
    }
}

#[inline(always)]
const fn min(a: u32, b: u32) -> u32 {
    if a < b { a } else { b }
}

/// Nanoseconds since `last_seen_ns`: 0 for an entry stamped after `now_ns` was read.
#[inline(always)]
#[must_use]
pub const fn idle_ns(last_seen_ns: u64, now_ns: u64) -> u64 {
    now_ns.saturating_sub(last_seen_ns)
}

#[cfg(test)]
mod tests;
