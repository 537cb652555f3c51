//! The datapath's clock: `CLOCK_MONOTONIC`, which `bpf_ktime_get_coarse_ns` reads (as of
//! the last tick) and which stamps `NatEntry::last_seen_ns`. The sweep, the views and the
//! upgrade of pinned tables compare with it.

use nix::time::{ClockId, clock_gettime};

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_now_ns() -> Result<u64, nix::Error> {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC)?;
    // Both are non-negative for CLOCK_MONOTONIC.
    let secs = u64::try_from(now.tv_sec()).unwrap_or_default();
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or_default();
    Ok(secs * 1_000_000_000 + nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let first = monotonic_now_ns().expect("clock");
        let second = monotonic_now_ns().expect("clock");
        assert!(first > 0 && second >= first);
    }
}
