//! Frames for the uplink programs' (source NAT) BPF_PROG_TEST_RUN tests, Cilium's
//! setup/check way: a node with masqueraded and plain pods and its NAT configuration;
//! TCP, UDP and ICMP frames written byte by byte, whose L4 checksums (pseudo header
//! included) are computed here, independently of the program; the checks on translated
//! and delivered frames.
//!
//! A test run's skb sits on the loopback (ifindex 1), which plays the uplink; the pods'
//! host veths are other ifindexes, only used as `bpf_redirect_peer` targets (the helper
//! returns TC_ACT_REDIRECT in a test run, nothing is sent).

use std::time::Duration;

use cni_ebpf_common::{NatConfig, NatEntry, NatKey, NatReverseKey, endpoint_flags, program_names};
use nix::time::{ClockId, clock_gettime};

use crate::{
    bpf_object::{BpfObject, Run},
    frames::{
        ETH_P_IP, IP, IP_CHECK, IP_DST, IP_END, IP_TTL, LOOPBACK, Pod, TC_ACT_OK, TC_ACT_REDIRECT,
        ethernet, internet_checksum, ipv4_header_is_valid, pod,
    },
};

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
/// Ports and a checksum over a pseudo header where UDP has them.
pub const DCCP: u8 = 33;
pub const UDPLITE: u8 = 136;
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;
pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_ECHO_REQUEST: u8 = 8;

// Byte offsets in a frame whose IPv4 header has no options.
/// Offset of the IPv4 flags and fragment offset.
pub const IP_FRAG: usize = IP + 6;
pub const IP_SRC: usize = IP + 12;
/// Offset of the TCP/UDP source port.
pub const SPORT: usize = IP_END;
pub const UDP_CHECK: usize = IP_END + 6;
/// Offset of the ICMP echo identifier.
pub const ICMP_ID: usize = IP_END + 4;
/// Offset of the IPv4 header an ICMP error quotes.
pub const INNER_IP: usize = IP_END + 8;
pub const INNER_SRC: usize = INNER_IP + 12;
/// Offset of the quoted TCP/UDP source port.
pub const INNER_SPORT: usize = INNER_IP + 20;
/// Offset of the quoted ICMP echo identifier.
pub const INNER_ICMP_ID: usize = INNER_IP + 24;

/// The node's address on its uplink: the source of translated packets.
pub const NODE_ADDR: [u8; 4] = [198, 18, 0, 1];
/// A server outside the cluster.
pub const REMOTE: [u8; 4] = [198, 18, 7, 80];
/// A router on the path, which sends ICMP errors.
pub const ROUTER: [u8; 4] = [198, 18, 0, 254];
/// The cluster's pod range: destinations inside keep the pod's address.
pub const CLUSTER: [u8; 4] = [10, 244, 0, 0];
pub const CLUSTER_PREFIX: u32 = 16;
/// A pod of another node, inside the cluster range.
pub const OTHER_NODE_POD: [u8; 4] = [10, 244, 9, 7];
/// The uplink's MAC: the loopback's, which a test run's skb sits on. The kernel marks a
/// frame to any other unicast MAC as for another host (`PACKET_OTHERHOST`), which the
/// uplink's ingress program never translates nor delivers.
pub const UPLINK_MAC: [u8; 6] = [0; 6];
pub const NEXT_HOP_MAC: [u8; 6] = [0x02, 0xbb, 0, 0, 0, 1];

pub const PORT_MIN: u16 = 40000;
pub const PORT_MAX: u16 = 40999;
/// The pods' source port (outside the node port range, so a translation shows).
pub const POD_PORT: u16 = 33000;
pub const REMOTE_PORT: u16 = 443;
pub const ECHO_ID: u16 = 0x1234;
/// Timeouts of [`nat_config`], in seconds.
pub const TCP_ESTABLISHED_SECS: u32 = 300;
pub const TCP_TRANSITORY_SECS: u32 = 60;

const fn masqueraded(mut pod: Pod) -> Pod {
    pod.info.flags = endpoint_flags::MASQUERADE;
    pod
}

/// A pod whose traffic leaving the cluster is source-NATed.
pub const MASQ: Pod = masqueraded(pod([10, 244, 0, 10], 21, 21));
/// Another one.
pub const MASQ_2: Pod = masqueraded(pod([10, 244, 0, 11], 22, 22));
/// A pod without the MASQUERADE flag.
pub const PLAIN: Pod = pod([10, 244, 0, 12], 23, 23);

