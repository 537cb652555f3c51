//! Reverse NAT on the uplink's ingress, run by the kernel through BPF_PROG_TEST_RUN:
//! replies to flows that `uplink_egress` translated (TCP, ICMP echo) and ICMP errors
//! quoting them get the pod's address and port back, every checksum valid, and go
//! straight into the pod; anything else reaches the stack untouched, and a pod's answers
//! on a connection a host outside opened to its own address leave untranslated.

use std::time::Duration;

use cni_ebpf_common::{NatCounter, NatEntry, tcp_state, udp_state};
use ebpf_cni_tests::{
    bpf_object::BpfObject,
    frames::{TC_ACT_OK, TC_ACT_REDIRECT, all_drops, assert_reference_checksum_is_right, no_drops},
    nat_frames::{
        ECHO_ID, ICMP, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, ICMP_ID, INNER_ICMP_ID, INNER_SPORT,
        INNER_SRC, IP_SRC, MASQ, MASQ_2, NODE_ADDR, OTHER_NODE_POD, POD_PORT, PORT_MIN, REMOTE,
        REMOTE_PORT, ROUTER, SPORT, TCP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, UDP, addr,
        assert_checksums_valid, assert_delivered, assert_unchanged, coarse_ns_ago, delivered,
        egress, frag_needed, icmp_echo, in_key, inbound, ingress, out_key, outbound, port, quote,
        tcp, time_exceeded, udp, uplink, with_ip_options, without_ip_options,
    },
    require_root,
};

const SYN_ACK: u8 = TCP_SYN | TCP_ACK;

/// Sends `pod`'s SYN to [`REMOTE`] out of the uplink; returns the translated frame and
/// its node port.
fn open_tcp(object: &BpfObject, pod_ip: [u8; 4]) -> (Vec<u8>, u16) {
    let syn = outbound(pod_ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_SYN));
    let run = egress(object, &syn);
    assert_eq!(run.verdict, TC_ACT_OK, "the SYN is translated");
    let node_port = port(&run.frame, SPORT);
    (run.frame, node_port)
}

fn syn_ack_to(node_port: u16) -> Vec<u8> {
    inbound(
        REMOTE,
        NODE_ADDR,
        TCP,
        &tcp(REMOTE_PORT, node_port, SYN_ACK),
    )
}

#[test]
fn syn_ack_to_the_node_port_reaches_the_pod_restored_and_establishes_the_flow() {
    require_root();
    assert_reference_checksum_is_right();
    let object = uplink();
    let (_, node_port) = open_tcp(&object, MASQ.ip);
    let reply = syn_ack_to(node_port);
    assert_checksums_valid(&reply, "test bug: the crafted SYN-ACK");
    let run = ingress(&object, &reply);
    let restored = inbound(REMOTE, MASQ.ip, TCP, &tcp(REMOTE_PORT, POD_PORT, SYN_ACK));
    assert_delivered(&run, &restored, &MASQ, "the SYN-ACK");

    let out = object
        .nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP))
        .expect("NAT_OUT still holds the flow");
    assert_eq!(out.state, tcp_state::ESTABLISHED, "NAT_OUT: established");
    let back = object.nat_in(&in_key(REMOTE, node_port, REMOTE_PORT, TCP));
    assert_eq!(back, Some(out), "NAT_IN: the same, established entry");
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 1);
    let delivered = object.endpoint_counters(MASQ.info.host_ifindex);
    assert_eq!(delivered.to_pod_packets, 1, "counted for the pod's veth");
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}

/// Both tables' state of the flow `open_tcp` opened to `node_port`, which must agree.
fn tcp_state_of(object: &BpfObject, node_port: u16) -> u8 {
    let out = object
        .nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP))
        .expect("NAT_OUT holds the flow");
    let back = object.nat_in(&in_key(REMOTE, node_port, REMOTE_PORT, TCP));
    assert_eq!(back, Some(out), "NAT_IN and NAT_OUT agree");
    out.state
}

