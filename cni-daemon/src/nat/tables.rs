//! The NAT maps the daemon owns: the configuration it writes, the cluster ranges it keeps
//! in step with the endpoints, and the two flow tables it sweeps.

use std::collections::HashMap as StdHashMap;

use aya::maps::{Array, HashMap, MapData, MapError};
use cni_ebpf_common::{NatConfig, NatEntry, NatKey, NatReverseKey};

use super::{
    NatSettings,
    args::Timeouts,
    cidrs::{self, ClusterCidrs},
    expiry,
};
use crate::api::Endpoint;

/// `NAT_OUT`: the pod side of each flow.
pub type FlowsOut = HashMap<MapData, NatKey, NatEntry>;
/// `NAT_IN`: the node side of each flow.
pub type FlowsIn = HashMap<MapData, NatReverseKey, NatEntry>;

/// Most entries one sweep reads from a table. Iterating a hash map that the datapath
/// changes meanwhile can restart from its first key; this keeps a sweep finite.
const MAX_SCAN: usize = 1 << 20;

/// The NAT maps, taken from the loaded object (see `Datapath::take_nat_maps`).
pub struct NatMaps {
    pub flows_out: FlowsOut,
    pub flows_in: FlowsIn,
    pub config: Array<MapData, NatConfig>,
    pub cluster_cidrs: ClusterCidrs,
}

/// What one sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Flows whose `NAT_OUT` entry (and `NAT_IN` pair) expired.
    pub flows: usize,
    /// Expired `NAT_IN` entries whose `NAT_OUT` pair was gone (evicted by the LRU).
    pub orphans: usize,
}

/// Source NAT as this daemon runs it: its settings (none: NAT is off) and its maps.
pub struct Nat {
    config: Array<MapData, NatConfig>,
    cluster_cidrs: ClusterCidrs,
    /// The flow tables, until the sweeper takes them ([`Self::take_flows`]).
    flows: Option<Flows>,
    settings: Option<NatSettings>,
    /// `NAT_CONFIG` as the previous daemon left it.
    previous: NatConfig,
}

impl Nat {
    pub fn open(maps: NatMaps, settings: Option<NatSettings>) -> Result<Self, MapError> {
        let NatMaps {
            flows_out,
            flows_in,
            config,
            cluster_cidrs,
        } = maps;
        let previous = config.get(&0, 0)?;
        Ok(Self {
            config,
            cluster_cidrs,
            flows: Some(Flows {
                out: flows_out,
                inbound: flows_in,
            }),
            settings,
            previous,
        })
    }

    pub fn settings(&self) -> Option<&NatSettings> {
        self.settings.as_ref()
    }

    /// The uplink the previous daemon attached to (0: none), whose pinned links may
    /// still be there.
    pub fn previous_uplink_ifindex(&self) -> u32 {
        self.previous.uplink_ifindex
    }

    /// Writes this daemon's configuration; with NAT off, a zero configuration (node
    /// address 0.0.0.0) and empty flow tables.
    pub fn write_config(&mut self) -> Result<(), MapError> {
        let config = self
            .settings
            .as_ref()
            .map_or_else(NatConfig::default, NatSettings::config);
        self.config.set(0, config, 0)?;
        if let (None, Some(flows)) = (&self.settings, &mut self.flows) {
            flows.flush()?;
        }
        Ok(())
    }

    /// Makes `CLUSTER_CIDRS` the union of `endpoints`' cluster ranges.
    pub fn sync_cluster_cidrs<'a>(
        &mut self,
        endpoints: impl IntoIterator<Item = &'a Endpoint>,
    ) -> Result<(), MapError> {
        cidrs::sync(&mut self.cluster_cidrs, &cidrs::union(endpoints))
    }

    /// Hands the flow tables, with the timeouts that decide their expiry, to the sweeper
    /// (`None` when NAT is off, or once taken).
    pub fn take_flows(&mut self) -> Option<(Flows, Timeouts)> {
        let timeouts = self.settings.as_ref()?.timeouts;
        Some((self.flows.take()?, timeouts))
    }
}

/// The two flow tables, as the sweeper owns them. A sweep needs nothing else of the
/// node, so it runs without the node's lock: one of 100,000 flows takes ~0.3 s (about
/// ten map syscalls a flow), which ADD and DEL would otherwise wait for.
pub struct Flows {
    out: FlowsOut,
    inbound: FlowsIn,
}

impl Flows {
    /// Removes every flow idle for longer than its timeout at `now_ns` (CLOCK_MONOTONIC),
    /// both entries of a pair together.
    pub fn sweep(&mut self, now_ns: u64, timeouts: &Timeouts) -> Result<Sweep, MapError> {
        let mut sweep = Sweep::default();
        for (key, out) in scan(&self.out)? {
            let reverse = key.reverse(out.node_port);
            // A NAT_IN entry for another pod's flow is not this flow's pair.
            let inbound = get(&self.inbound, &reverse)?
                .filter(|e| e.pod_addr == key.pod_addr && e.pod_port == key.pod_port);
            let decided = *expiry::latest(&out, inbound.as_ref());
            if !expiry::is_expired(&decided, key.proto, now_ns, timeouts) {
                continue;
            }
            // The datapath may have refreshed an entry since it was read: only entries
            // that saw no packet after the decision go. NAT_OUT first, so a port is never
            // free in NAT_IN while NAT_OUT still hands it out.
            if remove_if_idle(&mut self.out, &key, &decided)? {
                if inbound.is_some() {
                    remove_if_idle(&mut self.inbound, &reverse, &decided)?;
                }
                sweep.flows += 1;
            }
        }
        for (reverse, inbound) in scan(&self.inbound)? {
            let key = reverse.forward(&inbound);
            let paired =
                get(&self.out, &key)?.is_some_and(|out| out.node_port == reverse.node_port);
            if !paired
                && expiry::is_expired(&inbound, reverse.proto, now_ns, timeouts)
                && remove_if_idle(&mut self.inbound, &reverse, &inbound)?
            {
                sweep.orphans += 1;
            }
        }
        Ok(sweep)
    }

    /// Empties both flow tables (NAT is off: no program uses them).
    fn flush(&mut self) -> Result<(), MapError> {
        for (key, _) in scan(&self.out)? {
            crate::maps::removed(self.out.remove(&key))?;
        }
        for (key, _) in scan(&self.inbound)? {
            crate::maps::removed(self.inbound.remove(&key))?;
        }
        Ok(())
    }
}

/// Every entry of `map`, each key once, at most [`MAX_SCAN`].
fn scan<K, V>(map: &HashMap<MapData, K, V>) -> Result<Vec<(K, V)>, MapError>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod,
{
    let mut entries = StdHashMap::new();
    for entry in map.iter().take(MAX_SCAN) {
        let (key, value) = entry?;
        entries.insert(key, value);
    }
    Ok(entries.into_iter().collect())
}

fn get<K: aya::Pod>(
    map: &HashMap<MapData, K, NatEntry>,
    key: &K,
) -> Result<Option<NatEntry>, MapError> {
    match map.get(key, 0) {
        Ok(entry) => Ok(Some(entry)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Removes `key` unless its entry saw a packet after `decided`'s; returns whether it
/// is gone.
fn remove_if_idle<K: aya::Pod>(
    map: &mut HashMap<MapData, K, NatEntry>,
    key: &K,
    decided: &NatEntry,
) -> Result<bool, MapError> {
    match get(map, key)? {
        Some(now) if now.last_seen_ns > decided.last_seen_ns => Ok(false),
        Some(_) => crate::maps::removed(map.remove(key)).map(|()| true),
        None => Ok(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            pad: [0; 7],
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
