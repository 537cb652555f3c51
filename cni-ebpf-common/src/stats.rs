//! Traffic accounting: counters per source IPv4 address.

/// Key of the per-source counters: an IPv4 address as the four bytes seen on the wire
/// (network order), so `u32::from_be_bytes(addr)` is the address in user space.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourceKey {
    pub addr: [u8; 4],
}

/// Packets and bytes seen, summed per CPU by user space (the maps are per-CPU so the
/// kernel never needs an atomic add, which bpfel-unknown-none lacks).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCounters {
    pub packets: u64,
    pub bytes: u64,
}

impl TrafficCounters {
    /// Sum of two counters (used to fold per-CPU values).
    #[must_use]
    pub const fn plus(self, other: Self) -> Self {
        Self {
            packets: self.packets.wrapping_add(other.packets),
            bytes: self.bytes.wrapping_add(other.bytes),
        }
    }
}

const _: () = assert!(core::mem::size_of::<SourceKey>() == 4);
const _: () = assert!(core::mem::size_of::<TrafficCounters>() == 16);

#[cfg(feature = "user")]
// SAFETY: both are #[repr(C)] with fixed-width fields and no padding (asserted above).
unsafe impl aya::Pod for SourceKey {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for TrafficCounters {}
