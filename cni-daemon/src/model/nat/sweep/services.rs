//! The Service tables' share of a sweep (pure decisions, see
//! `cni_ebpf_common::services`): entries idle past their timeout or of a pod gone; then,
//! for each party near its budget, its own unanswered and closing entries, least
//! recently seen first; then, for a table near the brim, anyone's. An established TCP
//! connection or a UDP stream never goes before its timeout.

use std::collections::{HashMap as StdHashMap, HashSet};

use cni_ebpf_common::{
    NatEntry, NatKey, ServiceClient, ServiceCounts, flow::early_droppable, sweep,
};

use super::decide::{EARLY_DROP_ABOVE, EARLY_DROP_TO, Removal, early_drop};
use crate::model::nat::Timeouts;

/// A snapshot of one Service table, and what its removals need to know of it.
pub(super) struct Table<'a, K> {
    pub entries: &'a StdHashMap<K, NatEntry>,
    /// The `nat_sweep` kind of its items ([`sweep::SERVICE_CLIENT`] and the others).
    pub kind: u8,
    pub capacity: usize,
    /// Whether its parties are the node's pods (whose entries go with them), rather
    /// than addresses outside.
    pub pods_only: bool,
}

/// A Service table's key as a sweep item's `out` key.
pub(super) trait ItemKey: Copy + Eq + std::hash::Hash {
    fn item_key(&self) -> NatKey;
    fn proto(&self) -> u8;
}

impl ItemKey for ServiceClient {
    fn item_key(&self) -> NatKey {
        NatKey {
            pod_addr: self.addr,
            remote_addr: [0; 4],
            pod_port: self.port,
            remote_port: 0,
            proto: self.proto,
            pad: [0; 3],
        }
    }

    fn proto(&self) -> u8 {
        self.proto
    }
}

impl ItemKey for NatKey {
    fn item_key(&self) -> NatKey {
        *self
    }

    fn proto(&self) -> u8 {
        self.proto
    }
}

/// What a sweep removes from `table` at `now_ns`: expired entries, those of pods no
/// longer among `pods` (for a table of pods' entries), then early drops for each party
/// holding more than seven eighths of `budget` (down to three quarters) and for the
/// table itself (as `decide::early_drop`). The second value counts the early drops.
pub(super) fn removals<K: ItemKey>(
    table: &Table<'_, K>,
    pods: &HashSet<[u8; 4]>,
    now_ns: u64,
    timeouts: &Timeouts,
    budget: u32,
) -> (Vec<Removal>, usize) {
    let mut gone: HashSet<K> = table
        .entries
        .iter()
        .filter(|(key, entry)| {
            (table.pods_only && !pods.contains(&entry.pod_addr))
                || timeouts.expired(entry, key.proto(), now_ns)
        })
        .map(|(key, _)| *key)
        .collect();
    let expired = gone.len();
    let mut decided: Vec<(K, NatEntry)> = gone.iter().map(|k| (*k, table.entries[k])).collect();
    for (key, entry) in over_budget(table.entries, &gone, budget) {
        gone.insert(key);
        decided.push((key, entry));
    }
    let entries = table.entries.iter().map(|(k, e)| (*k, *e, k.proto()));
    let for_room = early_drop(entries, table.entries.len(), &gone, table.capacity);
    decided.extend(for_room);
    let early = decided.len() - expired;
    let removals = decided
        .into_iter()
        .map(|(key, entry)| Removal::Service {
            kind: table.kind,
            key: key.item_key(),
            entry,
        })
        .collect();
    (removals, early)
}

/// The counts of parties that hold no entry (see `cni_ebpf_common::services`), as
/// removals the `nat_sweep` program makes only if they still count nothing.
pub(super) fn forgotten(parties: &StdHashMap<[u8; 4], ServiceCounts>) -> Vec<Removal> {
    parties
        .iter()
        .filter(|(_, counts)| counts.is_empty())
        .map(|(party, _)| Removal::Service {
            kind: sweep::SERVICE_PARTY,
            key: NatKey::new((*party, 0), ([0; 4], 0), 0),
            entry: NO_ENTRY,
        })
        .collect()
}

