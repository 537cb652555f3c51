//! Which ipBlock peers an address is in, as a longest-prefix-match map answers it: every
//! CIDR and every except of the blocks in force is a prefix of the map, and a prefix's
//! value is the set of blocks that hold all of it ([`Blocks::prefixes`]). For an address,
//! the longest prefix holding it gives exactly its blocks: any CIDR or except holding the
//! address is itself a prefix of the map, no longer than that longest one, so it holds
//! the whole longest prefix too. Pods' addresses are looked up alone
//! ([`Blocks::peers_of`]), since upstream's ipBlock selects pods by address as well.
//!
//! Cost: each prefix and each address looks up the prefix lengths the blocks use in its
//! family (at most 33 or 129 hash lookups), whatever the number of blocks.

use std::net::IpAddr;

use foldhash::HashMap;
use ipnet::IpNet;

/// A block's index among the peers of the policies in force.
pub type PeerId = u32;

/// The blocks in force, by prefix.
#[derive(Debug, Default)]
pub struct Blocks {
    /// For each CIDR or except: the blocks it is the CIDR of, and those it is an except
    /// of. Hashed by foldhash, seeded per process: a compile looks up 33 lengths for
    /// each prefix, and SipHash was the largest part of its time.
    by_prefix: HashMap<IpNet, (Vec<PeerId>, Vec<PeerId>)>,
    /// The lengths of the prefixes held, by family (IPv4, IPv6), ascending: the only
    /// ones worth looking up.
    lengths: [Vec<u8>; 2],
}

impl Blocks {
    /// The blocks `(peer, cidr, except)`, networks without host bits.
    pub fn new<'a>(blocks: impl IntoIterator<Item = (PeerId, IpNet, &'a [IpNet])>) -> Self {
        let mut by_prefix: HashMap<IpNet, (Vec<PeerId>, Vec<PeerId>)> = HashMap::default();
        for (peer, cidr, except) in blocks {
            by_prefix.entry(cidr.trunc()).or_default().0.push(peer);
            for inner in except {
                by_prefix.entry(inner.trunc()).or_default().1.push(peer);
            }
        }
        let mut lengths = [Vec::new(), Vec::new()];
        for (prefix, (cidr_of, except_of)) in &mut by_prefix {
            for ids in [cidr_of, except_of] {
                ids.sort_unstable();
                ids.dedup();
            }
            lengths[family(prefix)].push(prefix.prefix_len());
        }
        for family in &mut lengths {
            family.sort_unstable();
            family.dedup();
        }
        Self { by_prefix, lengths }
    }

    /// Every prefix the map holds, in order, with the blocks that hold all of it (sorted;
    /// empty for an except no other block holds: its addresses are in no block).
    pub fn prefixes(&self) -> Vec<(IpNet, Vec<PeerId>)> {
        let mut all: Vec<(IpNet, Vec<PeerId>)> = self
            .by_prefix
            .keys()
            .map(|prefix| (*prefix, self.holding(*prefix)))
            .collect();
        all.sort_unstable();
        all
    }

    /// The blocks that hold `addr`, sorted.
    pub fn peers_of(&self, addr: IpAddr) -> Vec<PeerId> {
        self.holding(IpNet::from(addr))
    }

    /// The blocks whose CIDR holds all of `prefix` and none of whose excepts holds any
    /// of it, sorted. An except that holds part of `prefix` without holding all of it is
    /// longer, and a prefix of the map of its own.
    fn holding(&self, prefix: IpNet) -> Vec<PeerId> {
        let (mut inside, mut excepted) = (Vec::new(), Vec::new());
        let lengths = &self.lengths[family(&prefix)];
        for len in lengths
            .iter()
            .take_while(|len| **len <= prefix.prefix_len())
        {
            let Ok(outer) = IpNet::new(prefix.addr(), *len) else {
                continue;
            };
            if let Some((cidr_of, except_of)) = self.by_prefix.get(&outer.trunc()) {
                inside.extend_from_slice(cidr_of);
                excepted.extend_from_slice(except_of);
            }
        }
        inside.sort_unstable();
        inside.dedup();
        if !excepted.is_empty() {
            excepted.sort_unstable();
            inside.retain(|peer| excepted.binary_search(peer).is_err());
        }
        inside
    }
}

/// The index of `prefix`'s family in [`Blocks::lengths`].
fn family(prefix: &IpNet) -> usize {
    match prefix {
        IpNet::V4(_) => 0,
        IpNet::V6(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().expect("a CIDR")
    }

    fn ids(list: &[PeerId]) -> Vec<PeerId> {
        list.to_vec()
    }

    /// The blocks of an address by brute force: the definition, block by block.
    fn by_definition(blocks: &[(PeerId, IpNet, Vec<IpNet>)], addr: IpAddr) -> Vec<PeerId> {
        blocks
            .iter()
            .filter(|(_, cidr, except)| {
                cidr.contains(&addr) && !except.iter().any(|e| e.contains(&addr))
            })
            .map(|(peer, ..)| *peer)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// The longest of `prefixes` holding `addr`, as the map finds it.
    fn longest(prefixes: &[(IpNet, Vec<PeerId>)], addr: IpAddr) -> Vec<PeerId> {
        prefixes
            .iter()
            .filter(|(prefix, _)| prefix.contains(&addr))
            .max_by_key(|(prefix, _)| prefix.prefix_len())
            .map(|(_, peers)| peers.clone())
            .unwrap_or_default()
    }

    #[test]
    fn nested_and_overlapping_blocks_with_excepts_answer_as_their_definition() {
        let blocks = vec![
            (
                0,
                net("10.0.0.0/8"),
                vec![net("10.1.0.0/16"), net("10.2.3.0/24")],
            ),
            (1, net("10.1.0.0/16"), vec![net("10.1.1.0/24")]),
            (2, net("10.1.1.128/25"), vec![]),
            (3, net("0.0.0.0/0"), vec![net("10.0.0.0/8")]),
            (4, net("fd00::/8"), vec![net("fd00:1::/32")]),
        ];
        let table = Blocks::new(blocks.iter().map(|(p, c, e)| (*p, *c, e.as_slice())));
        let prefixes = table.prefixes();
        let probes = [
            "10.0.0.1",
            "10.1.0.1",
            "10.1.1.1",
            "10.1.1.200",
            "10.2.3.4",
            "10.2.4.4",
            "192.0.2.1",
            "fd00::1",
            "fd00:1::1",
            "fd01::1",
            "2001:db8::1",
        ];
        for probe in probes {
            let addr: IpAddr = probe.parse().expect("an address");
            let expected = by_definition(&blocks, addr);
            assert_eq!(table.peers_of(addr), expected, "{probe} looked up alone");
            assert_eq!(
                longest(&prefixes, addr),
                expected,
                "{probe} through the prefixes"
            );
        }
        assert_eq!(
            table.peers_of("10.1.1.200".parse().expect("addr")),
            ids(&[2])
        );
        assert_eq!(
            table.peers_of("192.0.2.1".parse().expect("addr")),
            ids(&[3])
        );
    }

    #[test]
    fn an_except_no_other_block_holds_maps_to_no_block() {
        let blocks = [(7, net("192.168.0.0/16"), vec![net("192.168.5.0/24")])];
        let table = Blocks::new(blocks.iter().map(|(p, c, e)| (*p, *c, e.as_slice())));
        assert_eq!(
            table.prefixes(),
            vec![
                (net("192.168.0.0/16"), ids(&[7])),
                (net("192.168.5.0/24"), ids(&[])),
            ]
        );
    }
}
