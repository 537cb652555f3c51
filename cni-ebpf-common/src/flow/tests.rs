use super::*;
use crate::{
    ip_proto::{SCTP, UDP},
    tcp_flags::{ACK, FIN, RST, SYN},
};

use crate::{
    NatKey,
    test_support::{NOW, SEC},
};

const TIMEOUTS: Timeouts = Timeouts {
    icmp: 20,
    ..crate::test_support::TIMEOUTS
};

/// A flow of 10.244.1.2:40000 translated to 198.18.0.1:61000, idle for `idle_secs`.
fn entry(idle_secs: u64, state: u8) -> NatEntry {
    let key = NatKey::new(([10, 244, 1, 2], 40000), ([198, 18, 0, 9], 443), 6);
    NatEntry::translated(&key, ([198, 18, 0, 1], 61000), state, NOW - idle_secs * SEC)
}

/// The states a TCP flow the pod opened goes through, packet by packet.
fn walk(packets: &[(Way, u8)]) -> u8 {
    let (first, rest) = packets.split_first().expect("a first packet");
    assert_eq!(first.0, Way::Out, "the pod opens its flows");
    rest.iter()
        .fold(opening_state(TCP, first.1), |state, &(way, flags)| {
            next_state(state, flags, way)
        })
}

#[test]
fn a_syn_opens_a_flow_and_its_answer_establishes_it() {
    assert_eq!(walk(&[(Way::Out, SYN)]), tcp_state::SYN_SENT);
    assert_eq!(
        walk(&[(Way::Out, SYN), (Way::In, SYN | ACK)]),
        tcp_state::ESTABLISHED
    );
    // Only an answer establishes it: the pod's own retransmissions do not.
    assert_eq!(
        walk(&[(Way::Out, SYN), (Way::Out, SYN)]),
        tcp_state::SYN_SENT
    );
}

#[test]
fn a_flow_picked_up_mid_stream_counts_as_established_and_a_stray_rst_as_closed() {
    assert_eq!(opening_state(TCP, ACK), tcp_state::ESTABLISHED);
    assert_eq!(opening_state(TCP, RST | ACK), tcp_state::CLOSED);
    assert_eq!(opening_state(TCP, SYN | RST), tcp_state::CLOSED);
}

#[test]
fn other_protocols_have_no_tcp_state() {
    assert_eq!(opening_state(UDP, 0), 0);
    assert_eq!(opening_state(ICMP, SYN), 0);
    assert_eq!(next_state(0, FIN | RST, Way::In), 0);
}

#[test]
fn the_pod_closing_first_ends_in_pod_closed() {
    let open = [(Way::Out, SYN), (Way::In, SYN | ACK)];
    let closing = [open[0], open[1], (Way::Out, FIN | ACK)];
    assert_eq!(walk(&closing), tcp_state::CLOSING);
    let closed = [closing[0], closing[1], closing[2], (Way::In, FIN | ACK)];
    assert_eq!(walk(&closed), tcp_state::POD_CLOSED);
    // A retransmitted FIN leaves it closed.
    assert_eq!(
        next_state(tcp_state::POD_CLOSED, FIN, Way::In),
        tcp_state::POD_CLOSED
    );
}

#[test]
fn the_remote_closing_first_ends_in_closed() {
    assert_eq!(
        next_state(tcp_state::ESTABLISHED, FIN | ACK, Way::In),
        tcp_state::REMOTE_CLOSING
    );
    assert_eq!(
        next_state(tcp_state::REMOTE_CLOSING, FIN | ACK, Way::Out),
        tcp_state::CLOSED
    );
    assert_eq!(
        next_state(tcp_state::CLOSED, FIN, Way::Out),
        tcp_state::CLOSED
    );
}

#[test]
fn a_rst_either_way_closes_and_a_new_syn_reopens() {
    for way in [Way::Out, Way::In] {
        assert_eq!(
            next_state(tcp_state::ESTABLISHED, RST, way),
            tcp_state::CLOSED
        );
    }
    assert_eq!(
        next_state(tcp_state::CLOSED, SYN, Way::Out),
        tcp_state::SYN_SENT
    );
    // A SYN from the remote on a closed flow does not reopen it.
    assert_eq!(
        next_state(tcp_state::CLOSED, SYN, Way::In),
        tcp_state::CLOSED
    );
}

