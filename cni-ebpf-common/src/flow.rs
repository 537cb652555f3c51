//! A flow's life as the datapath and the daemon both follow it: its states
//! ([`NatEntry::state`]), how each packet moves them, and how long an idle flow is kept.
//!
//! The datapath moves the state of the flows in `NAT_OUT` and `NAT_IN`, of the flows
//! opened from outside (`NAT_INBOUND`) and of hostPort connections (`HOSTPORT_FLOWS`),
//! and treats an entry idle past its timeout as gone; the daemon's sweep removes those
//! entries by the same rule ([`Timeouts::expired`]) and its views name the states.
//!
//! A TCP RST or FIN moves the state only when its sequence number fits what the flow
//! has seen ([`follow_seq`], a simplified conntrack `tcp_in_window`): a host that can
//! only guess the sequence numbers cannot close another's flow.

use crate::{
    NatConfig, NatEntry,
    ip_proto::{ICMP, TCP},
    tcp_flags::{ACK, FIN, RST, SYN, opens},
};

/// The TCP header fields a flow follows: its flags, sequence and acknowledgement
/// numbers (host order). All 0 for other protocols.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
}

impl Segment {
    /// A packet of a protocol other than TCP (or a TCP one with only these `flags`
    /// known, in tests).
    #[inline(always)]
    #[must_use]
    pub const fn flags(flags: u8) -> Self {
        Self {
            flags,
            seq: 0,
            ack: 0,
        }
    }
}

/// Bits of [`NatEntry::seq_seen`]: which side's highest sequence number
/// [`NatEntry::seq`] holds.
pub mod seq_seen {
    /// The side that opened the flow ([`super::Way::Out`]), `seq[0]`.
    pub const OPENER: u8 = 1;
    /// The other side ([`super::Way::In`]), `seq[1]`.
    pub const ANSWERER: u8 = 2;
    /// The opener sent a SYN on the live connection, which changed nothing: the
    /// answerer's SYN-ACK to it starts a new connection (see [`super::follow`]).
    pub const SYN_PENDING: u8 = 4;
}

/// How far (in bytes, either way) a RST's or FIN's sequence number may lie from the
/// highest one seen from its side and still move the flow's state; the same bound for
/// an acknowledgement of the other side's. 1 MiB: above what one packet advances a
/// sender (a GSO burst is at most 64 KiB, a BIG TCP one 512 KiB), and room for a FIN
/// whose last data was lost before reaching the node. A blind guess fits with a
/// chance of 2^-11 per packet and known flow (a connection's address and ports both
/// ways). See docs/decisions.md ("RST and FIN must fit the flow's sequence numbers").
pub const SEQ_SLACK: u32 = 1 << 20;

/// What [`follow_seq`] made of a TCP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqStep {
    /// Whether its sequence numbers fit the flow: a RST or FIN moves the state only then.
    pub fits: bool,
    /// The entry's [`NatEntry::seq_seen`] after it.
    pub seen: u8,
    /// The entry's [`NatEntry::seq`] after it.
    pub seq: [u32; 2],
}

/// Whether `value` lies within [`SEQ_SLACK`] of `mark`, modulo 2^32.
#[inline(always)]
#[must_use]
pub const fn near(value: u32, mark: u32) -> bool {
    value.wrapping_sub(mark).wrapping_add(SEQ_SLACK) <= 2 * SEQ_SLACK
}

