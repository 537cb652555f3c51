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
//!
//! Each compile also records which of this node's pods each policy selects, and the
//! directions each pod is isolated in: what `ebpf-cnid policy` shows ([`Policies::view`])
//! and the metrics count.

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use aya::maps::MapError;
use cni_api::{PoliciesView, PolicyInfo, PolicyPodInfo, RefusedObject, values::Protocol};
use cni_ebpf_common::{
    AddrKey, PolicyConfig, PolicyEndpoint, RuleKey, RuleValue, ip_proto,
    policy::{FAMILY_IPV6, RULE_ANY_PROTOCOL_BITS, RULE_PROTOCOL_BITS, direction, isolated, mode},
};
use cni_policy::{Cluster, Direction, Entry, Identities, Pod, Policy, compile, parse::Objects};
use foldhash::HashMap;
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
    /// What the source is, as the view names it (`file <path>`).
    source_name: Option<String>,
    identities: Identities,
    /// Each policy's counters slot, by namespace and name.
    slots: BTreeMap<(String, String), u32>,
    /// What the last compile found of this node's pods.
    selection: Selection,
    written: Written,
    config: PolicyConfig,
}

/// This node's Kubernetes pods and the policies selecting them, as the last compile
/// found them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Selection {
    /// Each pod (namespace, name), sorted, with its [`isolated`] bits.
    pods: Vec<((String, String), u32)>,
    /// For each policy of the objects compiled, in their order: the indexes in `pods`
    /// of those it selects.
    selects: Vec<Vec<usize>>,
}

