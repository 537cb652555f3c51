//! `CLUSTER_CIDRS`, the destinations that keep the pod's address: always the union of
//! every endpoint's `cluster_cidrs` (written with [`crate::ranges::sync`]).

use std::collections::BTreeSet;

use ipnet::Ipv4Net;

use cni_api::Endpoint;

/// The ranges every endpoint in `endpoints` keeps untranslated, host bits cleared.
pub fn union<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint>) -> BTreeSet<Ipv4Net> {
    endpoints
        .into_iter()
        .flat_map(|endpoint| endpoint.cluster_cidrs.iter().map(Ipv4Net::trunc))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_api::EndpointId;

    fn endpoint(name: &str, cidrs: &[&str]) -> Endpoint {
        Endpoint {
            id: EndpointId {
                container_id: name.to_owned(),
                ifname: "eth0".to_owned(),
            },
            network: "pods".to_owned(),
            netns: format!("/run/netns/{name}").into(),
            host_veth: format!("veb{name}"),
            host_ifindex: 7,
            host_mac: "0a:58:0a:f4:01:01".parse().expect("a MAC"),
            mac: "0a:58:0a:f4:01:02".parse().expect("a MAC"),
            ips: vec!["10.244.1.2/24".parse().expect("valid")],
            masquerade: true,
            cluster_cidrs: cidrs.iter().map(|c| c.parse().expect("valid")).collect(),
            port_mappings: Vec::new(),
            bandwidth: None,
            gateway: None,
            pod: None,
        }
    }

    fn nets(texts: &[&str]) -> BTreeSet<Ipv4Net> {
        texts.iter().map(|t| t.parse().expect("valid")).collect()
    }

    #[test]
    fn union_merges_every_endpoints_ranges_once() {
        let endpoints = [
            endpoint("a", &["10.244.0.0/16"]),
            endpoint("b", &["10.244.0.0/16", "10.96.0.0/12"]),
            endpoint("c", &[]),
        ];
        assert_eq!(union(&endpoints), nets(&["10.96.0.0/12", "10.244.0.0/16"]));
    }

    #[test]
    fn union_clears_host_bits() {
        let endpoints = [endpoint("a", &["10.244.1.7/16"])];
        assert_eq!(union(&endpoints), nets(&["10.244.0.0/16"]));
    }

    #[test]
    fn union_of_no_endpoints_is_empty() {
        assert!(union(&[]).is_empty());
    }
}
