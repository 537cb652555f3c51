//! Source NAT on the uplink's egress, run by the kernel through BPF_PROG_TEST_RUN: a
//! masqueraded pod's TCP, UDP and ICMP echo leave with the node's address and a node
//! port (or identifier) from the range, every checksum valid, the flow recorded in both
//! tables; traffic that must keep its source passes untouched. Port allocation is in
//! `nat_program_ports.rs`, replies in `nat_program_replies.rs`, fragmented datagrams in
//! `nat_program_fragments.rs`.

use cni_ebpf_common::{
    DropReason, NatConfig, NatCounter, NatEntry, Uplinks, flow::seq_seen, tcp_state,
};
use ebpf_cni_tests::{
    frames::{
        IP_DST, IP_END, LOOPBACK, TC_ACT_OK, TC_ACT_SHOT, all_drops,
        assert_reference_checksum_is_right, no_drops,
    },
    nat_frames::{
        ECHO_ID, ICMP, ICMP_ECHO_REQUEST, ICMP_ID, IP_SRC, MASQ, NODE_ADDR, OTHER_NODE_POD, PLAIN,
        POD_PORT, PORT_MAX, PORT_MIN, REMOTE, REMOTE_PORT, SPORT, TCP, TCP_ACK, TCP_SEQ, TCP_SYN,
        UDP, UDP_CHECK, addr, assert_checksums_valid, assert_unchanged, egress, entry, icmp_echo,
        in_key, inbound, ingress, monotonic_coarse_ns, nat_config, out_key, outbound, port,
        pseudo_header_checksum, quote, tcp, udp, uplink, uplink_with, without_udp_checksum,
    },
    require_root,
};

fn syn_from(pod_ip: [u8; 4]) -> Vec<u8> {
    outbound(pod_ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_SYN))
}

fn node_port_in_range(frame: &[u8], at: usize) -> u16 {
    let node_port = port(frame, at);
    let range = PORT_MIN..=PORT_MAX;
    assert!(
        range.contains(&node_port),
        "{node_port} is outside {range:?}"
    );
    node_port
}

#[test]
fn tcp_syn_from_a_masqueraded_pod_leaves_from_a_node_port_recorded_in_both_tables() {
    require_root();
    assert_reference_checksum_is_right();
    let object = uplink();
    let syn = syn_from(MASQ.ip);
    assert_checksums_valid(&syn, "test bug: the crafted SYN");
    let before = monotonic_coarse_ns();
    let run = egress(&object, &syn);
    let after = monotonic_coarse_ns();
    assert_eq!(
        run.verdict, TC_ACT_OK,
        "a translated packet goes on to the wire"
    );
    assert_eq!(addr(&run.frame, IP_SRC), NODE_ADDR, "source: the node");
    let node_port = node_port_in_range(&run.frame, SPORT);
    assert_checksums_valid(&run.frame, "the translated SYN");
    let expected = outbound(
        NODE_ADDR,
        REMOTE,
        TCP,
        &tcp(node_port, REMOTE_PORT, TCP_SYN),
    );
    assert_eq!(
        run.frame, expected,
        "only the source address and port change"
    );

    let key = out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP);
    let out = object.nat_out(&key).expect("NAT_OUT holds the flow");
    let stamp = out.last_seen_ns;
    assert_eq!(
        out,
        NatEntry {
            seq_seen: seq_seen::OPENER,
            seq: [TCP_SEQ, 0],
            ..entry(&key, node_port, tcp_state::SYN_SENT, stamp)
        },
        "NAT_OUT, with the SYN's sequence number"
    );
    assert!(
        (before..=after).contains(&stamp),
        "stamped now (CLOCK_MONOTONIC as of the last tick)"
    );
    let reverse = in_key(REMOTE, node_port, REMOTE_PORT, TCP);
    assert_eq!(
        object.nat_in(&reverse),
        Some(out),
        "NAT_IN holds the same entry"
    );
    assert_eq!(object.nat_out_entries().len(), 1, "one flow out");
    assert_eq!(object.nat_in_entries().len(), 1, "one flow in");
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 1);
    assert_eq!(object.nat_counter(NatCounter::TranslatedOut), 1);

    let again = egress(&object, &syn);
    assert_eq!(again.verdict, TC_ACT_OK);
    assert_eq!(again.frame, expected, "the same flow keeps its node port");
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 1, "no new flow");
    assert_eq!(object.nat_counter(NatCounter::TranslatedOut), 2);
    assert_eq!(object.nat_out_entries().len(), 1, "still one flow");
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}

