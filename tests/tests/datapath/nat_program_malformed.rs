//! Malformed IPv4 headers are never translated by the uplink programs (run through
//! BPF_PROG_TEST_RUN): an outer header whose version is not 4, whose header length is
//! under 20 bytes or beyond its total length, or whose total length is beyond the frame,
//! leaves untouched and leaves no flow behind; nor is an ICMP error whose quoted header
//! is malformed given back to a pod.

use ebpf_cni_tests::{
    frames::{IP, TC_ACT_OK},
    nat_frames::{
        INNER_IP, IP_SRC, MASQ, NODE_ADDR, POD_PORT, REMOTE, REMOTE_PORT, ROUTER, TCP, TCP_SYN,
        addr, assert_unchanged, egress, frag_needed, inbound, ingress, out_key, outbound, quote,
        tcp, uplink,
    },
    require_root,
};

fn syn() -> Vec<u8> {
    outbound(MASQ.ip, REMOTE, TCP, &tcp(POD_PORT, REMOTE_PORT, TCP_SYN))
}

/// `frame` with its IPv4 header's first byte (version and header length) set to
/// `vihl`, and its total length to `total` when given.
fn with_header(mut frame: Vec<u8>, at: usize, vihl: u8, total: Option<u16>) -> Vec<u8> {
    frame[at] = vihl;
    if let Some(total) = total {
        frame[at + 2..at + 4].copy_from_slice(&total.to_be_bytes());
    }
    frame
}

#[test]
fn malformed_outer_headers_leave_untouched_and_leave_no_flow() {
    require_root();
    let object = uplink();
    for (frame, what) in [
        (with_header(syn(), IP, 0x44, None), "a 16-byte header"),
        (with_header(syn(), IP, 0x40, None), "a header length of 0"),
        (
            with_header(syn(), IP, 0x65, None),
            "version 6 behind the IPv4 EtherType",
        ),
        (
            with_header(syn(), IP, 0x47, Some(24)),
            "a header longer than its total length",
        ),
        (
            with_header(syn(), IP, 0x45, Some(1000)),
            "a total length beyond the frame",
        ),
    ] {
        let run = egress(&object, &frame);
        assert_unchanged(&run, &frame, what);
        assert_eq!(
            object.nat_out(&out_key(MASQ.ip, POD_PORT, REMOTE_PORT, TCP)),
            None,
            "{what}: no flow was recorded"
        );
    }
}

#[test]
fn an_icmp_error_quoting_a_malformed_header_is_not_given_to_the_pod() {
    require_root();
    let object = uplink();
    let run = egress(&object, &syn());
    assert_eq!(run.verdict, TC_ACT_OK, "the SYN is translated");
    let translated = run.frame;
    assert_eq!(
        addr(&translated, IP_SRC),
        NODE_ADDR,
        "the SYN left as the node's"
    );
    for (vihl, total, what) in [
        (0x44, None, "a quoted 16-byte header"),
        (0x65, None, "a quoted version 6"),
        (
            0x46,
            Some(20),
            "a quoted header longer than its total length",
        ),
    ] {
        let mut quote = quote(&translated);
        quote[0] = vihl;
        if let Some(total) = total {
            quote[2..4].copy_from_slice(&u16::to_be_bytes(total));
        }
        let error = inbound(ROUTER, NODE_ADDR, 1, &frag_needed(1400, &quote));
        assert_eq!(error[INNER_IP], vihl, "test bug: the quote's place");
        let run = ingress(&object, &error);
        assert_unchanged(&run, &error, what);
    }
}
