//! IPv4 through the pod veth programs, run by the kernel through BPF_PROG_TEST_RUN:
//! `from_pod` forwards to a known pod: routed (sent to the gateway's MAC) with rewritten
//! MACs, one TTL less and a valid checksum for every TTL; switched (sent to the pod's
//! own MAC) unchanged; counted for both veths; and hands unknown or expiring
//! destinations to the stack unchanged. On a netkit pair's hook the same frame goes
//! through the destination's host side, whose kernel counters count it.

use cni_ebpf_common::EndpointCounters;
use ebpf_cni_tests::{
    bpf_object::Hook,
    frames::{
        IP, IP_CHECK, IP_END, LOOPBACK, PEER, SENDER, TC_ACT_REDIRECT, UNKNOWN, all_drops,
        assert_forwarded, assert_passes_unchanged, assert_reference_checksum_is_right, counters,
        datapath, from_pod, icmp_echo_request, internet_checksum, ipv4, ipv4_header_is_valid,
        ipv4_on_link, no_drops, tcp_syn,
    },
    require_root,
};

#[test]
fn ipv4_to_a_known_pod_is_rewritten_and_redirected_to_its_veth() {
    require_root();
    assert_reference_checksum_is_right();
    let object = datapath();
    let echo = ipv4(&SENDER, PEER.ip, 64, 1, &icmp_echo_request());
    let syn = ipv4(&SENDER, PEER.ip, 64, 6, &tcp_syn(SENDER.ip, PEER.ip));
    for frame in [&echo, &syn] {
        assert!(
            ipv4_header_is_valid(frame),
            "test bug: the crafted header is invalid"
        );
        assert_forwarded(frame, &from_pod(&object, frame), &PEER);
    }
    let bytes = echo.len() + syn.len();
    assert_eq!(
        object.endpoint_counters(PEER.info.host_ifindex),
        counters(0, 0, 2, bytes),
        "both delivered to the destination's veth"
    );
    assert_eq!(
        object.endpoint_counters(LOOPBACK),
        counters(2, bytes, 0, 0),
        "both sent by the sender"
    );
}

#[test]
fn on_a_netkit_hook_ipv4_to_a_known_pod_is_left_to_its_host_sides_counters() {
    require_root();
    let object = datapath();
    let syn = ipv4(&SENDER, PEER.ip, 64, 6, &tcp_syn(SENDER.ip, PEER.ip));
    let run = object.run_at(
        cni_ebpf_common::program_names::FROM_POD,
        &syn,
        Hook::NetkitPeer,
    );
    assert_forwarded(&syn, &run, &PEER);
    // Redirected to the host side's transmit (bpf_redirect_peer is refused off TC
    // ingress), whose kernel counters the daemon adds: the map counts it not.
    assert_eq!(
        object.endpoint_counters(PEER.info.host_ifindex),
        counters(0, 0, 0, 0)
    );
    assert_eq!(
        object.endpoint_counters(LOOPBACK),
        counters(1, syn.len(), 0, 0),
        "sent by the sender"
    );
    // The same frame at TC ingress goes straight into the pod, counted in the map.
    from_pod(&object, &syn);
    assert_eq!(
        object
            .endpoint_counters(PEER.info.host_ifindex)
            .to_pod_packets,
        1
    );
}

#[test]
fn ipv4_sent_to_a_known_pods_own_mac_is_redirected_to_it_unchanged() {
    require_root();
    let object = datapath();
    // TTL 1 too: on-link neighbours, as on a bridge, do not decrement it.
    for ttl in [64, 1] {
        let syn = ipv4_on_link(&SENDER, &PEER, ttl, 6, &tcp_syn(SENDER.ip, PEER.ip));
        let run = from_pod(&object, &syn);
        assert_eq!(run.verdict, TC_ACT_REDIRECT, "TTL {ttl}: redirected");
        assert_eq!(run.frame, syn, "TTL {ttl}: not a byte changed");
    }
    assert_eq!(
        object
            .endpoint_counters(PEER.info.host_ifindex)
            .to_pod_packets,
        2,
        "both delivered to the destination's veth"
    );
    assert_eq!(all_drops(&object), no_drops());
}

#[test]
fn ttl_decrement_keeps_the_ipv4_checksum_valid_for_every_ttl() {
    require_root();
    assert_reference_checksum_is_right();
    let object = datapath();
    let payload = icmp_echo_request();
    for ttl in 2..=u8::MAX {
        // Different identifications move the checksum through its carry cases.
        for id in [0x0000u16, 0x1c46, 0x8000, 0xfeff, 0xffff] {
            let mut frame = ipv4(&SENDER, PEER.ip, ttl, 1, &payload);
            frame[IP + 4..IP + 6].copy_from_slice(&id.to_be_bytes());
            frame[IP_CHECK..IP_CHECK + 2].fill(0);
            let check = internet_checksum(&frame[IP..IP_END]);
            frame[IP_CHECK..IP_CHECK + 2].copy_from_slice(&check.to_be_bytes());
            assert_forwarded(&frame, &from_pod(&object, &frame), &PEER);
        }
    }
}

#[test]
fn ipv4_to_an_unknown_or_expiring_destination_goes_to_the_stack_unchanged() {
    require_root();
    let object = datapath();
    let echo = icmp_echo_request();
    let cases = [
        (ipv4(&SENDER, UNKNOWN, 64, 1, &echo), "an address of no pod"),
        (
            ipv4(&SENDER, [198, 18, 0, 1], 64, 1, &echo),
            "an address off the node",
        ),
        (ipv4(&SENDER, PEER.ip, 1, 1, &echo), "TTL 1 to a pod"),
        (ipv4(&SENDER, PEER.ip, 0, 1, &echo), "TTL 0 to a pod"),
    ];
    for (frame, what) in &cases {
        assert_passes_unchanged(&object, frame, what);
    }
    assert_eq!(
        object.endpoint_counters(PEER.info.host_ifindex),
        EndpointCounters::default(),
        "nothing delivered to the pod"
    );
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}
