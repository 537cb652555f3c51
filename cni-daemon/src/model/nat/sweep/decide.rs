//! What a sweep removes, decided on a snapshot of the tables (pure functions): a flow is
//! as fresh as the latest of its two entries, and expires by the rule the datapath
//! applies too (`cni_ebpf_common::Timeouts::expired`).

use std::collections::{HashMap as StdHashMap, HashSet};

use cni_ebpf_common::{NatEntry, NatKey, NatReverseKey, flow::early_droppable};

use crate::model::nat::{Timeouts, expiry};

/// What a sweep removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Removal {
    /// An expired flow: its `NAT_OUT` entry and, when it has one, its `NAT_IN` pair;
    /// `decided` is the fresher of the two, which each must not have outlived.
    Flow {
        key: NatKey,
        reverse: Option<NatReverseKey>,
        decided: NatEntry,
    },
    /// An expired `NAT_IN` entry whose `NAT_OUT` pair is gone (removed while a reply
    /// refreshed this one, or its port taken over).
    Orphan {
        reverse: NatReverseKey,
        entry: NatEntry,
    },
    /// An expired note of `NAT_INBOUND`, or one of a pod gone.
    FromOutside { key: NatKey, note: NatEntry },
    /// An expired connection of `HOSTPORT_FLOWS`, or one of a pod gone.
    HostPort { key: NatKey, entry: NatEntry },
    /// An entry of a Service table (`kind`: its `nat_sweep` kind; `key`: its socket as
    /// a flow key, or its flow), expired, of a pod gone, or early-dropped.
    Service {
        kind: u8,
        key: NatKey,
        entry: NatEntry,
    },
}

/// The flows of a snapshot of both tables that are idle past their timeout at `now_ns`,
/// or whose pod is not among `pods` (the node's pod addresses) any more. A flow is as
/// fresh as the latest of its two entries; a `NAT_IN` entry is a flow's pair only when
/// it holds that flow's pod address and port (the port may have passed to another flow
/// since).
pub(super) fn expired(
    out: &StdHashMap<NatKey, NatEntry>,
    inbound: &StdHashMap<NatReverseKey, NatEntry>,
    pods: &HashSet<[u8; 4]>,
    now_ns: u64,
    timeouts: &Timeouts,
) -> Vec<Removal> {
    let gone = |entry: &NatEntry| !pods.contains(&entry.pod_addr);
    let mut removals = Vec::new();
    for (key, entry) in out {
        let reverse = key.reverse(entry.node_port);
        let pair = inbound
            .get(&reverse)
            .filter(|e| e.pod_addr == key.pod_addr && e.pod_port == key.pod_port);
        let decided = *expiry::latest(entry, pair);
        if gone(&decided) || timeouts.expired(&decided, key.proto, now_ns) {
            removals.push(Removal::Flow {
                key: *key,
                reverse: pair.map(|_| reverse),
                decided,
            });
        }
    }
    for (reverse, entry) in inbound {
        let paired = out
            .get(&reverse.forward(entry))
            .is_some_and(|out| out.node_port == reverse.node_port);
        if !paired && (gone(entry) || timeouts.expired(entry, reverse.proto, now_ns)) {
            removals.push(Removal::Orphan {
                reverse: *reverse,
                entry: *entry,
            });
        }
    }
    removals
}

/// How full a table may stay after a sweep before early drop makes room (a fraction of
/// its capacity), and down to how full early drop takes it: seven eighths and three
/// quarters. The datapath refuses new flows only at the brim, so a sweep that leaves a
/// table below seven eighths leaves room for every new flow until the next one.
pub(super) const EARLY_DROP_ABOVE: (usize, usize) = (7, 8);
pub(super) const EARLY_DROP_TO: (usize, usize) = (3, 4);

/// Early drop, as conntrack's: when more than [`EARLY_DROP_ABOVE`] of `capacity` would
/// stay in a table of `entries` after the removals decided (`gone`, keys of that
/// table), the flows [`early_droppable`] (unanswered, opening, closing), least recently
/// seen first, until [`EARLY_DROP_TO`] stays; never an established TCP connection nor
/// an answered UDP flow. Each comes with the entry decided on (the fresher of a flow's
/// two); the caller makes them removals.
pub(super) fn early_drop<'a, K: Eq + std::hash::Hash + Copy + 'a>(
    entries: impl Iterator<Item = (K, NatEntry, u8)> + 'a,
    count: usize,
    gone: &HashSet<K>,
    capacity: usize,
) -> Vec<(K, NatEntry)> {
    let staying = count.saturating_sub(gone.len());
    if staying * EARLY_DROP_ABOVE.1 <= capacity * EARLY_DROP_ABOVE.0 {
        return Vec::new();
    }
    let target = capacity * EARLY_DROP_TO.0 / EARLY_DROP_TO.1;
    let mut candidates: Vec<(K, NatEntry)> = entries
        .filter(|(key, entry, proto)| !gone.contains(key) && early_droppable(*proto, entry.state))
        .map(|(key, entry, _)| (key, entry))
        .collect();
    candidates.sort_by_key(|(_, entry)| entry.last_seen_ns);
    candidates.truncate(staying.saturating_sub(target));
    candidates
}

