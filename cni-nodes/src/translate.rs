//! Kubernetes' `Node` object read as a [`Node`]: which address and ranges count, and
//! what is left out.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node as K8sNode;

use crate::node::{Node, NodeSet};

/// Why a node, or one of its values, was left out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Problem {
    #[error("a node without metadata.name is skipped")]
    NoName,
    #[error("node {node}: no IPv4 InternalIP in status.addresses, node skipped")]
    NoInternalIpv4 { node: String },
    #[error("node {node}: InternalIP {value:?} is not an IP address, ignored")]
    BadAddress { node: String, value: String },
    #[error("node {node}: pod CIDR {value:?} is not a CIDR, ignored")]
    BadPodCidr { node: String, value: String },
    #[error("node {node} is listed more than once, the last entry counts")]
    Duplicate { node: String },
    #[error("{item} is of kind {kind}, not a Node, skipped")]
    NotANode { item: String, kind: String },
    #[error("{item} is not a valid Node ({reason}), skipped")]
    Malformed { item: String, reason: String },
}

impl NodeSet {
    /// Translates Kubernetes' nodes, logging a warning for each one (or value) left out.
    pub fn from_k8s<'a>(nodes: impl IntoIterator<Item = &'a K8sNode>) -> Self {
        let mut set = Self::new();
        for k8s in nodes {
            let translation = translate(k8s);
            for problem in &translation.problems {
                tracing::warn!("{problem}");
            }
            if let Some(node) = translation.node {
                set.insert(node);
            }
        }
        set
    }
}

/// A translated node and what was left out of it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Translation {
    /// None when the node is skipped; `problems` then says why.
    pub node: Option<Node>,
    pub problems: Vec<Problem>,
}

