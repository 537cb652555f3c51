//! What an IPAM result may give a pod. The IPAM plugin is another program, configured by
//! whoever wrote the conflist: its addresses go into the node's datapath (the endpoints
//! map, source NAT's cluster ranges), so they are checked like any input across a trust
//! boundary before anything is configured with them.
//!
//! Refused: an IPv4 address that is not a unicast host address (unspecified, loopback,
//! multicast, broadcast, link-local: 169.254.0.0/16 holds the node's hairpin source
//! 169.254.42.1), its subnet's network or broadcast address, a prefix shorter than /8 (the
//! pod's subnet is, by default, the range source NAT leaves alone: a /0 would turn
//! translation off for every pod of the node, and no pod network is wider than a /8), and
//! a gateway outside the address's subnet or equal to it. Addresses that are the node's
//! own are the daemon's to refuse (`NodeError::NodeAddressForPod`): it knows them.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};

use crate::spec::IpConfig;

/// The shortest prefix a pod's IPv4 subnet may have.
pub const MIN_PREFIX: u8 = 8;

/// Why `ip` cannot be a pod's address, if it cannot.
pub fn refusal(ip: &IpConfig) -> Option<String> {
    let IpNet::V4(net) = ip.address else {
        return None;
    };
    let addr = net.addr();
    let problem = address_problem(addr, net).or_else(|| match ip.gateway {
        Some(IpAddr::V4(gateway)) if gateway == addr => Some("is its own gateway".to_owned()),
        Some(IpAddr::V4(gateway)) if !net.contains(&gateway) => {
            Some(format!("has a gateway {gateway} outside its subnet"))
        }
        Some(IpAddr::V6(gateway)) => Some(format!("has an IPv6 gateway {gateway}")),
        _ => None,
    })?;
    Some(format!("{net} {problem}"))
}

fn address_problem(addr: Ipv4Addr, net: Ipv4Net) -> Option<String> {
    let kind = if addr.is_unspecified() {
        "the unspecified address"
    } else if addr.is_loopback() {
        "a loopback address"
    } else if addr.is_multicast() {
        "a multicast address"
    } else if addr.is_broadcast() {
        "the broadcast address"
    } else if addr.is_link_local() {
        "a link-local address (169.254.0.0/16)"
    } else if net.prefix_len() < MIN_PREFIX {
        return Some(format!(
            "has a prefix shorter than /{MIN_PREFIX}: its subnet would cover far more than pods"
        ));
    } else if net.prefix_len() <= 30 && addr == net.network() {
        "its subnet's network address"
    } else if net.prefix_len() <= 30 && addr == net.broadcast() {
        "its subnet's broadcast address"
    } else {
        return None;
    };
    Some(format!("is {kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(address: &str, gateway: Option<&str>) -> IpConfig {
        IpConfig {
            address: address.parse().expect("a CIDR"),
            gateway: gateway.map(|gateway| gateway.parse().expect("an address")),
            interface: None,
        }
    }

    #[test]
    fn ordinary_pod_addresses_pass() {
        for (address, gateway) in [
            ("10.244.1.7/24", Some("10.244.1.1")),
            ("10.244.1.7/24", None),
            ("10.0.0.9/8", Some("10.0.0.1")),
            ("192.168.5.5/32", None),
            ("100.64.0.2/31", None),
            ("fd00::5/64", Some("fd00::1")),
        ] {
            assert_eq!(refusal(&ip(address, gateway)), None, "{address}");
        }
    }

    #[test]
    fn addresses_no_pod_may_have_are_refused_naming_why() {
        for (address, gateway, why) in [
            ("0.0.0.0/24", None, "unspecified"),
            ("127.0.0.5/8", None, "loopback"),
            ("224.0.0.5/24", None, "multicast"),
            ("255.255.255.255/32", None, "broadcast"),
            ("169.254.42.1/16", None, "link-local"),
            ("10.244.1.7/0", None, "prefix shorter than /8"),
            ("10.244.1.7/7", None, "prefix shorter than /8"),
            ("10.244.1.0/24", None, "network address"),
            ("10.244.1.255/24", None, "broadcast address"),
            ("10.244.1.7/24", Some("10.244.2.1"), "outside its subnet"),
            ("10.244.1.7/24", Some("10.244.1.7"), "its own gateway"),
        ] {
            let refused = refusal(&ip(address, gateway))
                .unwrap_or_else(|| panic!("{address} must be refused"));
            assert!(refused.contains(why), "{address}: {refused}");
        }
    }
}