#[test]
fn a_translated_flow_follows_tcp_and_becomes_replied_at_its_first_reply_otherwise() {
    assert_eq!(
        state_after(TCP, tcp_state::SYN_SENT, SYN | ACK, Way::In),
        tcp_state::ESTABLISHED
    );
    assert_eq!(
        state_after(TCP, tcp_state::ESTABLISHED, FIN, Way::Out),
        tcp_state::CLOSING
    );
    assert_eq!(state_after(UDP, 0, 0, Way::Out), 0);
    assert_eq!(state_after(UDP, 0, 0, Way::In), udp_state::REPLIED);
    assert_eq!(state_after(SCTP, 0, 0, Way::In), udp_state::REPLIED);
    assert_eq!(
        state_after(ICMP, 0, 0, Way::In),
        0,
        "echo flows have no state"
    );
}

#[test]
fn a_flow_opened_from_outside_follows_tcp_with_the_ways_mirrored() {
    // The host outside sends the SYN, the pod answers.
    let syn = opening_state(TCP, SYN);
    assert_eq!(syn, tcp_state::SYN_SENT);
    assert_eq!(
        inbound_state(TCP, syn, SYN | ACK, true),
        tcp_state::ESTABLISHED
    );
    // The opener closing first: the whole closed timeout, never POD_CLOSED's short one.
    let closing = inbound_state(TCP, tcp_state::ESTABLISHED, FIN | ACK, false);
    assert_eq!(closing, tcp_state::CLOSING);
    assert_eq!(
        inbound_state(TCP, closing, FIN | ACK, true),
        tcp_state::CLOSED
    );
}

#[test]
fn a_flow_opened_from_outside_without_tcp_is_replied_at_the_pods_first_answer() {
    assert_eq!(inbound_state(UDP, 0, 0, false), 0);
    assert_eq!(inbound_state(UDP, 0, 0, true), udp_state::REPLIED);
    assert_eq!(
        inbound_state(SCTP, udp_state::REPLIED, 0, false),
        udp_state::REPLIED
    );
}

#[test]
fn each_proto_and_tcp_state_has_its_timeout() {
    assert_eq!(TIMEOUTS.secs(TCP, tcp_state::ESTABLISHED), 3600);
    assert_eq!(TIMEOUTS.secs(TCP, tcp_state::SYN_SENT), 120);
    assert_eq!(TIMEOUTS.secs(TCP, tcp_state::CLOSING), 120);
    assert_eq!(TIMEOUTS.secs(TCP, tcp_state::REMOTE_CLOSING), 120);
    assert_eq!(TIMEOUTS.secs(TCP, 0), 120);
    assert_eq!(TIMEOUTS.secs(UDP, 0), 30);
    assert_eq!(
        TIMEOUTS.secs(UDP, udp_state::REPLIED),
        30,
        "a query and its answer keep the short timeout, as in conntrack"
    );
    assert_eq!(TIMEOUTS.secs(UDP, udp_state::STREAM), 120);
    assert_eq!(
        TIMEOUTS.secs(SCTP, udp_state::STREAM),
        120,
        "so does an SCTP association"
    );
    assert_eq!(TIMEOUTS.secs(SCTP, 0), 30);
    assert_eq!(TIMEOUTS.secs(ICMP, 0), 20);
    // The state byte means nothing else outside TCP.
    assert_eq!(TIMEOUTS.secs(UDP, tcp_state::CLOSING), 30);
}

#[test]
fn established_tcp_lives_its_whole_timeout_of_idleness() {
    let fresh = entry(3599, tcp_state::ESTABLISHED);
    let stale = entry(3601, tcp_state::ESTABLISHED);
    assert!(!TIMEOUTS.expired(&fresh, TCP, NOW));
    assert!(TIMEOUTS.expired(&stale, TCP, NOW));
}

#[test]
fn opening_and_closing_tcp_expire_after_the_transitory_timeout() {
    for state in [tcp_state::SYN_SENT, tcp_state::CLOSING] {
        assert!(!TIMEOUTS.expired(&entry(119, state), TCP, NOW));
        assert!(TIMEOUTS.expired(&entry(121, state), TCP, NOW));
    }
}

