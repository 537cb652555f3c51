//! A pod's egress rate limit, held on the host side: `from_pod` spends each packet of
//! a limited pod from its token bucket (`RATE_LIMITS`), and a packet the bucket cannot
//! pay for is dropped. The pod's own `tbf` shapes what its stack sends to the same
//! rate, and stays the way its TCP is paced; the bucket is what holds against a raw
//! socket that skips that qdisc (`PACKET_QDISC_BYPASS`), and against a pod that removes
//! it. It is a policer: the daemon gives it some room over the pod's `tbf` (see
//! `cni-daemon`'s rate limits), so that shaped traffic is never dropped here.
//!
//! The bucket is shared by the CPUs without a lock: two packets of the pod on two CPUs
//! at once may both be paid from one refill, a bounded error.

use crate::primitives::{clock, maps::RATE_LIMITS};

/// The longest idle time refilled at once (the bucket is full long before).
const MAX_REFILL_NS: u64 = 1_000_000_000;

/// Whether the pod behind the host-side `ifindex` may send `len` bytes now (a pod
/// without a bucket may). A function of its own (a BPF call): its frame is not the pod
/// program's.
#[inline(never)]
pub fn admit(ifindex: u32, len: u32) -> bool {
    let Some(bucket) = RATE_LIMITS.get_ptr_mut(&ifindex) else {
        return true;
    };
    let now = clock::now_ns();
    // SAFETY: a pointer into the map value, valid for the program run.
    let bucket = unsafe { &mut *bucket };
    let elapsed = now.saturating_sub(bucket.refilled_ns).min(MAX_REFILL_NS);
    // At most 1e9 ns times a rate of bytes per second: no overflow below 18 GB/s.
    let refill = elapsed * bucket.rate / 1_000_000_000;
    let mut tokens = bucket.tokens;
    if refill > 0 {
        tokens = (tokens + refill).min(bucket.burst);
        bucket.refilled_ns = now;
    }
    let len = u64::from(len);
    if tokens < len {
        bucket.tokens = tokens;
        return false;
    }
    bucket.tokens = tokens - len;
    true
}