/// NAT enabled on the loopback as the uplink, ports [`PORT_MIN`]..=[`PORT_MAX`].
pub const fn nat_config() -> NatConfig {
    NatConfig {
        node_addr: NODE_ADDR,
        port_min: PORT_MIN,
        port_max: PORT_MAX,
        tcp_established_secs: TCP_ESTABLISHED_SECS,
        tcp_transitory_secs: TCP_TRANSITORY_SECS,
        udp_secs: 30,
        icmp_secs: 30,
        uplink_ifindex: LOOPBACK,
        tcp_closed_secs: 10,
        udp_stream_secs: 120,
        pod_flow_budget: 0,
        dest_port_budget: 0,
    }
}

/// Fresh maps with the three pods, the cluster range and [`nat_config`]; both uplink
/// programs loaded.
pub fn uplink() -> BpfObject {
    uplink_with(nat_config())
}

/// Like [`uplink`], with `config`.
pub fn uplink_with(config: NatConfig) -> BpfObject {
    uplink_sized(config, None)
}

/// Like [`uplink_with`], with flow tables of `max_flows` entries when given.
pub fn uplink_sized(config: NatConfig, max_flows: Option<u32>) -> BpfObject {
    let mut object = BpfObject::load_sized(
        "nat",
        &[program_names::UPLINK_EGRESS, program_names::UPLINK_INGRESS],
        max_flows,
    );
    for pod in [&MASQ, &MASQ_2, &PLAIN] {
        object.insert_endpoint(pod.ip, pod.info);
    }
    object.set_nat_config(config);
    object.insert_cluster_cidr(CLUSTER, CLUSTER_PREFIX);
    object
}

/// Runs `uplink_egress` once on `frame`.
pub fn egress(object: &BpfObject, frame: &[u8]) -> Run {
    object.run(program_names::UPLINK_EGRESS, frame)
}