#[test]
fn a_flow_the_pod_closed_first_frees_its_port_sooner_than_one_the_remote_closed() {
    // The remote keeps no TIME_WAIT when the pod closed first.
    assert!(!TIMEOUTS.expired(&entry(0, tcp_state::POD_CLOSED), TCP, NOW));
    assert!(TIMEOUTS.expired(&entry(2, tcp_state::POD_CLOSED), TCP, NOW));
    assert!(!TIMEOUTS.expired(&entry(9, tcp_state::CLOSED), TCP, NOW));
    assert!(TIMEOUTS.expired(&entry(11, tcp_state::CLOSED), TCP, NOW));
    assert_eq!(TIMEOUTS.secs(TCP, tcp_state::POD_CLOSED), 1);
}

#[test]
fn only_a_flow_the_pod_closed_first_is_reclaimable_and_only_past_a_quarter_second() {
    let idle_ms = |ms: u64, state: u8| NatEntry {
        last_seen_ns: NOW - ms * 1_000_000,
        ..entry(0, state)
    };
    assert!(!reclaimable(&idle_ms(200, tcp_state::POD_CLOSED), TCP, NOW));
    assert!(reclaimable(&idle_ms(300, tcp_state::POD_CLOSED), TCP, NOW));
    assert!(!TIMEOUTS.expired(&idle_ms(300, tcp_state::POD_CLOSED), TCP, NOW));
    // The remote may hold a TIME_WAIT, or the connection is still up.
    for state in [
        tcp_state::CLOSED,
        tcp_state::CLOSING,
        tcp_state::REMOTE_CLOSING,
        tcp_state::ESTABLISHED,
    ] {
        assert!(!reclaimable(&idle_ms(900, state), TCP, NOW), "{state}");
    }
    assert!(!reclaimable(&idle_ms(900, tcp_state::POD_CLOSED), UDP, NOW));
}

#[test]
fn udp_and_icmp_expire_after_their_own_timeouts() {
    assert!(!TIMEOUTS.expired(&entry(29, 0), UDP, NOW));
    assert!(TIMEOUTS.expired(&entry(31, 0), UDP, NOW));
    assert!(!TIMEOUTS.expired(&entry(19, 0), ICMP, NOW));
    assert!(TIMEOUTS.expired(&entry(21, 0), ICMP, NOW));
}

#[test]
fn a_packet_seen_after_now_was_read_is_not_idle() {
    let mut future = entry(0, 0);
    future.last_seen_ns = NOW + SEC;
    assert_eq!(idle_ns(future.last_seen_ns, NOW), 0);
    assert!(!TIMEOUTS.expired(&future, UDP, NOW));
}

#[test]
fn the_timeouts_are_those_the_config_carries() {
    let config = NatConfig {
        tcp_established_secs: 1,
        tcp_transitory_secs: 2,
        udp_secs: 3,
        icmp_secs: 4,
        tcp_closed_secs: 5,
        udp_stream_secs: 6,
        ..NatConfig::default()
    };
    assert_eq!(
        Timeouts::from_config(&config),
        Timeouts {
            tcp_established: 1,
            tcp_transitory: 2,
            tcp_closed: 5,
            udp: 3,
            udp_stream: 6,
            icmp: 4,
        }
    );
}

fn seg(flags: u8, seq: u32, ack: u32) -> Segment {
    Segment { flags, seq, ack }
}

/// An established flow: the pod's side at 1,000, the remote's at 5,000,000.
fn established() -> NatEntry {
    NatEntry {
        seq_seen: seq_seen::OPENER | seq_seen::ANSWERER,
        seq: [1_000, 5_000_000],
        ..entry(0, tcp_state::ESTABLISHED)
    }
}

