//! The ARP responder of `from_pod`, run by the kernel through BPF_PROG_TEST_RUN: a pod's
//! request for the gateway or any pod address is answered from the host veth's MAC, and
//! every request it must not answer reaches the stack unchanged.

use ebpf_cni_tests::{
    frames::{
        ARP_END, ELSEWHERE, GATEWAY, LOOPBACK, PEER, SENDER, UNKNOWN, all_drops, arp, arp_request,
        assert_arp_reply, assert_passes_unchanged, counters, datapath, from_pod, no_drops, pod,
    },
    require_root,
};

#[test]
fn arp_request_for_the_gateway_is_answered_with_the_host_veth_mac() {
    require_root();
    let object = datapath();
    let request = arp_request(&SENDER, GATEWAY);
    let run = from_pod(&object, &request);
    assert_arp_reply(&run, &request, GATEWAY);
    assert_eq!(
        object.endpoint_counters(LOOPBACK),
        counters(1, ARP_END, 1, ARP_END),
        "the request counts as sent by the pod, the reply as delivered to it"
    );
    assert_eq!(all_drops(&object), no_drops());
}

#[test]
fn arp_request_for_another_pod_is_answered_as_proxy_for_the_subnet() {
    require_root();
    let object = datapath();
    for target in [PEER.ip, ELSEWHERE.ip] {
        let request = arp_request(&SENDER, target);
        assert_arp_reply(&from_pod(&object, &request), &request, target);
    }
}

#[test]
fn arp_the_responder_must_not_answer_goes_to_the_stack_unchanged() {
    require_root();
    let object = datapath();
    let unknown = pod(UNKNOWN, LOOPBACK, 99);
    let cases = [
        (
            arp_request(&unknown, GATEWAY),
            "a sender that is no endpoint",
        ),
        (
            arp_request(&ELSEWHERE, GATEWAY),
            "a sender address owned by a pod behind another veth",
        ),
        (
            arp(2, SENDER.info.pod_mac, SENDER.ip, GATEWAY),
            "an ARP reply",
        ),
        (arp_request(&SENDER, SENDER.ip), "a gratuitous ARP"),
        (arp(1, SENDER.info.pod_mac, [0; 4], GATEWAY), "an ARP probe"),
    ];
    for (frame, what) in &cases {
        assert_passes_unchanged(&object, frame, what);
    }
    assert_eq!(
        object.endpoint_counters(LOOPBACK),
        counters(5, 5 * ARP_END, 0, 0),
        "every frame counted as sent, none as delivered"
    );
    assert_eq!(all_drops(&object), no_drops(), "nothing dropped");
}
