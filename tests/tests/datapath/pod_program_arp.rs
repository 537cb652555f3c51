//! The ARP responder of `from_pod`, run by the kernel through BPF_PROG_TEST_RUN: a pod's
//! request for another pod of the node is answered with that pod's MAC (as on a bridge),
//! one for the gateway or any other address with the host veth's MAC; ARP about the pod
//! itself that it must not answer reaches the stack unchanged, and ARP about anyone else
//! (or from another MAC) is dropped as `spoofed_arp`.

use cni_ebpf_common::DropReason;
use ebpf_cni_tests::{
    frames::{
        ARP_END, ELSEWHERE, GATEWAY, LOOPBACK, PEER, SENDER, UNKNOWN, all_drops, arp, arp_request,
        assert_arp_reply, assert_dropped, assert_passes_unchanged, counters, datapath, from_pod,
        no_drops, pod,
    },
    require_root,
};

#[test]
fn arp_request_for_the_gateway_is_answered_with_the_host_veth_mac() {
    require_root();
    let object = datapath();
    let request = arp_request(&SENDER, GATEWAY);
    let run = from_pod(&object, &request);
    assert_arp_reply(&run, &request, GATEWAY, SENDER.info.host_mac);
    assert_eq!(
        object.endpoint_counters(LOOPBACK),
        counters(1, ARP_END, 1, ARP_END),
        "the request counts as sent by the pod, the reply as delivered to it"
    );
    assert_eq!(all_drops(&object), no_drops());
}

#[test]
fn arp_request_for_another_pod_of_the_node_is_answered_with_that_pods_mac() {
    require_root();
    let object = datapath();
    for target in [&PEER, &ELSEWHERE] {
        let request = arp_request(&SENDER, target.ip);
        let run = from_pod(&object, &request);
        assert_arp_reply(&run, &request, target.ip, target.info.pod_mac);
    }
}

#[test]
fn arp_request_for_an_address_of_no_pod_is_answered_as_proxy_with_the_host_veth_mac() {
    require_root();
    let object = datapath();
    let request = arp_request(&SENDER, UNKNOWN);
    assert_arp_reply(
        &from_pod(&object, &request),
        &request,
        UNKNOWN,
        SENDER.info.host_mac,
    );
}

#[test]
fn arp_from_the_pod_itself_that_the_responder_must_not_answer_goes_to_the_stack_unchanged() {
    require_root();
    let object = datapath();
    let cases = [
        (
            arp(2, SENDER.info.pod_mac, SENDER.ip, GATEWAY),
            "an ARP reply",
        ),
        (arp_request(&SENDER, SENDER.ip), "a gratuitous ARP"),
    ];
    for (frame, what) in &cases {
        assert_passes_unchanged(&object, frame, what);
    }
    assert_eq!(
        object.endpoint_counters(LOOPBACK),
        counters(2, 2 * ARP_END, 0, 0),
        "every frame counted as sent, none as delivered"
    );
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}

#[test]
fn arp_not_about_the_pod_itself_is_dropped_as_spoofed_arp() {
    require_root();
    let object = datapath();
    let unknown = pod(UNKNOWN, LOOPBACK, 99);
    // The pod's own address with another pod's MAC as sender, in the frame and the ARP
    // header alike.
    let mut their_mac = arp(2, PEER.info.pod_mac, SENDER.ip, GATEWAY);
    their_mac[6..12].copy_from_slice(&PEER.info.pod_mac);
    // The pod's own MAC in the frame, another's in the ARP header.
    let mut other_sha = arp(2, SENDER.info.pod_mac, SENDER.ip, GATEWAY);
    other_sha[22..28].copy_from_slice(&PEER.info.pod_mac);
    let cases = [
        (
            arp_request(&unknown, GATEWAY),
            "a sender address that is no endpoint",
        ),
        (
            arp_request(&ELSEWHERE, GATEWAY),
            "a sender address owned by a pod behind another veth",
        ),
        (
            arp(2, SENDER.info.pod_mac, PEER.ip, GATEWAY),
            "a reply claiming another pod's address",
        ),
        (their_mac, "the pod's address with another pod's MAC"),
        (other_sha, "a sender MAC that is not the frame's"),
        (
            arp(1, SENDER.info.pod_mac, [0; 4], GATEWAY),
            "an ARP probe (sender 0.0.0.0)",
        ),
    ];
    for (frame, what) in &cases {
        assert_dropped(&object, frame, DropReason::SpoofedArp, what);
    }
}
