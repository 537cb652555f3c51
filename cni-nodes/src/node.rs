//! A node as the datapath sees it, and the set of them.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// One node of the cluster: where to send its pods' traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `metadata.name`.
    pub name: String,
    /// The first IPv4 `InternalIP` in `status.addresses`.
    pub address: Ipv4Addr,
    /// The node's IPv4 pod ranges from `spec.podCIDRs`, else `spec.podCIDR`, in their order,
    /// without duplicates and with host bits cleared. Empty until the controller manager has
    /// given the node a range.
    pub pod_cidrs: Vec<Ipv4Net>,
}

/// The cluster's nodes by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSet {
    nodes: BTreeMap<String, Node>,
}

impl NodeSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// The nodes in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// The names in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    pub fn as_map(&self) -> &BTreeMap<String, Node> {
        &self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Adds or replaces the node of that name; true when the set changed.
    pub fn insert(&mut self, node: Node) -> bool {
        if self.nodes.get(&node.name) == Some(&node) {
            return false;
        }
        self.nodes.insert(node.name.clone(), node);
        true
    }

    /// Removes the node of that name; true when it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        self.nodes.remove(name).is_some()
    }
}

impl FromIterator<Node> for NodeSet {
    fn from_iter<I: IntoIterator<Item = Node>>(iter: I) -> Self {
        let mut set = Self::new();
        for node in iter {
            set.insert(node);
        }
        set
    }
}

impl<'a> IntoIterator for &'a NodeSet {
    type Item = &'a Node;
    type IntoIter = std::collections::btree_map::Values<'a, String, Node>;

    fn into_iter(self) -> Self::IntoIter {
        self.nodes.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn insert_and_remove_say_whether_the_set_changed() {
        let node = Node {
            name: "a".into(),
            address: Ipv4Addr::new(10, 0, 0, 1),
            pod_cidrs: vec![net("10.244.1.0/24")],
        };
        let mut set = NodeSet::new();
        assert!(set.insert(node.clone()));
        assert!(!set.insert(node.clone()));
        assert!(set.insert(Node {
            pod_cidrs: vec![],
            ..node
        }));
        assert!(set.remove("a"));
        assert!(!set.remove("a"));
    }
}