#[test]
fn a_rst_or_fin_far_from_the_sides_sequence_numbers_moves_nothing() {
    let flow = established();
    for flags in [RST, RST | ACK, FIN | ACK] {
        for seq in [
            5_000_000 + SEQ_SLACK + 1,
            5_000_000 - SEQ_SLACK - 1,
            0,
            0x8000_0000,
        ] {
            let after = follow(&flow, TCP, &seg(flags, seq, 1_000), Way::In, false, NOW);
            assert_eq!(after.state, tcp_state::ESTABLISHED, "{flags:#x} at {seq}");
            assert_eq!(
                (after.seq_seen, after.seq),
                (flow.seq_seen, flow.seq),
                "no mark moved"
            );
            // Opened from outside: the outside's side is the opener's, at 1,000.
            let opener_seq = seq.wrapping_sub(5_000_000).wrapping_add(1_000);
            let inbound = follow(&flow, TCP, &seg(flags, opener_seq, 0), Way::Out, true, NOW);
            assert_eq!(
                inbound.state,
                tcp_state::ESTABLISHED,
                "opened from outside too"
            );
        }
    }
    // The pod's own side is held to its own numbers.
    let pod_rst = follow(
        &flow,
        TCP,
        &seg(RST, 1_000 + 2 * SEQ_SLACK, 0),
        Way::Out,
        false,
        NOW,
    );
    assert_eq!(pod_rst.state, tcp_state::ESTABLISHED);
}

#[test]
fn a_rst_or_fin_near_the_sides_sequence_numbers_moves_the_state() {
    let flow = established();
    for seq in [
        5_000_000,
        5_000_000 + SEQ_SLACK,
        5_000_000 - SEQ_SLACK,
        5_000_123,
    ] {
        assert_eq!(
            follow(&flow, TCP, &seg(RST, seq, 0), Way::In, false, NOW).state,
            tcp_state::CLOSED,
            "{seq}"
        );
    }
    let fin = follow(
        &flow,
        TCP,
        &seg(FIN | ACK, 5_001_000, 1_000),
        Way::In,
        false,
        NOW,
    );
    assert_eq!(fin.state, tcp_state::REMOTE_CLOSING);
    assert_eq!(fin.seq, [1_000, 5_001_000], "the mark follows");
    let pod_fin = follow(
        &flow,
        TCP,
        &seg(FIN | ACK, 1_500, 5_000_000),
        Way::Out,
        false,
        NOW,
    );
    assert_eq!(pod_fin.state, tcp_state::CLOSING);
}

#[test]
fn sequence_marks_wrap_and_only_move_ahead() {
    let step = |seen, seq, s| follow_seq(seen, seq, &seg(ACK, s, 0), Way::In);
    let both = seq_seen::OPENER | seq_seen::ANSWERER;
    let wrapped = step(both, [0, u32::MAX - 10], 20);
    assert!(wrapped.fits);
    assert_eq!(wrapped.seq[1], 20, "ahead across the wrap");
    let behind = step(both, [0, 1_000_000], 999_000);
    assert!(behind.fits, "a retransmission fits");
    assert_eq!(behind.seq[1], 1_000_000, "and leaves the mark");
    let far = step(both, [0, 1_000_000], 1_000_000 + SEQ_SLACK + 1);
    assert!(!far.fits);
    assert_eq!(
        far.seq[1], 1_000_000,
        "a packet that does not fit moves no mark"
    );
}

#[test]
fn an_unseen_side_must_acknowledge_the_other() {
    // The pod's SYN at 7,000: the remote is not seen yet.
    let (seen, seq) = opening_seq(TCP, &seg(SYN, 7_000, 0), NOW);
    let syn_sent = NatEntry {
        seq_seen: seen,
        seq,
        ..entry(0, tcp_state::SYN_SENT)
    };
    // A refusal acknowledges the SYN.
    let refused = follow(
        &syn_sent,
        TCP,
        &seg(RST | ACK, 0, 7_001),
        Way::In,
        false,
        NOW,
    );
    assert_eq!(refused.state, tcp_state::CLOSED);
    // A blind RST, with no acknowledgement or a wrong one, does not.
    for blind in [seg(RST, 123, 0), seg(RST | ACK, 123, 7_001 + 2 * SEQ_SLACK)] {
        assert_eq!(
            follow(&syn_sent, TCP, &blind, Way::In, false, NOW).state,
            tcp_state::SYN_SENT,
            "{blind:?}"
        );
    }
    let answer = follow(
        &syn_sent,
        TCP,
        &seg(SYN | ACK, 90_000, 7_001),
        Way::In,
        false,
        NOW,
    );
    assert_eq!(answer.state, tcp_state::ESTABLISHED);
    assert_eq!(
        (answer.seq_seen, answer.seq),
        (seq_seen::OPENER | seq_seen::ANSWERER, [7_000, 90_000])
    );
    // An entry that knows no side (carried over) takes the first it sees.
    let carried = entry(0, tcp_state::ESTABLISHED);
    assert_eq!(
        follow(&carried, TCP, &seg(RST, 42, 0), Way::In, false, NOW).state,
        tcp_state::CLOSED
    );
}

