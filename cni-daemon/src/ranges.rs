//! LPM tries of IPv4 ranges (`CLUSTER_CIDRS`, `SERVICE_CIDRS`, `CLUSTER_NODES`: (prefix
//! length, address in network order) -> 1) kept equal to a set of ranges, and those
//! whose ranges carry a value (`REMOTE_NODES`) kept equal to a map.
//!
//! A full trie degrades one thing, never the whole sync: what does not fit is left out
//! and counted ([`Synced::left_out`]), everything else is written, and the caller says
//! what the ranges left out miss.

use std::{
    borrow::BorrowMut,
    collections::{BTreeMap, BTreeSet},
};

use aya::maps::{LpmTrie, MapData, lpm_trie::Key};
use ipnet::Ipv4Net;

/// What a sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synced {
    /// Whether anything changed.
    pub changed: bool,
    /// Ranges that did not fit in the full trie.
    pub left_out: usize,
}

/// Whether `error` is the kernel's answer to an insert into a full trie.
fn is_full(error: &aya::maps::MapError) -> bool {
    matches!(error, aya::maps::MapError::SyscallError(error)
        if matches!(error.io_error.raw_os_error(), Some(libc::ENOSPC | libc::E2BIG)))
}

/// Inserts `value` at `net`; `Ok(false)` when the trie is full.
fn insert<T: BorrowMut<MapData>, V: aya::Pod>(
    trie: &mut LpmTrie<T, [u8; 4], V>,
    net: &Ipv4Net,
    value: V,
) -> Result<bool, aya::maps::MapError> {
    match trie.insert(&key(net), value, 0) {
        Ok(()) => Ok(true),
        Err(error) if is_full(&error) => Ok(false),
        Err(error) => Err(error),
    }
}

/// What to insert and what to remove so that `current` becomes `desired`.
fn changes(
    current: &BTreeSet<Ipv4Net>,
    desired: &BTreeSet<Ipv4Net>,
) -> (Vec<Ipv4Net>, Vec<Ipv4Net>) {
    (
        desired.difference(current).copied().collect(),
        current.difference(desired).copied().collect(),
    )
}

/// Makes `trie` hold exactly `desired`, as much of it as fits. New ranges go in before
/// old ones leave, so a range present in both never disappears, even for a moment;
/// those that found the trie full are tried again once the old ones are out.
pub fn sync<T: BorrowMut<MapData>>(
    trie: &mut LpmTrie<T, [u8; 4], u8>,
    desired: &BTreeSet<Ipv4Net>,
) -> Result<Synced, aya::maps::MapError> {
    let keys: Vec<Key<[u8; 4]>> = trie.keys().collect::<Result<_, _>>()?;
    let mut current = BTreeSet::new();
    for key in keys {
        // A key the daemon did not write (prefix > 32) cannot be a range: remove it too.
        match Ipv4Net::new(key.data().into(), prefix_u8(key.prefix_len())) {
            Ok(net) => {
                current.insert(net);
            }
            Err(_) => crate::maps::removed(trie.remove(&key))?,
        }
    }
    let (add, remove) = changes(&current, desired);
    let mut full = Vec::new();
    for net in &add {
        if !insert(trie, net, 1)? {
            full.push(*net);
        }
    }
    for net in &remove {
        crate::maps::removed(trie.remove(&key(net)))?;
    }
    let mut left_out = 0;
    for net in &full {
        if !insert(trie, net, 1)? {
            left_out += 1;
        }
    }
    Ok(Synced {
        changed: add.len() > left_out || !remove.is_empty(),
        left_out,
    })
}

/// Adds to `trie` the ranges of `ranges` it lacks, removing none, as many as fit.
/// (Compared by key: a lookup would find a range inside a wider one.)
pub fn extend<T: BorrowMut<MapData>>(
    trie: &mut LpmTrie<T, [u8; 4], u8>,
    ranges: &BTreeSet<Ipv4Net>,
) -> Result<Synced, aya::maps::MapError> {
    let present: BTreeSet<(u32, [u8; 4])> = trie
        .keys()
        .map(|key| key.map(|key| (key.prefix_len(), key.data())))
        .collect::<Result<_, _>>()?;
    let mut synced = Synced::default();
    for net in ranges {
        let key = key(net);
        if !present.contains(&(key.prefix_len(), key.data())) {
            if insert(trie, net, 1)? {
                synced.changed = true;
            } else {
                synced.left_out += 1;
            }
        }
    }
    Ok(synced)
}

/// Makes `trie` hold exactly `desired`, each range with its value, as much of it as
/// fits. New and changed ranges are written before old ones leave; those that found
/// the trie full are tried again once the old ones are out.
pub fn sync_values<T: BorrowMut<MapData>, V: aya::Pod + PartialEq>(
    trie: &mut LpmTrie<T, [u8; 4], V>,
    desired: &BTreeMap<Ipv4Net, V>,
) -> Result<Synced, aya::maps::MapError> {
    let mut current = BTreeMap::new();
    let mut stray = Vec::new();
    for entry in trie.iter() {
        let (key, value) = entry?;
        match Ipv4Net::new(key.data().into(), prefix_u8(key.prefix_len())) {
            Ok(net) => {
                current.insert(net, value);
            }
            Err(_) => stray.push(key),
        }
    }
    let mut changed = !stray.is_empty();
    let mut full = Vec::new();
    for (net, value) in desired {
        if current.get(net) != Some(value) {
            if insert(trie, net, *value)? {
                changed = true;
            } else {
                full.push((*net, *value));
            }
        }
    }
    for net in current.keys().filter(|net| !desired.contains_key(net)) {
        crate::maps::removed(trie.remove(&key(net)))?;
        changed = true;
    }
    for key in stray {
        crate::maps::removed(trie.remove(&key))?;
    }
    let mut left_out = 0;
    for (net, value) in full {
        if insert(trie, &net, value)? {
            changed = true;
        } else {
            left_out += 1;
        }
    }
    Ok(Synced { changed, left_out })
}

fn key(net: &Ipv4Net) -> Key<[u8; 4]> {
    Key::new(u32::from(net.prefix_len()), net.network().octets())
}

fn prefix_u8(prefix_len: u32) -> u8 {
    u8::try_from(prefix_len).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(texts: &[&str]) -> BTreeSet<Ipv4Net> {
        texts.iter().map(|t| t.parse().expect("valid")).collect()
    }

    #[test]
    fn changes_add_the_new_and_remove_the_gone() {
        let current = nets(&["10.244.0.0/16", "172.16.0.0/12"]);
        let desired = nets(&["10.244.0.0/16", "10.96.0.0/12"]);
        let (add, remove) = changes(&current, &desired);
        assert_eq!(add, vec!["10.96.0.0/12".parse::<Ipv4Net>().expect("valid")]);
        assert_eq!(
            remove,
            vec!["172.16.0.0/12".parse::<Ipv4Net>().expect("valid")]
        );
        let (add, remove) = changes(&desired, &desired);
        assert!(add.is_empty() && remove.is_empty());
    }

    #[test]
    fn trie_key_is_prefix_length_and_network_order_address() {
        let key = key(&"10.244.0.0/16".parse().expect("valid"));
        assert_eq!(key.prefix_len(), 16);
        assert_eq!(key.data(), [10, 244, 0, 0]);
    }
}
