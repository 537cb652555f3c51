//! A TCP RST or FIN moves a flow's state only when its sequence number fits what the flow
//! has seen (`cni_ebpf_common::flow::follow_seq`), run by the kernel through
//! BPF_PROG_TEST_RUN: a host outside that guesses (spoofing the remote's address and
//! port) cannot close a pod's translated flow, nor a flow it opened to a pod's own
//! address; the real ends still can.

use cni_ebpf_common::{NatEntry, tcp_state};
use ebpf_cni_tests::{
    bpf_object::BpfObject,
    frames::{TC_ACT_OK, TC_ACT_REDIRECT},
    nat_frames::{
        MASQ, NODE_ADDR, POD_PORT, REMOTE, REMOTE_PORT, SPORT, TCP, TCP_ACK, TCP_FIN, TCP_RST,
        TCP_SYN, egress, in_key, inbound, ingress, out_key, outbound, port, tcp_at, uplink,
    },
    require_root,
};

/// The pod's and the remote's initial sequence numbers.
const POD_ISN: u32 = 0x1000_0000;
const REMOTE_ISN: u32 = 0x7000_0000;
/// Far from both: what a host that does not see the flow might try.
const GUESS: u32 = 0x3333_3333;

/// Opens a translated TCP flow from [`MASQ`] to [`REMOTE`] and answers it; returns the
/// node port.
fn established(object: &BpfObject) -> u16 {
    let syn = outbound(
        MASQ.ip,
        REMOTE,
        TCP,
        &tcp_at(POD_PORT, REMOTE_PORT, TCP_SYN, POD_ISN, 0),
    );
    let run = egress(object, &syn);
    assert_eq!(run.verdict, TC_ACT_OK, "the SYN is translated");
    let node_port = port(&run.frame, SPORT);
    let syn_ack = from_remote(node_port, TCP_SYN | TCP_ACK, REMOTE_ISN, POD_ISN + 1);
    assert_eq!(ingress(object, &syn_ack).verdict, TC_ACT_REDIRECT);
    assert_eq!(states(object, node_port), [tcp_state::ESTABLISHED; 2]);
    node_port
}

fn from_remote(node_port: u16, flags: u8, seq: u32, ack: u32) -> Vec<u8> {
    inbound(
        REMOTE,
        NODE_ADDR,
        TCP,
        &tcp_at(REMOTE_PORT, node_port, flags, seq, ack),
    )
}

/// The flow's state in `NAT_OUT` and `NAT_IN`.
fn states(object: &BpfObject, node_port: u16) -> [u8; 2] {
    let out = object
        .nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP))
        .expect("NAT_OUT holds the flow");
    let back = object
        .nat_in(&in_key(REMOTE, node_port, REMOTE_PORT, TCP))
        .expect("NAT_IN holds the flow");
    [out.state, back.state]
}

#[test]
fn a_rst_or_fin_with_a_made_up_sequence_number_leaves_a_translated_flow_established() {
    require_root();
    let object = uplink();
    let node_port = established(&object);
    for (flags, what) in [
        (TCP_RST, "RST"),
        (TCP_RST | TCP_ACK, "RST-ACK"),
        (TCP_FIN | TCP_ACK, "FIN"),
    ] {
        let blind = from_remote(node_port, flags, GUESS, GUESS);
        // Still delivered: the pod's stack ignores it as out of window.
        assert_eq!(ingress(&object, &blind).verdict, TC_ACT_REDIRECT, "{what}");
        assert_eq!(
            states(&object, node_port),
            [tcp_state::ESTABLISHED; 2],
            "a {what} at a guessed sequence number moves nothing"
        );
    }
    // The remote's own RST, at its sequence number, closes the flow.
    let real = from_remote(node_port, TCP_RST, REMOTE_ISN + 1, 0);
    assert_eq!(ingress(&object, &real).verdict, TC_ACT_REDIRECT);
    assert_eq!(states(&object, node_port), [tcp_state::CLOSED; 2]);
}