/// Follows the sequence number of `seg`, a TCP packet going `way` on a flow whose entry
/// has `seen` and `seq` ([`NatEntry::seq_seen`], [`NatEntry::seq`]). A simplified
/// conntrack `tcp_in_window`:
/// - the opener's SYN (a new connection on the 4-tuple) starts over: its side alone,
///   at its number;
/// - a side already seen fits when its sequence number is [`near`] the highest seen
///   from it (no windows, no window scaling, no payload lengths: [`SEQ_SLACK`] stands
///   for them);
/// - a side not seen yet fits when it acknowledges near the other side's highest
///   number (an answer to its SYN, a RST refusing it), or when no side is known (an
///   entry made without them, such as a note of a connection to a pod's own address:
///   picked up as conntrack picks up a flow mid-stream);
/// - a packet that fits raises its side's mark when it is ahead (modulo 2^32); one
///   that does not changes nothing.
#[inline(always)]
#[must_use]
pub const fn follow_seq(seen: u8, seq: [u32; 2], seg: &Segment, way: Way) -> SeqStep {
    let (me, mine, theirs) = match way {
        Way::Out => (0, seq_seen::OPENER, seq_seen::ANSWERER),
        Way::In => (1, seq_seen::ANSWERER, seq_seen::OPENER),
    };
    let mut seq = seq;
    if matches!(way, Way::Out) && opens(seg.flags) {
        seq[0] = seg.seq;
        return SeqStep {
            fits: true,
            seen: seq_seen::OPENER,
            seq,
        };
    }
    let fits = if seen & mine != 0 {
        near(seg.seq, seq[me])
    } else if seen & theirs != 0 {
        seg.flags & ACK != 0 && near(seg.ack, seq[1 - me])
    } else {
        true
    };
    if !fits {
        return SeqStep { fits, seen, seq };
    }
    // Ahead of the mark: within half the sequence space after it.
    if seen & mine == 0 || (seg.seq.wrapping_sub(seq[me]) as i32) > 0 {
        seq[me] = seg.seq;
    }
    SeqStep {
        fits,
        seen: seen | mine,
        seq,
    }
}

/// The flags of `seg` the state machine may act on: all of them, but none of a RST or
/// FIN whose sequence number does not fit ([`follow_seq`]): such a packet moves nothing.
#[inline(always)]
#[must_use]
pub const fn state_flags(seg: &Segment, fits: bool) -> u8 {
    if fits || seg.flags & (RST | FIN) == 0 {
        seg.flags
    } else {
        0
    }
}

/// A flow's entry after one of its packets: the state and the sequence marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Followed {
    pub state: u8,
    pub seq_seen: u8,
    pub seq: [u32; 2],
}

impl Followed {
    /// Whether `entry` must be written to hold this.
    #[inline(always)]
    #[must_use]
    pub const fn changes_seq(&self, entry: &NatEntry) -> bool {
        self.seq_seen != entry.seq_seen
            || self.seq[0] != entry.seq[0]
            || self.seq[1] != entry.seq[1]
    }
}

/// `entry` (a flow of `proto`) after `seg` going `way` at `now_ns`: [`state_after`] for
/// a flow the pod opened, [`inbound_state`] for one opened from outside (`inbound`;
/// `way` is then [`Way::In`] from the pod), with the RST or FIN of a TCP packet whose
/// sequence number does not fit ([`follow_seq`]) taken as no flags, and a SYN on a
/// live connection held as conntrack holds it ([`held_syn`]); a replied flow of
/// another protocol still active [`udp_state::STREAM_AFTER_MS`] after it began becomes
/// a stream ([`udp_state::STREAM`]).
#[inline(always)]
#[must_use]
pub const fn follow(
    entry: &NatEntry,
    proto: u8,
    seg: &Segment,
    way: Way,
    inbound: bool,
    now_ns: u64,
) -> Followed {
    if proto == TCP
        && let Some(held) = held_syn(entry, seg, way)
    {
        return held;
    }
    let (flags, seq_seen, seq) = if proto == TCP {
        let step = follow_seq(entry.seq_seen, entry.seq, seg, way);
        // Any other answer than a SYN-ACK: the SYN noted was not taken.
        let seen = match way {
            Way::In => step.seen & !seq_seen::SYN_PENDING,
            Way::Out => step.seen,
        };
        (state_flags(seg, step.fits), seen, step.seq)
    } else {
        (0, entry.seq_seen, entry.seq)
    };
    let state = if inbound {
        inbound_state(proto, entry.state, flags, matches!(way, Way::In))
    } else {
        state_after(proto, entry.state, flags, way)
    };
    let state = if proto != TCP
        && proto != ICMP
        && state == udp_state::REPLIED
        && millis(now_ns).wrapping_sub(entry.seq[0]) >= udp_state::STREAM_AFTER_MS
    {
        udp_state::STREAM
    } else {
        state
    };
    Followed {
        state,
        seq_seen,
        seq,
    }
}

