//! The removals as the `nat_sweep` program reads them: one [`SweepItem`] each, its bytes
//! laid out as the program's frame holds them.

use cni_ebpf_common::{SweepItem, sweep};

use super::decide::Removal;

impl Removal {
    /// The `nat_sweep` program's item for this removal.
    pub(super) fn item(&self) -> SweepItem {
        let (out, inbound, kind, decided) = match *self {
            Self::Flow {
                key,
                reverse: Some(reverse),
                decided,
            } => (key, reverse, sweep::FLOW | sweep::PAIR, decided),
            Self::Flow {
                key,
                reverse: None,
                decided,
            } => (key, key.reverse(decided.node_port), sweep::FLOW, decided),
            Self::Orphan { reverse, entry } => {
                (reverse.forward(&entry), reverse, sweep::ORPHAN, entry)
            }
            // `inbound` unused: the note is keyed as `NAT_OUT` is.
            Self::FromOutside { key, note } => {
                (key, key.reverse(note.node_port), sweep::FROM_OUTSIDE, note)
            }
            Self::HostPort { key, entry } => {
                (key, key.reverse(entry.node_port), sweep::HOSTPORT, entry)
            }
            // `inbound` unused.
            Self::Service { kind, key, entry } => (key, key.reverse(0), kind, entry),
        };
        SweepItem {
            out,
            inbound,
            kind,
            pad: [0; 3],
            decided_ns: decided.last_seen_ns,
        }
    }
}

/// The bytes of `item`, as the `nat_sweep` program reads them.
pub(super) fn item_bytes(item: &SweepItem) -> &[u8] {
    // SAFETY: `SweepItem` is #[repr(C)] plain data without implicit padding (its size
    // is asserted), so all its bytes are initialised.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(item).cast(), size_of::<SweepItem>()) }
}

#[cfg(test)]
mod tests {
    use cni_ebpf_common::{NatEntry, NatKey};

    use super::*;

    fn flow(pod_port: u16) -> NatKey {
        NatKey::new(([10, 244, 1, 2], pod_port), ([198, 18, 0, 9], 443), 17)
    }

    fn entry(key: &NatKey, node_port: u16, last_seen_ns: u64) -> NatEntry {
        NatEntry::translated(key, ([198, 18, 0, 1], node_port), 0, last_seen_ns)
    }

    #[test]
    fn each_removal_becomes_the_sweep_program_item_that_says_the_same() {
        let key = flow(1000);
        let decided = entry(&key, 2000, 99_000_000_000_000);
        let pair = Removal::Flow {
            key,
            reverse: Some(key.reverse(2000)),
            decided,
        }
        .item();
        assert_eq!(
            (pair.out, pair.inbound, pair.kind, pair.decided_ns),
            (
                key,
                key.reverse(2000),
                sweep::FLOW | sweep::PAIR,
                decided.last_seen_ns
            )
        );
        let alone = Removal::Flow {
            key,
            reverse: None,
            decided,
        }
        .item();
        assert_eq!((alone.out, alone.kind), (key, sweep::FLOW));
        let orphan = Removal::Orphan {
            reverse: key.reverse(2000),
            entry: decided,
        }
        .item();
        assert_eq!(
            (orphan.inbound, orphan.kind, orphan.decided_ns),
            (key.reverse(2000), sweep::ORPHAN, decided.last_seen_ns)
        );
        // The bytes the program reads: the item as laid out, key first.
        let bytes = item_bytes(&pair);
        assert_eq!(bytes.len(), 40);
        assert_eq!(bytes[..4], key.pod_addr);
        assert_eq!(bytes[28], sweep::FLOW | sweep::PAIR);
        assert_eq!(bytes[32..], decided.last_seen_ns.to_ne_bytes());
    }
}