/// The entries of `table` (`NAT_INBOUND`'s notes or `HOSTPORT_FLOWS`'s connections,
/// keyed from the pod's side) idle past their timeout at `now_ns`, or whose pod is not
/// among `pods` any more.
pub(super) fn expired_notes<'a>(
    table: &'a StdHashMap<NatKey, NatEntry>,
    pods: &'a HashSet<[u8; 4]>,
    now_ns: u64,
    timeouts: &'a Timeouts,
) -> impl Iterator<Item = (NatKey, NatEntry)> + 'a {
    table
        .iter()
        .filter(move |(key, entry)| {
            !pods.contains(&entry.pod_addr) || timeouts.expired(entry, key.proto, now_ns)
        })
        .map(|(key, entry)| (*key, *entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    use cni_ebpf_common::test_support::{NOW, SEC, TIMEOUTS};

    /// The pods of the node: the one pod the flows below belong to.
    fn pods() -> HashSet<[u8; 4]> {
        HashSet::from([[10, 244, 1, 2]])
    }

    fn flow(pod_port: u16) -> NatKey {
        NatKey {
            pod_addr: [10, 244, 1, 2],
            remote_addr: [198, 18, 0, 9],
            pod_port,
            remote_port: 443,
            proto: 17,
            pad: [0; 3],
        }
    }

    /// A UDP flow's entry (30 s timeout), idle for `idle_secs`.
    fn entry(key: &NatKey, node_port: u16, idle_secs: u64) -> NatEntry {
        NatEntry::translated(key, ([198, 18, 0, 1], node_port), 0, NOW - idle_secs * SEC)
    }

    fn tables(
        flows: &[(NatKey, NatEntry, Option<NatEntry>)],
    ) -> (
        StdHashMap<NatKey, NatEntry>,
        StdHashMap<NatReverseKey, NatEntry>,
    ) {
        let out = flows.iter().map(|(key, out, _)| (*key, *out)).collect();
        let inbound = flows
            .iter()
            .filter_map(|(key, out, inbound)| inbound.map(|e| (key.reverse(out.node_port), e)))
            .collect();
        (out, inbound)
    }

    #[test]
    fn an_idle_flow_goes_with_its_pair_and_a_live_one_stays() {
        let (idle, live) = (flow(1000), flow(1001));
        let (out, inbound) = tables(&[
            (idle, entry(&idle, 2000, 31), Some(entry(&idle, 2000, 40))),
            (live, entry(&live, 2001, 29), Some(entry(&live, 2001, 29))),
        ]);
        assert_eq!(
            expired(&out, &inbound, &pods(), NOW, &TIMEOUTS),
            [Removal::Flow {
                key: idle,
                reverse: Some(idle.reverse(2000)),
                decided: entry(&idle, 2000, 31),
            }]
        );
    }

    #[test]
    fn a_live_flow_of_a_pod_that_is_gone_goes_with_its_pair_and_its_orphans() {
        let (flowing, orphaned) = (flow(1000), flow(1001));
        let (out, mut inbound) = tables(&[(
            flowing,
            entry(&flowing, 2000, 1),
            Some(entry(&flowing, 2000, 1)),
        )]);
        inbound.insert(orphaned.reverse(2001), entry(&orphaned, 2001, 1));
        let mut removals = expired(&out, &inbound, &HashSet::new(), NOW, &TIMEOUTS);
        removals.sort_by_key(|removal| matches!(removal, Removal::Orphan { .. }));
        assert_eq!(
            removals,
            [
                Removal::Flow {
                    key: flowing,
                    reverse: Some(flowing.reverse(2000)),
                    decided: entry(&flowing, 2000, 1),
                },
                Removal::Orphan {
                    reverse: orphaned.reverse(2001),
                    entry: entry(&orphaned, 2001, 1),
                },
            ]
        );
        assert_eq!(
            expired(&out, &inbound, &pods(), NOW, &TIMEOUTS),
            [],
            "while the pod is there, fresh entries stay"
        );
    }

    #[test]
    fn a_recent_reply_keeps_a_flow_whose_outbound_entry_is_old() {
        let key = flow(1000);
        let (out, inbound) = tables(&[(key, entry(&key, 2000, 60), Some(entry(&key, 2000, 5)))]);
        assert_eq!(expired(&out, &inbound, &pods(), NOW, &TIMEOUTS), []);
    }

    #[test]
    fn a_port_held_by_another_flow_is_not_this_flows_pair() {
        // `old` expired and its node port 2000 passed to `new` (another pod port).
        let (old, new) = (flow(1000), flow(1001));
        let mut out = StdHashMap::from([(old, entry(&old, 2000, 31)), (new, entry(&new, 2000, 1))]);
        let inbound = StdHashMap::from([(new.reverse(2000), entry(&new, 2000, 1))]);
        let removals = expired(&out, &inbound, &pods(), NOW, &TIMEOUTS);
        assert_eq!(
            removals,
            [Removal::Flow {
                key: old,
                reverse: None,
                decided: entry(&old, 2000, 31),
            }],
            "the old flow goes alone; the new flow's NAT_IN entry stays"
        );
        out.remove(&new);
        assert_eq!(
            expired(&out, &inbound, &pods(), NOW, &TIMEOUTS).len(),
            1,
            "a fresh entry without its pair is not removed as an orphan yet"
        );
    }

    #[test]
    fn an_expired_entry_without_its_pair_goes_as_an_orphan() {
        let key = flow(1000);
        let orphan = entry(&key, 2000, 31);
        let inbound = StdHashMap::from([(key.reverse(2000), orphan)]);
        assert_eq!(
            expired(&StdHashMap::new(), &inbound, &pods(), NOW, &TIMEOUTS),
            [Removal::Orphan {
                reverse: key.reverse(2000),
                entry: orphan,
            }]
        );
    }

    #[test]
    fn early_drop_takes_unanswered_flows_oldest_first_and_never_a_stream() {
        // 16 flows in a table of 16: 8 streams, 8 never answered, of various ages.
        let mut table = Vec::new();
        for port in 0..16u16 {
            let key = flow(1000 + port);
            let mut e = entry(&key, 2000 + port, u64::from(port));
            e.state = if port % 2 == 0 {
                cni_ebpf_common::udp_state::STREAM
            } else {
                0
            };
            table.push((key, e, 17));
        }
        let dropped = early_drop(table.iter().copied(), 16, &HashSet::new(), 16);
        // Down to three quarters (12): four go, the oldest unanswered ones.
        let ports: Vec<u16> = dropped.iter().map(|(key, _)| key.pod_port).collect();
        assert_eq!(ports, [1015, 1013, 1011, 1009], "idle longest first");
        assert!(dropped.iter().all(|(_, e)| e.state == 0), "streams stay");
        // Removals already decided count: 3 gone leave 13, below 7/8 of 16.
        let gone: HashSet<NatKey> = [flow(1000), flow(1002), flow(1004)].into();
        assert_eq!(early_drop(table.iter().copied(), 16, &gone, 16), []);
        // A table of streams only: nothing to take, however full.
        let answered: Vec<_> = table
            .iter()
            .filter(|(_, e, _)| e.state != 0)
            .copied()
            .collect();
        assert_eq!(
            early_drop(answered.iter().copied(), 8, &HashSet::new(), 8),
            []
        );
    }

    #[test]
    fn reverse_and_forward_keys_name_the_same_flow() {
        let key = NatKey {
            pod_addr: [10, 244, 1, 2],
            remote_addr: [198, 18, 0, 9],
            pod_port: 40000,
            remote_port: 443,
            proto: 6,
            pad: [0; 3],
        };
        let entry = NatEntry {
            last_seen_ns: 1,
            pod_addr: key.pod_addr,
            pod_port: key.pod_port,
            node_port: 61007,
            state: 2,
            seq_seen: 0,
            pad: [0; 2],
            seq: [0; 2],
            node_addr: [198, 18, 0, 1],
        };
        let reverse = key.reverse(entry.node_port);
        assert_eq!(
            reverse,
            NatReverseKey {
                remote_addr: [198, 18, 0, 9],
                node_port: 61007,
                remote_port: 443,
                proto: 6,
                pad: [0; 3],
            }
        );
        assert_eq!(reverse.forward(&entry), key);
    }
}