#[test]
fn closing_follows_who_sent_the_first_fin() {
    require_root();
    let fin_ack = TCP_FIN | TCP_ACK;
    for pod_first in [true, false] {
        let object = uplink();
        let (_, node_port) = open_tcp(&object, MASQ.ip);
        ingress(&object, &syn_ack_to(node_port));
        let from_pod = outbound(MASQ.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, fin_ack));
        let from_remote = inbound(
            REMOTE,
            NODE_ADDR,
            TCP,
            &tcp(REMOTE_PORT, node_port, fin_ack),
        );
        let (first, second, closing, closed) = if pod_first {
            // The remote holds no TIME_WAIT: the port may serve again soon.
            let (a, b) = (&from_pod, &from_remote);
            (a, b, tcp_state::CLOSING, tcp_state::POD_CLOSED)
        } else {
            let (a, b) = (&from_remote, &from_pod);
            (a, b, tcp_state::REMOTE_CLOSING, tcp_state::CLOSED)
        };
        let send = |frame: &Vec<u8>| {
            if frame == &from_pod {
                egress(&object, frame)
            } else {
                ingress(&object, frame)
            }
        };
        send(first);
        assert_eq!(
            tcp_state_of(&object, node_port),
            closing,
            "pod first: {pod_first}"
        );
        send(second);
        assert_eq!(
            tcp_state_of(&object, node_port),
            closed,
            "pod first: {pod_first}"
        );
        // A retransmitted FIN changes nothing.
        send(second);
        assert_eq!(
            tcp_state_of(&object, node_port),
            closed,
            "pod first: {pod_first}"
        );
    }
}

#[test]
fn replies_matching_no_flow_reach_the_stack_unchanged() {
    require_root();
    let object = uplink();
    let (_, node_port) = open_tcp(&object, MASQ.ip);
    let unknown_port = if node_port == PORT_MIN {
        PORT_MIN + 1
    } else {
        PORT_MIN
    };
    let cases = [
        (syn_ack_to(unknown_port), "to a node port no flow holds"),
        (
            inbound(
                ROUTER,
                NODE_ADDR,
                TCP,
                &tcp(REMOTE_PORT, node_port, SYN_ACK),
            ),
            "to the flow's node port from another address",
        ),
        (
            inbound(
                REMOTE,
                NODE_ADDR,
                TCP,
                &tcp(REMOTE_PORT + 1, node_port, SYN_ACK),
            ),
            "to the flow's node port from another remote port",
        ),
        (
            inbound(
                REMOTE,
                NODE_ADDR,
                ICMP,
                &icmp_echo(ICMP_ECHO_REPLY, node_port),
            ),
            "an echo reply with the TCP flow's node port as identifier",
        ),
    ];
    for (frame, what) in &cases {
        assert_unchanged(&ingress(&object, frame), frame, what);
    }
    let out = object
        .nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP))
        .expect("NAT_OUT still holds the flow");
    assert_eq!(
        out.state,
        tcp_state::SYN_SENT,
        "no stray reply establishes it"
    );
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 0);
}

#[test]
fn icmp_echo_round_trip_restores_the_identifier_and_reaches_the_pod() {
    require_root();
    let object = uplink();
    let request = outbound(
        MASQ.ip,
        REMOTE,
        ICMP,
        &icmp_echo(ICMP_ECHO_REQUEST, ECHO_ID),
    );
    let run = egress(&object, &request);
    assert_eq!(run.verdict, TC_ACT_OK, "the request is translated");
    let node_id = port(&run.frame, ICMP_ID);
    assert_ne!(
        node_id, ECHO_ID,
        "test bug: the identifier must change to show"
    );

    let reply = inbound(
        REMOTE,
        NODE_ADDR,
        ICMP,
        &icmp_echo(ICMP_ECHO_REPLY, node_id),
    );
    assert_checksums_valid(&reply, "test bug: the crafted reply");
    let run = ingress(&object, &reply);
    let restored = inbound(REMOTE, MASQ.ip, ICMP, &icmp_echo(ICMP_ECHO_REPLY, ECHO_ID));
    assert_delivered(&run, &restored, &MASQ, "the echo reply");
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 1);
}