#[test]
fn a_blind_rst_leaves_an_unanswered_syn_open_and_a_refusal_closes_it() {
    require_root();
    let object = uplink();
    let syn = outbound(
        MASQ.ip,
        REMOTE,
        TCP,
        &tcp_at(POD_PORT, REMOTE_PORT, TCP_SYN, POD_ISN, 0),
    );
    let node_port = port(&egress(&object, &syn).frame, SPORT);
    for (flags, ack) in [(TCP_RST, 0), (TCP_RST | TCP_ACK, GUESS)] {
        ingress(&object, &from_remote(node_port, flags, GUESS, ack));
        assert_eq!(
            states(&object, node_port),
            [tcp_state::SYN_SENT; 2],
            "a RST that does not acknowledge the SYN ({flags:#x})"
        );
    }
    ingress(
        &object,
        &from_remote(node_port, TCP_RST | TCP_ACK, 0, POD_ISN + 1),
    );
    assert_eq!(
        states(&object, node_port),
        [tcp_state::CLOSED; 2],
        "refused"
    );
}

#[test]
fn data_moves_the_window_and_the_fins_that_follow_it_close_the_flow() {
    require_root();
    let object = uplink();
    let node_port = established(&object);
    // 40 segments of 64 KiB from the remote: 2.5 MiB past its ISN, beyond the slack
    // from where it began.
    for i in 0..40 {
        let data = from_remote(node_port, TCP_ACK, REMOTE_ISN + 1 + i * 65_536, POD_ISN + 1);
        assert_eq!(ingress(&object, &data).verdict, TC_ACT_REDIRECT);
    }
    let remote_end = REMOTE_ISN + 1 + 40 * 65_536;
    let stale_fin = from_remote(node_port, TCP_FIN | TCP_ACK, REMOTE_ISN + 1, POD_ISN + 1);
    ingress(&object, &stale_fin);
    assert_eq!(
        states(&object, node_port),
        [tcp_state::ESTABLISHED; 2],
        "a FIN at the start of the stream no longer fits"
    );
    ingress(
        &object,
        &from_remote(node_port, TCP_FIN | TCP_ACK, remote_end, POD_ISN + 1),
    );
    assert_eq!(states(&object, node_port), [tcp_state::REMOTE_CLOSING; 2]);
    let pod_fin = outbound(
        MASQ.ip,
        REMOTE,
        TCP,
        &tcp_at(
            POD_PORT,
            REMOTE_PORT,
            TCP_FIN | TCP_ACK,
            POD_ISN + 1,
            remote_end + 1,
        ),
    );
    assert_eq!(egress(&object, &pod_fin).verdict, TC_ACT_OK);
    assert_eq!(states(&object, node_port), [tcp_state::CLOSED; 2]);
}

/// The note of the connection [`REMOTE`] opened to [`MASQ`]'s own address.
fn note(object: &BpfObject) -> NatEntry {
    let key = out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP);
    let notes = object.nat_inbound();
    let Some((_, note)) = notes.iter().find(|(noted, _)| *noted == key) else {
        panic!("no note of {key:?} in {notes:?}");
    };
    *note
}

#[test]
fn a_blind_rst_leaves_a_connection_from_outside_to_a_pods_own_address_established() {
    require_root();
    let object = uplink();
    let to_pod = |flags, seq, ack| {
        inbound(
            REMOTE,
            MASQ.ip,
            TCP,
            &tcp_at(REMOTE_PORT, POD_PORT, flags, seq, ack),
        )
    };
    ingress(&object, &to_pod(TCP_SYN, REMOTE_ISN, 0));
    let answer = outbound(
        MASQ.ip,
        REMOTE,
        TCP,
        &tcp_at(
            POD_PORT,
            REMOTE_PORT,
            TCP_SYN | TCP_ACK,
            POD_ISN,
            REMOTE_ISN + 1,
        ),
    );
    assert_eq!(egress(&object, &answer).verdict, TC_ACT_OK);
    assert_eq!(note(&object).state, tcp_state::ESTABLISHED);
    ingress(&object, &to_pod(TCP_RST, GUESS, 0));
    assert_eq!(
        note(&object).state,
        tcp_state::ESTABLISHED,
        "a RST at a guessed sequence number moves nothing"
    );
    ingress(&object, &to_pod(TCP_RST, REMOTE_ISN + 1, 0));
    assert_eq!(
        note(&object).state,
        tcp_state::CLOSED,
        "the real one closes it"
    );
}