#[test]
fn udp_without_checksum_keeps_zero_and_udp_with_one_stays_valid_after_translation() {
    require_root();
    let object = uplink();
    let bare = without_udp_checksum(outbound(MASQ.ip, REMOTE, UDP, &udp(POD_PORT, 53, b"q")));
    let run = egress(&object, &bare);
    assert_eq!(run.verdict, TC_ACT_OK);
    let node_port = node_port_in_range(&run.frame, SPORT);
    assert_eq!(
        port(&run.frame, UDP_CHECK),
        0,
        "no checksum stays no checksum"
    );
    let expected = outbound(NODE_ADDR, REMOTE, UDP, &udp(node_port, 53, b"q"));
    assert_eq!(
        run.frame,
        without_udp_checksum(expected),
        "source address and port"
    );

    let summed = outbound(MASQ.ip, REMOTE, UDP, &udp(POD_PORT + 1, 53, b"query"));
    assert_checksums_valid(&summed, "test bug: the crafted datagram");
    let run = egress(&object, &summed);
    assert_eq!(run.verdict, TC_ACT_OK);
    let node_port = node_port_in_range(&run.frame, SPORT);
    assert_checksums_valid(&run.frame, "the translated datagram");
    let expected = outbound(NODE_ADDR, REMOTE, UDP, &udp(node_port, 53, b"query"));
    assert_eq!(run.frame, expected, "source address and port");
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 2, "two UDP flows");
    let key = out_key(MASQ.ip, POD_PORT + 1, 53, UDP);
    let out = object.nat_out(&key).expect("NAT_OUT holds the flow");
    assert_eq!(
        (out.node_port, out.state),
        (node_port, 0),
        "UDP has no state"
    );
}

/// A checksum that sums to zero once translated must go out as 0xffff: 0 would say
/// "no checksum".
#[test]
fn udp_whose_translated_checksum_is_zero_leaves_with_0xffff() {
    require_root();
    let frame = |src, sport, word: u16| {
        let payload = [&word.to_be_bytes()[..], b"ab"].concat();
        outbound(src, REMOTE, UDP, &udp(sport, 53, &payload))
    };
    // A range of one port: the node port is known before the run (ports are otherwise
    // probed from a random start).
    let one_port = || {
        uplink_with(NatConfig {
            port_max: PORT_MIN,
            ..nat_config()
        })
    };
    let node_port = PORT_MIN;
    // `word` adds exactly what the translated datagram's sum misses to be 0xffff.
    let translated = without_udp_checksum(frame(NODE_ADDR, node_port, 0));
    let word = pseudo_header_checksum(NODE_ADDR, REMOTE, UDP, &translated[IP_END..]);
    let sent = frame(MASQ.ip, POD_PORT, word);
    assert_checksums_valid(&sent, "test bug: the crafted datagram");
    let run = egress(&one_port(), &sent);
    assert_eq!(
        port(&run.frame, SPORT),
        node_port,
        "test bug: another node port"
    );
    assert_eq!(
        port(&run.frame, UDP_CHECK),
        0xffff,
        "a zero sum is sent as 0xffff"
    );
    assert_checksums_valid(&run.frame, "the translated datagram");
}

#[test]
fn icmp_echo_request_from_a_masqueraded_pod_gets_a_node_identifier() {
    require_root();
    let object = uplink();
    let request = outbound(
        MASQ.ip,
        REMOTE,
        ICMP,
        &icmp_echo(ICMP_ECHO_REQUEST, ECHO_ID),
    );
    assert_checksums_valid(&request, "test bug: the crafted request");
    let run = egress(&object, &request);
    assert_eq!(run.verdict, TC_ACT_OK);
    let id = node_port_in_range(&run.frame, ICMP_ID);
    assert_checksums_valid(&run.frame, "the translated request");
    let expected = outbound(NODE_ADDR, REMOTE, ICMP, &icmp_echo(ICMP_ECHO_REQUEST, id));
    assert_eq!(run.frame, expected, "source address and identifier");
    let out = object
        .nat_out(&out_key(MASQ.ip, ECHO_ID, 0, ICMP))
        .expect("NAT_OUT holds the echo flow");
    assert_eq!((out.node_port, out.state), (id, 0));
    assert_eq!(object.nat_in(&in_key(REMOTE, id, 0, ICMP)), Some(out));
    assert_eq!(object.nat_counter(NatCounter::TranslatedOut), 1);
}