#[test]
fn fragmentation_needed_quoting_a_translated_syn_reaches_the_pod_with_the_quote_restored() {
    require_root();
    let object = uplink();
    let syn = outbound(MASQ.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_SYN));
    let (translated, node_port) = open_tcp(&object, MASQ.ip);
    let error = inbound(
        ROUTER,
        NODE_ADDR,
        ICMP,
        &frag_needed(1400, &quote(&translated)),
    );
    assert_checksums_valid(&error, "test bug: the crafted ICMP error");
    let run = ingress(&object, &error);
    assert_eq!(
        (
            run.frame.get(INNER_SRC..INNER_SRC + 4),
            run.frame.get(INNER_SPORT..INNER_SPORT + 2)
        ),
        (Some(&MASQ.ip[..]), Some(&POD_PORT.to_be_bytes()[..])),
        "the quoted source: the pod's address and port"
    );
    // The pod gets the error about the SYN it sent, as it sent it.
    let restored = inbound(ROUTER, MASQ.ip, ICMP, &frag_needed(1400, &quote(&syn)));
    assert_delivered(&run, &restored, &MASQ, "the fragmentation needed error");
    assert_eq!(object.nat_counter(NatCounter::IcmpErrorsIn), 1);
    assert_eq!(
        object.nat_counter(NatCounter::TranslatedIn),
        0,
        "counted as an error"
    );
    let back = object
        .nat_in(&in_key(REMOTE, node_port, REMOTE_PORT, TCP))
        .expect("NAT_IN still holds the flow");
    assert_eq!(
        back.state,
        tcp_state::SYN_SENT,
        "an error does not establish"
    );
}

#[test]
fn an_icmp_error_quoting_an_untranslated_packet_reaches_the_stack_unchanged() {
    require_root();
    let object = uplink();
    let (_, node_port) = open_tcp(&object, MASQ.ip);
    // The node's own SYN from another port: no flow of ours.
    let own = outbound(
        NODE_ADDR,
        REMOTE,
        TCP,
        &tcp(node_port ^ 1, REMOTE_PORT, TCP_SYN),
    );
    let error = inbound(ROUTER, NODE_ADDR, ICMP, &frag_needed(1400, &quote(&own)));
    assert_unchanged(
        &ingress(&object, &error),
        &error,
        "an error about the node's flow",
    );
    assert_eq!(object.nat_counter(NatCounter::IcmpErrorsIn), 0);
}

/// Traceroute's case: the error quotes an echo request, whose identifier is the node's.
/// The quoted echo's own checksum (of a message the quote truncates, so nobody can
/// verify it) is left as the router saw it; everything else is the pod's request.
#[test]
fn time_exceeded_quoting_a_translated_echo_request_reaches_the_pod_restored() {
    require_root();
    let object = uplink();
    let request = outbound(
        MASQ.ip,
        REMOTE,
        ICMP,
        &icmp_echo(ICMP_ECHO_REQUEST, ECHO_ID),
    );
    let translated = quote(&egress(&object, &request).frame);
    let error = inbound(ROUTER, NODE_ADDR, ICMP, &time_exceeded(&translated));
    assert_checksums_valid(&error, "test bug: the crafted ICMP error");
    let run = ingress(&object, &error);
    assert_eq!(
        port(&run.frame, INNER_ICMP_ID),
        ECHO_ID,
        "the quoted identifier"
    );
    let mut quoted = quote(&request);
    // The quoted echo checksum: 20 bytes of IPv4 header, then 2 bytes of type and code.
    quoted[22..24].copy_from_slice(&translated[22..24]);
    let restored = inbound(ROUTER, MASQ.ip, ICMP, &time_exceeded(&quoted));
    assert_delivered(&run, &restored, &MASQ, "the time exceeded error");
    assert_eq!(object.nat_counter(NatCounter::IcmpErrorsIn), 1);
}