/// This node's pods isolated in each direction, for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IsolatedPods {
    pub ingress: usize,
    pub egress: usize,
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
            source_name: None,
            identities: Identities::default(),
            slots: BTreeMap::new(),
            selection: Selection::default(),
            config: PolicyConfig {
                generation: previous.generation,
                mode: match policy_mode {
                    PolicyMode::Enforce => mode::ENFORCE,
                    PolicyMode::Audit => mode::AUDIT,
                },
            },
        }
    }

    /// Names the source for the view (`file <path>`); unnamed, the view says `unnamed`.
    pub fn name_source(&mut self, name: impl Into<String>) {
        self.source_name = Some(name.into());
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

    /// Objects the source left out (0 before it answers).
    pub fn refused(&self) -> usize {
        self.objects().map_or(0, |objects| objects.refused.len())
    }

    /// This node's pods isolated in each direction, as of the last compile.
    pub fn isolated_pods(&self) -> IsolatedPods {
        let mut counts = IsolatedPods::default();
        for (_, bits) in &self.selection.pods {
            counts.ingress += usize::from(bits & isolated::INGRESS != 0);
            counts.egress += usize::from(bits & isolated::EGRESS != 0);
        }
        counts
    }

    /// What `ebpf-cnid policy` shows: the source, the mode, each policy with the pods of
    /// this node it selects, each of those pods with the directions it is isolated in,
    /// and the objects refused.
    pub fn view(&self) -> PoliciesView {
        let source = match self.source {
            Source::None => None,
            Source::Pending | Source::Ready(_) => Some(
                self.source_name
                    .clone()
                    .unwrap_or_else(|| "unnamed".to_owned()),
            ),
        };
        let pods = &self.selection.pods;
        let label = |index: &usize| {
            pods.get(*index)
                .map(|((namespace, name), _)| format!("{namespace}/{name}"))
        };
        let (policies, refused) = match self.objects() {
            None => (Vec::new(), Vec::new()),
            Some(objects) => {
                let mut policies: Vec<PolicyInfo> = objects
                    .policies
                    .iter()
                    .enumerate()
                    .map(|(index, policy)| PolicyInfo {
                        namespace: policy.namespace.clone(),
                        name: policy.name.clone(),
                        slot: self.slot_of(policy),
                        ingress: policy.rules(Direction::Ingress).is_some(),
                        egress: policy.rules(Direction::Egress).is_some(),
                        selects: self
                            .selection
                            .selects
                            .get(index)
                            .map(|selected| selected.iter().filter_map(label).collect())
                            .unwrap_or_default(),
                    })
                    .collect();
                policies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
                let refused = objects
                    .refused
                    .iter()
                    .map(|refused| RefusedObject {
                        object: refused.object.clone(),
                        reason: refused.reason.clone(),
                    })
                    .collect();
                (policies, refused)
            }
        };
        PoliciesView {
            source,
            answered: matches!(self.source, Source::Ready(_)),
            mode: if self.config.mode == mode::AUDIT {
                "audit"
            } else {
                "enforce"
            }
            .to_owned(),
            generation: self.config.generation,
            policies,
            pods: pods
                .iter()
                .map(|((namespace, name), bits)| PolicyPodInfo {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    ingress: bits & isolated::INGRESS != 0,
                    egress: bits & isolated::EGRESS != 0,
                })
                .collect(),
            refused,
        }
    }

    /// Compiles the policies for `endpoints` (this node's) and writes the differences.
    /// Nothing changes while the source has not answered.
    pub fn sync<'a>(
        &mut self,
        endpoints: impl IntoIterator<Item = &'a EndpointRecord>,
    ) -> Result<Synced, MapError> {
        let desired = match &self.source {
            Source::Pending => return Ok(Synced::default()),
            Source::None => {
                self.selection = Selection::default();
                Written::default()
            }
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
        let mut by_name: std::collections::HashMap<(String, String), usize> = pods
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
        let slots: Vec<u32> = objects
            .policies
            .iter()
            .map(|policy| self.slot_of(policy))
            .collect();
        let cluster = Cluster {
            namespaces: &objects.namespaces,
            pods: &pods,
            policies: &objects.policies,
        };
        let compiled = compile(cluster, &local, &mut self.identities);
        self.selection = select(&objects.policies, &pods, &local);
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
                let by = isolating(&objects.policies, pod, way).map_or(0, |policy| slots[policy]);
                if way == direction::INGRESS {
                    entry.ingress_policy = by;
                } else {
                    entry.egress_policy = by;
                }
                for rule in entries {
                    let value = RuleValue {
                        policy: slots[rule.policy],
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

/// The `local` pods (indexes in `pods`, a pod with several endpoints there once each)
/// and the policies selecting each, with the directions they isolate it in: local pods
/// times policies.
fn select(policies: &[Policy], pods: &[Pod], local: &[usize]) -> Selection {
    let mut local: Vec<usize> = local.to_vec();
    local.sort_by(|a, b| {
        (&pods[*a].namespace, &pods[*a].name).cmp(&(&pods[*b].namespace, &pods[*b].name))
    });
    local.dedup();
    let mut selection = Selection {
        pods: local
            .iter()
            .map(|index| {
                (
                    (pods[*index].namespace.clone(), pods[*index].name.clone()),
                    0,
                )
            })
            .collect(),
        selects: vec![Vec::new(); policies.len()],
    };
    for (policy, selected) in policies.iter().zip(&mut selection.selects) {
        let ways = [
            (Direction::Ingress, isolated::INGRESS),
            (Direction::Egress, isolated::EGRESS),
        ]
        .into_iter()
        .filter(|(direction, _)| policy.rules(*direction).is_some())
        .fold(0, |bits, (_, bit)| bits | bit);
        for (at, index) in local.iter().enumerate() {
            let pod = &pods[*index];
            if policy.namespace == pod.namespace && policy.selects.matches(&pod.labels) {
                selected.push(at);
                selection.pods[at].1 |= ways;
            }
        }
    }
    selection
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
    fn each_policy_selects_the_local_pods_of_its_namespace_its_selector_matches() {
        let objects = cni_policy::parse::parse_objects(
            br#"
apiVersion: v1
kind: Pod
metadata: {namespace: x, name: b, labels: {pod: b}}
---
apiVersion: v1
kind: Pod
metadata: {namespace: x, name: a, labels: {pod: a}}
---
apiVersion: v1
kind: Pod
metadata: {namespace: 'y', name: a, labels: {pod: a}}
---
apiVersion: v1
kind: Pod
metadata: {namespace: x, name: elsewhere, labels: {pod: a}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: x, name: deny-ingress}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: x, name: a-out}
spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress]}
"#,
        )
        .expect("objects");
        assert!(objects.refused.is_empty(), "{:?}", objects.refused);
        let at = |namespace: &str, name: &str| {
            objects
                .pods
                .iter()
                .position(|pod| pod.namespace == namespace && pod.name == name)
                .expect("a pod")
        };
        // x/a has two interfaces; x/elsewhere is another node's.
        let local = [at("x", "b"), at("x", "a"), at("y", "a"), at("x", "a")];
        let selection = select(&objects.policies, &objects.pods, &local);
        let pod =
            |namespace: &str, name: &str, bits| ((namespace.to_owned(), name.to_owned()), bits);
        assert_eq!(
            selection.pods,
            [
                pod("x", "a", isolated::INGRESS | isolated::EGRESS),
                pod("x", "b", isolated::INGRESS),
                pod("y", "a", 0),
            ]
        );
        let selects: Vec<(&str, &[usize])> = objects
            .policies
            .iter()
            .map(|policy| policy.name.as_str())
            .zip(selection.selects.iter().map(Vec::as_slice))
            .collect();
        assert_eq!(
            selects,
            [("deny-ingress", &[0, 1][..]), ("a-out", &[0][..])]
        );
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
