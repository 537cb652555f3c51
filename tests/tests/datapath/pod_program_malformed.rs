//! Frames `from_pod` must not trust, run by the kernel through BPF_PROG_TEST_RUN (or, when
//! the kernel refuses them, sent on a real veth): truncated and malformed IPv4 and ARP
//! are dropped and counted per reason, so are other EtherTypes (IPv6 among them), and a
//! seeded batch of random frames gets exactly the verdicts the reference model allows.

use std::{
    collections::HashMap,
    io, mem,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use aya::programs::ProgramError;
use cni_ebpf_common::{DropReason, program_names};
use ebpf_cni_tests::{
    daemon::eventually,
    frames::{
        ARP_END, ARP_HLEN, ARP_HTYPE, ARP_OPER, ARP_PLEN, ARP_PTYPE, BROADCAST, ETH_P_IP,
        ETH_P_IPV6, ETH_TYPE, GATEWAY, IP, IP_END, LOOPBACK, Lcg, Outcome, PEER, PODS, SENDER,
        TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, all_drops, arp_request, assert_dropped,
        assert_forwarded, counters, datapath, ethernet, expected_arp_reply, expected_outcome,
        icmp_echo_request, ipv4, no_drops, random_frame,
    },
    netns::{Netns, run_ok},
    require_root,
    traffic::run_in,
};

// --- Malformed frames ---------------------------------------------------------------------

/// This kernel's BPF_PROG_TEST_RUN refuses IPv4 frames shorter than an IPv4 header
/// (EINVAL) before any program runs, so the program's own length check is reached with
/// real frames: sent raw from a pod namespace into a veth whose host side runs `from_pod`.
#[test]
fn ipv4_frame_shorter_than_an_ip_header_is_dropped_as_truncated_on_a_real_veth() {
    require_root();
    let mut object = datapath();
    let pinned = object.pin_program(program_names::FROM_POD);
    let node = Netns::new("node");
    let pod_ns = Netns::new("pod");
    node.link_veth("h0", "10.0.0.1/24", &pod_ns, "eth0", "10.0.0.10/24");
    // nsenter keeps our mounts (`tc -n` remounts /sys, hiding the pin).
    let tc = |args: &[&str]| run_ok(node.command("tc").args(args));
    tc(&["qdisc", "add", "dev", "h0", "clsact"]);
    let pinned = pinned.to_str().expect("a UTF-8 pin path");
    tc(&[
        "filter",
        "add",
        "dev",
        "h0",
        "ingress",
        "bpf",
        "direct-action",
        "object-pinned",
        pinned,
    ]);

    let full = ipv4(&SENDER, PEER.ip, 64, 1, &[]);
    let frames: Vec<Vec<u8>> = [IP, IP + 1, IP_END - 1]
        .map(|len| full[..len].to_vec())
        .into();
    let sent = frames.len() as u64;
    send_raw(&pod_ns, "eth0", frames);
    assert!(
        eventually(Duration::from_secs(5), || object
            .drops(DropReason::TruncatedFrame)
            == sent),
        "{sent} frames of 14, 15 and 33 bytes must count as truncated drops, counted {:?}",
        all_drops(&object)
    );
    let mut expected = no_drops();
    expected[DropReason::TruncatedFrame as usize] = sent;
    assert_eq!(all_drops(&object), expected, "and nothing else is dropped");
}

/// Sends `frames` as they are from `interface` inside `netns` (an AF_PACKET raw socket).
fn send_raw(netns: &Netns, interface: &'static str, frames: Vec<Vec<u8>>) {
    run_in(netns, move || {
        let ifindex = nix::net::if_::if_nametoindex(interface)
            .unwrap_or_else(|error| panic!("no {interface} in the namespace: {error}"));
        // SAFETY: a plain socket call; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(fd >= 0, "AF_PACKET socket: {}", io::Error::last_os_error());
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data, valid when zeroed.
        let mut to: libc::sockaddr_ll = unsafe { mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = ifindex as i32;
        for frame in frames {
            // SAFETY: the buffer and the address are valid for the lengths passed.
            let sent = unsafe {
                libc::sendto(
                    socket.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&raw const to).cast(),
                    mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            assert_eq!(
                sent,
                frame.len() as isize,
                "sending {frame:02x?}: {}",
                io::Error::last_os_error()
            );
        }
    });
}

#[test]
fn ipv4_with_a_bad_version_or_header_length_is_dropped_as_malformed() {
    require_root();
    let object = datapath();
    let echo = icmp_echo_request();
    // IHL 3, 0 and 4; versions 6, 0 and 15.
    for vihl in [0x43, 0x40, 0x44, 0x65, 0x05, 0xf5] {
        let mut frame = ipv4(&SENDER, PEER.ip, 64, 1, &echo);
        frame[IP] = vihl;
        let what = format!("version/IHL byte {vihl:#04x}");
        assert_dropped(&object, &frame, DropReason::MalformedIpv4, &what);
    }
}

#[test]
fn ipv4_whose_lengths_do_not_fit_is_dropped_as_malformed() {
    require_root();
    let object = datapath();
    let echo = icmp_echo_request();
    let fits = ipv4(&SENDER, PEER.ip, 64, 1, &echo);
    let total = u16::try_from(fits.len() - IP).expect("a short packet");
    for (vihl, total, what) in [
        (0x46, 20, "a 24-byte header in a 20-byte packet"),
        (0x45, total + 1, "a total length one byte beyond the frame"),
        (0x45, 0, "a total length of 0 in a frame of no BIG TCP size"),
    ] {
        let mut frame = fits.clone();
        frame[IP] = vihl;
        frame[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
        assert_dropped(&object, &frame, DropReason::MalformedIpv4, what);
    }
}

#[test]
fn arp_shorter_than_its_header_is_dropped_as_truncated() {
    require_root();
    let object = datapath();
    let request = arp_request(&SENDER, GATEWAY);
    for len in [IP, ARP_OPER, ARP_END - 1] {
        let what = format!("an ARP frame of {len} bytes");
        assert_dropped(&object, &request[..len], DropReason::TruncatedFrame, &what);
    }
}

#[test]
fn arp_that_is_not_ethernet_ipv4_is_dropped_as_malformed() {
    require_root();
    let object = datapath();
    let cases: [(usize, &[u8], &str); 4] = [
        (ARP_HTYPE, &[0, 6], "htype 6 (IEEE 802)"),
        (ARP_PTYPE, &[0x86, 0xdd], "ptype IPv6"),
        (ARP_HLEN, &[8], "hlen 8"),
        (ARP_PLEN, &[16], "plen 16"),
    ];
    for (at, bytes, what) in cases {
        let mut frame = arp_request(&SENDER, GATEWAY);
        frame[at..at + bytes.len()].copy_from_slice(bytes);
        assert_dropped(&object, &frame, DropReason::MalformedArp, what);
    }
}

#[test]
fn ipv6_and_other_ethertypes_are_dropped() {
    require_root();
    let object = datapath();
    let mut ipv6 = ethernet(SENDER.info.host_mac, SENDER.info.pod_mac, ETH_P_IPV6);
    // Version 6, payload 8 bytes of ICMPv6 echo, hop limit 64, fe80::a -> fe80::1.
    ipv6.extend([0x60, 0, 0, 0, 0, 8, 58, 64]);
    ipv6.extend([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a]);
    ipv6.extend([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01]);
    ipv6.extend([128, 0, 0, 0, 0, 1, 0, 1]);
    assert_dropped(
        &object,
        &ipv6,
        DropReason::PodEtherType,
        "an IPv6 echo request",
    );
    let lldp = ethernet(BROADCAST, SENDER.info.pod_mac, 0x88cc);
    assert_dropped(
        &object,
        &lldp,
        DropReason::PodEtherType,
        "a bare 14-byte LLDP header",
    );
    let mut short = ethernet(BROADCAST, SENDER.info.pod_mac, 0x8863);
    short.extend([0x11, 0x09, 0, 0, 0, 0]);
    assert_dropped(
        &object,
        &short,
        DropReason::PodEtherType,
        "a PPPoE discovery frame",
    );
}

// --- Random frames ------------------------------------------------------------------------

/// Recent kernels refuse (EINVAL) to test-run an IPv4 frame shorter than an IPv4 header;
/// that is the kernel's check, not the program's, and only for those frames.
fn kernel_refuses(frame: &[u8], error: &ProgramError) -> bool {
    let ProgramError::SyscallError(error) = error else {
        return false;
    };
    let ether_type = u16::from_be_bytes([frame[ETH_TYPE], frame[ETH_TYPE + 1]]);
    error.io_error.raw_os_error() == Some(libc::EINVAL)
        && ether_type == ETH_P_IP
        && frame.len() < IP_END
}

#[test]
fn random_frames_get_only_the_verdicts_their_headers_allow() {
    require_root();
    let object = datapath();
    let mut rng = Lcg(0x00c0_ffee);
    let mut sent = (0, 0);
    let mut delivered = HashMap::<u32, (u64, usize)>::new();
    let mut drops = no_drops();
    let mut seen = [[0u32; 3]; 2];
    let mut refused = 0;
    for n in 0..3000 {
        let frame = random_frame(&mut rng);
        let context = format!("frame {n} ({} bytes): {frame:02x?}", frame.len());
        let run = match object.try_run(program_names::FROM_POD, &frame) {
            Ok(run) => run,
            Err(error) if kernel_refuses(&frame, &error) => {
                refused += 1;
                continue;
            }
            Err(error) => panic!("BPF_PROG_TEST_RUN failed ({error:?}) on {context}"),
        };
        assert!(
            matches!(run.verdict, TC_ACT_OK | TC_ACT_SHOT | TC_ACT_REDIRECT),
            "verdict {} for {context}",
            run.verdict
        );
        sent = (sent.0 + 1, sent.1 + frame.len());
        let outcome = expected_outcome(&frame);
        let (verdict, to) = match outcome {
            Outcome::Stack => (TC_ACT_OK, None),
            Outcome::Drop(reason) => {
                drops[reason as usize] += 1;
                (TC_ACT_SHOT, None)
            }
            Outcome::Forward(pod) | Outcome::Switch(pod) => {
                (TC_ACT_REDIRECT, Some(pod.info.host_ifindex))
            }
            Outcome::ArpReply(_) => (TC_ACT_REDIRECT, Some(LOOPBACK)),
        };
        assert_eq!(run.verdict, verdict, "{context}");
        match outcome {
            Outcome::Forward(pod) => assert_forwarded(&frame, &run, pod),
            Outcome::ArpReply(answer) => {
                assert_eq!(run.frame, expected_arp_reply(&frame, answer), "{context}")
            }
            Outcome::Stack | Outcome::Drop(_) | Outcome::Switch(_) => {
                assert_eq!(run.frame, frame, "{context}")
            }
        }
        if let Some(ifindex) = to {
            let slot = delivered.entry(ifindex).or_default();
            *slot = (slot.0 + 1, slot.1 + frame.len());
        }
        let is_arp = usize::from(frame[ETH_TYPE + 1] == 0x06);
        let slot = match verdict {
            TC_ACT_OK => 0,
            TC_ACT_SHOT => 1,
            _ => 2,
        };
        seen[is_arp][slot] += 1;
    }
    assert!(
        refused < 3000 / 5,
        "the kernel refused {refused} frames: the batch barely reaches the program"
    );
    assert!(
        seen.iter().flatten().all(|count| *count > 0),
        "the batch must reach every verdict for IPv4 and ARP (ok, shot, redirect): {seen:?}"
    );
    assert_eq!(all_drops(&object), drops, "drops counted per reason");
    for pod in PODS {
        let ifindex = pod.info.host_ifindex;
        let (packets, bytes) = delivered.get(&ifindex).copied().unwrap_or_default();
        let (from_packets, from_bytes) = if ifindex == LOOPBACK { sent } else { (0, 0) };
        assert_eq!(
            object.endpoint_counters(ifindex),
            counters(from_packets, from_bytes, packets, bytes),
            "counters of ifindex {ifindex}"
        );
    }
}