/// PMTU discovery for a hostPort service: a router's "fragmentation needed" about the
/// pod's reply, which left the node as `NODE_ADDR:HOST_PORT`, reaches the pod with the
/// quote restored to the pod's address and port.
#[test]
fn fragmentation_needed_quoting_a_hostport_reply_reaches_the_pod_restored() {
    require_root();
    const HOST_PORT: u16 = 30080;
    const CONTAINER_PORT: u16 = 8080;
    let mut object = uplink();
    object.insert_host_port(TCP, NODE_ADDR, HOST_PORT, MASQ.ip, CONTAINER_PORT);
    // The client's SYN opens the hostPort connection.
    let syn = inbound(
        REMOTE,
        NODE_ADDR,
        TCP,
        &tcp(REMOTE_PORT, HOST_PORT, TCP_SYN),
    );
    let run = ingress(&object, &syn);
    let to_pod = inbound(
        REMOTE,
        MASQ.ip,
        TCP,
        &tcp(REMOTE_PORT, CONTAINER_PORT, TCP_SYN),
    );
    assert_delivered(&run, &to_pod, &MASQ, "the SYN through the hostPort");
    // The pod's SYN-ACK leaves with the host address and port.
    let reply = outbound(
        MASQ.ip,
        REMOTE,
        TCP,
        &tcp(CONTAINER_PORT, REMOTE_PORT, SYN_ACK),
    );
    let left = egress(&object, &reply).frame;
    assert_eq!(
        (port(&left, SPORT), left.get(26..30)),
        (HOST_PORT, Some(&NODE_ADDR[..])),
        "the reply leaves as the host port"
    );
    let error = inbound(ROUTER, NODE_ADDR, ICMP, &frag_needed(1400, &quote(&left)));
    assert_checksums_valid(&error, "test bug: the crafted ICMP error");
    let run = ingress(&object, &error);
    let restored = inbound(ROUTER, MASQ.ip, ICMP, &frag_needed(1400, &quote(&reply)));
    assert_delivered(&run, &restored, &MASQ, "the fragmentation needed error");
    // An error about a connection the node does not have reaches the stack untouched.
    let stranger = outbound(
        NODE_ADDR,
        REMOTE,
        TCP,
        &tcp(HOST_PORT, REMOTE_PORT ^ 1, SYN_ACK),
    );
    let error = inbound(
        ROUTER,
        NODE_ADDR,
        ICMP,
        &frag_needed(1400, &quote(&stranger)),
    );
    assert_unchanged(
        &ingress(&object, &error),
        &error,
        "no such hostPort connection",
    );
}

