//! NetworkPolicy on this node: the objects the policy source gives
//! (`cni_policy::parse::Objects`), compiled for this node's pods and written into the
//! datapath's policy maps as differences (identities and ways in before the pods they
//! isolate, stale ones out after), then a new generation, which has every flow's
//! verdicts asked again.
//!
//! This node's pods are its endpoints whose runtime named their Kubernetes pod
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`); their addresses are the endpoints', whatever
//! the Pod object says yet. A pod the source does not hold (yet) is taken with its
//! namespace and no labels: the policies selecting every pod of its namespace isolate
//! it from its first packet, those selecting by label once its object arrives.
//! Endpoints without a Kubernetes pod are never isolated.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Arc,
};

use aya::maps::MapError;
use cni_api::values::Protocol;
use cni_ebpf_common::{
    AddrKey, PolicyConfig, PolicyEndpoint, RuleKey, RuleValue, ip_proto,
    policy::{FAMILY_IPV6, RULE_ANY_PROTOCOL_BITS, RULE_PROTOCOL_BITS, direction, isolated, mode},
};
use cni_policy::{Cluster, Direction, Entry, Identities, Pod, Policy, compile, parse::Objects};
use ipnet::IpNet;

use crate::{datapath::policy_maps::PolicyMaps, model::record::EndpointRecord};

/// Where policies come from and how they are taken (`ebpf-cnid run`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PolicyArgs {
    /// NetworkPolicies, with the Namespaces and Pods they select, from a file as
    /// Kubernetes prints them: a `List` (or `NamespaceList`, `PodList`,
    /// `NetworkPolicyList`), JSON or YAML, several YAML documents too. Changes to it
    /// (written in place or replaced by a rename) take effect within a second; an
    /// object that does not check is refused alone, and a file that does not read
    /// keeps the last good one in force. Without it, they come from the Kubernetes API
    /// when the nodes do (`--kubeconfig`, or in a pod); else no pod is isolated.
    #[arg(long, env = "EBPF_CNID_POLICY_FILE")]
    pub policy_file: Option<std::path::PathBuf>,
    /// `enforce`: what no policy lets through is dropped. `audit`: it is counted
    /// (`ebpf_cni_policy_audited_total`) and let through, for rolling policies out.
    #[arg(long, env = "EBPF_CNID_POLICY_MODE", value_enum, default_value_t = PolicyMode::Enforce)]
    pub policy_mode: PolicyMode,
}

/// `--policy-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PolicyMode {
    /// What no policy lets through is dropped.
    #[default]
    Enforce,
    /// It is counted and let through.
    Audit,
}

/// Where the node stands with its policy source.
#[derive(Debug, Clone)]
enum Source {
    /// No source: nothing is isolated.
    None,
    /// A source that has not answered yet: the maps keep what they hold.
    Pending,
    Ready(Arc<Objects>),
}

/// What one sync wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    /// Identities, ways and endpoints written or removed.
    pub changes: usize,
    /// This node's pods isolated in some direction.
    pub isolated: usize,
}

/// The policy state of the node, and the maps it is written in.
pub struct Policies {
    maps: PolicyMaps,
    source: Source,
    identities: Identities,
    /// Each policy's counters slot, by namespace and name.
    slots: BTreeMap<(String, String), u32>,
    written: Written,
    config: PolicyConfig,
}

/// What the maps hold, as written.
#[derive(Debug, Default, PartialEq, Eq)]
struct Written {
    ids: HashMap<(u32, AddrKey), u32>,
    rules: HashMap<(u32, RuleKey), RuleValue>,
    endpoints: HashMap<u32, PolicyEndpoint>,
}

impl Policies {
    /// Takes over the maps as a previous daemon left them (they stay in force until the
    /// first sync), in `mode`; `has_source`: whether a policy source will answer.
    pub fn open(maps: PolicyMaps, policy_mode: PolicyMode, has_source: bool) -> Self {
        let contents = maps.contents();
        let previous = maps.config().unwrap_or_default();
        Self {
            written: Written {
                ids: contents.ids.into_iter().collect(),
                rules: contents.rules.into_iter().collect(),
                endpoints: contents.endpoints.into_iter().collect(),
            },
            maps,
            source: if has_source {
                Source::Pending
            } else {
                Source::None
            },
            identities: Identities::default(),
            slots: BTreeMap::new(),
            config: PolicyConfig {
                generation: previous.generation,
                mode: match policy_mode {
                    PolicyMode::Enforce => mode::ENFORCE,
                    PolicyMode::Audit => mode::AUDIT,
                },
            },
        }
    }

    /// Takes the source's objects (applied at the next [`Self::sync`]).
    pub fn set_objects(&mut self, objects: Arc<Objects>) {
        self.source = Source::Ready(objects);
    }

    /// The objects in force, when the source has answered.
    pub fn objects(&self) -> Option<&Arc<Objects>> {
        match &self.source {
            Source::Ready(objects) => Some(objects),
            Source::None | Source::Pending => None,
        }
    }

    /// Each policy's counters slot.
    pub fn slots(&self) -> &BTreeMap<(String, String), u32> {
        &self.slots
    }

