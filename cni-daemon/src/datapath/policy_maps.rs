//! The NetworkPolicy maps (`cni_ebpf_common::policy`), held by the node's policy state
//! (`model::policy`), which writes what it compiled into them as differences.

use aya::maps::{
    Array, HashMap, LpmTrie, MapData, MapError, PerCpuHashMap, lpm_trie::Key as LpmKey,
};
use cni_ebpf_common::{
    AddrKey, PolicyConfig, PolicyCounters, PolicyEndpoint, RuleKey, RuleValue, map_names,
};

use super::{Datapath, DatapathError};

/// The maps, typed.
pub struct PolicyMaps {
    ids: LpmTrie<MapData, AddrKey, u32>,
    rules: LpmTrie<MapData, RuleKey, RuleValue>,
    endpoints: HashMap<MapData, u32, PolicyEndpoint>,
    config: Array<MapData, PolicyConfig>,
    stats: PerCpuHashMap<MapData, u32, PolicyCounters>,
}

impl Datapath {
    /// Hands the policy maps to their owner.
    pub fn take_policy_maps(&mut self) -> Result<PolicyMaps, DatapathError> {
        let mut take = |name: &'static str| {
            self.ebpf
                .take_map(name)
                .ok_or(DatapathError::MissingMap(name))
        };
        Ok(PolicyMaps {
            ids: LpmTrie::try_from(take(map_names::POLICY_IDS)?)?,
            rules: LpmTrie::try_from(take(map_names::POLICY_RULES)?)?,
            endpoints: HashMap::try_from(take(map_names::POLICY_ENDPOINTS)?)?,
            config: Array::try_from(take(map_names::POLICY_CONFIG)?)?,
            stats: PerCpuHashMap::try_from(take(map_names::POLICY_STATS)?)?,
        })
    }
}

impl PolicyMaps {
    pub fn set_identity(&mut self, prefix_len: u32, key: AddrKey, id: u32) -> Result<(), MapError> {
        self.ids.insert(&LpmKey::new(prefix_len, key), id, 0)
    }

    pub fn remove_identity(&mut self, prefix_len: u32, key: AddrKey) -> Result<(), MapError> {
        crate::maps::removed(self.ids.remove(&LpmKey::new(prefix_len, key)))
    }

    pub fn set_rule(
        &mut self,
        prefix_len: u32,
        key: RuleKey,
        value: RuleValue,
    ) -> Result<(), MapError> {
        self.rules.insert(&LpmKey::new(prefix_len, key), value, 0)
    }

    pub fn remove_rule(&mut self, prefix_len: u32, key: RuleKey) -> Result<(), MapError> {
        crate::maps::removed(self.rules.remove(&LpmKey::new(prefix_len, key)))
    }

    pub fn set_endpoint(&mut self, ifindex: u32, endpoint: PolicyEndpoint) -> Result<(), MapError> {
        self.endpoints.insert(ifindex, endpoint, 0)
    }

    pub fn remove_endpoint(&mut self, ifindex: u32) -> Result<(), MapError> {
        crate::maps::removed(self.endpoints.remove(&ifindex))
    }

    /// What the maps hold now, for a daemon that starts over pins a previous one filled:
    /// its identities, rules and endpoints (each with its prefix length).
    pub fn contents(&self) -> Contents {
        Contents {
            ids: self
                .ids
                .iter()
                .filter_map(Result::ok)
                .map(|(key, id)| ((key.prefix_len(), key.data()), id))
                .collect(),
            rules: self
                .rules
                .iter()
                .filter_map(Result::ok)
                .map(|(key, value)| ((key.prefix_len(), key.data()), value))
                .collect(),
            endpoints: self.endpoints.iter().filter_map(Result::ok).collect(),
        }
    }

    pub fn config(&self) -> Result<PolicyConfig, MapError> {
        self.config.get(&0, 0)
    }

    pub fn set_config(&mut self, config: PolicyConfig) -> Result<(), MapError> {
        self.config.set(0, config, 0)
    }

    /// Each policy slot's counters, summed over the CPUs.
    pub fn counters(&self) -> Vec<(u32, PolicyCounters)> {
        self.stats
            .iter()
            .filter_map(Result::ok)
            .map(|(slot, per_cpu)| {
                let mut sum = PolicyCounters::default();
                for counters in per_cpu.iter() {
                    sum.allowed += counters.allowed;
                    sum.denied += counters.denied;
                    sum.audited += counters.audited;
                }
                (slot, sum)
            })
            .collect()
    }

    /// Forgets a slot's counters (its policy is gone, and the slot may be given again).
    pub fn forget_counters(&mut self, slot: u32) -> Result<(), MapError> {
        crate::maps::removed(self.stats.remove(&slot))
    }
}

/// What [`PolicyMaps::contents`] read.
#[derive(Debug, Default)]
pub struct Contents {
    pub ids: Vec<((u32, AddrKey), u32)>,
    pub rules: Vec<((u32, RuleKey), RuleValue)>,
    pub endpoints: Vec<(u32, PolicyEndpoint)>,
}