#[test]
fn tcp_and_udp_whose_packets_carry_ip_options_are_translated_both_ways() {
    require_root();
    // The programs find the ports after the header length the IHL gives: a header with
    // options must translate as well, options intact, its checksum covering them.
    let object = uplink();
    for (proto, l4_out, l4_in) in [
        (
            TCP,
            tcp(POD_PORT, REMOTE_PORT, TCP_SYN),
            tcp(REMOTE_PORT, 0, SYN_ACK),
        ),
        (
            UDP,
            udp(POD_PORT, REMOTE_PORT, b"q"),
            udp(REMOTE_PORT, 0, b"a"),
        ),
    ] {
        let what = format!("protocol {proto}");
        let out = outbound(MASQ.ip, REMOTE, proto, &l4_out);
        let run = egress(&object, &with_ip_options(&out));
        assert_eq!(run.verdict, TC_ACT_OK, "{what}: translated, on its way");
        let translated = without_ip_options(&run.frame, &what);
        assert_checksums_valid(&translated, &what);
        let node_port = port(&translated, SPORT);
        let mut expected_l4 = l4_out.clone();
        expected_l4[..2].copy_from_slice(&node_port.to_be_bytes());
        assert_eq!(
            translated,
            outbound(NODE_ADDR, REMOTE, proto, &expected_l4),
            "{what}: source address and port translated"
        );

        let mut reply_l4 = l4_in.clone();
        reply_l4[2..4].copy_from_slice(&node_port.to_be_bytes());
        let reply = inbound(REMOTE, NODE_ADDR, proto, &reply_l4);
        let run = ingress(&object, &with_ip_options(&reply));
        assert_eq!(run.verdict, TC_ACT_REDIRECT, "{what}: into the pod");
        let mut restored_l4 = l4_in;
        restored_l4[2..4].copy_from_slice(&POD_PORT.to_be_bytes());
        let restored = inbound(REMOTE, MASQ.ip, proto, &restored_l4);
        let got = without_ip_options(&run.frame, &what);
        assert_checksums_valid(&got, &what);
        assert_eq!(
            got,
            delivered(&restored, &MASQ),
            "{what}: the reply the pod gets"
        );
    }
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}

#[test]
fn a_connection_from_outside_to_a_pods_own_address_is_answered_untranslated() {
    require_root();
    let object = uplink();
    // A routed pod network: a host outside reaches the pod's own address; the stack
    // routes it on. From another node's pod (inside the cluster ranges) nothing is noted.
    let syn = inbound(REMOTE, MASQ.ip, TCP, &tcp(REMOTE_PORT, POD_PORT, TCP_SYN));
    assert_unchanged(&ingress(&object, &syn), &syn, "the stack routes it");
    let from_cluster = inbound(
        OTHER_NODE_POD,
        MASQ.ip,
        TCP,
        &tcp(REMOTE_PORT, POD_PORT, TCP_SYN),
    );
    assert_unchanged(
        &ingress(&object, &from_cluster),
        &from_cluster,
        "from another node's pod",
    );
    let noted = object.nat_inbound();
    assert_eq!(
        noted.iter().map(|(flow, _)| *flow).collect::<Vec<_>>(),
        vec![out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP)],
        "the outside host's flow alone, keyed from the pod's side"
    );

    let answer = outbound(MASQ.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, SYN_ACK));
    assert_unchanged(&egress(&object, &answer), &answer, "the pod's SYN-ACK");
    assert!(object.nat_out_entries().is_empty(), "no translated flow");
    // Another pod's packet on no such flow is translated as before.
    let other = outbound(MASQ_2.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, SYN_ACK));
    let run = egress(&object, &other);
    assert_eq!(addr(&run.frame, IP_SRC), NODE_ADDR, "translated");
}

/// The state of the note of the flow a host outside opened to [`MASQ`]'s port
/// [`POD_PORT`] from [`REMOTE_PORT`] over `proto`.
fn note_of(object: &BpfObject, proto: u8) -> NatEntry {
    let key = out_key(MASQ.ip, POD_PORT, REMOTE_PORT, proto);
    let notes = object.nat_inbound();
    let Some((_, note)) = notes.iter().find(|(noted, _)| *noted == key) else {
        panic!("no note of {key:?} in {notes:?}");
    };
    *note
}

