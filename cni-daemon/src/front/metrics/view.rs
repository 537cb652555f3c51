//! The node as the metrics see it, published by the front after every change it makes
//! under the node's lock (requests, address changes, start), and the readiness it and
//! the flags of [`super::Telemetry`] give.

use std::net::IpAddr;

use cni_api::UplinkStatus;

use crate::model::{node::LocalNode, policy::Policies, record::EndpointRecord};

/// Where installing the CNI configuration stands (`--cni-conf-dir`, `--cni-bin-dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Install {
    /// Neither `--cni-conf-dir` nor `--cni-bin-dir`: nothing to install, readiness does
    /// not wait for it.
    NotAsked,
    /// Not written yet.
    Pending,
    Done,
    /// The last attempt failed (retried).
    Failed(String),
}

/// One pod interface: the labels of its counters, and what else the metrics count of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointView {
    /// The key of its counters (`ENDPOINT_COUNTERS`).
    pub host_ifindex: u32,
    /// The pod's namespace and name from `CNI_ARGS`; "" when the runtime gave none.
    pub namespace: String,
    pub pod: String,
    /// Its first address ("" when it has none).
    pub ip: String,
    /// The interface's name inside the pod (`CNI_IFNAME`).
    pub interface: String,
    pub port_mappings: usize,
    /// Its rate limits in bits per second: what it may receive (`to_pod`) and send
    /// (`from_pod`), where it has one.
    pub limits: Vec<(&'static str, u64)>,
}

impl EndpointView {
    fn of(endpoint: &EndpointRecord) -> Self {
        let pod = endpoint.pod.clone().unwrap_or_default();
        Self {
            host_ifindex: endpoint.host_ifindex,
            namespace: pod.namespace.unwrap_or_default(),
            pod: pod.name.unwrap_or_default(),
            ip: endpoint
                .ips
                .iter()
                .map(|net| net.addr())
                .find(IpAddr::is_ipv4)
                .or_else(|| endpoint.ips.first().map(|net| net.addr()))
                .map(|addr| addr.to_string())
                .unwrap_or_default(),
            interface: endpoint.id.ifname.clone(),
            port_mappings: endpoint.port_mappings.len(),
            limits: endpoint
                .bandwidth
                .iter()
                .flat_map(|limits| {
                    [
                        ("to_pod", limits.ingress_rate),
                        ("from_pod", limits.egress_rate),
                    ]
                })
                .filter_map(|(direction, rate)| Some((direction, rate?)))
                .collect(),
        }
    }
}

/// What the metrics and the readiness need of the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    pub endpoints: Vec<EndpointView>,
    /// The interfaces source NAT translates on, with their addresses; empty: NAT is
    /// off (no `--uplink` and no default route at start).
    pub uplinks: Vec<UplinkStatus>,
    /// What is refused of the other nodes, counted by reason.
    pub node_refusals: std::collections::BTreeMap<&'static str, u64>,
    /// Entries of each full map that did not fit.
    pub maps_left_out: std::collections::BTreeMap<&'static str, u64>,
    /// NetworkPolicy: what the metrics name and count of it.
    pub policies: PolicyView,
}

/// NetworkPolicy in [`NodeView`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyView {
    /// Each policy's counters slot (`POLICY_STATS`) with its namespace and name.
    pub slots: Vec<(u32, String, String)>,
    /// Objects the policy source refused.
    pub refused: u64,
    /// This node's pods isolated for ingress, for egress.
    pub isolated_ingress: u64,
    pub isolated_egress: u64,
}

impl PolicyView {
    fn of(policies: &Policies) -> Self {
        let isolated = policies.isolated_pods();
        Self {
            slots: policies
                .slots()
                .iter()
                .map(|((namespace, name), slot)| (*slot, namespace.clone(), name.clone()))
                .collect(),
            refused: policies.refused() as u64,
            isolated_ingress: isolated.ingress as u64,
            isolated_egress: isolated.egress as u64,
        }
    }
}