/// Reads a Kubernetes node. IPv6 addresses and ranges are left out without a word (the
/// datapath is IPv4); values that do not parse are problems, and so is a node without a
/// name or an IPv4 InternalIP, which is then skipped whole.
pub(crate) fn translate(k8s: &K8sNode) -> Translation {
    let Some(name) = k8s.metadata.name.clone().filter(|name| !name.is_empty()) else {
        return Translation {
            node: None,
            problems: vec![Problem::NoName],
        };
    };
    let mut problems = Vec::new();

    let mut address = None;
    let addresses = k8s
        .status
        .as_ref()
        .and_then(|status| status.addresses.as_ref());
    for entry in addresses.into_iter().flatten() {
        if entry.type_ != "InternalIP" {
            continue;
        }
        match entry.address.trim().parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) => {
                address = Some(v4);
                break;
            }
            Ok(IpAddr::V6(_)) => {}
            Err(_) => problems.push(Problem::BadAddress {
                node: name.clone(),
                value: entry.address.clone(),
            }),
        }
    }

    let spec = k8s.spec.as_ref();
    let plural = spec
        .and_then(|spec| spec.pod_cidrs.as_ref())
        .filter(|list| !list.is_empty());
    let ranges: Vec<&String> = match plural {
        Some(list) => list.iter().collect(),
        None => spec
            .and_then(|spec| spec.pod_cidr.as_ref())
            .into_iter()
            .collect(),
    };
    let mut pod_cidrs = Vec::new();
    for value in ranges {
        match value.trim().parse::<IpNet>() {
            Ok(IpNet::V4(net)) => {
                let net = net.trunc();
                if !pod_cidrs.contains(&net) {
                    pod_cidrs.push(net);
                }
            }
            Ok(IpNet::V6(_)) => {}
            Err(_) => problems.push(Problem::BadPodCidr {
                node: name.clone(),
                value: value.clone(),
            }),
        }
    }

    let Some(address) = address else {
        problems.push(Problem::NoInternalIpv4 { node: name });
        return Translation {
            node: None,
            problems,
        };
    };
    Translation {
        node: Some(Node {
            name,
            address,
            pod_cidrs,
        }),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::Ipv4Net;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::net::Ipv4Addr;

    fn k8s_node(name: &str, addresses: &[(&str, &str)], spec: NodeSpec) -> K8sNode {
        K8sNode {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(type_, address)| NodeAddress {
                            type_: (*type_).to_owned(),
                            address: (*address).to_owned(),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        }
    }

    fn cidrs(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|s| (*s).to_owned()).collect())
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn the_first_ipv4_internal_ip_is_the_address() {
        let k8s = k8s_node(
            "a",
            &[
                ("Hostname", "a"),
                ("ExternalIP", "203.0.113.1"),
                ("InternalIP", "fd00::1"),
                ("InternalIP", "10.0.0.1"),
                ("InternalIP", "10.0.0.2"),
            ],
            NodeSpec::default(),
        );
        let t = translate(&k8s);
        assert_eq!(t.problems, []);
        let node = t.node.expect("node kept");
        assert_eq!(node.address, Ipv4Addr::new(10, 0, 0, 1));
        assert!(node.pod_cidrs.is_empty(), "no range given yet: {node:?}");
    }

    #[test]
    fn pod_cidrs_win_over_pod_cidr_and_ipv6_ranges_are_left_out() {
        let spec = NodeSpec {
            pod_cidr: Some("10.244.9.0/24".into()),
            pod_cidrs: cidrs(&["fd00:10:244::/64", "10.244.1.0/24", "10.245.1.0/24"]),
            ..NodeSpec::default()
        };
        let t = translate(&k8s_node("a", &[("InternalIP", "10.0.0.1")], spec));
        assert_eq!(t.problems, []);
        let node = t.node.expect("node kept");
        assert_eq!(node.pod_cidrs, [net("10.244.1.0/24"), net("10.245.1.0/24")]);
    }

    #[test]
    fn pod_cidr_is_read_when_pod_cidrs_is_absent_or_empty() {
        for plural in [None, Some(Vec::new())] {
            let spec = NodeSpec {
                pod_cidr: Some("10.244.3.0/24".into()),
                pod_cidrs: plural.clone(),
                ..NodeSpec::default()
            };
            let t = translate(&k8s_node("a", &[("InternalIP", "10.0.0.1")], spec));
            let node = t.node.expect("node kept");
            assert_eq!(
                node.pod_cidrs,
                [net("10.244.3.0/24")],
                "podCIDRs {plural:?}"
            );
        }
    }

    #[test]
    fn ranges_lose_host_bits_and_duplicates() {
        let spec = NodeSpec {
            pod_cidrs: cidrs(&["10.244.1.7/24", "10.244.1.0/24"]),
            ..NodeSpec::default()
        };
        let t = translate(&k8s_node("a", &[("InternalIP", "10.0.0.1")], spec));
        assert_eq!(t.node.expect("node kept").pod_cidrs, [net("10.244.1.0/24")]);
    }

    #[test]
    fn a_bad_range_is_left_out_and_the_node_kept() {
        let spec = NodeSpec {
            pod_cidrs: cidrs(&["10.244.1.0/33", "10.244.2.0/24"]),
            ..NodeSpec::default()
        };
        let t = translate(&k8s_node("a", &[("InternalIP", "10.0.0.1")], spec));
        assert_eq!(
            t.problems,
            [Problem::BadPodCidr {
                node: "a".into(),
                value: "10.244.1.0/33".into()
            }]
        );
        assert_eq!(t.node.expect("node kept").pod_cidrs, [net("10.244.2.0/24")]);
    }

    #[test]
    fn a_node_without_ipv4_internal_ip_is_skipped() {
        let cases: [&[(&str, &str)]; 3] = [
            &[("InternalIP", "fd00::1"), ("ExternalIP", "203.0.113.1")],
            &[],
            &[("InternalIP", "10.0.0.300")],
        ];
        for addresses in cases {
            let t = translate(&k8s_node("a", addresses, NodeSpec::default()));
            assert_eq!(t.node, None, "{addresses:?}");
            assert_eq!(
                t.problems.last(),
                Some(&Problem::NoInternalIpv4 { node: "a".into() }),
                "{addresses:?}"
            );
        }
        let t = translate(&k8s_node(
            "a",
            &[("InternalIP", "10.0.0.300")],
            NodeSpec::default(),
        ));
        assert_eq!(
            t.problems[0],
            Problem::BadAddress {
                node: "a".into(),
                value: "10.0.0.300".into()
            }
        );
    }

    #[test]
    fn a_node_without_name_or_status_is_skipped() {
        let mut k8s = k8s_node("a", &[("InternalIP", "10.0.0.1")], NodeSpec::default());
        k8s.metadata.name = None;
        assert_eq!(translate(&k8s).problems, [Problem::NoName]);
        let bare = K8sNode {
            metadata: ObjectMeta {
                name: Some("b".into()),
                ..ObjectMeta::default()
            },
            ..K8sNode::default()
        };
        assert_eq!(
            translate(&bare).problems,
            [Problem::NoInternalIpv4 { node: "b".into() }]
        );
    }
}