/// Runs `uplink_ingress` once on `frame`.
pub fn ingress(object: &BpfObject, frame: &[u8]) -> Run {
    object.run(program_names::UPLINK_INGRESS, frame)
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of the NAT tables' timestamps.
pub fn monotonic_ns() -> u64 {
    nanos(ClockId::CLOCK_MONOTONIC)
}

/// CLOCK_MONOTONIC as of the last tick (CLOCK_MONOTONIC_COARSE), what the datapath's
/// `bpf_ktime_get_coarse_ns` stamps entries with.
pub fn monotonic_coarse_ns() -> u64 {
    nanos(ClockId::CLOCK_MONOTONIC_COARSE)
}

/// [`monotonic_coarse_ns`] as it was `ago`: a timestamp for an entry made to look that
/// old. On a machine up for less than that (a guest just booted, `cargo xtask
/// vm-test`), waits until the clock has reached it, since there is no earlier time.
pub fn coarse_ns_ago(ago: Duration) -> u64 {
    let ago = u64::try_from(ago.as_nanos()).expect("an age within u64 nanoseconds");
    let now = monotonic_coarse_ns();
    if let Some(short) = (ago + 1_000_000_000).checked_sub(now) {
        std::thread::sleep(Duration::from_nanos(short));
    }
    monotonic_coarse_ns() - ago
}

fn nanos(clock: ClockId) -> u64 {
    let now = clock_gettime(clock).unwrap_or_else(|error| panic!("{clock}: {error}"));
    u64::try_from(now.tv_sec()).expect("a positive clock") * 1_000_000_000
        + u64::try_from(now.tv_nsec()).expect("a positive clock")
}

// --- Map keys and entries -----------------------------------------------------------------

/// The `NAT_OUT` key of `pod:pod_port` -> [`REMOTE`]`:remote_port` over `proto`.
pub fn out_key(pod_addr: [u8; 4], pod_port: u16, remote_port: u16, proto: u8) -> NatKey {
    let remote_addr = REMOTE;
    let pad = [0; 3];
    NatKey {
        pod_addr,
        remote_addr,
        pod_port,
        remote_port,
        proto,
        pad,
    }
}

/// The `NAT_IN` key of replies from `remote_addr:remote_port` to `node_port`.
pub fn in_key(remote_addr: [u8; 4], node_port: u16, remote_port: u16, proto: u8) -> NatReverseKey {
    let pad = [0; 3];
    NatReverseKey {
        remote_addr,
        node_port,
        remote_port,
        proto,
        pad,
    }
}

/// The entry of `key`'s flow translated to [`NODE_ADDR`] and `node_port`.
pub fn entry(key: &NatKey, node_port: u16, state: u8, last_seen_ns: u64) -> NatEntry {
    NatEntry::translated(key, (NODE_ADDR, node_port), state, last_seen_ns)
}

// --- Checksums, computed here ---------------------------------------------------------------

/// The RFC 1071 sum of a TCP or UDP `segment` (checksum field as it is) behind the IPv4
/// pseudo header: zero when the segment carries a valid checksum, the checksum to write
/// when its field is zero.
pub fn pseudo_header_checksum(src: [u8; 4], dst: [u8; 4], proto: u8, segment: &[u8]) -> u16 {
    let len = u16::try_from(segment.len()).expect("a small segment");
    let mut pseudo = [src, dst].concat();
    pseudo.extend([0, proto]);
    pseudo.extend(len.to_be_bytes());
    pseudo.extend(segment);
    internet_checksum(&pseudo)
}

/// Where the L4 checksum of a frame of `proto` sits, for TCP, UDP and ICMP.
fn checksum_at(proto: u8) -> Option<usize> {
    match proto {
        TCP => Some(IP_END + 16),
        UDP | DCCP | UDPLITE => Some(UDP_CHECK),
        ICMP => Some(IP_END + 2),
        _ => None,
    }
}

/// Recomputes the IPv4 header checksum of `frame`, over the header length its IHL gives.
fn set_ip_checksum(frame: &mut [u8]) {
    let end = IP + usize::from(frame[IP] & 0x0f) * 4;
    frame[IP_CHECK..IP_CHECK + 2].fill(0);
    let check = internet_checksum(&frame[IP..end]);
    frame[IP_CHECK..IP_CHECK + 2].copy_from_slice(&check.to_be_bytes());
}

/// Computes every checksum of `frame` (IPv4 header without options): the header's, and
/// the TCP, UDP (0 sent as 0xffff), DCCP, UDP-Lite (both over the whole packet) or ICMP
/// one; another protocol's bytes stay as given.
fn set_checksums(frame: &mut [u8]) {
    set_ip_checksum(frame);
    let proto = frame[IP + 9];
    let Some(at) = checksum_at(proto) else {
        return;
    };
    frame[at..at + 2].fill(0);
    let (src, dst) = (addr(frame, IP_SRC), addr(frame, IP_DST));
    let check = match proto {
        ICMP => internet_checksum(&frame[IP_END..]),
        _ => match pseudo_header_checksum(src, dst, proto, &frame[IP_END..]) {
            0 if proto == UDP => 0xffff,
            check => check,
        },
    };
    frame[at..at + 2].copy_from_slice(&check.to_be_bytes());
}

/// Every checksum of `frame` verifies: IPv4 header, TCP/UDP over the pseudo header (a
/// UDP checksum of 0, "none", fails here), ICMP, and the IPv4 header an ICMP error
/// quotes.
pub fn assert_checksums_valid(frame: &[u8], what: &str) {
    let header = &frame[IP..IP_END];
    assert!(
        ipv4_header_is_valid(frame),
        "{what}: IPv4 header checksum broken: {header:02x?}"
    );
    let (proto, segment) = (frame[IP + 9], &frame[IP_END..]);
    let sum = match proto {
        TCP | UDP | DCCP | UDPLITE => {
            let at = checksum_at(proto).expect("they have one");
            assert_ne!(port(frame, at), 0, "{what}: no L4 checksum");
            pseudo_header_checksum(addr(frame, IP_SRC), addr(frame, IP_DST), proto, segment)
        }
        ICMP => internet_checksum(segment),
        _ => panic!("{what}: no checksum to check for protocol {proto}"),
    };
    assert_eq!(
        sum, 0,
        "{what}: protocol {proto} checksum broken: {segment:02x?}"
    );
    if proto == ICMP && matches!(segment[0], 3 | 11 | 12) {
        let inner = &frame[INNER_IP..INNER_IP + 20];
        let sum = internet_checksum(inner);
        assert_eq!(
            sum, 0,
            "{what}: quoted IPv4 header checksum broken: {inner:02x?}"
        );
    }
}

// --- Frames -------------------------------------------------------------------------------

/// The sequence number of [`tcp`]'s segments, both ways.
pub const TCP_SEQ: u32 = 0x0102_0304;

/// A TCP header (no options, no payload) with `flags`; the frame builders fill its
/// checksum.
pub fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    // Both sides at the same sequence number: each acknowledges the other's.
    let ack: u32 = if flags & TCP_ACK != 0 { TCP_SEQ + 1 } else { 0 };
    let mut tcp = [sport.to_be_bytes(), dport.to_be_bytes()].concat();
    tcp.extend(TCP_SEQ.to_be_bytes());
    tcp.extend(ack.to_be_bytes());
    tcp.extend([0x50, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
    tcp
}

/// A TCP header (no options, no payload) with `flags`, sequence number `seq` and
/// acknowledgement number `ack`.
pub fn tcp_at(sport: u16, dport: u16, flags: u8, seq: u32, ack: u32) -> Vec<u8> {
    let mut tcp = [sport.to_be_bytes(), dport.to_be_bytes()].concat();
    tcp.extend(seq.to_be_bytes());
    tcp.extend(ack.to_be_bytes());
    tcp.extend([0x50, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
    tcp
}

/// A UDP header and `payload`.
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).expect("a small datagram");
    let mut udp = [sport.to_be_bytes(), dport.to_be_bytes(), len.to_be_bytes()].concat();
    udp.extend([0, 0]);
    udp.extend(payload);
    udp
}

/// An ICMP echo request or reply (`kind`) with identifier `id`, sequence 1, 32 bytes of
/// data.
pub fn icmp_echo(kind: u8, id: u16) -> Vec<u8> {
    let mut icmp = vec![kind, 0, 0, 0];
    icmp.extend(id.to_be_bytes());
    icmp.extend([0, 1]);
    icmp.extend((0u8..32).map(|i| b'a' + i % 26));
    icmp
}

/// ICMP destination unreachable, fragmentation needed (type 3 code 4) with the next
/// hop's `mtu`, quoting `quoted`.
pub fn frag_needed(mtu: u16, quoted: &[u8]) -> Vec<u8> {
    let mut icmp = vec![3, 4, 0, 0, 0, 0];
    icmp.extend(mtu.to_be_bytes());
    icmp.extend(quoted);
    icmp
}

/// ICMP time exceeded in transit (type 11 code 0), quoting `quoted`.
pub fn time_exceeded(quoted: &[u8]) -> Vec<u8> {
    [&[11, 0, 0, 0, 0, 0, 0, 0][..], quoted].concat()
}

/// What routers quote of a packet in an ICMP error: its IPv4 header and 8 bytes more.
pub fn quote(frame: &[u8]) -> Vec<u8> {
    frame[IP..IP_END + 8].to_vec()
}

fn ipv4(
    macs: ([u8; 6], [u8; 6]),
    ttl: u8,
    ends: ([u8; 4], [u8; 4]),
    proto: u8,
    l4: &[u8],
) -> Vec<u8> {
    let mut frame = ethernet(macs.0, macs.1, ETH_P_IP);
    let total = u16::try_from(20 + l4.len()).expect("a small packet");
    frame.extend([0x45, 0]);
    frame.extend(total.to_be_bytes());
    // Identification, then Don't Fragment.
    frame.extend([0x1c, 0x46, 0x40, 0x00, ttl, proto, 0, 0]);
    frame.extend(ends.0);
    frame.extend(ends.1);
    frame.extend(l4);
    set_checksums(&mut frame);
    frame
}

/// A packet leaving by the uplink (already routed by the node), every checksum valid.
pub fn outbound(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    ipv4((NEXT_HOP_MAC, UPLINK_MAC), 64, (src, dst), proto, l4)
}

/// A packet arriving on the uplink, every checksum valid.
pub fn inbound(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    ipv4((UPLINK_MAC, NEXT_HOP_MAC), 60, (src, dst), proto, l4)
}

/// `frame` (UDP) with its checksum 0: "none".
pub fn without_udp_checksum(mut frame: Vec<u8>) -> Vec<u8> {
    frame[UDP_CHECK..UDP_CHECK + 2].fill(0);
    frame
}

/// `frame` with its flags and fragment offset field set to `frag`.
pub fn with_frag_field(mut frame: Vec<u8>, frag: u16) -> Vec<u8> {
    frame[IP_FRAG..IP_FRAG + 2].copy_from_slice(&frag.to_be_bytes());
    set_ip_checksum(&mut frame);
    frame
}

/// `frame` with the IPv4 identification `id`.
pub fn with_ip_id(mut frame: Vec<u8>, id: u16) -> Vec<u8> {
    frame[IP + 4..IP + 6].copy_from_slice(&id.to_be_bytes());
    set_ip_checksum(&mut frame);
    frame
}

/// `frame` with the IPv4 addresses `src` and `dst` and its header checksum recomputed,
/// nothing else changed: what a fragment after the first (no L4 header) becomes when
/// translated.
pub fn with_addrs(mut frame: Vec<u8>, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    frame[IP_SRC..IP_SRC + 4].copy_from_slice(&src);
    frame[IP_DST..IP_DST + 4].copy_from_slice(&dst);
    set_ip_checksum(&mut frame);
    frame
}

/// The options [`with_ip_options`] puts in an IPv4 header: three NOPs, end of list.
pub const IP_OPTIONS: [u8; 4] = [1, 1, 1, 0];

/// `frame` (IPv4 header without options) with [`IP_OPTIONS`] in its header: IHL 6,
/// total length and header checksum to match (the L4 checksum does not cover them).
pub fn with_ip_options(frame: &[u8]) -> Vec<u8> {
    let mut out = frame[..IP_END].to_vec();
    out.extend(IP_OPTIONS);
    out.extend(&frame[IP_END..]);
    out[IP] = 0x46;
    resize_ip_header(&mut out, 4);
    out
}

/// `frame`, whose IPv4 header must carry [`IP_OPTIONS`] unchanged and a checksum that
/// verifies over them, with the options taken out again (as [`with_ip_options`] found
/// it), so it compares with frames built here.
pub fn without_ip_options(frame: &[u8], what: &str) -> Vec<u8> {
    let header = &frame[IP..IP_END + 4];
    assert_eq!(header[0], 0x46, "{what}: IHL 6 kept: {header:02x?}");
    assert_eq!(
        internet_checksum(header),
        0,
        "{what}: IPv4 header checksum (options included) broken: {header:02x?}"
    );
    assert_eq!(header[20..], IP_OPTIONS, "{what}: options kept");
    let mut out = frame[..IP_END].to_vec();
    out.extend(&frame[IP_END + 4..]);
    out[IP] = 0x45;
    resize_ip_header(&mut out, -4);
    out
}

/// Adds `by` bytes to the IPv4 total length of `frame` and recomputes its header
/// checksum.
fn resize_ip_header(frame: &mut [u8], by: i32) {
    let total = i32::from(u16::from_be_bytes([frame[IP + 2], frame[IP + 3]])) + by;
    let total = u16::try_from(total).expect("a small packet");
    frame[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
    set_ip_checksum(frame);
}

/// `frame` as delivery into `pod` must leave it: MACs of the pod's veth pair, TTL one
/// less, IPv4 header checksum recomputed.
pub fn delivered(frame: &[u8], pod: &Pod) -> Vec<u8> {
    let mut frame = frame.to_vec();
    frame[..6].copy_from_slice(&pod.info.pod_mac);
    frame[6..12].copy_from_slice(&pod.info.host_mac);
    frame[IP_TTL] -= 1;
    set_ip_checksum(&mut frame);
    frame
}

pub fn addr(frame: &[u8], at: usize) -> [u8; 4] {
    frame[at..at + 4].try_into().expect("four bytes")
}

pub fn port(frame: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([frame[at], frame[at + 1]])
}

// --- Checks -------------------------------------------------------------------------------

/// The run handed `frame` on as it was.
pub fn assert_unchanged(run: &Run, frame: &[u8], what: &str) {
    assert_eq!(run.verdict, TC_ACT_OK, "{what}: the stack must get it");
    assert_eq!(run.frame, frame, "{what}: must stay untouched");
}

/// The run redirected `expected` (the frame as the pod must see it before delivery)
/// into `pod`, with every checksum valid.
pub fn assert_delivered(run: &Run, expected: &[u8], pod: &Pod, what: &str) {
    assert_eq!(
        run.verdict, TC_ACT_REDIRECT,
        "{what}: redirected into the pod"
    );
    assert_checksums_valid(&run.frame, what);
    assert_eq!(
        run.frame,
        delivered(expected, pod),
        "{what}: the frame the pod gets"
    );
}
