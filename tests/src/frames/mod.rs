//! Frames for the pod veth programs' BPF_PROG_TEST_RUN tests, Cilium's setup/check way:
//! the seeded endpoints, frames written byte by byte, an independent IPv4 checksum, the
//! checks on verdicts and rewritten frames, and the seeded random frames with the
//! reference model that says what the datapath must do with each.
//!
//! A test run's skb sits on the loopback of the calling thread's namespace (ifindex 1),
//! so the pod that sends is the endpoint whose host veth is ifindex 1; the redirect
//! helpers only return TC_ACT_REDIRECT there, nothing is sent anywhere.

mod random;

pub use random::{Lcg, Outcome, expected_outcome, random_frame};

use cni_ebpf_common::{DropReason, EndpointCounters, EndpointInfo, program_names};

use crate::bpf_object::{BpfObject, Run};

/// Verdict: hand the frame to the stack.
pub const TC_ACT_OK: u32 = 0;
/// Verdict: drop the frame.
pub const TC_ACT_SHOT: u32 = 2;
/// Verdict: the frame was redirected to another device.
pub const TC_ACT_REDIRECT: u32 = 7;

/// The device of every test-run skb: the host veth of the sending pod.
pub const LOOPBACK: u32 = 1;

/// EtherType of IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// EtherType of ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// The Ethernet broadcast address.
pub const BROADCAST: [u8; 6] = [0xff; 6];

// Byte offsets in a frame.
/// Offset of the EtherType.
pub const ETH_TYPE: usize = 12;
/// Offset of the IPv4 header (its version/IHL byte).
pub const IP: usize = 14;
/// Offset of the IPv4 TTL.
pub const IP_TTL: usize = IP + 8;
/// Offset of the IPv4 header checksum.
pub const IP_CHECK: usize = IP + 10;
/// Offset of the IPv4 source address.
pub const IP_SRC: usize = IP + 12;
/// Offset of the IPv4 destination address.
pub const IP_DST: usize = IP + 16;
/// End of an IPv4 header without options.
pub const IP_END: usize = IP + 20;
/// Offset of the ARP hardware type.
pub const ARP_HTYPE: usize = 14;
/// Offset of the ARP protocol type.
pub const ARP_PTYPE: usize = 16;
/// Offset of the ARP hardware address length.
pub const ARP_HLEN: usize = 18;
/// Offset of the ARP protocol address length.
pub const ARP_PLEN: usize = 19;
/// Offset of the ARP operation.
pub const ARP_OPER: usize = 20;
/// Offset of the ARP sender hardware address.
pub const ARP_SHA: usize = 22;
/// Offset of the ARP sender protocol address.
pub const ARP_SPA: usize = 28;
/// Offset of the ARP target hardware address.
pub const ARP_THA: usize = 32;
/// Offset of the ARP target protocol address.
pub const ARP_TPA: usize = 38;
/// End of an Ethernet/IPv4 ARP frame.
pub const ARP_END: usize = 42;

/// The pods' gateway, answered by the ARP responder.
pub const GATEWAY: [u8; 4] = [10, 0, 0, 1];
/// An address in the pod subnet that belongs to no endpoint.
pub const UNKNOWN: [u8; 4] = [10, 0, 0, 99];

/// A pod as the endpoints map knows it: its address and its entry.
pub struct Pod {
    pub ip: [u8; 4],
    pub info: EndpointInfo,
}

/// The pod at `ip` behind host veth `host_ifindex`; `n` makes both MACs unique.
pub const fn pod(ip: [u8; 4], host_ifindex: u32, n: u8) -> Pod {
    Pod {
        ip,
        info: EndpointInfo {
            host_ifindex,
            pod_mac: [0x02, 0, 0, 0, 0, n],
            host_mac: [0x02, 0xee, 0, 0, 0, n],
            flags: 0,
            pad: [0; 2],
        },
    }
}

/// The pod that sends: its host veth is the test run's device.
pub const SENDER: Pod = pod([10, 0, 0, 10], LOOPBACK, 10);
/// Another pod of the node, the destination of forwarded traffic.
pub const PEER: Pod = pod([10, 0, 0, 20], 20, 20);
/// A pod behind another veth, whose address the sender must not be able to use.
pub const ELSEWHERE: Pod = pod([10, 0, 0, 30], 30, 30);
/// Every pod [`datapath`] seeds.
pub const PODS: [&Pod; 3] = [&SENDER, &PEER, &ELSEWHERE];

/// Fresh maps with the three pods, and the pod program loaded.
pub fn datapath() -> BpfObject {
    let mut object = BpfObject::load("pod", &[program_names::FROM_POD]);
    for pod in PODS {
        object.insert_endpoint(pod.ip, pod.info);
    }
    object
}

/// Runs `from_pod` once on `frame`, as sent by [`SENDER`].
pub fn from_pod(object: &BpfObject, frame: &[u8]) -> Run {
    object.run(program_names::FROM_POD, frame)
}

