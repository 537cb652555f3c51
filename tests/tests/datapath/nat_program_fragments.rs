//! Fragmented datagrams through source NAT, run by the kernel through
//! BPF_PROG_TEST_RUN: only a datagram's first fragment carries the ports a flow is found
//! by; the fragments after it get what their first fragment got (the node's address
//! leaving, the pod's arriving, straight into the pod), with nothing but the IPv4 header
//! changed. A fragment whose first one has not passed is never sent with the pod's
//! address (dropped, counted) and, arriving, is left to the stack.

use std::time::Duration;

use cni_ebpf_common::{DropReason, FragmentKey, NatCounter};
use ebpf_cni_tests::{
    frames::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, all_drops, ipv4_header_is_valid, no_drops},
    nat_frames::{
        IP_SRC, MASQ, NODE_ADDR, POD_PORT, REMOTE, REMOTE_PORT, SPORT, UDP, addr,
        assert_checksums_valid, assert_delivered, assert_unchanged, coarse_ns_ago, delivered,
        egress, inbound, ingress, outbound, port, udp, uplink, with_addrs, with_frag_field,
        with_ip_id,
    },
    require_root,
};

/// The flags and offset field of a first fragment: more fragments, offset 0.
const FIRST: u16 = 0x2000;
/// Of a last fragment: offset 185 (1,480 bytes), no more fragments.
const LAST: u16 = 185;
/// Another datagram's identification (the frames here carry 0x1c46).
const OTHER_ID: u16 = 0x1c47;

fn nat_fragment_drops(count: u64) -> Vec<u64> {
    let mut drops = no_drops();
    drops[DropReason::NatFragment as usize] = count;
    drops
}

#[test]
fn fragments_after_a_translated_first_one_leave_with_its_source() {
    require_root();
    let mut object = uplink();
    let datagram = outbound(
        MASQ.ip,
        REMOTE,
        UDP,
        &udp(POD_PORT, REMOTE_PORT, &[0x5a; 32]),
    );
    let first = with_frag_field(datagram.clone(), FIRST);
    let last = with_frag_field(datagram, LAST);

    // Before its first fragment nothing says where it goes: dropped, not leaked.
    let run = egress(&object, &last);
    assert_eq!(run.verdict, TC_ACT_SHOT, "it would leak the pod's address");
    assert_eq!(run.frame, last, "a dropped packet is not rewritten");
    assert_eq!(all_drops(&object), nat_fragment_drops(1), "nat_fragment");
    assert!(object.nat_out_entries().is_empty(), "no flow opened");

    let run = egress(&object, &first);
    assert_eq!(run.verdict, TC_ACT_OK, "the first fragment is translated");
    assert_eq!(addr(&run.frame, IP_SRC), NODE_ADDR);
    assert_ne!(port(&run.frame, SPORT), 0);
    assert_checksums_valid(&run.frame, "the translated first fragment");

    let run = egress(&object, &last);
    assert_eq!(run.verdict, TC_ACT_OK, "it follows its first fragment");
    assert!(ipv4_header_is_valid(&run.frame), "header checksum");
    assert_eq!(
        run.frame,
        with_addrs(last.clone(), NODE_ADDR, REMOTE),
        "only the source (and the header checksum) change: the bytes after the header \
         are the datagram's, not a port to rewrite"
    );
    assert_eq!(object.nat_counter(NatCounter::FragmentsOut), 1);

    // The record is per datagram: another one's fragment has had no first fragment.
    let other = with_ip_id(last.clone(), OTHER_ID);
    assert_eq!(
        egress(&object, &other).verdict,
        TC_ACT_SHOT,
        "another datagram"
    );
    assert_eq!(all_drops(&object), nat_fragment_drops(2));

    // A record older than the reassembly timeout (30 s) leads nowhere.
    let records = object.nat_fragments();
    assert_eq!(records.len(), 1, "one datagram recorded: {records:?}");
    let (key, mut target) = records[0];
    assert_eq!(key.way, FragmentKey::LEAVING);
    assert_eq!(target.addr, NODE_ADDR);
    target.seen_ns = coarse_ns_ago(Duration::from_secs(31));
    object.insert_nat_fragment(key, target);
    assert_eq!(egress(&object, &last).verdict, TC_ACT_SHOT, "expired");
    assert_eq!(all_drops(&object), nat_fragment_drops(3));
}

#[test]
fn fragments_after_a_replys_first_one_go_into_the_pod_with_it() {
    require_root();
    let object = uplink();
    let query = outbound(MASQ.ip, REMOTE, UDP, &udp(POD_PORT, REMOTE_PORT, b"query"));
    let node_port = port(&egress(&object, &query).frame, SPORT);
    let payload = [0xa5; 32];
    let reply = inbound(
        REMOTE,
        NODE_ADDR,
        UDP,
        &udp(REMOTE_PORT, node_port, &payload),
    );
    let first = with_frag_field(reply.clone(), FIRST);
    let last = with_frag_field(reply, LAST);

    assert_unchanged(
        &ingress(&object, &last),
        &last,
        "a fragment before its first one",
    );

    let run = ingress(&object, &first);
    let for_pod = inbound(REMOTE, MASQ.ip, UDP, &udp(REMOTE_PORT, POD_PORT, &payload));
    assert_delivered(
        &run,
        &with_frag_field(for_pod, FIRST),
        &MASQ,
        "the first fragment",
    );

    let run = ingress(&object, &last);
    assert_eq!(
        run.verdict, TC_ACT_REDIRECT,
        "into the pod, as its first fragment"
    );
    assert_eq!(
        run.frame,
        delivered(&with_addrs(last.clone(), REMOTE, MASQ.ip), &MASQ),
        "the pod's address, TTL one less, MACs of the pod's veth; nothing after the header"
    );
    assert_eq!(object.nat_counter(NatCounter::FragmentsIn), 1);

    let other = with_ip_id(last, OTHER_ID);
    assert_unchanged(&ingress(&object, &other), &other, "another datagram's");
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped arriving");
}
