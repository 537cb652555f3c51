//! `CLUSTER_CIDRS`, the destinations that keep the pod's address: always the union of
//! every endpoint's `cluster_cidrs` (written with [`crate::ranges::sync`]).

use std::collections::BTreeSet;

use ipnet::Ipv4Net;

use crate::model::record::EndpointRecord;

/// The ranges every endpoint in `endpoints` keeps untranslated, host bits cleared.
pub fn union<'a>(endpoints: impl IntoIterator<Item = &'a EndpointRecord>) -> BTreeSet<Ipv4Net> {
    endpoints
        .into_iter()
        .flat_map(|endpoint| endpoint.ipv4_cluster_cidrs().map(|net| net.trunc()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(name: &str, cidrs: &[&str]) -> EndpointRecord {
        EndpointRecord {
            cluster_cidrs: cidrs.iter().map(|c| c.parse().expect("valid")).collect(),
            ..EndpointRecord::for_tests(name)
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
