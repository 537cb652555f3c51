//! Source NAT of the protocols besides TCP, UDP and ICMP echo, run by the kernel through
//! BPF_PROG_TEST_RUN. SCTP keeps its ports (its CRC32c covers them and not the
//! addresses); protocols without ports (GRE here) are translated by address alone, as
//! MASQUERADE's generic handling does; either way nothing after the IPv4 header changes,
//! and another pod that would need the same mapping meanwhile is dropped and counted.
//! DCCP and UDP-Lite, whose checksums cover the addresses as UDP's does, get a node
//! port as UDP does.

use cni_ebpf_common::{DropReason, NatCounter, udp_state};
use ebpf_cni_tests::{
    frames::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, all_drops, ipv4_header_is_valid, no_drops},
    nat_frames::{
        DCCP, ICMP, INNER_SRC, MASQ, MASQ_2, NODE_ADDR, POD_PORT, PORT_MAX, PORT_MIN, REMOTE,
        REMOTE_PORT, ROUTER, SPORT, UDPLITE, assert_checksums_valid, assert_delivered, delivered,
        egress, frag_needed, inbound, ingress, out_key, outbound, port, quote, uplink, with_addrs,
    },
    require_root,
};

const SCTP: u8 = 132;
const GRE: u8 = 47;
/// Another server outside the cluster.
const REMOTE_2: [u8; 4] = [198, 18, 7, 81];

/// An SCTP common header (ports, verification tag, CRC32c as the pod computed it) and
/// a chunk: the datapath reads the ports and nothing else.
fn sctp(sport: u16, dport: u16) -> Vec<u8> {
    let mut packet = [sport.to_be_bytes(), dport.to_be_bytes()].concat();
    packet.extend([0xde, 0xad, 0xbe, 0xef, 0x12, 0x34, 0x56, 0x78]);
    packet.extend([1, 0, 0, 20]);
    packet.extend([0x5a; 16]);
    packet
}

/// A GRE header (no flags, carrying IPv4) and what it carries.
fn gre() -> Vec<u8> {
    [&[0, 0, 0x08, 0x00][..], &[0xa5; 24]].concat()
}

/// `frame` as it must leave: the node's address as source, nothing else changed but
/// the header checksum.
fn translated(frame: &[u8], remote: [u8; 4]) -> Vec<u8> {
    with_addrs(frame.to_vec(), NODE_ADDR, remote)
}

fn drops_of(reason: DropReason, count: u64) -> Vec<u64> {
    let mut drops = no_drops();
    drops[reason as usize] = count;
    drops
}

#[test]
fn sctp_keeps_its_ports_and_only_the_address_changes_both_ways() {
    require_root();
    let object = uplink();
    let init = outbound(MASQ.ip, REMOTE, SCTP, &sctp(POD_PORT, REMOTE_PORT));
    let run = egress(&object, &init);
    assert_eq!(run.verdict, TC_ACT_OK, "translated, on to the wire");
    assert!(ipv4_header_is_valid(&run.frame), "header checksum");
    assert_eq!(
        run.frame,
        translated(&init, REMOTE),
        "the source alone: ports and CRC32c as the pod sent them"
    );
    let flow = object
        .nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, SCTP))
        .expect("NAT_OUT holds the association");
    assert_eq!(flow.node_port, POD_PORT, "its port kept");

    let reply = inbound(REMOTE, NODE_ADDR, SCTP, &sctp(REMOTE_PORT, POD_PORT));
    let run = ingress(&object, &reply);
    assert_eq!(run.verdict, TC_ACT_REDIRECT, "straight into the pod");
    assert_eq!(
        run.frame,
        delivered(&with_addrs(reply, REMOTE, MASQ.ip), &MASQ),
        "the pod's address back, nothing else but TTL and MACs"
    );
    assert_eq!(object.nat_counter(NatCounter::TranslatedIn), 1);
    let replied = object
        .nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, SCTP))
        .expect("the association");
    assert_eq!(
        replied.state,
        udp_state::REPLIED,
        "a reply makes it a stream (the longer timeout)"
    );

    // Another pod from the same port to the same remote port would share the mapping.
    let same = outbound(MASQ_2.ip, REMOTE, SCTP, &sctp(POD_PORT, REMOTE_PORT));
    let run = egress(&object, &same);
    assert_eq!(
        run.verdict, TC_ACT_SHOT,
        "it would get the first pod's replies"
    );
    assert_eq!(run.frame, same, "a dropped packet is not rewritten");
    assert_eq!(
        all_drops(&object),
        drops_of(DropReason::NatPortsExhausted, 1)
    );
    assert_eq!(object.nat_counter(NatCounter::AllocationFailures), 1);
    // From another port it has its own.
    let other = outbound(MASQ_2.ip, REMOTE, SCTP, &sctp(POD_PORT + 1, REMOTE_PORT));
    let run = egress(&object, &other);
    assert_eq!(run.verdict, TC_ACT_OK);
    assert_eq!(run.frame, translated(&other, REMOTE));
}

