//! The policies in force, compiled for one node's pods: every address gets an identity,
//! the class of addresses the policies treat alike, and each local pod the entries that
//! let traffic through, keyed by identity, protocol and port prefix.
//!
//! An address's *signature* is what the policies can tell about it: the peers it
//! matches (pod and namespace selectors for pods' addresses, the ipBlocks holding it),
//! and, for each port name an egress rule opens, the port of that name on its pod.
//! Addresses with one signature share an identity, so identities count the distinct
//! treatments, not the pods. A pod no policy selects for a direction is not isolated
//! that way (`None`); one that is lets through only what its entries hold.
//!
//! Cost: the peers and ports a signature is made of (its *marks*) are numbered once and
//! kept across compilations ([`Identities`]), so a signature is a short sorted list of
//! numbers, hashed and compared as such; tables are hashed by foldhash. A compile of
//! 1,000 policies with 10,000 ipBlock peers takes a few milliseconds (docs/decisions.md,
//! "A compile within the latency budget").

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use cni_api::values::Protocol;
use foldhash::{HashMap, HashSet};
use ipnet::IpNet;

use crate::{
    blocks::{Blocks, PeerId},
    policy::{Direction, Namespaces, Peer, Policy, Ports, Rule},
    ports::{PortPrefix, prefixes},
    selector::{Labels, Selector},
};

/// A class of addresses the policies treat alike, numbered on this node.
pub type Identity = u32;

/// In an entry: any identity.
pub const ANY: Identity = 0;
/// Addresses no peer matches and no named port is on.
pub const WORLD: Identity = 1;
/// The first identity given to a signature; those below are reserved.
pub const FIRST: Identity = 16;

/// The label Kubernetes gives every namespace, its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A port its pod's containers name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// A pod as policies see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub addrs: Vec<IpAddr>,
    pub ports: Vec<NamedPort>,
}

/// What the policies see of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Cluster<'a> {
    /// Each namespace's labels; a namespace missing here has only its name label.
    pub namespaces: &'a BTreeMap<String, Labels>,
    pub pods: &'a [Pod],
    pub policies: &'a [Policy],
}

/// One way through: from or to `identity` (or [`ANY`]), on `protocol` (`None`: any)
/// and the ports of `ports`, let through by policy `policy` (an index into the
/// cluster's policies: the first that lets it through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub identity: Identity,
    pub protocol: Option<Protocol>,
    pub ports: PortPrefix,
    pub policy: usize,
}

/// A local pod's entries: `None` for a direction it is not isolated in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its index among the cluster's pods.
    pub pod: usize,
    pub ingress: Option<Vec<Entry>>,
    pub egress: Option<Vec<Entry>>,
}

/// The policies compiled for a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// Prefixes (pods' addresses as host prefixes) and their identity, for a longest
    /// prefix match; an address under none of them is [`WORLD`].
    pub addresses: Vec<(IpNet, Identity)>,
    pub endpoints: Vec<Endpoint>,
}

/// A peer, with the namespace of its policy when it means that one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct OwnedPeer {
    own_namespace: Option<String>,
    peer: Peer,
}

/// What a signature is made of: the peer itself rather than an index among this
/// compile's peers, so that a signature stays the same whatever else the policies add
/// or remove.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Mark {
    /// Matches this peer.
    Peer(OwnedPeer),
    /// Its pod has this port, of a name an egress rule opens.
    Port(NamedPort),
}

/// A mark's number, kept while the mark is in force.
type MarkNo = u32;

/// A signature: its marks' numbers, sorted, without repeats.
type Signature = Box<[MarkNo]>;

/// Marks and identities by signature, kept across compilations so that an unchanged
/// mark keeps its number and an unchanged signature its identity.
#[derive(Debug, Default)]
pub struct Identities {
    marks: HashMap<Mark, MarkNo>,
    free_marks: Vec<MarkNo>,
    next_mark: MarkNo,
    by_signature: HashMap<Signature, Identity>,
    free: Vec<Identity>,
    next: Option<Identity>,
}

impl Identities {
    /// The number of `mark`, given one when it has none; recorded in `used`.
    fn number(&mut self, mark: Mark, used: &mut HashSet<MarkNo>) -> MarkNo {
        let number = match self.marks.get(&mark) {
            Some(number) => *number,
            None => {
                let number = self.free_marks.pop().unwrap_or_else(|| {
                    self.next_mark += 1;
                    self.next_mark - 1
                });
                self.marks.insert(mark, number);
                number
            }
        };
        used.insert(number);
        number
    }