/// The entry a party's removal carries: none (its check is the counts, not a time).
const NO_ENTRY: NatEntry = NatEntry {
    last_seen_ns: 0,
    pod_addr: [0; 4],
    pod_port: 0,
    node_port: 0,
    state: 0,
    seq_seen: 0,
    pad: [0; 2],
    node_addr: [0; 4],
    seq: [0; 2],
};

/// The entries each party near its budget loses: of a party holding more than
/// [`EARLY_DROP_ABOVE`] of `budget` once `gone` are gone, its early-droppable entries
/// (unanswered, opening, closing), least recently seen first, until [`EARLY_DROP_TO`]
/// of it stays.
fn over_budget<K: ItemKey>(
    entries: &StdHashMap<K, NatEntry>,
    gone: &HashSet<K>,
    budget: u32,
) -> Vec<(K, NatEntry)> {
    let budget = budget as usize;
    let mut parties: StdHashMap<[u8; 4], Vec<(K, NatEntry)>> = StdHashMap::new();
    for (key, entry) in entries.iter().filter(|(key, _)| !gone.contains(*key)) {
        parties
            .entry(entry.pod_addr)
            .or_default()
            .push((*key, *entry));
    }
    let mut dropped = Vec::new();
    for held in parties.into_values() {
        if budget == 0 || held.len() * EARLY_DROP_ABOVE.1 <= budget * EARLY_DROP_ABOVE.0 {
            continue;
        }
        let target = budget * EARLY_DROP_TO.0 / EARLY_DROP_TO.1;
        let excess = held.len() - target;
        let mut candidates: Vec<(K, NatEntry)> = held
            .into_iter()
            .filter(|(key, entry)| early_droppable(key.proto(), entry.state))
            .collect();
        candidates.sort_by_key(|(_, entry)| entry.last_seen_ns);
        candidates.truncate(excess);
        dropped.extend(candidates);
    }
    dropped
}

#[cfg(test)]
mod tests {
    use cni_ebpf_common::{
        ip_proto::{TCP, UDP},
        tcp_state,
    };

    use super::*;

    use cni_ebpf_common::test_support::{NOW, SEC};

    const TIMEOUTS: Timeouts = Timeouts {
        tcp_established: 86_400,
        ..cni_ebpf_common::test_support::TIMEOUTS
    };

    fn socket(addr: [u8; 4], port: u16, proto: u8) -> ServiceClient {
        ServiceClient {
            addr,
            port,
            proto,
            pad: 0,
        }
    }

    /// The entry of the socket `addr`:`port`, opened by it (no node side).
    fn entry(addr: [u8; 4], port: u16, state: u8, idle_secs: u64) -> NatEntry {
        let socket = NatKey::new((addr, port), ([0; 4], 0), 0);
        NatEntry::translated(&socket, ([0; 4], 0), state, NOW - idle_secs * SEC)
    }

