//! Service ranges (`--service-cidr`): the destinations the datapath hands to the node's
//! stack, where kube-proxy (iptables or nftables mode) DNATs Services. See the eBPF
//! side, `cni-ebpf/src/features/services.rs`.

use std::collections::BTreeSet;

use aya::maps::{Array, LpmTrie};
use cni_ebpf_common::{MAX_SERVICE_CIDRS, map_names};
use ipnet::Ipv4Net;

use super::{Datapath, DatapathError};
use crate::ranges;

impl Datapath {
    /// Makes the Service ranges exactly `ranges` (host bits cleared): the trie first,
    /// then their number, which turns the datapath's Service checks on (or off, at 0).
    pub fn set_service_cidrs(&mut self, ranges: &[Ipv4Net]) -> Result<(), DatapathError> {
        let desired: BTreeSet<Ipv4Net> = ranges.iter().map(Ipv4Net::trunc).collect();
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
        let changed = ranges::sync(&mut trie, &desired)?;
        let name = map_names::SERVICE_RANGES;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DatapathError::MissingMap(name))?;
        let mut count: Array<_, u32> = Array::try_from(map)?;
        // At most MAX_SERVICE_CIDRS, checked above.
        count.set(0, desired.len() as u32, 0)?;
        self.service_cidrs = desired.iter().copied().collect();
        if changed {
            tracing::info!(
                ranges = ?desired,
                "Service ranges: pods' traffic to them, and its replies, goes through the \
                 node's stack (kube-proxy)"
            );
        }
        Ok(())
    }

    /// The Service ranges in force.
    pub fn service_cidrs(&self) -> &[Ipv4Net] {
        &self.service_cidrs
    }
}