/// The drop counters, one per [`DropReason`] in its order.
pub fn all_drops(object: &BpfObject) -> Vec<u64> {
    DropReason::ALL.map(|reason| object.drops(reason)).to_vec()
}

/// What [`all_drops`] shows when nothing was dropped.
pub fn no_drops() -> Vec<u64> {
    vec![0; DropReason::ALL.len()]
}

/// The counters an endpoint must show, with byte counts as frame lengths add them up.
pub fn counters(
    packets: u64,
    bytes: usize,
    to_pod_packets: u64,
    to_pod_bytes: usize,
) -> EndpointCounters {
    EndpointCounters {
        from_pod_packets: packets,
        from_pod_bytes: bytes as u64,
        to_pod_packets,
        to_pod_bytes: to_pod_bytes as u64,
    }
}

// --- Frames, written byte by byte -------------------------------------------------------

/// RFC 1071 checksum: zero over a block that carries a valid checksum. Written here,
/// independently of the program, to check the checksum the program updates.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The reference checksum against a published header (192.168.0.1 -> 192.168.0.199,
/// checksum 0xb861), so that a broken reference cannot agree with a broken program.
pub fn assert_reference_checksum_is_right() {
    let mut header = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(internet_checksum(&header), 0, "a valid header sums to zero");
    header[10..12].fill(0);
    assert_eq!(internet_checksum(&header), 0xb861, "the known checksum");
}

/// Whether `frame` holds a whole IPv4 header (as long as its IHL says) with a valid
/// checksum.
pub fn ipv4_header_is_valid(frame: &[u8]) -> bool {
    let len = usize::from(frame[IP] & 0x0f) * 4;
    frame.len() >= IP + len && internet_checksum(&frame[IP..IP + len]) == 0
}

/// A bare Ethernet header.
pub fn ethernet(dst: [u8; 6], src: [u8; 6], ether_type: u16) -> Vec<u8> {
    [&dst[..], &src[..], &ether_type.to_be_bytes()].concat()
}

/// A broadcast Ethernet/IPv4 ARP frame of operation `oper` (1 request, 2 reply), with an
/// empty target hardware address.
pub fn arp(oper: u16, sha: [u8; 6], spa: [u8; 4], tpa: [u8; 4]) -> Vec<u8> {
    let mut frame = ethernet(BROADCAST, sha, ETH_P_ARP);
    frame.extend([0, 1, 0x08, 0x00, 6, 4]);
    frame.extend(oper.to_be_bytes());
    frame.extend(sha);
    frame.extend(spa);
    frame.extend([0; 6]);
    frame.extend(tpa);
    frame
}

/// `who-has target tell sender`, from the sender's pod interface.
pub fn arp_request(sender: &Pod, target: [u8; 4]) -> Vec<u8> {
    arp(1, sender.info.pod_mac, sender.ip, target)
}

/// The same packet as [`ipv4`], sent by a pod straight to `to`'s MAC, as it does for an
/// address of its subnet once the ARP responder told it that pod's MAC.
pub fn ipv4_on_link(from: &Pod, to: &Pod, ttl: u8, proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = ipv4(from, to.ip, ttl, proto, payload);
    frame[..6].copy_from_slice(&to.info.pod_mac);
    frame
}

/// An IPv4 packet the sender's pod routes through its gateway (the host veth's MAC).
pub fn ipv4(from: &Pod, dst: [u8; 4], ttl: u8, proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = ethernet(from.info.host_mac, from.info.pod_mac, ETH_P_IP);
    let total = u16::try_from(20 + payload.len()).expect("a small packet");
    frame.extend([0x45, 0]);
    frame.extend(total.to_be_bytes());
    // Identification, then Don't Fragment.
    frame.extend([0x1c, 0x46, 0x40, 0x00]);
    frame.extend([ttl, proto, 0, 0]);
    frame.extend(from.ip);
    frame.extend(dst);
    let check = internet_checksum(&frame[IP..IP_END]);
    frame[IP_CHECK..IP_CHECK + 2].copy_from_slice(&check.to_be_bytes());
    frame.extend(payload);
    frame
}

/// An ICMP echo request with a valid checksum: a payload for [`ipv4`], protocol 1.
pub fn icmp_echo_request() -> Vec<u8> {
    let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
    icmp.extend((0u8..32).map(|i| b'a' + i % 26));
    let check = internet_checksum(&icmp);
    icmp[2..4].copy_from_slice(&check.to_be_bytes());
    icmp
}

/// A TCP SYN to port 80 with a valid checksum for `src -> dst`: a payload for [`ipv4`],
/// protocol 6.
pub fn tcp_syn(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut tcp = vec![
        0x9c, 0x40, 0, 80, 1, 2, 3, 4, 0, 0, 0, 0, 0x50, 0x02, 0xfa, 0xf0,
    ];
    tcp.extend([0, 0, 0, 0]);
    let pseudo = [&src[..], &dst[..], &[0, 6, 0, 20], &tcp].concat();
    let check = internet_checksum(&pseudo);
    tcp[16..18].copy_from_slice(&check.to_be_bytes());
    tcp
}

