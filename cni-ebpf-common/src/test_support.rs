//! What tests of the flow rules build their cases from, in this crate, the daemon and the
//! tests crate (feature `test-support`): a clock far from zero, the timeouts they
//! assume, and a flow's entry.

use crate::{NatEntry, NatKey, Timeouts};

/// A second in nanoseconds.
pub const SEC: u64 = 1_000_000_000;
/// A monotonic "now" far from zero, as on a machine that has been up a while.
pub const NOW: u64 = 100_000 * SEC;
/// The timeouts the cases assume (tests that need another one change it by name).
pub const TIMEOUTS: Timeouts = Timeouts {
    tcp_established: 3600,
    tcp_transitory: 120,
    tcp_closed: 10,
    udp: 30,
    udp_stream: 120,
    icmp: 30,
};

impl NatEntry {
    /// The entry of `key`'s flow translated to `node` (address, port), in `state`, last
    /// seen at `last_seen_ns`, no side's sequence number known.
    pub const fn translated(
        key: &NatKey,
        node: ([u8; 4], u16),
        state: u8,
        last_seen_ns: u64,
    ) -> Self {
        Self {
            last_seen_ns,
            pod_addr: key.pod_addr,
            pod_port: key.pod_port,
            node_port: node.1,
            state,
            seq_seen: 0,
            pad: [0; 2],
            node_addr: node.0,
            seq: [0; 2],
        }
    }
}
