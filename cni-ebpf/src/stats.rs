//! Traffic accounting maps and the logic that updates them.

use aya_ebpf::{macros::map, maps::PerCpuHashMap};
use cni_ebpf_common::{SourceKey, TrafficCounters};

/// Upper bound of distinct sources tracked; a full map stops counting new sources but
/// never affects forwarding.
const MAX_SOURCES: u32 = 4096;

// Pinned by name under the daemon's bpffs folder, so counters survive a restart.
#[map(name = "SOURCE_STATS")]
static SOURCE_STATS: PerCpuHashMap<SourceKey, TrafficCounters> =
    PerCpuHashMap::pinned(MAX_SOURCES, 0);

/// What [`count`] did, so the caller can log the first packet of a new source.
pub enum Counted {
    Existing,
    NewSource,
}

/// Adds one packet of `bytes` to the counters of `key` on this CPU.
///
/// Per-CPU values need no atomics (bpfel-unknown-none has no 64-bit fetch_add); user
/// space sums the CPUs when it reads.
#[inline(always)]
pub fn count(key: &SourceKey, bytes: u64) -> Result<Counted, i64> {
    if let Some(counters) = SOURCE_STATS.get_ptr_mut(key) {
        // SAFETY: the pointer comes from the map lookup and is valid for this CPU while
        // the program runs; no other CPU writes this per-CPU slot.
        unsafe {
            (*counters).packets += 1;
            (*counters).bytes += bytes;
        }
        return Ok(Counted::Existing);
    }
    let first = TrafficCounters { packets: 1, bytes };
    SOURCE_STATS.insert(key, &first, 0)?;
    Ok(Counted::NewSource)
}