/// A SYN, or the answer to one, on a live TCP connection (established or closing), as
/// conntrack takes them: the opener's SYN changes nothing but a note
/// ([`seq_seen::SYN_PENDING`]), since anyone who knows the 4-tuple can send one (a
/// reopened flow would then close at a RST of the sender's own number); the
/// answerer's SYN-ACK to a noted SYN confirms a new connection on the 4-tuple (a peer
/// whose socket is live answers a SYN with a bare ACK instead): the flow is
/// established, the answerer's side starts over at its number and the opener's is
/// learnt from its next packet. `None`: the packet is followed as any other.
#[inline(always)]
#[must_use]
pub const fn held_syn(entry: &NatEntry, seg: &Segment, way: Way) -> Option<Followed> {
    let live = matches!(
        entry.state,
        tcp_state::ESTABLISHED | tcp_state::CLOSING | tcp_state::REMOTE_CLOSING
    );
    match way {
        Way::Out if live && opens(seg.flags) => Some(Followed {
            state: entry.state,
            seq_seen: entry.seq_seen | seq_seen::SYN_PENDING,
            seq: entry.seq,
        }),
        Way::In
            if entry.seq_seen & seq_seen::SYN_PENDING != 0
                && seg.flags & (SYN | ACK) == SYN | ACK =>
        {
            Some(Followed {
                state: tcp_state::ESTABLISHED,
                seq_seen: seq_seen::ANSWERER,
                seq: [entry.seq[0], seg.seq],
            })
        }
        _ => None,
    }
}

/// The sequence marks of a flow whose first packet is `seg` of `proto`, from its
/// opener, at `now_ns`: ([`NatEntry::seq_seen`], [`NatEntry::seq`]). Flows of other
/// protocols have no sequence numbers: `seq[0]` holds when they began, in milliseconds
/// of `CLOCK_MONOTONIC` modulo 2^32 (see [`udp_state::STREAM`]).
#[inline(always)]
#[must_use]
pub const fn opening_seq(proto: u8, seg: &Segment, now_ns: u64) -> (u8, [u32; 2]) {
    if proto == TCP {
        (seq_seen::OPENER, [seg.seq, 0])
    } else {
        (0, [millis(now_ns), 0])
    }
}

/// `now_ns` in milliseconds, modulo 2^32 (compared with `wrapping_sub`).
#[inline(always)]
const fn millis(now_ns: u64) -> u32 {
    (now_ns / 1_000_000) as u32
}

/// The [`NatEntry::seq_seen`] of the twin entry (the other table's) of a flow when this
/// table's, which follows `way`, is refreshed with `followed` after a packet with
/// `flags`: the side of `way` and a held SYN's note are copied; the opener's SYN, and
/// the SYN-ACK confirming a held one (this side alone seen), start the twin over too.
#[inline(always)]
#[must_use]
pub const fn twin_seen(twin: u8, followed: u8, flags: u8, way: Way) -> u8 {
    let mine = match way {
        Way::Out => seq_seen::OPENER,
        Way::In => seq_seen::ANSWERER,
    };
    let copied = mine | seq_seen::SYN_PENDING;
    let restarted = match way {
        Way::Out => opens(flags) && followed & seq_seen::SYN_PENDING == 0,
        Way::In => flags & (SYN | ACK) == SYN | ACK && followed == seq_seen::ANSWERER,
    };
    if restarted {
        followed & mine
    } else {
        (twin & !copied) | (followed & copied)
    }
}

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
    /// Seconds a [`POD_CLOSED`] flow keeps its node port: two or three retransmissions
    /// of the remote's FIN (Linux's first RTO is 200 ms or more), should the pod's last
    /// ACK be lost. Under pressure the pod's own next flow may take the port sooner
    /// ([`POD_CLOSED_RECLAIM_MS`]).
    pub const POD_CLOSED_SECS: u32 = 1;
    /// Milliseconds after which a [`POD_CLOSED`] flow's node port goes to a new flow
    /// of the same pod when no other port is found for it (the pod at its budget of
    /// ports toward the destination, or the range taken): conntrack's early drop and
    /// Linux's TIME_WAIT recycling under `tcp_max_tw_buckets` likewise shorten closing
    /// state under pressure rather than refuse the new connection. A quarter of
    /// [`POD_CLOSED_SECS`], past Linux's shortest retransmission timeout (200 ms): the
    /// remote's first FIN retransmission, if the pod's last ACK was lost, has come.
    /// It lifts the rate of short connections one pod can keep up toward one service
    /// from the budget per second (27,776) to four times that.
    pub const POD_CLOSED_RECLAIM_MS: u32 = 250;
}

