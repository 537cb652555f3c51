//! The ranges whose traffic the datapath hands to the node's stack: Service ranges
//! (`--service-cidr`), where kube-proxy (iptables or nftables mode) DNATs Services, and
//! the host firewall's (`--host-firewall-cidr`), destinations such as a cloud metadata
//! address that pods must only reach through the node's netfilter. Both are one set to
//! the datapath (`SERVICE_CIDRS`); see its side, `cni-ebpf/src/features/services.rs`.

use std::collections::BTreeSet;

use aya::maps::{Array, LpmTrie};
use cni_ebpf_common::{MAX_SERVICE_CIDRS, ServiceConfig, map_names};
use ipnet::Ipv4Net;

use super::{Datapath, DatapathError};
use crate::ranges;

impl Datapath {
    /// Makes the ranges handed to the stack exactly `services` and `host_firewall` (host
    /// bits cleared): the trie first, then their number, which turns the datapath's
    /// checks on (or off, at 0).
    pub fn set_stack_cidrs(
        &mut self,
        services: &[Ipv4Net],
        host_firewall: &[Ipv4Net],
    ) -> Result<(), DatapathError> {
        let desired: BTreeSet<Ipv4Net> = services
            .iter()
            .chain(host_firewall)
            .map(Ipv4Net::trunc)
            .collect();
        if desired.len() > MAX_SERVICE_CIDRS as usize {
            return Err(DatapathError::ServiceCidrs(format!(
                "{} ranges, at most {MAX_SERVICE_CIDRS}",
                desired.len()
            )));
        }
        let name = map_names::SERVICE_CIDRS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DatapathError::MissingMap(name))?;
        let mut trie: LpmTrie<_, [u8; 4], u8> = LpmTrie::try_from(map)?;
        // No more ranges than the trie holds (checked above): none is left out.
        let changed = ranges::sync(&mut trie, &desired)?.changed;
        let name = map_names::SERVICE_RANGES;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DatapathError::MissingMap(name))?;
        let mut count: Array<_, u32> = Array::try_from(map)?;
        // At most MAX_SERVICE_CIDRS, checked above.
        count.set(0, desired.len() as u32, 0)?;
        let sorted = |ranges: &[Ipv4Net]| {
            let set: BTreeSet<Ipv4Net> = ranges.iter().map(Ipv4Net::trunc).collect();
            set.into_iter().collect::<Vec<_>>()
        };
        self.service_cidrs = sorted(services);
        self.host_firewall_cidrs = sorted(host_firewall);
        if changed {
            tracing::info!(
                ranges = ?desired,
                "Service and host firewall ranges: pods' traffic to them, and its replies, \
                 goes through the node's stack (kube-proxy, netfilter)"
            );
        }
        Ok(())
    }

    /// Writes what the datapath needs of Services besides their ranges: the NodePort
    /// range (`--service-node-port-range`) and each party's budget in the Service
    /// tables (`--service-party-budget`).
    pub fn set_service_config(
        &mut self,
        node_ports: (u16, u16),
        party_budget: u32,
    ) -> Result<(), DatapathError> {
        let name = map_names::SERVICE_CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DatapathError::MissingMap(name))?;
        let mut config: Array<_, ServiceConfig> = Array::try_from(map)?;
        config.set(
            0,
            ServiceConfig {
                node_port_min: node_ports.0,
                node_port_max: node_ports.1,
                party_budget,
            },
            0,
        )?;
        Ok(())
    }

    /// The Service ranges in force.
    pub fn service_cidrs(&self) -> &[Ipv4Net] {
        &self.service_cidrs
    }

    /// The host firewall's ranges in force.
    pub fn host_firewall_cidrs(&self) -> &[Ipv4Net] {
        &self.host_firewall_cidrs
    }
}