#[test]
fn the_openers_syn_starts_the_sequence_marks_over() {
    let closed = NatEntry {
        state: tcp_state::CLOSED,
        ..established()
    };
    let reopened = follow(
        &closed,
        TCP,
        &seg(SYN, 0x9000_0000, 0),
        Way::Out,
        false,
        NOW,
    );
    assert_eq!(reopened.state, tcp_state::SYN_SENT);
    assert_eq!(
        (reopened.seq_seen, reopened.seq[0]),
        (seq_seen::OPENER, 0x9000_0000)
    );
    assert_eq!(
        twin_seen(
            seq_seen::OPENER | seq_seen::ANSWERER,
            reopened.seq_seen,
            SYN,
            Way::Out
        ),
        seq_seen::OPENER,
        "the twin forgets the answerer too"
    );
    assert_eq!(
        twin_seen(seq_seen::OPENER, seq_seen::ANSWERER, ACK, Way::In),
        seq_seen::OPENER | seq_seen::ANSWERER,
        "the twin learns this side"
    );
}

/// A UDP flow in `state`, begun `age_ms` before [`NOW`].
fn udp_flow(state: u8, age_ms: u64) -> NatEntry {
    let (_, seq) = opening_seq(UDP, &Segment::default(), NOW - age_ms * 1_000_000);
    NatEntry {
        seq,
        ..entry(0, state)
    }
}

#[test]
fn other_protocols_keep_no_sequence_marks_but_when_they_began() {
    let udp = udp_flow(0, 0);
    let after = follow(&udp, UDP, &Segment::default(), Way::In, false, NOW);
    assert_eq!((after.state, after.seq_seen), (udp_state::REPLIED, 0));
    assert_eq!(after.seq, udp.seq, "the start stays");
    assert_eq!(
        opening_seq(UDP, &seg(0, 5, 0), NOW),
        (0, [(NOW / 1_000_000) as u32, 0]),
        "milliseconds of the clock, modulo 2^32"
    );
}

#[test]
fn a_replied_flow_still_active_two_seconds_after_it_began_is_a_stream() {
    let out = |flow: &NatEntry| follow(flow, UDP, &Segment::default(), Way::Out, false, NOW);
    assert_eq!(
        out(&udp_flow(udp_state::REPLIED, 1_500)).state,
        udp_state::REPLIED,
        "a query answered and asked again within two seconds"
    );
    assert_eq!(
        out(&udp_flow(udp_state::REPLIED, 2_500)).state,
        udp_state::STREAM
    );
    assert_eq!(
        out(&udp_flow(0, 2_500)).state,
        0,
        "never answered: no stream, however long"
    );
    let reply = follow(
        &udp_flow(udp_state::STREAM, 10_000),
        UDP,
        &Segment::default(),
        Way::In,
        false,
        NOW,
    );
    assert_eq!(reply.state, udp_state::STREAM, "a reply keeps a stream one");
    let from_outside = follow(
        &udp_flow(udp_state::REPLIED, 2_500),
        SCTP,
        &Segment::default(),
        Way::In,
        true,
        NOW,
    );
    assert_eq!(
        from_outside.state,
        udp_state::STREAM,
        "opened from outside too"
    );
    assert_eq!(
        inbound_state(UDP, udp_state::STREAM, 0, true),
        udp_state::STREAM
    );
    let ping = follow(
        &udp_flow(0, 2_500),
        ICMP,
        &Segment::default(),
        Way::In,
        false,
        NOW,
    );
    assert_eq!(ping.state, 0, "echo flows have no state");
}