#[test]
fn a_connection_from_outside_is_noted_with_its_tcp_state_and_forgotten_once_closed() {
    require_root();
    let mut object = uplink();
    let from_remote = |flags| inbound(REMOTE, MASQ.ip, TCP, &tcp(REMOTE_PORT, POD_PORT, flags));
    let from_pod = |flags| outbound(MASQ.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, flags));
    let fin_ack = TCP_FIN | TCP_ACK;
    let steps = [
        (from_remote(TCP_SYN), tcp_state::SYN_SENT),
        (from_pod(SYN_ACK), tcp_state::ESTABLISHED),
        (from_remote(TCP_ACK), tcp_state::ESTABLISHED),
        (from_remote(fin_ack), tcp_state::CLOSING),
        // Closed by the host outside first: the whole closed timeout (the pod may still
        // retransmit its FIN), not the pod's short TIME_WAIT hold.
        (from_pod(fin_ack), tcp_state::CLOSED),
    ];
    for (frame, state) in steps {
        let run = if addr(&frame, IP_SRC) == REMOTE {
            ingress(&object, &frame)
        } else {
            egress(&object, &frame)
        };
        assert_unchanged(&run, &frame, "a packet of the connection from outside");
        assert_eq!(note_of(&object, TCP).state, state, "after {frame:?}");
    }

    // Aged past the closed timeout (10 s): the pod's late packet is no answer any more.
    let key = out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP);
    let closed = note_of(&object, TCP);
    let aged = |state| NatEntry {
        last_seen_ns: coarse_ns_ago(Duration::from_secs(11)),
        state,
        ..closed
    };
    object.insert_nat_inbound(key, aged(tcp_state::ESTABLISHED));
    let late = from_pod(TCP_ACK);
    assert_unchanged(
        &egress(&object, &late),
        &late,
        "an established connection 11 s idle is still answered untranslated",
    );
    object.insert_nat_inbound(key, aged(tcp_state::CLOSED));
    let run = egress(&object, &late);
    assert_eq!(
        addr(&run.frame, IP_SRC),
        NODE_ADDR,
        "a connection closed 11 s ago: the pod's packet opens a translated flow"
    );
}

#[test]
fn a_datagram_flow_from_outside_becomes_a_stream_once_the_pod_answers() {
    require_root();
    let object = uplink();
    let request = inbound(REMOTE, MASQ.ip, UDP, &udp(REMOTE_PORT, POD_PORT, b"query"));
    assert_unchanged(&ingress(&object, &request), &request, "to the stack");
    assert_eq!(note_of(&object, UDP).state, 0, "no answer yet");
    let answer = outbound(MASQ.ip, REMOTE, UDP, &udp(POD_PORT, REMOTE_PORT, b"answer"));
    assert_unchanged(&egress(&object, &answer), &answer, "the pod's answer");
    assert_eq!(
        note_of(&object, UDP).state,
        udp_state::REPLIED,
        "answered: the stream timeout"
    );
}

#[test]
fn a_pods_stray_rst_takes_a_node_port_for_the_closed_timeout_only() {
    require_root();
    let object = uplink();
    // A RST on a connection the tables no longer hold (a pod resetting a flow whose
    // entry the LRU evicted): it leaves translated, as every packet of the pod does...
    let rst = outbound(MASQ.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_RST));
    let run = egress(&object, &rst);
    assert_eq!(addr(&run.frame, IP_SRC), NODE_ADDR, "translated");
    // ...and its entry is closed: the node port is free again after the closed timeout,
    // not held the established one (a day).
    let entry = object
        .nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP))
        .expect("NAT_OUT holds the flow");
    assert_eq!(entry.state, tcp_state::CLOSED);
    // A packet picked up mid-stream is established, a SYN opens.
    for (pod_port, flags, state) in [
        (POD_PORT + 1, TCP_ACK, tcp_state::ESTABLISHED),
        (POD_PORT + 2, TCP_SYN, tcp_state::SYN_SENT),
    ] {
        let packet = outbound(MASQ.ip, REMOTE, TCP, &tcp(pod_port, REMOTE_PORT, flags));
        egress(&object, &packet);
        let entry = object
            .nat_out(&out_key(MASQ.ip, pod_port, REMOTE_PORT, TCP))
            .expect("NAT_OUT holds the flow");
        assert_eq!(entry.state, state, "flags {flags:#x}");
    }
}