#[test]
fn traffic_that_keeps_its_source_passes_unchanged_and_opens_no_flow() {
    require_root();
    let object = uplink();
    let cases = [
        (
            outbound(
                MASQ.ip,
                OTHER_NODE_POD,
                TCP,
                &tcp(POD_PORT, REMOTE_PORT, TCP_SYN),
            ),
            "to a pod of another node (inside the cluster range)",
        ),
        (syn_from(PLAIN.ip), "from a pod without the MASQUERADE flag"),
        (syn_from(NODE_ADDR), "from the node itself"),
    ];
    for (frame, what) in &cases {
        assert_unchanged(&egress(&object, frame), frame, what);
    }
    assert!(object.nat_out_entries().is_empty(), "no flow out");
    assert!(object.nat_in_entries().is_empty(), "no flow in");
    assert_eq!(object.nat_counter(NatCounter::TranslatedOut), 0);
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}

#[test]
fn nothing_is_translated_while_nat_is_disabled_by_a_zero_node_address() {
    require_root();
    let object = uplink_with(NatConfig {
        node_addr: [0; 4],
        ..nat_config()
    });
    let syn = syn_from(MASQ.ip);
    assert_unchanged(&egress(&object, &syn), &syn, "NAT disabled");
    assert!(object.nat_out_entries().is_empty(), "no flow out");
    assert_eq!(object.nat_counter(NatCounter::NewFlows), 0);
}

#[test]
fn without_a_node_address_masqueraded_traffic_is_dropped_and_nothing_is_translated_back() {
    require_root();
    let mut object = uplink();
    let syn = syn_from(MASQ.ip);
    let node_port = port(&egress(&object, &syn).frame, SPORT);
    // The uplink loses its address (the daemon writes `NO_ADDRESS`).
    object.set_nat_config(NatConfig {
        node_addr: NatConfig::NO_ADDRESS,
        ..nat_config()
    });
    let mut drops = no_drops();
    let cases = [
        (
            outbound(MASQ.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_ACK)),
            "a packet of the flow opened before",
        ),
        (
            outbound(
                MASQ.ip,
                REMOTE,
                TCP,
                &tcp(POD_PORT + 1, REMOTE_PORT, TCP_SYN),
            ),
            "a new flow",
        ),
    ];
    for (frame, what) in &cases {
        let run = egress(&object, frame);
        assert_eq!(run.verdict, TC_ACT_SHOT, "{what}: dropped");
        assert_eq!(&run.frame, frame, "{what}: not rewritten");
        drops[DropReason::NatNoAddress as usize] += 1;
        assert_eq!(
            all_drops(&object),
            drops,
            "{what}: counted as nat_no_address"
        );
    }
    assert_eq!(
        object.nat_out_entries().len(),
        1,
        "the new flow took no port"
    );
    let plain = syn_from(PLAIN.ip);
    assert_unchanged(
        &egress(&object, &plain),
        &plain,
        "a pod that keeps its address",
    );

    // A broadcast that looks like a reply to the flow (the reserved value is the
    // limited broadcast address) is not handed to the pod.
    let reply = inbound(
        REMOTE,
        NatConfig::NO_ADDRESS,
        TCP,
        &tcp(REMOTE_PORT, node_port, TCP_SYN | TCP_ACK),
    );
    assert_unchanged(&ingress(&object, &reply), &reply, "a broadcast");
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 0);
}

/// Another uplink's address (a second NIC).
const SECOND_ADDR: [u8; 4] = [192, 0, 2, 7];

fn uplinks(list: &[(u32, [u8; 4])]) -> Uplinks {
    let mut uplinks = Uplinks::default();
    for &(ifindex, addr) in list {
        assert!(uplinks.push(ifindex, addr), "room for {ifindex}");
    }
    uplinks
}