#[test]
fn only_answered_flows_are_kept_from_early_drop() {
    use crate::{
        flow::early_droppable,
        ip_proto::{ICMP, TCP, UDP},
    };
    assert!(!early_droppable(TCP, tcp_state::ESTABLISHED));
    for state in [
        tcp_state::SYN_SENT,
        tcp_state::CLOSING,
        tcp_state::REMOTE_CLOSING,
        tcp_state::CLOSED,
        tcp_state::POD_CLOSED,
    ] {
        assert!(early_droppable(TCP, state), "TCP state {state}");
    }
    assert!(!early_droppable(UDP, udp_state::STREAM));
    assert!(
        early_droppable(UDP, udp_state::REPLIED),
        "a query and its answer"
    );
    assert!(early_droppable(UDP, 0));
    assert!(early_droppable(ICMP, 0));
}

#[test]
fn a_syn_on_a_live_connection_changes_nothing_but_a_note() {
    for state in [
        tcp_state::ESTABLISHED,
        tcp_state::CLOSING,
        tcp_state::REMOTE_CLOSING,
    ] {
        for inbound in [false, true] {
            let flow = NatEntry {
                state,
                ..established()
            };
            let syn = follow(
                &flow,
                TCP,
                &seg(SYN, 0x7000_0000, 0),
                Way::Out,
                inbound,
                NOW,
            );
            assert_eq!(syn.state, state, "the state stands");
            assert_eq!(syn.seq, flow.seq, "the marks stand");
            assert_eq!(
                syn.seq_seen,
                seq_seen::OPENER | seq_seen::ANSWERER | seq_seen::SYN_PENDING
            );
            // The RST at the SYN's own number then fits nothing.
            let noted = NatEntry {
                seq_seen: syn.seq_seen,
                ..flow
            };
            let rst = follow(
                &noted,
                TCP,
                &seg(RST, 0x7000_0000, 0),
                Way::Out,
                inbound,
                NOW,
            );
            assert_eq!(rst.state, state, "a RST at the SYN's number moves nothing");
        }
    }
}

#[test]
fn the_answerers_syn_ack_to_a_held_syn_starts_a_new_connection_and_anything_else_drops_the_note() {
    let noted = NatEntry {
        seq_seen: seq_seen::OPENER | seq_seen::ANSWERER | seq_seen::SYN_PENDING,
        ..established()
    };
    let syn_ack = follow(
        &noted,
        TCP,
        &seg(SYN | ACK, 0x1234_0000, 0x7000_0001),
        Way::In,
        false,
        NOW,
    );
    assert_eq!(syn_ack.state, tcp_state::ESTABLISHED);
    assert_eq!(
        syn_ack.seq_seen,
        seq_seen::ANSWERER,
        "the opener is learnt anew"
    );
    assert_eq!(syn_ack.seq[1], 0x1234_0000);
    assert_eq!(
        twin_seen(
            seq_seen::OPENER | seq_seen::ANSWERER | seq_seen::SYN_PENDING,
            syn_ack.seq_seen,
            SYN | ACK,
            Way::In
        ),
        seq_seen::ANSWERER,
        "the twin starts over too"
    );
    // The live peer's challenge ACK: the note goes, nothing else changes.
    let ack = follow(
        &noted,
        TCP,
        &seg(ACK, 5_000_100, 1_000),
        Way::In,
        false,
        NOW,
    );
    assert_eq!(ack.state, tcp_state::ESTABLISHED);
    assert_eq!(ack.seq_seen, seq_seen::OPENER | seq_seen::ANSWERER);
    // The note reaches the twin with the side's mark.
    assert_eq!(
        twin_seen(
            seq_seen::OPENER | seq_seen::ANSWERER,
            noted.seq_seen,
            SYN,
            Way::Out
        ),
        noted.seq_seen
    );
}

#[test]
fn a_syn_on_a_closed_or_opening_flow_still_reopens_it() {
    for state in [
        tcp_state::CLOSED,
        tcp_state::POD_CLOSED,
        tcp_state::SYN_SENT,
    ] {
        let flow = NatEntry {
            state,
            ..established()
        };
        let syn = follow(&flow, TCP, &seg(SYN, 0x7000_0000, 0), Way::Out, false, NOW);
        assert_eq!(syn.state, tcp_state::SYN_SENT);
        assert_eq!((syn.seq_seen, syn.seq[0]), (seq_seen::OPENER, 0x7000_0000));
    }
}
