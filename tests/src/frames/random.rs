//! Seeded random frames for the pod program, and the reference model that says, from the
//! headers alone, what the datapath must do with each.

use cni_ebpf_common::DropReason;

use super::{
    ARP_END, ARP_HLEN, ARP_HTYPE, ARP_OPER, ARP_PTYPE, ARP_SHA, ARP_SPA, ARP_TPA, ELSEWHERE,
    ETH_P_ARP, ETH_P_IP, ETH_TYPE, GATEWAY, IP, IP_CHECK, IP_DST, IP_END, IP_SRC, IP_TTL, LOOPBACK,
    PEER, PODS, Pod, SENDER, UNKNOWN, internet_checksum,
};

/// The EtherType of an 802.1Q tag.
const ETH_P_8021Q: u16 = 0x8100;
/// Where the Ethernet source address is.
const ETH_SRC: usize = 6;

/// Knuth's MMIX LCG: a fixed seed gives the same frames on every run.
pub struct Lcg(pub u64);

impl Lcg {
    /// The next 31 pseudo-random bits.
    #[expect(
        clippy::should_implement_trait,
        reason = "an endless generator of bits, not an iterator"
    )]
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// True about once in `n` calls.
    pub fn one_in(&mut self, n: u32) -> bool {
        self.next().is_multiple_of(n)
    }

    /// One of `items`, repeated items being likelier.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.next() as usize % items.len()]
    }
}

/// Writes what fits of `bytes` at `at`: random frames may end anywhere.
fn put(frame: &mut [u8], at: usize, bytes: &[u8]) {
    for (slot, byte) in frame.iter_mut().skip(at).zip(bytes) {
        *slot = *byte;
    }
}

/// 14..=128 random bytes with an IPv4, ARP or (now and then) 802.1Q EtherType; most get
/// plausible header fields, most of them the sending pod's own MAC and address, so that
/// every branch of the program is reached, not just the first checks.
pub fn random_frame(rng: &mut Lcg) -> Vec<u8> {
    let len = 14 + rng.next() as usize % 115;
    let mut frame: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    let is_arp = rng.one_in(2);
    let ether_type = if rng.one_in(16) {
        ETH_P_8021Q
    } else if is_arp {
        ETH_P_ARP
    } else {
        ETH_P_IP
    };
    frame[ETH_TYPE..IP].copy_from_slice(&ether_type.to_be_bytes());
    if rng.one_in(4) {
        return frame;
    }
    let mac = rng.pick(&[
        SENDER.info.pod_mac,
        SENDER.info.pod_mac,
        SENDER.info.pod_mac,
        PEER.info.pod_mac,
    ]);
    put(&mut frame, ETH_SRC, &mac);
    let addresses = [SENDER.ip, SENDER.ip, PEER.ip, ELSEWHERE.ip, UNKNOWN, [0; 4]];
    let sources = [
        SENDER.ip, SENDER.ip, SENDER.ip, SENDER.ip, PEER.ip, UNKNOWN, [0; 4],
    ];
    if is_arp {
        put(&mut frame, ARP_HTYPE, &[0, rng.pick(&[1, 1, 1, 6])]);
        put(
            &mut frame,
            ARP_PTYPE,
            &rng.pick(&[[8, 0], [8, 0], [0x86, 0xdd]]),
        );
        put(
            &mut frame,
            ARP_HLEN,
            &[rng.pick(&[6, 6, 6, 8]), rng.pick(&[4, 4, 4, 16])],
        );
        put(&mut frame, ARP_OPER, &[0, rng.pick(&[1, 1, 2, 3])]);
        let sha = if rng.one_in(8) {
            PEER.info.pod_mac
        } else {
            mac
        };
        put(&mut frame, ARP_SHA, &sha);
        put(&mut frame, ARP_SPA, &rng.pick(&sources));
        put(
            &mut frame,
            ARP_TPA,
            &rng.pick(&[GATEWAY, PEER.ip, SENDER.ip]),
        );
    } else {
        let vihl = rng.pick(&[0x45, 0x45, 0x45, 0x46, 0x4f, 0x44, 0x40, 0x65, 0x05]);
        put(&mut frame, IP, &[vihl]);
        put(&mut frame, IP_TTL, &[rng.pick(&[0, 1, 2, 64, 255])]);
        put(&mut frame, IP_SRC, &rng.pick(&sources));
        // Mostly the length the frame holds; now and then one it does not.
        let fits = u16::try_from(frame.len() - IP).expect("a short frame");
        let total = rng.pick(&[fits, fits, fits, fits / 2, fits + 1, 10, 0]);
        put(&mut frame, IP + 2, &total.to_be_bytes());
        let dst = rng.pick(&addresses);
        put(&mut frame, IP_DST, &dst);
        // Half the frames to a pod are sent to its own MAC, as after the ARP responder's
        // answer (the program then switches them unchanged).
        if let Some(pod) = endpoint(&dst).filter(|_| rng.one_in(2)) {
            put(&mut frame, 0, &pod.info.pod_mac);
        }
        if vihl == 0x45 && frame.len() >= IP_END && rng.one_in(2) {
            frame[IP_CHECK..IP_CHECK + 2].fill(0);
            let check = internet_checksum(&frame[IP..IP_END]);
            frame[IP_CHECK..IP_CHECK + 2].copy_from_slice(&check.to_be_bytes());
        }
    }
    frame
}