    /// Takes back the numbers of marks not `used` by this compile. Every signature
    /// holding one is gone with them ([`Identities::assign`] ran first), so a number
    /// given again later cannot join an old signature.
    fn forget_unused(&mut self, used: &HashSet<MarkNo>) {
        let free_marks = &mut self.free_marks;
        self.marks.retain(|_, number| {
            let keep = used.contains(number);
            if !keep {
                free_marks.push(*number);
            }
            keep
        });
    }

    /// Gives each of `signatures` an identity (in their order, the empty one excepted),
    /// and takes back the numbers of the signatures not among them.
    fn assign<'a>(&mut self, signatures: impl Iterator<Item = &'a [MarkNo]> + Clone) {
        let current: HashSet<&[MarkNo]> = signatures.clone().collect();
        let free = &mut self.free;
        self.by_signature.retain(|signature, id| {
            let keep = current.contains(&**signature);
            if !keep {
                free.push(*id);
            }
            keep
        });
        for signature in signatures {
            if signature.is_empty() || self.by_signature.contains_key(signature) {
                continue;
            }
            let id = self.free.pop().unwrap_or_else(|| {
                let id = self.next.unwrap_or(FIRST);
                self.next = Some(id + 1);
                id
            });
            self.by_signature.insert(signature.into(), id);
        }
    }

    /// The identity of a signature [`Identities::assign`] gave one.
    fn of(&self, signature: &[MarkNo]) -> Identity {
        if signature.is_empty() {
            return WORLD;
        }
        self.by_signature.get(signature).copied().unwrap_or(WORLD)
    }
}

/// A peer of some policy, its own namespace resolved: two rules naming the same
/// peer share its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PeerKey<'a> {
    own_namespace: Option<&'a str>,
    peer: &'a Peer,
}

/// The distinct peers in force: numbered by `PeerKey`, each number's mark in `marks`.
struct Peers<'a> {
    ids: HashMap<PeerKey<'a>, PeerId>,
    marks: Vec<MarkNo>,
}

impl Peers<'_> {
    fn mark(&self, id: PeerId) -> MarkNo {
        self.marks[id as usize]
    }
}