    pub fn maps(&self) -> &PolicyMaps {
        &self.maps
    }

    /// Compiles the policies for `endpoints` (this node's) and writes the differences.
    /// Nothing changes while the source has not answered.
    pub fn sync<'a>(
        &mut self,
        endpoints: impl IntoIterator<Item = &'a EndpointRecord>,
    ) -> Result<Synced, MapError> {
        let desired = match &self.source {
            Source::Pending => return Ok(Synced::default()),
            Source::None => Written::default(),
            Source::Ready(objects) => {
                let objects = Arc::clone(objects);
                self.desired(&objects, endpoints)
            }
        };
        let isolated = desired.endpoints.len();
        let changes = self.write(desired)?;
        if changes > 0 {
            self.config.generation = self.config.generation.wrapping_add(1);
        }
        // Written every time: the mode may be new even when the ways are not.
        self.maps.set_config(self.config)?;
        Ok(Synced { changes, isolated })
    }

    /// What the maps should hold for `objects` and `endpoints`.
    fn desired<'a>(
        &mut self,
        objects: &Objects,
        endpoints: impl IntoIterator<Item = &'a EndpointRecord>,
    ) -> Written {
        let mut pods: Vec<Pod> = objects.pods.clone();
        let mut by_name: HashMap<(String, String), usize> = pods
            .iter()
            .enumerate()
            .map(|(index, pod)| ((pod.namespace.clone(), pod.name.clone()), index))
            .collect();
        let mut local = Vec::new();
        let mut ifindexes = Vec::new();
        for endpoint in endpoints {
            let Some((namespace, name)) = endpoint
                .pod
                .as_ref()
                .and_then(|pod| Some((pod.namespace.clone()?, pod.name.clone()?)))
            else {
                continue;
            };
            let index = *by_name
                .entry((namespace.clone(), name.clone()))
                .or_insert_with(|| {
                    pods.push(Pod {
                        namespace,
                        name,
                        ..Pod::default()
                    });
                    pods.len() - 1
                });
            for addr in endpoint.ips.iter().map(IpNet::addr) {
                if !pods[index].addrs.contains(&addr) {
                    pods[index].addrs.push(addr);
                }
            }
            local.push(index);
            ifindexes.push(endpoint.host_ifindex);
        }
        self.assign_slots(&objects.policies);
        let cluster = Cluster {
            namespaces: &objects.namespaces,
            pods: &pods,
            policies: &objects.policies,
        };
        let compiled = compile(cluster, &local, &mut self.identities);
        let mut desired = Written::default();
        for (prefix, id) in &compiled.addresses {
            desired.ids.insert(addr_key(prefix), *id);
        }
        for (endpoint, ifindex) in compiled.endpoints.iter().zip(ifindexes) {
            let pod = &pods[endpoint.pod];
            let mut entry = PolicyEndpoint::default();
            for (way, entries, bit) in [
                (direction::INGRESS, &endpoint.ingress, isolated::INGRESS),
                (direction::EGRESS, &endpoint.egress, isolated::EGRESS),
            ] {
                let Some(entries) = entries else { continue };
                entry.isolated |= bit;
                let by = isolating(&objects.policies, pod, way)
                    .map_or(0, |policy| self.slot_of(&objects.policies[policy]));
                if way == direction::INGRESS {
                    entry.ingress_policy = by;
                } else {
                    entry.egress_policy = by;
                }
                for rule in entries {
                    let value = RuleValue {
                        policy: self.slot_of(&objects.policies[rule.policy]),
                    };
                    desired
                        .rules
                        .entry(rule_key(ifindex, way, rule))
                        .or_insert(value);
                }
            }
            if entry.isolated != 0 {
                desired.endpoints.insert(ifindex, entry);
            }
        }
        desired
    }

    /// Gives each policy a counters slot, keeping the ones they had; the slots of
    /// policies gone are taken back, their counters forgotten.
    fn assign_slots(&mut self, policies: &[Policy]) {
        let present: std::collections::BTreeSet<(String, String)> = policies
            .iter()
            .map(|policy| (policy.namespace.clone(), policy.name.clone()))
            .collect();
        let gone: Vec<(String, String)> = self
            .slots
            .keys()
            .filter(|key| !present.contains(*key))
            .cloned()
            .collect();
        for key in gone {
            if let Some(slot) = self.slots.remove(&key)
                && let Err(error) = self.maps.forget_counters(slot)
            {
                tracing::warn!(%error, slot, "cannot forget a removed policy's counters");
            }
        }
        let mut used: std::collections::BTreeSet<u32> = self.slots.values().copied().collect();
        let mut next = 0;
        for key in present {
            if self.slots.contains_key(&key) {
                continue;
            }
            while used.contains(&next) {
                next += 1;
            }
            used.insert(next);
            self.slots.insert(key, next);
        }
    }

    fn slot_of(&self, policy: &Policy) -> u32 {
        self.slots
            .get(&(policy.namespace.clone(), policy.name.clone()))
            .copied()
            .unwrap_or(0)
    }

    /// Writes the differences between what is written and `desired`: additions first,
    /// then the endpoints, then removals. Returns how many entries changed.
    fn write(&mut self, desired: Written) -> Result<usize, MapError> {
        let mut changes = 0;
        for (key, id) in &desired.ids {
            if self.written.ids.get(key) != Some(id) {
                self.maps.set_identity(key.0, key.1, *id)?;
                self.written.ids.insert(*key, *id);
                changes += 1;
            }
        }
        for (key, value) in &desired.rules {
            if self.written.rules.get(key) != Some(value) {
                self.maps.set_rule(key.0, key.1, *value)?;
                self.written.rules.insert(*key, *value);
                changes += 1;
            }
        }
        for (ifindex, endpoint) in &desired.endpoints {
            if self.written.endpoints.get(ifindex) != Some(endpoint) {
                self.maps.set_endpoint(*ifindex, *endpoint)?;
                self.written.endpoints.insert(*ifindex, *endpoint);
                changes += 1;
            }
        }
        let gone: Vec<u32> = self
            .written
            .endpoints
            .keys()
            .filter(|ifindex| !desired.endpoints.contains_key(*ifindex))
            .copied()
            .collect();
        for ifindex in gone {
            self.maps.remove_endpoint(ifindex)?;
            self.written.endpoints.remove(&ifindex);
            changes += 1;
        }
        let gone: Vec<(u32, RuleKey)> = self
            .written
            .rules
            .keys()
            .filter(|key| !desired.rules.contains_key(*key))
            .copied()
            .collect();
        for key in gone {
            self.maps.remove_rule(key.0, key.1)?;
            self.written.rules.remove(&key);
            changes += 1;
        }
        let gone: Vec<(u32, AddrKey)> = self
            .written
            .ids
            .keys()
            .filter(|key| !desired.ids.contains_key(*key))
            .copied()
            .collect();
        for key in gone {
            self.maps.remove_identity(key.0, key.1)?;
            self.written.ids.remove(&key);
            changes += 1;
        }
        Ok(changes)
    }
}

