//! When a translated flow has been idle long enough to forget (pure decisions).
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, the clock `bpf_ktime_get_coarse_ns` reads (as
//! of the last tick, a few milliseconds behind at most).

use cni_ebpf_common::{NatEntry, tcp_state, udp_state};

use super::args::Timeouts;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The idle timeout of a flow of `proto` in TCP `state` (ignored for other protocols).
/// A TCP flow in no known state counts as transitory; other protocols than TCP, UDP and
/// ICMP (SCTP, and those translated by address alone: GRE, ESP...) get the UDP ones, as
/// in the datapath's `nat_maps::expired`: the stream timeout once they had a reply.
pub fn timeout_secs(proto: u8, state: u8, timeouts: &Timeouts) -> u32 {
    match (proto, state) {
        (IPPROTO_TCP, tcp_state::ESTABLISHED) => timeouts.tcp_established,
        (IPPROTO_TCP, tcp_state::CLOSED) => timeouts.tcp_closed,
        (IPPROTO_TCP, tcp_state::POD_CLOSED) => timeouts.tcp_closed.min(tcp_state::POD_CLOSED_SECS),
        (IPPROTO_TCP, _) => timeouts.tcp_transitory,
        (IPPROTO_ICMP, _) => timeouts.icmp,
        (_, udp_state::REPLIED) => timeouts.udp_stream,
        _ => timeouts.udp,
    }
}

/// Nanoseconds since `last_seen_ns` (0 when the datapath saw a packet after `now_ns` was read).
pub fn idle_ns(last_seen_ns: u64, now_ns: u64) -> u64 {
    now_ns.saturating_sub(last_seen_ns)
}

/// Whether `entry`, a flow of `proto`, has been idle for longer than its timeout.
pub fn is_expired(entry: &NatEntry, proto: u8, now_ns: u64, timeouts: &Timeouts) -> bool {
    let timeout_ns = u64::from(timeout_secs(proto, entry.state, timeouts)) * NANOS_PER_SEC;
    idle_ns(entry.last_seen_ns, now_ns) > timeout_ns
}

/// Seconds left before `entry` expires; 0 once it has (until the sweeper removes it).
pub fn expires_in_secs(entry: &NatEntry, proto: u8, now_ns: u64, timeouts: &Timeouts) -> u64 {
    let timeout = u64::from(timeout_secs(proto, entry.state, timeouts));
    timeout.saturating_sub(idle_ns(entry.last_seen_ns, now_ns) / NANOS_PER_SEC)
}

/// The entry that speaks for a flow: of its two entries (`NAT_OUT`'s and, when present,
/// `NAT_IN`'s), the one that saw the latest packet, with the TCP state it saw then.
pub fn latest<'a>(out: &'a NatEntry, inbound: Option<&'a NatEntry>) -> &'a NatEntry {
    match inbound {
        Some(inbound) if inbound.last_seen_ns > out.last_seen_ns => inbound,
        _ => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        tcp_established: 3600,
        tcp_transitory: 120,
        tcp_closed: 10,
        udp: 30,
        udp_stream: 120,
        icmp: 20,
    };
    const SEC: u64 = NANOS_PER_SEC;
    /// A monotonic "now" far from zero, as on a machine that has been up a while.
    const NOW: u64 = 100_000 * SEC;

    fn entry(idle_secs: u64, state: u8) -> NatEntry {
        NatEntry {
            last_seen_ns: NOW - idle_secs * SEC,
            pod_addr: [10, 244, 1, 2],
            pod_port: 40000,
            node_port: 61000,
            state,
            pad: [0; 3],
            node_addr: [198, 18, 0, 1],
        }
    }

    #[test]
    fn each_proto_and_tcp_state_has_its_timeout() {
        assert_eq!(
            timeout_secs(IPPROTO_TCP, tcp_state::ESTABLISHED, &TIMEOUTS),
            3600
        );
        assert_eq!(
            timeout_secs(IPPROTO_TCP, tcp_state::SYN_SENT, &TIMEOUTS),
            120
        );
        assert_eq!(
            timeout_secs(IPPROTO_TCP, tcp_state::CLOSING, &TIMEOUTS),
            120
        );
        assert_eq!(timeout_secs(IPPROTO_TCP, 0, &TIMEOUTS), 120);
        assert_eq!(timeout_secs(IPPROTO_UDP, 0, &TIMEOUTS), 30);
        assert_eq!(
            timeout_secs(IPPROTO_UDP, udp_state::REPLIED, &TIMEOUTS),
            120,
            "a UDP flow that had a reply is a stream"
        );
        assert_eq!(
            timeout_secs(132, udp_state::REPLIED, &TIMEOUTS),
            120,
            "so is an SCTP association"
        );
        assert_eq!(timeout_secs(132, 0, &TIMEOUTS), 30);
        assert_eq!(timeout_secs(IPPROTO_ICMP, 0, &TIMEOUTS), 20);
        // The state byte means nothing else outside TCP.
        assert_eq!(
            timeout_secs(IPPROTO_UDP, tcp_state::ESTABLISHED, &TIMEOUTS),
            30
        );
    }

    #[test]
    fn established_tcp_lives_an_hour_of_idleness() {
        let fresh = entry(3599, tcp_state::ESTABLISHED);
        let stale = entry(3601, tcp_state::ESTABLISHED);
        assert!(!is_expired(&fresh, IPPROTO_TCP, NOW, &TIMEOUTS));
        assert!(is_expired(&stale, IPPROTO_TCP, NOW, &TIMEOUTS));
    }

    #[test]
    fn opening_and_closing_tcp_expire_after_the_transitory_timeout() {
        for state in [tcp_state::SYN_SENT, tcp_state::CLOSING] {
            assert!(!is_expired(&entry(119, state), IPPROTO_TCP, NOW, &TIMEOUTS));
            assert!(is_expired(&entry(121, state), IPPROTO_TCP, NOW, &TIMEOUTS));
        }
    }

    #[test]
    fn a_flow_the_pod_closed_first_frees_its_port_sooner_than_one_the_remote_closed() {
        // The remote keeps no TIME_WAIT when the pod closed first.
        let pod_first = |age| entry(age, tcp_state::POD_CLOSED);
        assert!(!is_expired(&pod_first(1), IPPROTO_TCP, NOW, &TIMEOUTS));
        assert!(is_expired(&pod_first(3), IPPROTO_TCP, NOW, &TIMEOUTS));
        assert!(!is_expired(
            &entry(9, tcp_state::CLOSED),
            IPPROTO_TCP,
            NOW,
            &TIMEOUTS
        ));
        assert!(is_expired(
            &entry(11, tcp_state::CLOSED),
            IPPROTO_TCP,
            NOW,
            &TIMEOUTS
        ));
        // A closed timeout set below the grace wins.
        let short = Timeouts {
            tcp_closed: 1,
            ..TIMEOUTS
        };
        assert_eq!(timeout_secs(IPPROTO_TCP, tcp_state::POD_CLOSED, &short), 1);
    }

    #[test]
    fn udp_and_icmp_expire_after_their_own_timeouts() {
        assert!(!is_expired(&entry(29, 0), IPPROTO_UDP, NOW, &TIMEOUTS));
        assert!(is_expired(&entry(31, 0), IPPROTO_UDP, NOW, &TIMEOUTS));
        assert!(!is_expired(&entry(19, 0), IPPROTO_ICMP, NOW, &TIMEOUTS));
        assert!(is_expired(&entry(21, 0), IPPROTO_ICMP, NOW, &TIMEOUTS));
    }

    #[test]
    fn a_packet_seen_after_now_was_read_is_not_idle() {
        let mut future = entry(0, 0);
        future.last_seen_ns = NOW + SEC;
        assert!(!is_expired(&future, IPPROTO_UDP, NOW, &TIMEOUTS));
        assert_eq!(expires_in_secs(&future, IPPROTO_UDP, NOW, &TIMEOUTS), 30);
    }

    #[test]
    fn expires_in_counts_down_to_zero() {
        assert_eq!(
            expires_in_secs(&entry(10, 0), IPPROTO_UDP, NOW, &TIMEOUTS),
            20
        );
        assert_eq!(
            expires_in_secs(&entry(45, 0), IPPROTO_UDP, NOW, &TIMEOUTS),
            0
        );
    }

    #[test]
    fn the_latest_entry_of_a_pair_decides() {
        let out = entry(40, tcp_state::SYN_SENT);
        let inbound = entry(5, tcp_state::ESTABLISHED);
        assert_eq!(latest(&out, Some(&inbound)), &inbound);
        assert_eq!(latest(&inbound, Some(&out)), &inbound);
        assert_eq!(latest(&out, None), &out);
        // A one-way stream refreshes only the inbound entry: the flow stays.
        assert!(!is_expired(
            latest(&entry(40, 0), Some(&entry(5, 0))),
            IPPROTO_UDP,
            NOW,
            &TIMEOUTS
        ));
    }
}