#[test]
fn protocols_without_ports_are_translated_by_address_one_pod_per_remote() {
    require_root();
    let object = uplink();
    let tunnel = outbound(MASQ.ip, REMOTE, GRE, &gre());
    let run = egress(&object, &tunnel);
    assert_eq!(run.verdict, TC_ACT_OK);
    assert_eq!(run.frame, translated(&tunnel, REMOTE), "the source alone");
    let sent = run.frame;

    let back = inbound(REMOTE, NODE_ADDR, GRE, &gre());
    let run = ingress(&object, &back);
    assert_eq!(run.verdict, TC_ACT_REDIRECT, "straight into the pod");
    assert_eq!(
        run.frame,
        delivered(&with_addrs(back, REMOTE, MASQ.ip), &MASQ)
    );

    // A router's "fragmentation needed" about the tunnel's packet reaches the pod, the
    // quote showing what the pod sent.
    let error = inbound(ROUTER, NODE_ADDR, ICMP, &frag_needed(1400, &quote(&sent)));
    let run = ingress(&object, &error);
    assert_eq!(run.verdict, TC_ACT_REDIRECT, "the error goes into the pod");
    assert_eq!(
        run.frame.get(INNER_SRC..INNER_SRC + 4),
        Some(&MASQ.ip[..]),
        "the quoted source: the pod"
    );
    let restored = inbound(ROUTER, MASQ.ip, ICMP, &frag_needed(1400, &quote(&tunnel)));
    assert_eq!(run.frame, delivered(&restored, &MASQ));
    assert_eq!(object.nat_counter(NatCounter::IcmpErrorsIn), 1);

    // One pod at a time per remote address and protocol.
    let same = outbound(MASQ_2.ip, REMOTE, GRE, &gre());
    assert_eq!(
        egress(&object, &same).verdict,
        TC_ACT_SHOT,
        "REMOTE is held"
    );
    assert_eq!(
        all_drops(&object),
        drops_of(DropReason::NatPortsExhausted, 1)
    );
    let elsewhere = outbound(MASQ_2.ip, REMOTE_2, GRE, &gre());
    let run = egress(&object, &elsewhere);
    assert_eq!(run.verdict, TC_ACT_OK, "another remote is free");
    assert_eq!(run.frame, translated(&elsewhere, REMOTE_2));
    let table = object.nat_out_entries();
    assert_eq!(table.len(), 2, "two flows: {table:?}");
    assert!(
        table.iter().all(|(key, entry)| key.proto == GRE
            && (key.pod_port, key.remote_port, entry.node_port) == (0, 0, 0)),
        "no ports: {table:?}"
    );
}

/// A DCCP or UDP-Lite header from `sport` to `dport` (checksum left for `outbound` or
/// `inbound` to compute; DCCP's CsCov and UDP-Lite's coverage 0: the whole packet) and
/// a few bytes.
fn dccp_or_udplite(sport: u16, dport: u16) -> Vec<u8> {
    let mut packet = [sport.to_be_bytes(), dport.to_be_bytes()].concat();
    packet.extend([3, 0, 0, 0, 0x0a, 0, 0, 1]);
    packet.extend([0x5a; 12]);
    packet
}

#[test]
fn dccp_and_udp_lite_get_a_node_port_with_their_checksums_right_both_ways() {
    require_root();
    for proto in [DCCP, UDPLITE] {
        let object = uplink();
        let out = outbound(
            MASQ.ip,
            REMOTE,
            proto,
            &dccp_or_udplite(POD_PORT, REMOTE_PORT),
        );
        assert_checksums_valid(&out, "test bug: the crafted packet");
        let run = egress(&object, &out);
        assert_eq!(run.verdict, TC_ACT_OK, "protocol {proto}: translated");
        let node_port = port(&run.frame, SPORT);
        assert!(
            (PORT_MIN..=PORT_MAX).contains(&node_port),
            "protocol {proto}: a node port from the range, not {node_port}"
        );
        assert_checksums_valid(&run.frame, "the translated packet");
        assert_eq!(
            run.frame,
            outbound(
                NODE_ADDR,
                REMOTE,
                proto,
                &dccp_or_udplite(node_port, REMOTE_PORT)
            ),
            "protocol {proto}: source address and port, and the checksum over them"
        );

        let reply = inbound(
            REMOTE,
            NODE_ADDR,
            proto,
            &dccp_or_udplite(REMOTE_PORT, node_port),
        );
        let for_pod = inbound(
            REMOTE,
            MASQ.ip,
            proto,
            &dccp_or_udplite(REMOTE_PORT, POD_PORT),
        );
        assert_delivered(
            &ingress(&object, &reply),
            &for_pod,
            &MASQ,
            "the reply, into the pod",
        );
        assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
    }
}
