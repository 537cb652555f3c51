//! How long a translated flow has left, as the daemon shows it (pure decisions). Whether a
//! flow is idle long enough to forget is `cni_ebpf_common::Timeouts::expired`, the rule
//! the datapath applies too.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, the clock `bpf_ktime_get_coarse_ns` reads (as
//! of the last tick, a few milliseconds behind at most).

use cni_ebpf_common::{NatEntry, flow::idle_ns};

use super::args::Timeouts;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Seconds left before `entry` expires; 0 once it has (until the sweeper removes it).
pub fn expires_in_secs(entry: &NatEntry, proto: u8, now_ns: u64, timeouts: &Timeouts) -> u64 {
    let timeout = u64::from(timeouts.secs(proto, entry.state));
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
    use cni_ebpf_common::{
        ip_proto::{TCP, UDP},
        tcp_state,
    };

    use super::*;

    use cni_ebpf_common::{
        NatKey,
        test_support::{NOW, SEC},
    };

    const TIMEOUTS: Timeouts = Timeouts {
        icmp: 20,
        ..cni_ebpf_common::test_support::TIMEOUTS
    };

    /// A flow of 10.244.1.2:40000 translated to 198.18.0.1:61000, idle for `idle_secs`.
    fn entry(idle_secs: u64, state: u8) -> NatEntry {
        let key = NatKey::new(([10, 244, 1, 2], 40000), ([198, 18, 0, 9], 443), 6);
        NatEntry::translated(&key, ([198, 18, 0, 1], 61000), state, NOW - idle_secs * SEC)
    }

    #[test]
    fn expires_in_counts_down_to_zero() {
        assert_eq!(expires_in_secs(&entry(10, 0), UDP, NOW, &TIMEOUTS), 20);
        assert_eq!(expires_in_secs(&entry(45, 0), UDP, NOW, &TIMEOUTS), 0);
        assert_eq!(
            expires_in_secs(&entry(100, tcp_state::ESTABLISHED), TCP, NOW, &TIMEOUTS),
            3500
        );
    }

    #[test]
    fn a_packet_seen_after_now_was_read_leaves_the_whole_timeout() {
        let mut future = entry(0, 0);
        future.last_seen_ns = NOW + SEC;
        assert_eq!(expires_in_secs(&future, UDP, NOW, &TIMEOUTS), 30);
    }

    #[test]
    fn the_latest_entry_of_a_pair_decides() {
        let out = entry(40, tcp_state::SYN_SENT);
        let inbound = entry(5, tcp_state::ESTABLISHED);
        assert_eq!(latest(&out, Some(&inbound)), &inbound);
        assert_eq!(latest(&inbound, Some(&out)), &inbound);
        assert_eq!(latest(&out, None), &out);
        // A one-way stream refreshes only the inbound entry: the flow stays.
        assert!(!TIMEOUTS.expired(latest(&entry(40, 0), Some(&entry(5, 0))), UDP, NOW));
    }
}