#[test]
fn each_uplink_translates_to_its_own_address_and_takes_only_replies_to_it() {
    require_root();
    let mut object = uplink();
    // The test run's device (the loopback) is the second of two uplinks.
    object.set_uplinks(uplinks(&[
        (LOOPBACK + 1000, NODE_ADDR),
        (LOOPBACK, SECOND_ADDR),
    ]));
    let run = egress(&object, &syn_from(MASQ.ip));
    assert_eq!(run.verdict, TC_ACT_OK);
    assert_eq!(
        addr(&run.frame, IP_SRC),
        SECOND_ADDR,
        "its uplink's address"
    );
    assert_checksums_valid(&run.frame, "the translated SYN");
    let node_port = port(&run.frame, SPORT);
    let key = out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP);
    let out = object.nat_out(&key).expect("NAT_OUT holds the flow");
    assert_eq!(out.node_addr, SECOND_ADDR, "the flow records its address");
    let reverse = in_key(REMOTE, node_port, REMOTE_PORT, TCP);
    assert_eq!(
        object.nat_in(&reverse).map(|e| e.node_addr),
        Some(SECOND_ADDR)
    );

    // A reply to the other uplink's address, arriving here, is not this device's.
    let to_other = inbound(
        REMOTE,
        NODE_ADDR,
        TCP,
        &tcp(REMOTE_PORT, node_port, TCP_SYN | TCP_ACK),
    );
    assert_unchanged(&ingress(&object, &to_other), &to_other, "another address");
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 0);

    // Both uplinks with the address of the first: a reply to it on the same port is
    // still not the flow's, which left with the second address.
    object.set_uplinks(uplinks(&[(LOOPBACK, NODE_ADDR)]));
    assert_unchanged(
        &ingress(&object, &to_other),
        &to_other,
        "not the flow's address",
    );
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 0);

    // The flow's own address answers.
    object.set_uplinks(uplinks(&[(LOOPBACK, SECOND_ADDR)]));
    let reply = inbound(
        REMOTE,
        SECOND_ADDR,
        TCP,
        &tcp(REMOTE_PORT, node_port, TCP_SYN | TCP_ACK),
    );
    let run = ingress(&object, &reply);
    assert_eq!(
        addr(&run.frame, IP_DST),
        MASQ.ip,
        "translated back to the pod"
    );
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 1);
}

#[test]
fn a_device_that_is_no_uplink_translates_nothing() {
    require_root();
    let mut object = uplink();
    // NAT is on, but the test run's device is not among the uplinks (programs left on
    // a device the daemon no longer translates on).
    object.set_uplinks(uplinks(&[(LOOPBACK + 1000, NODE_ADDR)]));
    let syn = syn_from(MASQ.ip);
    assert_unchanged(&egress(&object, &syn), &syn, "not an uplink");
    assert!(object.nat_out_entries().is_empty(), "no flow");
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}

/// ICMP destination unreachable, port unreachable (type 3 code 3), quoting `quoted`.
fn port_unreachable(quoted: &[u8]) -> Vec<u8> {
    [&[3, 3, 0, 0, 0, 0, 0, 0][..], quoted].concat()
}

#[test]
fn a_pods_icmp_error_about_a_translated_flow_leaves_as_the_nodes() {
    require_root();
    let object = uplink();
    let open = outbound(MASQ.ip, REMOTE, UDP, &udp(POD_PORT, REMOTE_PORT, b"open"));
    let node_port = port(&egress(&object, &open).frame, SPORT);
    // What the remote sent on the flow, and what the pod got of it (checksum "none":
    // the quoted UDP checksum is not fixed, as routers' quotes are often too short).
    let sent = without_udp_checksum(inbound(
        REMOTE,
        NODE_ADDR,
        UDP,
        &udp(REMOTE_PORT, node_port, b"late"),
    ));
    let got = without_udp_checksum(inbound(
        REMOTE,
        MASQ.ip,
        UDP,
        &udp(REMOTE_PORT, POD_PORT, b"late"),
    ));
    let error = outbound(MASQ.ip, REMOTE, ICMP, &port_unreachable(&quote(&got)));
    let run = egress(&object, &error);
    assert_eq!(run.verdict, TC_ACT_OK, "on to the remote");
    assert_checksums_valid(&run.frame, "the translated error");
    assert_eq!(
        run.frame,
        outbound(NODE_ADDR, REMOTE, ICMP, &port_unreachable(&quote(&sent))),
        "from the node, quoting the packet as the remote sent it"
    );
    assert_eq!(object.nat_counter(NatCounter::TranslatedOut), 2);

    // An error about a packet of no translated flow stays as it is.
    let stray = inbound(REMOTE, MASQ.ip, UDP, &udp(REMOTE_PORT, POD_PORT + 1, b"x"));
    let other = outbound(MASQ.ip, REMOTE, ICMP, &port_unreachable(&quote(&stray)));
    assert_unchanged(&egress(&object, &other), &other, "no flow");
}
