//! Source NAT's control plane: [`start`] after a (re)start, then [`Nat`], which writes
//! the configuration and the uplinks the datapath reads, keeps the cluster ranges in step
//! with the endpoints and the cluster's nodes, and holds the flow tables until the sweeper takes them.

use std::collections::BTreeSet;

use crate::model::record::EndpointRecord;
use aya::maps::{Array, MapData, MapError};
use cni_ebpf_common::{NatConfig, Uplinks};
use ipnet::Ipv4Net;

use super::{NatError, NatSettings, Timeouts, cidrs, flows::Flows, sysctl};
use crate::datapath::{
    Datapath,
    nat_maps::{ClusterCidrs, NatMaps},
};

/// Brings NAT to what `settings` asks after a (re)start: cluster ranges from
/// `endpoints` (and those of other nodes an earlier daemon wrote, kept until the node
/// source answers), forwarding, the uplink programs, `UPLINKS` and `NAT_CONFIG`, and the
/// previous daemon's programs off the devices that are no longer uplinks. With NAT off,
/// all of its uplink links and its flows go.
///
/// Order: the programs go on every uplink before `UPLINKS` names it (until then they
/// translate nothing there, and `from_pod` sends nothing there), and come off the old
/// ones last: no moment where pods' traffic is handed to a device without them.
pub fn start<'a>(
    datapath: &mut Datapath,
    settings: Option<NatSettings>,
    endpoints: impl IntoIterator<Item = &'a EndpointRecord>,
) -> Result<Nat, NatError> {
    let mut nat = Nat::open(datapath.take_nat_maps()?, settings)?;
    let synced = nat.sync_cluster_cidrs(endpoints, None)?;
    if synced.left_out > 0 {
        tracing::warn!(
            left_out = synced.left_out,
            "CLUSTER_CIDRS is full: pods' traffic to the ranges left out is translated"
        );
    }
    let previous = nat.previous_uplinks();
    let Some(settings) = nat.settings().cloned() else {
        nat.write_config()?;
        datapath.detach_uplinks_except(&[], &previous)?;
        return Ok(nat);
    };
    sysctl::warn_on_port_overlap(&settings.ports);
    sysctl::enable_ip_forward("pods' traffic to the outside is routed to the uplink").map_err(
        |source| NatError::Sysctl {
            path: sysctl::IP_FORWARD,
            source,
        },
    )?;
    for uplink in &settings.uplinks {
        datapath.attach_uplink(&uplink.name)?;
    }
    nat.write_config()?;
    let names: Vec<&str> = settings.uplinks.iter().map(|u| u.name.as_str()).collect();
    datapath.detach_uplinks_except(&names, &previous)?;
    for uplink in &settings.uplinks {
        tracing::info!(
            uplink = %uplink.name,
            node_addr = ?uplink.node_addr,
            ports = %settings.ports,
            "source NAT enabled"
        );
    }
    Ok(nat)
}

/// Source NAT as this daemon runs it: its settings (none: NAT is off) and its maps.
pub struct Nat {
    config: Array<MapData, NatConfig>,
    uplinks: Array<MapData, Uplinks>,
    cluster_cidrs: ClusterCidrs,
    /// The flow tables, until the sweeper takes them ([`Self::take_flows`]).
    flows: Option<Flows>,
    pub(super) settings: Option<NatSettings>,
    /// `NAT_CONFIG` as the previous daemon left it.
    previous: NatConfig,
    /// `UPLINKS` as the previous daemon left it (empty if it had none).
    previous_uplinks: Uplinks,
}