/// The first policy isolating `pod` for `way` (its counters take what no way lets
/// through).
fn isolating(policies: &[Policy], pod: &Pod, way: u8) -> Option<usize> {
    let wanted = if way == direction::INGRESS {
        Direction::Ingress
    } else {
        Direction::Egress
    };
    policies.iter().position(|policy| {
        policy.rules(wanted).is_some()
            && policy.namespace == pod.namespace
            && policy.selects.matches(&pod.labels)
    })
}

/// The `POLICY_IDS` key of `prefix`, with its prefix length.
fn addr_key(prefix: &IpNet) -> (u32, AddrKey) {
    let key = match prefix.addr() {
        IpAddr::V4(v4) => AddrKey::ipv4(v4.octets()),
        IpAddr::V6(v6) => AddrKey {
            family: FAMILY_IPV6,
            pad: [0; 3],
            addr: v6.octets(),
        },
    };
    (AddrKey::prefix_len(u32::from(prefix.prefix_len())), key)
}

/// The `POLICY_RULES` key of `rule` at the endpoint `ifindex`, with its prefix length.
fn rule_key(ifindex: u32, way: u8, rule: &Entry) -> (u32, RuleKey) {
    match rule.protocol {
        None => (
            RULE_ANY_PROTOCOL_BITS,
            RuleKey::new(ifindex, way, rule.identity, 0, 0),
        ),
        Some(protocol) => (
            RULE_PROTOCOL_BITS + u32::from(rule.ports.bits),
            RuleKey::new(
                ifindex,
                way,
                rule.identity,
                protocol_number(protocol),
                rule.ports.port,
            ),
        ),
    }
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => ip_proto::TCP,
        Protocol::Udp => ip_proto::UDP,
        Protocol::Sctp => ip_proto::SCTP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_policy::ports::PortPrefix;

    #[test]
    fn a_rule_for_every_protocol_stops_at_the_identity_and_a_port_block_adds_its_bits() {
        let any = Entry {
            identity: 20,
            protocol: None,
            ports: PortPrefix { port: 0, bits: 0 },
            policy: 0,
        };
        assert_eq!(rule_key(7, direction::INGRESS, &any).0, 96);
        let block = Entry {
            protocol: Some(Protocol::Udp),
            ports: PortPrefix {
                port: 8080,
                bits: 13,
            },
            ..any
        };
        let (bits, key) = rule_key(7, direction::EGRESS, &block);
        assert_eq!(bits, 112 + 13);
        assert_eq!(key, RuleKey::new(7, direction::EGRESS, 20, 17, 8080));
    }

    #[test]
    fn an_address_prefix_counts_the_family_bits_first() {
        let (bits, key) = addr_key(&"10.1.0.0/16".parse().expect("a prefix"));
        assert_eq!(bits, 32 + 16);
        assert_eq!(key.addr[..4], [10, 1, 0, 0]);
        let (bits, key) = addr_key(&"fd00::/8".parse().expect("a prefix"));
        assert_eq!((bits, key.family), (32 + 8, FAMILY_IPV6));
    }
}
