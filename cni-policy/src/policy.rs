//! A NetworkPolicy as enforced: checked, defaults filled in, every field in the form its
//! meaning takes (see `translate` for how Kubernetes' object becomes one).

use cni_api::values::Protocol;
use ipnet::IpNet;

use crate::selector::Selector;

/// Which way a rule lets traffic: into the selected pods, or out of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

/// The namespaces a pod peer is looked for in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Namespaces {
    /// The policy's own namespace (a peer with a pod selector alone).
    Own,
    /// Every namespace the selector selects.
    Matching(Selector),
}

/// Who is on the other side of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// Pods the selector selects in those namespaces.
    Pods {
        namespaces: Namespaces,
        pods: Selector,
    },
    /// Addresses in `cidr` and in none of `except` (pods' addresses included).
    Block { cidr: IpNet, except: Vec<IpNet> },
}

/// The ports a rule opens, of one protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ports {
    /// Every port.
    All,
    /// `first..=last` (one port when both are the same).
    Range { first: u16, last: u16 },
    /// The port of that name on the pod at the rule's far end: the selected pod for
    /// ingress, the peer for egress; a pod without it is not opened.
    Named(String),
}

/// A protocol and the ports of it a rule opens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortRule {
    pub protocol: Protocol,
    pub ports: Ports,
}

/// One rule: traffic with any of `peers` on any of `ports` is let through.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// `None`: from or to anywhere.
    pub peers: Option<Vec<Peer>>,
    /// `None`: every port of every protocol.
    pub ports: Option<Vec<PortRule>>,
}

/// A checked NetworkPolicy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    /// The pods of `namespace` it selects.
    pub selects: Selector,
    /// `Some` when it isolates the selected pods for ingress: only these rules let
    /// traffic in (none: nothing).
    pub ingress: Option<Vec<Rule>>,
    /// As `ingress`, for egress.
    pub egress: Option<Vec<Rule>>,
}

impl Policy {
    /// Its rules for `direction`, when it isolates that way.
    pub fn rules(&self, direction: Direction) -> Option<&[Rule]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }
}