impl NodeView {
    /// Read from `node`; the caller holds its lock already, for its own work.
    pub fn of(node: &LocalNode) -> Self {
        let mut node_refusals = std::collections::BTreeMap::new();
        for refusal in node.cluster().refused() {
            *node_refusals.entry(refusal.kind).or_default() += 1;
        }
        Self {
            endpoints: node.list().iter().map(EndpointView::of).collect(),
            uplinks: node.status().uplinks,
            node_refusals,
            maps_left_out: node
                .maps_left_out()
                .iter()
                .map(|(map, count)| (*map, *count as u64))
                .collect(),
            policies: PolicyView::of(node.policies()),
        }
    }

    /// Every hostPort mapping of the node's pods.
    pub fn port_mappings(&self) -> usize {
        self.endpoints.iter().map(|e| e.port_mappings).sum()
    }

    /// Why pods cannot be served as they should through the uplink, if they cannot: NAT
    /// is off, or an uplink has no IPv4 address (what leaves by it is dropped).
    pub fn uplink_problem(&self) -> Option<String> {
        if self.uplinks.is_empty() {
            return Some(
                "no uplink: no --uplink was given and there was no default IPv4 route at \
                 start, so source NAT is off"
                    .to_owned(),
            );
        }
        let bare: Vec<&str> = self
            .uplinks
            .iter()
            .filter(|uplink| uplink.node_addr.is_none())
            .map(|uplink| uplink.name.as_str())
            .collect();
        (!bare.is_empty()).then(|| {
            format!(
                "uplink {} has no IPv4 address: pods' traffic out by it is dropped",
                bare.join(", ")
            )
        })
    }
}

/// Why the daemon is not ready (empty: ready): the datapath is loaded, the plugin's
/// socket serves, every uplink has an address, and the CNI configuration (the plugin,
/// the conflist) is installed when it was asked for.
pub fn not_ready(telemetry: &super::Telemetry) -> Vec<String> {
    let mut reasons = Vec::new();
    if !telemetry.datapath_loaded() {
        reasons.push("the datapath is not loaded yet".to_owned());
    }
    if !telemetry.serving() {
        reasons.push("the plugin's socket does not serve yet".to_owned());
    }
    // Before the datapath is up the view is empty: its uplink says nothing yet.
    if telemetry.datapath_loaded()
        && let Some(problem) = telemetry.view().uplink_problem()
    {
        reasons.push(problem);
    }
    match telemetry.install() {
        Install::NotAsked | Install::Done => {}
        Install::Pending => reasons.push("the CNI configuration is not installed yet".to_owned()),
        Install::Failed(error) => {
            reasons.push(format!("installing the CNI configuration failed: {error}"));
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::metrics::Telemetry;

    fn uplink(addr: Option<[u8; 4]>) -> UplinkStatus {
        UplinkStatus {
            name: "eth0".to_owned(),
            ifindex: 2,
            node_addr: addr.map(Into::into),
        }
    }

    #[test]
    fn ready_only_when_loaded_serving_with_an_addressed_uplink_and_installed() {
        let telemetry = Telemetry::new("/sys/fs/bpf/x".into(), Install::Pending);
        assert_eq!(
            not_ready(&telemetry).len(),
            3,
            "{:?}",
            not_ready(&telemetry)
        );
        telemetry.set_datapath_loaded();
        telemetry.set_serving();
        let reasons = not_ready(&telemetry);
        assert!(reasons[0].starts_with("no uplink"), "{reasons:?}");
        telemetry.publish(NodeView {
            endpoints: Vec::new(),
            uplinks: vec![uplink(None)],
            ..NodeView::default()
        });
        let reasons = not_ready(&telemetry);
        assert!(
            reasons[0].contains("eth0 has no IPv4 address"),
            "{reasons:?}"
        );
        telemetry.publish(NodeView {
            endpoints: Vec::new(),
            uplinks: vec![uplink(Some([198, 18, 0, 1]))],
            ..NodeView::default()
        });
        assert_eq!(
            not_ready(&telemetry),
            ["the CNI configuration is not installed yet"]
        );
        telemetry.set_install(Install::Failed("read-only".to_owned()));
        assert!(not_ready(&telemetry)[0].contains("read-only"));
        telemetry.set_install(Install::Done);
        assert!(not_ready(&telemetry).is_empty());
    }
}