impl Nat {
    pub fn open(maps: NatMaps, settings: Option<NatSettings>) -> Result<Self, MapError> {
        let NatMaps {
            flows_out,
            flows_in,
            from_outside,
            hostport,
            config,
            uplinks,
            cluster_cidrs,
            sweeper,
            endpoints,
            stats,
            services,
        } = maps;
        let previous = config.get(&0, 0)?;
        let previous_uplinks = uplinks.get(&0, 0)?;
        Ok(Self {
            config,
            uplinks,
            cluster_cidrs,
            flows: Some(Flows {
                out: flows_out,
                inbound: flows_in,
                from_outside,
                hostport,
                sweeper,
                endpoints,
                stats,
                services,
                service_budget: cni_ebpf_common::DEFAULT_PARTY_BUDGET,
            }),
            settings,
            previous,
            previous_uplinks,
        })
    }

    pub fn settings(&self) -> Option<&NatSettings> {
        self.settings.as_ref()
    }

    /// The devices the previous daemon translated on (none when NAT was off), whose
    /// programs may still be attached: its `UPLINKS`, and the uplink of its
    /// `NAT_CONFIG` (a daemon of one uplink had no `UPLINKS`).
    pub fn previous_uplinks(&self) -> Vec<u32> {
        let mut ifindexes: Vec<u32> = self
            .previous_uplinks
            .iter()
            .map(|(ifindex, _)| ifindex)
            .collect();
        let first = self.previous.uplink_ifindex;
        if first != 0 && !ifindexes.contains(&first) {
            ifindexes.push(first);
        }
        ifindexes
    }

    /// Writes this daemon's configuration; with NAT off, a zero configuration (node
    /// address 0.0.0.0), no uplink and empty flow tables. The uplinks go first: a new
    /// one is translated on before the first uplink's address says NAT is on.
    pub fn write_config(&mut self) -> Result<(), MapError> {
        let (config, uplinks) = self.settings.as_ref().map_or_else(
            || (NatConfig::default(), Uplinks::default()),
            |settings| (settings.config(), settings.uplinks()),
        );
        self.uplinks.set(0, uplinks, 0)?;
        self.config.set(0, config, 0)?;
        if let (None, Some(flows)) = (&self.settings, &mut self.flows) {
            flows.flush()?;
        }
        Ok(())
    }

    /// Makes `CLUSTER_CIDRS` the union of `endpoints`' cluster ranges and `nodes`, every
    /// node's pod ranges (and the cluster CIDRs), collapsed: a range inside another or
    /// beside its twin takes no entry of its own. `None`: the nodes are not known yet (a
    /// start, before the node source's first answer): ranges are then only added, so
    /// that those of other nodes an earlier daemon wrote stay, and traffic to their pods
    /// keeps its source, until the nodes are known. A full table leaves ranges out
    /// (their pods' addresses are then translated), counted in what is returned.
    pub fn sync_cluster_cidrs<'a>(
        &mut self,
        endpoints: impl IntoIterator<Item = &'a EndpointRecord>,
        nodes: Option<BTreeSet<Ipv4Net>>,
    ) -> Result<crate::ranges::Synced, MapError> {
        let mut desired = cidrs::union(endpoints);
        let known = nodes.is_some();
        desired.extend(nodes.into_iter().flatten());
        let desired: BTreeSet<Ipv4Net> = Ipv4Net::aggregate(&desired.into_iter().collect())
            .into_iter()
            .collect();
        let synced = if known {
            crate::ranges::sync(&mut self.cluster_cidrs, &desired)?
        } else {
            crate::ranges::extend(&mut self.cluster_cidrs, &desired)?
        };
        if synced.changed {
            tracing::info!(
                ranges = desired.len(),
                first = ?desired.iter().take(8).collect::<Vec<_>>(),
                "cluster ranges kept untranslated"
            );
        }
        Ok(synced)
    }

    /// Hands the flow tables, with the timeouts that decide their expiry, to the sweeper
    /// (`None` when NAT is off, or once taken).
    pub fn take_flows(&mut self) -> Option<(Flows, Timeouts)> {
        let timeouts = self.settings.as_ref()?.timeouts;
        Some((self.flows.take()?, timeouts))
    }
}