/// Compiles `cluster`'s policies for its pods `local` (indexes into its pods).
pub fn compile(cluster: Cluster<'_>, local: &[usize], identities: &mut Identities) -> Compiled {
    let mut used = HashSet::default();
    let peers = distinct_peers(cluster.policies, identities, &mut used);
    let blocks = Blocks::new(peers.ids.iter().filter_map(|(key, id)| match key.peer {
        Peer::Block { cidr, except } => Some((*id, *cidr, except.as_slice())),
        Peer::Pods { .. } => None,
    }));
    let egress_names = egress_port_names(cluster.policies);

    // Each block prefix with its signature, then each pod's address with its own (a
    // pod's holds its address's blocks and more: it wins a prefix both name).
    let mut addressed: Vec<(IpNet, Vec<MarkNo>)> = blocks
        .prefixes()
        .into_iter()
        .map(|(prefix, held_by)| {
            let mut signature: Vec<MarkNo> = held_by.iter().map(|id| peers.mark(*id)).collect();
            signature.sort_unstable();
            (prefix, signature)
        })
        .collect();
    // Each namespace's candidate peers (those whose namespace part takes it), made once
    // per namespace: a pod is then checked against its namespace's peers' pod
    // selectors only, not every peer of the cluster.
    let mut in_namespace: HashMap<&str, Vec<(&Selector, PeerId)>> = HashMap::default();
    for pod in cluster.pods {
        if in_namespace.contains_key(pod.namespace.as_str()) {
            continue;
        }
        let labels = namespace_labels(cluster.namespaces, &pod.namespace);
        let candidates = peers
            .ids
            .iter()
            .filter_map(|(key, id)| {
                namespace_takes(key, &pod.namespace, &labels).map(|pods| (pods, *id))
            })
            .collect();
        in_namespace.insert(pod.namespace.as_str(), candidates);
    }
    // The named ports among the marks, for the egress rules that open them.
    let mut port_marks: HashMap<MarkNo, &NamedPort> = HashMap::default();
    for pod in cluster.pods {
        let mut common: Vec<MarkNo> = in_namespace
            .get(pod.namespace.as_str())
            .into_iter()
            .flatten()
            .filter(|(pods, _)| pods.matches(&pod.labels))
            .map(|(_, id)| peers.mark(*id))
            .collect();
        for port in pod
            .ports
            .iter()
            .filter(|port| egress_names.contains(&(port.name.as_str(), port.protocol)))
        {
            let number = identities.number(Mark::Port(port.clone()), &mut used);
            port_marks.insert(number, port);
            common.push(number);
        }
        for addr in &pod.addrs {
            let mut signature = common.clone();
            signature.extend(blocks.peers_of(*addr).iter().map(|id| peers.mark(*id)));
            signature.sort_unstable();
            signature.dedup();
            addressed.push((IpNet::from(*addr), signature));
        }
    }
    identities.assign(addressed.iter().map(|(_, signature)| signature.as_slice()));
    identities.forget_unused(&used);
    // Each mark's identities, and each named port's identities with its number there:
    // made once, read for every rule of every local pod.
    let mut by_mark: HashMap<MarkNo, Vec<Identity>> = HashMap::default();
    let mut named: HashMap<(&str, Protocol), Vec<(Identity, u16)>> = HashMap::default();
    for (signature, id) in &identities.by_signature {
        for mark in signature {
            by_mark.entry(*mark).or_default().push(*id);
            if let Some(port) = port_marks.get(mark) {
                named
                    .entry((port.name.as_str(), port.protocol))
                    .or_default()
                    .push((*id, port.port));
            }
        }
    }

    let addresses: BTreeMap<IpNet, Identity> = addressed
        .iter()
        .map(|(prefix, signature)| (*prefix, identities.of(signature)))
        .collect();

    let rules = Rules {
        cluster,
        peers: &peers,
        by_mark: &by_mark,
        named: &named,
    };
    let endpoints = local
        .iter()
        .filter(|index| **index < cluster.pods.len())
        .map(|index| Endpoint {
            pod: *index,
            ingress: rules.of(&cluster.pods[*index], Direction::Ingress),
            egress: rules.of(&cluster.pods[*index], Direction::Egress),
        })
        .collect();
    Compiled {
        addresses: addresses.into_iter().collect(),
        endpoints,
    }
}

/// Every distinct peer of the policies, numbered, with its mark's number.
fn distinct_peers<'a>(
    policies: &'a [Policy],
    identities: &mut Identities,
    used: &mut HashSet<MarkNo>,
) -> Peers<'a> {
    let mut peers = Peers {
        ids: HashMap::default(),
        marks: Vec::new(),
    };
    for policy in policies {
        for rules in [&policy.ingress, &policy.egress].into_iter().flatten() {
            for peer in rules.iter().flat_map(|rule| rule.peers.iter().flatten()) {
                let key = peer_key(policy, peer);
                if !peers.ids.contains_key(&key) {
                    peers.ids.insert(key, peers.marks.len() as PeerId);
                    let mark = Mark::Peer(OwnedPeer {
                        own_namespace: key.own_namespace.map(str::to_owned),
                        peer: peer.clone(),
                    });
                    peers.marks.push(identities.number(mark, used));
                }
            }
        }
    }
    peers
}

fn peer_key<'a>(policy: &'a Policy, peer: &'a Peer) -> PeerKey<'a> {
    let own_namespace = match peer {
        Peer::Pods {
            namespaces: Namespaces::Own,
            ..
        } => Some(policy.namespace.as_str()),
        _ => None,
    };
    PeerKey {
        own_namespace,
        peer,
    }
}

/// The port names (with their protocol) some egress rule opens.
fn egress_port_names(policies: &[Policy]) -> BTreeSet<(&str, Protocol)> {
    policies
        .iter()
        .flat_map(|policy| policy.egress.iter().flatten())
        .flat_map(|rule| rule.ports.iter().flatten())
        .filter_map(|port| match &port.ports {
            Ports::Named(name) => Some((name.as_str(), port.protocol)),
            _ => None,
        })
        .collect()
}

/// A namespace's labels, its name label always among them (the API server sets it).
fn namespace_labels(namespaces: &BTreeMap<String, Labels>, name: &str) -> Labels {
    let mut labels = namespaces.get(name).cloned().unwrap_or_default();
    labels.insert(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned());
    labels
}