    fn table(
        entries: &StdHashMap<ServiceClient, NatEntry>,
        pods_only: bool,
    ) -> Table<'_, ServiceClient> {
        Table {
            entries,
            kind: sweep::SERVICE_PEER,
            capacity: 1_000,
            pods_only,
        }
    }

    fn removed_ports(removals: &[Removal]) -> Vec<u16> {
        let mut ports: Vec<u16> = removals
            .iter()
            .map(|removal| match removal {
                Removal::Service { key, .. } => key.pod_port,
                other => panic!("not a Service removal: {other:?}"),
            })
            .collect();
        ports.sort_unstable();
        ports
    }

    #[test]
    fn idle_entries_expire_by_their_state() {
        let addr = [203, 0, 113, 7];
        let entries = StdHashMap::from([
            (
                socket(addr, 1, TCP),
                entry(addr, 1, tcp_state::SYN_SENT, 121),
            ),
            (
                socket(addr, 2, TCP),
                entry(addr, 2, tcp_state::ESTABLISHED, 121),
            ),
            (socket(addr, 3, UDP), entry(addr, 3, 0, 31)),
            (socket(addr, 4, UDP), entry(addr, 4, 0, 29)),
        ]);
        let (removals, early) =
            removals(&table(&entries, false), &HashSet::new(), NOW, &TIMEOUTS, 0);
        assert_eq!(removed_ports(&removals), [1, 3]);
        assert_eq!(early, 0);
    }

    #[test]
    fn a_pods_entries_go_with_it_an_outside_address_has_no_pod() {
        let pod = [10, 244, 1, 5];
        let entries = StdHashMap::from([(
            socket(pod, 1, TCP),
            entry(pod, 1, tcp_state::ESTABLISHED, 0),
        )]);
        let (gone, _) = removals(&table(&entries, true), &HashSet::new(), NOW, &TIMEOUTS, 0);
        assert_eq!(removed_ports(&gone), [1]);
        let (kept, _) = removals(&table(&entries, false), &HashSet::new(), NOW, &TIMEOUTS, 0);
        assert!(kept.is_empty());
        let pods = HashSet::from([pod]);
        let (kept, _) = removals(&table(&entries, true), &pods, NOW, &TIMEOUTS, 0);
        assert!(kept.is_empty());
    }

    #[test]
    fn a_party_near_its_budget_loses_its_own_unanswered_entries_oldest_first() {
        let flooder = [198, 51, 100, 1];
        let other = [198, 51, 100, 2];
        let mut entries = StdHashMap::new();
        // 15 of a budget of 16: above seven eighths. Two of them established.
        for port in 0..15u16 {
            let state = if port < 2 {
                tcp_state::ESTABLISHED
            } else {
                tcp_state::SYN_SENT
            };
            entries.insert(
                socket(flooder, port, TCP),
                entry(flooder, port, state, 100 - u64::from(port)),
            );
        }
        // Another party's unanswered entries, as old, are not its to lose.
        for port in 0..4u16 {
            entries.insert(
                socket(other, port, TCP),
                entry(other, port, tcp_state::SYN_SENT, 110),
            );
        }
        let (removals, early) =
            removals(&table(&entries, false), &HashSet::new(), NOW, &TIMEOUTS, 16);
        // Down to 12 (three quarters): the three oldest unanswered ones, never an
        // established one nor the other party's.
        assert_eq!(early, 3);
        for removal in &removals {
            let Removal::Service { key, entry, .. } = removal else {
                panic!("not a Service removal");
            };
            assert_eq!(key.pod_addr, flooder);
            assert_eq!(entry.state, tcp_state::SYN_SENT);
        }
        assert_eq!(removed_ports(&removals), [2, 3, 4]);
    }

    #[test]
    fn a_full_table_drops_anyones_unanswered_entries_never_an_established_one() {
        let mut entries = StdHashMap::new();
        for port in 0..950u16 {
            let addr = [198, 51, 100, (port % 200) as u8];
            let state = if port % 2 == 0 {
                tcp_state::ESTABLISHED
            } else {
                tcp_state::SYN_SENT
            };
            entries.insert(socket(addr, port, TCP), entry(addr, port, state, 1));
        }
        let (removals, early) =
            removals(&table(&entries, false), &HashSet::new(), NOW, &TIMEOUTS, 0);
        // 950 of 1,000: above seven eighths, down to three quarters.
        assert_eq!(early, 200);
        assert!(removals.iter().all(
            |r| matches!(r, Removal::Service { entry, .. } if entry.state == tcp_state::SYN_SENT)
        ));
    }

    #[test]
    fn only_parties_that_count_nothing_are_forgotten() {
        let empty = ServiceCounts::default();
        let holding = ServiceCounts {
            peers: 1,
            ..ServiceCounts::default()
        };
        let parties = StdHashMap::from([([192, 0, 2, 1], empty), ([192, 0, 2, 2], holding)]);
        let gone = forgotten(&parties);
        assert_eq!(gone.len(), 1);
        let Removal::Service { kind, key, .. } = gone[0] else {
            panic!("not a Service removal");
        };
        assert_eq!((kind, key.pod_addr), (sweep::SERVICE_PARTY, [192, 0, 2, 1]));
    }
}