// --- Checks -------------------------------------------------------------------------------

/// `from_pod` hands `frame` to the stack as it is.
pub fn assert_passes_unchanged(object: &BpfObject, frame: &[u8], what: &str) {
    let run = from_pod(object, frame);
    assert_eq!(run.verdict, TC_ACT_OK, "{what}: the stack must get it");
    assert_eq!(
        run.frame, frame,
        "{what}: a frame for the stack must stay untouched"
    );
}

/// `from_pod` drops `frame` untouched, counting exactly one drop, for `reason`.
pub fn assert_dropped(object: &BpfObject, frame: &[u8], reason: DropReason, what: &str) {
    let mut expected = all_drops(object);
    expected[reason as usize] += 1;
    let run = from_pod(object, frame);
    assert_eq!(run.verdict, TC_ACT_SHOT, "{what}: must be dropped");
    assert_eq!(run.frame, frame, "{what}: a dropped frame is not rewritten");
    assert_eq!(
        all_drops(object),
        expected,
        "{what}: exactly one drop counted as {}",
        reason.name()
    );
}

/// The reply the responder must build from `request`: sent back to its source, from the
/// host veth's MAC, claiming the requested address for that MAC.
pub fn expected_arp_reply(request: &[u8], host_mac: [u8; 6]) -> Vec<u8> {
    let mut reply = request.to_vec();
    reply[..6].copy_from_slice(&request[6..12]);
    reply[6..12].copy_from_slice(&host_mac);
    reply[ARP_OPER..ARP_OPER + 2].copy_from_slice(&2u16.to_be_bytes());
    reply[ARP_SHA..ARP_SHA + 6].copy_from_slice(&host_mac);
    reply[ARP_SPA..ARP_SPA + 4].copy_from_slice(&request[ARP_TPA..ARP_TPA + 4]);
    reply[ARP_THA..ARP_THA + 6].copy_from_slice(&request[ARP_SHA..ARP_SHA + 6]);
    reply[ARP_TPA..ARP_TPA + 4].copy_from_slice(&request[ARP_SPA..ARP_SPA + 4]);
    reply
}

/// The sender's request for `target` came back as a reply, out of the sender's host
/// veth, saying `target` is at `answer`.
pub fn assert_arp_reply(run: &Run, request: &[u8], target: [u8; 4], answer: [u8; 6]) {
    let host_mac = answer;
    assert_eq!(
        run.verdict, TC_ACT_REDIRECT,
        "the reply goes back out of the veth"
    );
    assert_eq!(
        run.frame.len(),
        request.len(),
        "the reply keeps the frame length"
    );
    assert_eq!(
        run.frame[..6],
        SENDER.info.pod_mac,
        "eth dst: the asking pod"
    );
    assert_eq!(run.frame[6..12], host_mac, "eth src: the answered MAC");
    assert_eq!(run.frame[ARP_OPER..ARP_OPER + 2], [0, 2], "oper: reply");
    assert_eq!(
        run.frame[ARP_SHA..ARP_SHA + 6],
        host_mac,
        "sha: the answered MAC"
    );
    assert_eq!(
        run.frame[ARP_SPA..ARP_SPA + 4],
        target,
        "spa: the asked address"
    );
    assert_eq!(
        run.frame[ARP_THA..ARP_THA + 6],
        SENDER.info.pod_mac,
        "tha: the pod"
    );
    assert_eq!(
        run.frame[ARP_TPA..ARP_TPA + 4],
        SENDER.ip,
        "tpa: the pod's address"
    );
    assert_eq!(
        run.frame,
        expected_arp_reply(request, host_mac),
        "nothing else in the frame changes"
    );
}

/// `input` was handed to `to`'s veth: MACs rewritten, TTL down by one, header checksum
/// still valid if it was, every other byte as it was.
pub fn assert_forwarded(input: &[u8], run: &Run, to: &Pod) {
    assert_eq!(
        run.verdict, TC_ACT_REDIRECT,
        "redirected to the destination pod"
    );
    assert_eq!(run.frame.len(), input.len(), "the frame keeps its length");
    assert_eq!(
        run.frame[..6],
        to.info.pod_mac,
        "eth dst: the destination pod"
    );
    assert_eq!(run.frame[6..12], to.info.host_mac, "eth src: its host veth");
    assert_eq!(run.frame[IP_TTL], input[IP_TTL] - 1, "TTL decremented once");
    if ipv4_header_is_valid(input) {
        assert!(
            ipv4_header_is_valid(&run.frame),
            "the IPv4 header checksum is broken after the TTL update: {:02x?}",
            &run.frame[IP..IP_END]
        );
    }
    let mut expected = input.to_vec();
    expected[..6].copy_from_slice(&to.info.pod_mac);
    expected[6..12].copy_from_slice(&to.info.host_mac);
    expected[IP_TTL] -= 1;
    expected[IP_CHECK..IP_CHECK + 2].copy_from_slice(&run.frame[IP_CHECK..IP_CHECK + 2]);
    assert_eq!(run.frame, expected, "nothing else in the frame changes");
}