/// Whether `entry`, a flow of `proto`, is a [`tcp_state::POD_CLOSED`] flow idle longer
/// than [`tcp_state::POD_CLOSED_RECLAIM_MS`] at `now_ns`: its node port may go to
/// a new flow of the same pod that finds no other.
#[inline(always)]
#[must_use]
pub const fn reclaimable(entry: &NatEntry, proto: u8, now_ns: u64) -> bool {
    proto == TCP
        && entry.state == tcp_state::POD_CLOSED
        && idle_ns(entry.last_seen_ns, now_ns)
            > tcp_state::POD_CLOSED_RECLAIM_MS as u64 * NANOS_PER_SEC / 1000
}

/// [`NatEntry::state`] of a UDP flow, and of SCTP and protocols without ports (ICMP
/// flows stay 0). As conntrack's UDP: a flow answered once (a DNS query) keeps the
/// short timeout; one still active two seconds after it began is a stream and keeps
/// the longer one.
pub mod udp_state {
    /// A reply came: still the short timeout (conntrack's `udp_timeout`, 30 s).
    pub const REPLIED: u8 = 1;
    /// Replied, and a packet either way [`STREAM_AFTER_MS`] or more after the flow
    /// began: the longer "stream" timeout (conntrack's assured UDP flows,
    /// `udp_timeout_stream`, 120 s).
    pub const STREAM: u8 = 2;
    /// How long after its first packet a replied flow's next packet makes it a stream.
    pub const STREAM_AFTER_MS: u32 = 2_000;
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
/// [`next_state`]; another protocol's flow becomes [`udp_state::REPLIED`] at a reply
/// (a stream stays one), except ICMP echo flows, which have no state.
#[inline(always)]
#[must_use]
pub const fn state_after(proto: u8, state: u8, flags: u8, way: Way) -> u8 {
    match (proto, way) {
        (TCP, _) => next_state(state, flags, way),
        (ICMP, _) | (_, Way::Out) => state,
        (_, Way::In) => replied(state),
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
        return if from_pod { replied(state) } else { state };
    }
    let way = if from_pod { Way::In } else { Way::Out };
    match next_state(state, flags, way) {
        tcp_state::POD_CLOSED => tcp_state::CLOSED,
        next => next,
    }
}

/// Whether a flow of `proto` in `state` may go before its timeout when its table
/// fills up (conntrack's early drop takes flows not yet assured): TCP not established
/// (opening, closing, closed), UDP and the others until they are a stream (a query
/// and its answer go too), ICMP echo always (a ping's flow is one request and its
/// reply). An established TCP connection and a UDP stream never go for room.
#[inline(always)]
#[must_use]
pub const fn early_droppable(proto: u8, state: u8) -> bool {
    match proto {
        TCP => state != tcp_state::ESTABLISHED,
        ICMP => true,
        _ => state != udp_state::STREAM,
    }
}

/// A non-TCP flow's state after a reply: [`udp_state::REPLIED`], or the stream it is.
#[inline(always)]
const fn replied(state: u8) -> u8 {
    if state == udp_state::STREAM {
        state
    } else {
        udp_state::REPLIED
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
    /// they are a stream ([`udp_state::STREAM`]).
    #[inline(always)]
    #[must_use]
    pub const fn secs(&self, proto: u8, state: u8) -> u32 {
        match (proto, state) {
            (TCP, tcp_state::ESTABLISHED) => self.tcp_established,
            (TCP, tcp_state::CLOSED) => self.tcp_closed,
            (TCP, tcp_state::POD_CLOSED) => min(self.tcp_closed, tcp_state::POD_CLOSED_SECS),
            (TCP, _) => self.tcp_transitory,
            (ICMP, _) => self.icmp,
            (_, udp_state::STREAM) => self.udp_stream,
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