/// What the datapath must do with a frame from the loopback's pod.
#[derive(Clone, Copy)]
pub enum Outcome {
    /// Handed to the stack unchanged.
    Stack,
    /// Dropped unchanged, counted for this reason.
    Drop(DropReason),
    /// Rewritten and redirected to this pod's veth.
    Forward(&'static Pod),
    /// Already addressed to this pod's MAC: redirected to its veth unchanged.
    Switch(&'static Pod),
    /// Answered with an ARP reply back out of the sender's veth, saying the asked
    /// address is at this MAC.
    ArpReply([u8; 6]),
}

fn endpoint(addr: &[u8]) -> Option<&'static Pod> {
    PODS.into_iter().find(|pod| pod.ip == addr)
}

/// Whether `addr` and `mac` are the sending pod's own: [`SENDER`] is the one endpoint
/// behind [`LOOPBACK`].
fn is_sender(addr: &[u8], mac: &[u8]) -> (bool, bool) {
    let own_addr = endpoint(addr).is_some_and(|pod| pod.info.host_ifindex == LOOPBACK);
    (own_addr, mac == SENDER.info.pod_mac)
}

/// The reference model: the outcome the program must reach for `frame` (14 bytes or more)
/// from [`SENDER`], written from the headers alone.
pub fn expected_outcome(frame: &[u8]) -> Outcome {
    let ether_type = u16::from_be_bytes([frame[ETH_TYPE], frame[ETH_TYPE + 1]]);
    let eth_src = &frame[ETH_SRC..ETH_SRC + 6];
    if ether_type == ETH_P_8021Q {
        Outcome::Drop(DropReason::VlanTagged)
    } else if ether_type == ETH_P_IP {
        if frame.len() < IP_END {
            return Outcome::Drop(DropReason::TruncatedFrame);
        }
        // Version 4, a header of 20 bytes or more within the total length, and a total
        // length the frame holds (0, BIG TCP's, only in frames over 64 KiB).
        let header = usize::from(frame[IP] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([frame[IP + 2], frame[IP + 3]]));
        if frame[IP] >> 4 != 4
            || header < 20
            || total == 0
            || header > total
            || total > frame.len() - IP
        {
            return Outcome::Drop(DropReason::MalformedIpv4);
        }
        match is_sender(&frame[IP_SRC..IP_SRC + 4], eth_src) {
            (false, _) => return Outcome::Drop(DropReason::SpoofedIpv4Source),
            (true, false) => return Outcome::Drop(DropReason::SpoofedMac),
            (true, true) => {}
        }
        match endpoint(&frame[IP_DST..IP_END]) {
            Some(pod) if frame[..6] == pod.info.pod_mac => Outcome::Switch(pod),
            Some(pod) if frame[IP_TTL] > 1 => Outcome::Forward(pod),
            _ => Outcome::Stack,
        }
    } else if ether_type == ETH_P_ARP {
        if frame.len() < ARP_END {
            return Outcome::Drop(DropReason::TruncatedFrame);
        }
        if frame[ARP_HTYPE..ARP_OPER] != [0, 1, 8, 0, 6, 4] {
            return Outcome::Drop(DropReason::MalformedArp);
        }
        let (spa, tpa) = (&frame[ARP_SPA..ARP_SPA + 4], &frame[ARP_TPA..ARP_TPA + 4]);
        let sha = &frame[ARP_SHA..ARP_SHA + 6];
        if sha != eth_src || is_sender(spa, sha) != (true, true) {
            return Outcome::Drop(DropReason::SpoofedArp);
        }
        let request = frame[ARP_OPER..ARP_OPER + 2] == [0, 1];
        if request && spa != tpa {
            let answer = endpoint(tpa).map_or(SENDER.info.host_mac, |target| target.info.pod_mac);
            Outcome::ArpReply(answer)
        } else {
            Outcome::Stack
        }
    } else {
        Outcome::Drop(DropReason::PodEtherType)
    }
}