/// The pod selector of `key` when its namespace part takes the namespace `name` (with
/// `labels`); `None` for a block, or a namespace it does not take.
fn namespace_takes<'a>(key: &PeerKey<'a>, name: &str, labels: &Labels) -> Option<&'a Selector> {
    match key.peer {
        Peer::Block { .. } => None,
        Peer::Pods { namespaces, pods } => {
            let takes = match namespaces {
                Namespaces::Own => key.own_namespace == Some(name),
                Namespaces::Matching(selector) => selector.matches(labels),
            };
            takes.then_some(pods)
        }
    }
}

/// What the entries of a local pod are made from.
struct Rules<'a> {
    cluster: Cluster<'a>,
    peers: &'a Peers<'a>,
    by_mark: &'a HashMap<MarkNo, Vec<Identity>>,
    /// The identities a port of that name and protocol is on, with its number.
    named: &'a HashMap<(&'a str, Protocol), Vec<(Identity, u16)>>,
}

impl Rules<'_> {
    /// The entries of `pod` for `direction`; `None` when no policy isolates it that way.
    fn of(&self, pod: &Pod, direction: Direction) -> Option<Vec<Entry>> {
        let mut isolated = false;
        let mut entries: BTreeMap<(Identity, Option<Protocol>, PortPrefix), usize> =
            BTreeMap::new();
        for (index, policy) in self.cluster.policies.iter().enumerate() {
            let Some(rules) = policy.rules(direction) else {
                continue;
            };
            if policy.namespace != pod.namespace || !policy.selects.matches(&pod.labels) {
                continue;
            }
            isolated = true;
            for rule in rules {
                for (identity, protocol, ports) in self.rule(policy, rule, pod, direction) {
                    entries.entry((identity, protocol, ports)).or_insert(index);
                }
            }
        }
        isolated.then(|| {
            entries
                .into_iter()
                .map(|((identity, protocol, ports), policy)| Entry {
                    identity,
                    protocol,
                    ports,
                    policy,
                })
                .collect()
        })
    }

    /// The ways through `rule` of `policy` opens for `pod` in `direction`.
    fn rule(
        &self,
        policy: &Policy,
        rule: &Rule,
        pod: &Pod,
        direction: Direction,
    ) -> Vec<(Identity, Option<Protocol>, PortPrefix)> {
        let identities: BTreeSet<Identity> = match &rule.peers {
            None => BTreeSet::from([ANY]),
            Some(peers) => peers
                .iter()
                .filter_map(|peer| self.peers.ids.get(&peer_key(policy, peer)))
                .flat_map(|id| {
                    self.by_mark
                        .get(&self.peers.mark(*id))
                        .into_iter()
                        .flatten()
                })
                .copied()
                .collect(),
        };
        let Some(ports) = &rule.ports else {
            let every = PortPrefix { port: 0, bits: 0 };
            return identities.into_iter().map(|id| (id, None, every)).collect();
        };
        let mut ways = Vec::new();
        for port in ports {
            let protocol = Some(port.protocol);
            match &port.ports {
                Ports::All => ways.extend(
                    identities
                        .iter()
                        .map(|id| (*id, protocol, PortPrefix { port: 0, bits: 0 })),
                ),
                Ports::Range { first, last } => {
                    for block in prefixes(*first, *last) {
                        ways.extend(identities.iter().map(|id| (*id, protocol, block)));
                    }
                }
                // Into the pod: the port of that name on it.
                Ports::Named(name) if direction == Direction::Ingress => {
                    for named in pod
                        .ports
                        .iter()
                        .filter(|p| p.name == *name && p.protocol == port.protocol)
                    {
                        let block = PortPrefix {
                            port: named.port,
                            bits: 16,
                        };
                        ways.extend(identities.iter().map(|id| (*id, protocol, block)));
                    }
                }
                // Out of the pod: the port of that name on each peer's pod.
                Ports::Named(name) => {
                    let on = self.named.get(&(name.as_str(), port.protocol));
                    ways.extend(
                        on.into_iter()
                            .flatten()
                            .filter(|(id, _)| identities.contains(&ANY) || identities.contains(id))
                            .map(|(id, number)| {
                                (
                                    *id,
                                    protocol,
                                    PortPrefix {
                                        port: *number,
                                        bits: 16,
                                    },
                                )
                            }),
                    );
                }
            }
        }
        ways
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::translate;

    fn pod(namespace: &str, name: &str, addr: &str, ports: &[(&str, Protocol, u16)]) -> Pod {
        Pod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            labels: Labels::from([("pod".to_owned(), name.to_owned())]),
            addrs: vec![addr.parse().expect("an address")],
            ports: ports
                .iter()
                .map(|(name, protocol, port)| NamedPort {
                    name: (*name).to_owned(),
                    protocol: *protocol,
                    port: *port,
                })
                .collect(),
        }
    }

    /// x/a, x/b, y/a; x/a serves TCP 80 as "serve-80", y/a serves it on 8080.
    fn pods() -> Vec<Pod> {
        vec![
            pod("x", "a", "10.0.0.1", &[("serve-80", Protocol::Tcp, 80)]),
            pod("x", "b", "10.0.0.2", &[]),
            pod("y", "a", "10.0.1.1", &[("serve-80", Protocol::Tcp, 8080)]),
        ]
    }

    fn policy(namespace: &str, spec: serde_json::Value) -> Policy {
        translate::policy(
            &serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": namespace},
                "spec": spec,
            }))
            .expect("a NetworkPolicy"),
        )
        .expect("valid")
    }

    fn compile_all(policies: &[Policy], identities: &mut Identities) -> Compiled {
        let namespaces = BTreeMap::from([
            ("x".to_owned(), Labels::from([("team".into(), "x".into())])),
            ("y".to_owned(), Labels::from([("team".into(), "y".into())])),
        ]);
        let pods = pods();
        let cluster = Cluster {
            namespaces: &namespaces,
            pods: &pods,
            policies,
        };
        compile(cluster, &[0, 1, 2], identities)
    }

    fn identity_of(compiled: &Compiled, addr: &str) -> Identity {
        let addr: IpAddr = addr.parse().expect("an address");
        compiled
            .addresses
            .iter()
            .filter(|(prefix, _)| prefix.contains(&addr))
            .max_by_key(|(prefix, _)| prefix.prefix_len())
            .map_or(WORLD, |(_, id)| *id)
    }

    fn tcp(port: u16) -> (Option<Protocol>, PortPrefix) {
        (Some(Protocol::Tcp), PortPrefix { port, bits: 16 })
    }

    fn ways(entries: &[Entry]) -> Vec<(Identity, Option<Protocol>, PortPrefix)> {
        entries
            .iter()
            .map(|e| (e.identity, e.protocol, e.ports))
            .collect()
    }

    #[test]
    fn pods_no_policy_selects_are_not_isolated_and_a_deny_all_isolates_with_nothing() {
        let deny = policy("x", json!({"podSelector": {"matchLabels": {"pod": "a"}}}));
        let compiled = compile_all(&[deny], &mut Identities::default());
        let [a, b, y] = &compiled.endpoints[..] else {
            panic!("three endpoints: {compiled:?}");
        };
        assert_eq!(
            (a.ingress.as_deref(), a.egress.as_deref()),
            (Some(&[][..]), None)
        );
        assert_eq!((b.ingress.as_deref(), b.egress.as_deref()), (None, None));
        assert_eq!((y.ingress.as_deref(), y.egress.as_deref()), (None, None));
        assert_eq!(identity_of(&compiled, "10.0.1.1"), WORLD, "no peer at all");
    }

    #[test]
    fn a_namespace_peer_gives_its_pods_one_identity_and_the_rule_its_ports() {
        let allow = policy(
            "x",
            json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{
                    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}],
                    "ports": [{"port": 80}, {"protocol": "UDP", "port": 81}],
                }],
            }),
        );
        let compiled = compile_all(&[allow], &mut Identities::default());
        let from_y = identity_of(&compiled, "10.0.1.1");
        assert!(from_y >= FIRST, "y/a matches the peer: {compiled:?}");
        assert_eq!(
            identity_of(&compiled, "10.0.0.2"),
            WORLD,
            "x/b matches nothing"
        );
        let ingress = compiled.endpoints[0].ingress.as_deref().expect("isolated");
        let udp = (Some(Protocol::Udp), PortPrefix { port: 81, bits: 16 });
        assert_eq!(
            ways(ingress),
            vec![(from_y, tcp(80).0, tcp(80).1), (from_y, udp.0, udp.1)]
        );
        assert!(ingress.iter().all(|e| e.policy == 0));
    }

    #[test]
    fn an_ip_block_selects_pods_by_address_and_its_except_leaves_them_out() {
        let block = policy(
            "x",
            json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}]}],
            }),
        );
        let compiled = compile_all(&[block], &mut Identities::default());
        let inside = identity_of(&compiled, "10.0.0.2");
        assert!(inside >= FIRST);
        assert_eq!(
            identity_of(&compiled, "10.0.200.9"),
            inside,
            "an outside address in the block"
        );
        assert_eq!(
            identity_of(&compiled, "10.0.1.1"),
            WORLD,
            "y/a is in the except"
        );
        assert_eq!(identity_of(&compiled, "10.0.1.77"), WORLD);
        assert_eq!(identity_of(&compiled, "192.0.2.1"), WORLD);
        let ingress = compiled.endpoints[0].ingress.as_deref().expect("isolated");
        let every = PortPrefix { port: 0, bits: 0 };
        assert_eq!(ways(ingress), vec![(inside, None, every)]);
    }

    #[test]
    fn named_ports_resolve_on_the_pod_at_the_far_end() {
        let named = policy(
            "x",
            json!({
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"ports": [{"port": "serve-80"}]}],
                "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "serve-80"}]}],
            }),
        );
        let compiled = compile_all(&[named], &mut Identities::default());
        let (x_a, y_a) = (
            identity_of(&compiled, "10.0.0.1"),
            identity_of(&compiled, "10.0.1.1"),
        );
        assert_ne!(x_a, y_a, "the port differs, so does the treatment");
        // Into x/a: its own port 80, from anyone; x/b has no such port: nothing.
        let a = &compiled.endpoints[0];
        assert_eq!(
            ways(a.ingress.as_deref().expect("isolated")),
            vec![(ANY, tcp(80).0, tcp(80).1)]
        );
        assert_eq!(compiled.endpoints[1].ingress.as_deref(), Some(&[][..]));
        // Out of x/b: to each pod, the port of that name on it.
        let out = ways(compiled.endpoints[1].egress.as_deref().expect("isolated"));
        let mut expected = vec![(x_a, tcp(80).0, tcp(80).1), (y_a, tcp(8080).0, tcp(8080).1)];
        expected.sort();
        assert_eq!(out, expected);
        assert_eq!(
            compiled.endpoints[2].egress, None,
            "y's pods are not selected"
        );
    }

    #[test]
    fn policies_add_up_and_the_first_that_lets_a_way_through_is_named() {
        let web = policy(
            "x",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}),
        );
        let more = policy(
            "x",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"port": 80}, {"port": 443}]}]}),
        );
        let compiled = compile_all(&[web, more], &mut Identities::default());
        let a = compiled.endpoints[0].ingress.as_deref().expect("isolated");
        assert_eq!(
            a.iter()
                .map(|e| (e.ports.port, e.policy))
                .collect::<Vec<_>>(),
            vec![(80, 0), (443, 1)]
        );
        let b = compiled.endpoints[1].ingress.as_deref().expect("isolated");
        assert_eq!(b.iter().map(|e| e.ports.port).collect::<Vec<_>>(), vec![80]);
    }

    #[test]
    fn an_unchanged_signature_keeps_its_identity_across_compilations() {
        let from_y = |port: u16| {
            policy(
                "x",
                json!({"ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}}}], "ports": [{"port": port}]}]}),
            )
        };
        let from_x_b = policy(
            "x",
            json!({"ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        );
        let mut identities = Identities::default();
        let first = compile_all(&[from_y(80), from_x_b.clone()], &mut identities);
        let second = compile_all(&[from_x_b, from_y(81)], &mut identities);
        for addr in ["10.0.0.1", "10.0.0.2", "10.0.1.1"] {
            assert_eq!(
                identity_of(&first, addr),
                identity_of(&second, addr),
                "{addr}"
            );
        }
        // A signature gone gives its number back.
        let third = compile_all(&[], &mut identities);
        assert!(third.addresses.iter().all(|(_, id)| *id == WORLD));
        assert_eq!(identities.by_signature.len(), 0);
        assert_eq!(identities.free.len(), 2);
        assert!(
            identities.marks.is_empty(),
            "marks no policy uses are forgotten"
        );
    }
}
