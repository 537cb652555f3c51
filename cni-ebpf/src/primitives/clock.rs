//! The datapath's clock.

use aya_ebpf::helpers::generated::bpf_ktime_get_coarse_ns;

/// CLOCK_MONOTONIC at the last tick (the clock of the flows' timestamps, which the
/// daemon reads too): timeouts are whole seconds, and the coarse clock is a memory read
/// where the precise one reads the clock source (in a VM, a paravirtual clock read per
/// packet).
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}
