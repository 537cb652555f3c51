//! Port ranges as the prefixes a longest-prefix-match map holds: a range `port..=endPort`
//! becomes the fewest aligned blocks that cover exactly it (at most 30 for 16-bit
//! ports), each a port and how many of its leading bits must match.

/// An aligned block of ports: every port whose first `bits` bits are `port`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortPrefix {
    pub port: u16,
    /// 0 (every port) to 16 (`port` alone).
    pub bits: u8,
}

impl PortPrefix {
    /// The first and last port of the block.
    pub const fn range(self) -> (u16, u16) {
        let size = 1u32 << (16 - self.bits as u32);
        (self.port, (self.port as u32 + size - 1) as u16)
    }
}

/// The blocks that cover `first..=last` exactly, lowest first; none when `first > last`.
pub fn prefixes(first: u16, last: u16) -> Vec<PortPrefix> {
    let mut blocks = Vec::new();
    let (mut at, last) = (u32::from(first), u32::from(last));
    while at <= last {
        // The largest block aligned at `at` that ends within the range.
        let mut size = if at == 0 {
            1 << 16
        } else {
            1 << at.trailing_zeros()
        };
        while at + size - 1 > last {
            size >>= 1;
        }
        blocks.push(PortPrefix {
            port: at as u16,
            bits: 16 - size.trailing_zeros() as u8,
        });
        at += size;
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every port the blocks cover, in order.
    fn covered(blocks: &[PortPrefix]) -> Vec<u32> {
        blocks
            .iter()
            .flat_map(|b| {
                let (first, last) = b.range();
                u32::from(first)..=u32::from(last)
            })
            .collect()
    }

    #[test]
    fn a_single_port_is_one_full_prefix() {
        assert_eq!(prefixes(80, 80), vec![PortPrefix { port: 80, bits: 16 }]);
    }

    #[test]
    fn every_port_is_the_empty_prefix() {
        assert_eq!(prefixes(0, u16::MAX), vec![PortPrefix { port: 0, bits: 0 }]);
        assert_eq!(covered(&prefixes(1, u16::MAX)).len(), 65_535);
    }

    #[test]
    fn ranges_are_covered_exactly_with_at_most_thirty_blocks() {
        let ranges = [
            (1, 65_535),
            (32_000, 32_768),
            (80, 81),
            (1000, 2000),
            (1, 65_534),
        ];
        for (first, last) in ranges {
            let blocks = prefixes(first, last);
            assert_eq!(
                covered(&blocks),
                (u32::from(first)..=u32::from(last)).collect::<Vec<_>>(),
                "{first}..={last}: {blocks:?}"
            );
            assert!(
                blocks.len() <= 30,
                "{first}..={last}: {} blocks",
                blocks.len()
            );
        }
        assert_eq!(prefixes(1, 65_534).len(), 30, "the worst case");
    }

    #[test]
    fn an_inverted_range_is_empty() {
        assert!(prefixes(81, 80).is_empty());
    }
}
