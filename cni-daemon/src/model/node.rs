//! The node's state as requests see it: the datapath, the endpoint records, source NAT,
//! hostPorts and the node's addresses, kept in step: every record's veth is bound to the
//! pods' TC block (a veth is bound before its record exists while the plugin runs IPAM,
//! see [`Node::prepare`]), its addresses are in the endpoints map and its port mappings
//! in the hostPort maps; `CLUSTER_CIDRS` is the union of the records' cluster ranges
//! and every node's pod ranges ([`Cluster`]); the records' gateways are addresses of
//! the node ([`Gateways`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::Path,
    sync::Arc,
};

use cni_ebpf_common::{RemoteNode, map_names};
use ipnet::Ipv4Net;

use tokio::sync::Notify;

use cni_api::{EndpointId, ErrorKind, Status, UplinkStatus};

use crate::model::record::EndpointRecord;

use crate::{
    datapath::{
        Datapath, DatapathError,
        gateways::Gateways,
        node_routes::{self, Via},
        overlay::{self, ClusterNodes, OverlaySettings, RemoteNodes},
        tc_block,
    },
    model::{
        cluster::{Cluster, Routing},
        endpoints::{EndpointError, Endpoints},
        hostports::{self, HostPortError, HostPorts},
        nat::{self, Flows, Nat, NatError, NatSettings, Timeouts},
        node_addrs::{NodeAddrError, NodeAddrs},
        policy::{Policies, PolicyMode},
        rate_limits::RateLimits,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Nat(#[from] NatError),
    #[error(transparent)]
    HostPort(#[from] HostPortError),
    #[error(transparent)]
    NodeAddr(#[from] NodeAddrError),
    #[error("cannot write the pods' network policies: {0}")]
    Policy(aya::maps::MapError),
    #[error("{0} is an address of this node: no pod may have it")]
    NodeAddressForPod(std::net::IpAddr),
    #[error("cannot write {path}: {source}")]
    State {
        path: String,
        source: std::io::Error,
    },
}

/// How the node takes NetworkPolicy: `--policy-mode`, and whether a policy source
/// will answer (without one, nothing is isolated).
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicySettings {
    pub mode: PolicyMode,
    pub has_source: bool,
}

/// A change [`LocalNode::attach`] made, with what undoing it needs.
#[derive(Debug)]
enum Undo {
    /// The pod's veth bound to the pods' block (and its counters begun).
    Bind { veth: String, ifindex: u32 },
    /// The previous record's hostPorts removed.
    RemovedPorts(EndpointRecord),
    /// The new record's hostPorts added.
    AddedPorts(EndpointRecord),
    /// The record written, in place of `previous` when there was one.
    Record {
        id: EndpointId,
        previous: Option<EndpointRecord>,
    },
}

impl NodeError {
    /// What kind of refusal this is for the plugin (`cni_api::ErrorKind`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::HostPort(HostPortError::Conflict(_)) => ErrorKind::PortConflict,
            Self::HostPort(HostPortError::Invalid(..))
            | Self::Datapath(DatapathError::NotPodVeth { .. } | DatapathError::NoInterface(_)) => {
                ErrorKind::InvalidRequest
            }
            Self::Endpoint(EndpointError::AddressTaken { .. }) | Self::NodeAddressForPod(_) => {
                ErrorKind::AddressTaken
            }
            _ => ErrorKind::NodeFailure,
        }
    }
}

/// The gateways the records' pods route through: unicast addresses that are no pod's
/// (a record is the plugin's word, and the node must not take a broadcast or loopback
/// address, nor a pod's own).
fn gateways_of(endpoints: &Endpoints) -> BTreeSet<Ipv4Addr> {
    let pods: BTreeSet<std::net::IpAddr> = endpoints
        .list()
        .flat_map(|endpoint| endpoint.ips.iter().map(ipnet::IpNet::addr))
        .collect();
    endpoints
        .list()
        .filter_map(EndpointRecord::ipv4_gateway)
        .filter(|gateway| {
            !(gateway.is_unspecified()
                || gateway.is_loopback()
                || gateway.is_multicast()
                || gateway.is_broadcast()
                || pods.contains(&std::net::IpAddr::V4(*gateway)))
        })
        .collect()
}

/// The overlay as the node keeps it in step.
struct Overlay {
    ifindex: u32,
    /// The MTU of the device, and of pods whose conflist sets none.
    pod_mtu: u32,
    /// The UDP port every node's tunnel packets arrive at: no hostPort's.
    port: u16,
}

/// This node as the daemon keeps it: its pods, their hostPorts, source NAT, the node's
/// addresses, the cluster and the datapath they are written into, kept in step per
/// request. (`cni_nodes::Node` is any node of the cluster as the node source gives it.)
pub struct LocalNode {
    datapath: Datapath,
    endpoints: Endpoints,
    nat: Nat,
    host_ports: HostPorts,
    node_addrs: NodeAddrs,
    /// The pods' gateways as addresses of the node: those of the records.
    gateways: Gateways,
    /// This node's name and the cluster's nodes.
    cluster: Cluster,
    /// `--routing vxlan`: the overlay device.
    overlay: Option<Overlay>,
    /// `REMOTE_NODES`: the other nodes' ranges, each with its node (the overlay sends by
    /// it; with either routing, pods' traffic to each node is counted by it).
    remote_nodes: RemoteNodes,
    /// `CLUSTER_NODES`: the nodes' addresses, to which pods may send no tunnel packet.
    cluster_nodes: ClusterNodes,
    /// Told after every detach, so that the NAT sweeper forgets the pod's flows at once
    /// (see [`Self::on_detach`]).
    detached: Option<Arc<Notify>>,
    /// Entries of each full map (by name) that did not fit at its last sync.
    left_out: BTreeMap<&'static str, usize>,
    /// `RATE_LIMITS`: the pods' egress token buckets.
    rate_limits: RateLimits,
    /// Host ports no mapping may take, with what they are ([`Self::deny_host_ports`]).
    denied_ports: Vec<(u16, String)>,
    /// Host veths [`Self::prepare`] bound to the pods' block that no endpoint uses yet.
    /// A plugin that dies in between leaves the name here until the daemon stops, and
    /// the veth bound until it is deleted (a binding goes with its device).
    prepared: BTreeSet<String>,
    /// NetworkPolicy, compiled for the endpoints' pods.
    policies: Policies,
}

impl LocalNode {
    /// Reconciles after a (re)start: this daemon's `from_pod` goes into the pods' TC
    /// block (replacing the previous daemon's in place), records whose veth is gone are
    /// dropped with their counters, every remaining pod's veth is bound to the block (one
    /// holding a clsact that is not ours is left as it is, with a warning). Then
    /// NAT starts as `nat` says (`None`: off), see [`nat::start`]. hostPorts: the
    /// mappings of the records, the node's addresses, and the socket programs on
    /// `cgroup` (`None`: the node's own processes do not reach hostPorts). `cluster`
    /// holds no nodes yet ([`Self::set_nodes`] gives them); with `--routing vxlan` and a
    /// node source the overlay device is made (or found) with `overlay`'s settings and
    /// an MTU the uplink's less the overlay's; otherwise it goes.
    pub fn open(
        mut datapath: Datapath,
        state_dir: &Path,
        nat: Option<NatSettings>,
        cgroup: Option<&Path>,
        cluster: Cluster,
        overlay: OverlaySettings,
        policy: PolicySettings,
    ) -> Result<Self, NodeError> {
        let uplink = nat.as_ref().map(|settings| settings.first().name.clone());
        datapath.install_pod_block()?;
        tc_block::record_netns(state_dir)?;
        let (endpoints, gone) = Endpoints::open(state_dir, datapath.take_endpoints_map()?)?;
        let mut rate_limits = RateLimits::open(datapath.take_rate_limits_map()?);
        rate_limits
            .sync(endpoints.list())
            .map_err(DatapathError::from)?;
        for endpoint in &gone {
            datapath.detach_pod(&endpoint.host_veth)?;
            datapath.forget_counters(endpoint.host_ifindex)?;
        }
        for endpoint in endpoints.list() {
            // One veth that cannot be bound (a clsact someone else put there) must not
            // keep every other pod's CNI calls from being served.
            if let Err(error) = datapath.attach_pod(&endpoint.host_veth) {
                tracing::warn!(
                    %error,
                    veth = %endpoint.host_veth,
                    "a pod's veth cannot be bound to the pods' block: left as it is"
                );
            }
        }
        tracing::info!(
            endpoints = endpoints.len(),
            dropped = gone.len(),
            "endpoints reconciled"
        );
        let nat = nat::start(&mut datapath, nat, endpoints.list())?;
        // A node on its own (no node source) has no other nodes to reach.
        let overlay = match (cluster.routing(), cluster.source()) {
            (Routing::Vxlan, Some(_)) => {
                let pod_mtu = overlay::pod_mtu(uplink.as_deref())?;
                let port = overlay.port;
                let ifindex = datapath.start_overlay(overlay, pod_mtu)?;
                Some(Overlay {
                    ifindex,
                    pod_mtu,
                    port,
                })
            }
            (Routing::Native, _) | (Routing::Vxlan, None) => {
                datapath.stop_overlay(overlay.underlay_trust)?;
                None
            }
        };
        let remote_nodes = datapath.take_remote_nodes()?;
        let cluster_nodes = datapath.take_cluster_nodes()?;
        let maps = datapath.take_hostport_maps()?;
        let host_ports = HostPorts::open(
            datapath.take_hostports_map()?,
            maps.targets,
            endpoints.list(),
        )?;
        let mut gateways = Gateways::open(datapath.take_gateways_map()?);
        if let Err(error) = gateways.sync(&gateways_of(&endpoints)) {
            // The next ADD or DEL tries again.
            tracing::warn!(%error, "cannot give the pods' gateways to the node");
        }
        let mut node_addrs = NodeAddrs::open(maps.node_addrs);
        if let Err(error) = node_addrs.sync() {
            // The address watcher tries again at the next change.
            tracing::warn!(%error, "cannot fill the node's addresses");
        }
        datapath.start_sockets(cgroup)?;
        let policies = Policies::open(datapath.take_policy_maps()?, policy.mode, policy.has_source);
        let mut node = Self {
            datapath,
            endpoints,
            nat,
            host_ports,
            node_addrs,
            gateways,
            cluster,
            overlay,
            remote_nodes,
            cluster_nodes,
            detached: None,
            left_out: BTreeMap::new(),
            rate_limits,
            denied_ports: hostports::NODE_SERVICE_PORTS
                .iter()
                .map(|(port, what)| (*port, (*what).to_owned()))
                .collect(),
            prepared: BTreeSet::new(),
            policies,
        };
        // Without a policy source nothing is isolated (what a previous daemon wrote
        // goes); with one, what is written stays in force until it answers.
        node.sync_policies()?;
        node.cluster
            .set_bounds(node.reserved_ranges(), node.node_addrs.current().clone());
        // Pods recorded before this start are reached from their gateway too.
        for endpoint in node.endpoints.list() {
            node.route_from_gateway(endpoint);
        }
        // Without a node source there are no other nodes: routes a previous daemon
        // made to theirs go (with one, they go once the source has answered).
        if node.cluster.source().is_none() {
            node.sync_node_routes()?;
        }
        if let Err(error) = node.sync_guard() {
            // The next link or uplink change tries again.
            tracing::warn!(%error, "cannot put the gateway guard on the node's devices");
        }
        Ok(node)
    }

    pub fn status(&self) -> Status {
        Status {
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            // Through its display form: an answer must encode as JSON, which only
            // takes UTF-8 paths.
            bpf_dir: self.datapath.bpf_dir().display().to_string().into(),
            datapath_loaded: true,
            endpoints: self.endpoints.len(),
            attachments: self.datapath.attachments().to_vec(),
            nat_enabled: self.nat.settings().is_some(),
            uplink: self.nat.settings().map(|s| s.first().name.clone()),
            node_addr: self.nat.settings().and_then(|s| s.first().node_addr),
            uplinks: self.nat.settings().map_or_else(Vec::new, |settings| {
                settings
                    .uplinks
                    .iter()
                    .map(|uplink| UplinkStatus {
                        name: uplink.name.clone(),
                        ifindex: uplink.ifindex,
                        node_addr: uplink.node_addr,
                    })
                    .collect()
            }),
            host_port_addrs: self.node_addrs.current().iter().copied().collect(),
            gateways: self.gateways.current().iter().copied().collect(),
            service_cidrs: self.datapath.service_cidrs().to_vec(),
            host_firewall_cidrs: self.datapath.host_firewall_cidrs().to_vec(),
            // Filled in by the server, outside the node's lock (a netlink query).
            pod_gso_max_size: None,
            node_name: Some(self.cluster.name().to_owned()),
            node_source: self.cluster.source().map(ToString::to_string),
            pod_cidrs: self.cluster.pod_cidrs(),
            pod_mtu: self.overlay.as_ref().map(|overlay| overlay.pod_mtu),
        }
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Takes the cluster's nodes as the node source now gives them: source NAT leaves
    /// every node's pod ranges untranslated, and the ways to the other nodes' pods
    /// (routes, `REMOTE_NODES`, the overlay's address) follow them.
    pub fn set_nodes(&mut self, nodes: cni_nodes::NodeSet) -> Result<(), NodeError> {
        if self.cluster.set_nodes(nodes) {
            self.sync_cluster_cidrs()?;
            self.sync_node_routes()?;
        }
        Ok(())
    }

    /// Brings the ways to other nodes' pods in step with the nodes: `REMOTE_NODES`; then
    /// with the overlay, its address and the routes through the device; without, the
    /// routes via each node's address. Until the nodes are known, routes
    /// are only added (an earlier daemon's stay).
    fn sync_node_routes(&mut self) -> Result<(), NodeError> {
        let remote = self.cluster.remote_ranges();
        let nodes = remote
            .iter()
            .map(|(net, addr)| {
                let node = RemoteNode {
                    addr: addr.octets(),
                    pad: 0,
                };
                (*net, node)
            })
            .collect();
        let synced = crate::ranges::sync_values(&mut self.remote_nodes, &nodes)
            .map_err(DatapathError::from)?;
        self.left_out(
            map_names::REMOTE_NODES,
            synced.left_out,
            "other nodes' pod ranges left out are not counted per node nor reached through \
             the overlay by the pods' program",
        );
        let addresses = self
            .cluster
            .node_addresses()
            .into_iter()
            .map(Ipv4Net::from)
            .collect();
        let synced = crate::ranges::sync(&mut self.cluster_nodes, &addresses)
            .map_err(DatapathError::from)?;
        self.left_out(
            map_names::CLUSTER_NODES,
            synced.left_out,
            "pods' tunnel packets to the node addresses left out are not dropped",
        );
        let desired: BTreeMap<Ipv4Net, Via> = match &self.overlay {
            None => remote
                .iter()
                .map(|(net, addr)| (*net, Via::Gateway(*addr)))
                .collect(),
            Some(overlay) => {
                let source = self.cluster.overlay_address();
                overlay::set_address(overlay.ifindex, source)?;
                match source {
                    Some(source) => remote
                        .keys()
                        .map(|net| {
                            let via = Via::Device {
                                ifindex: overlay.ifindex,
                                source,
                            };
                            (*net, via)
                        })
                        .collect(),
                    // No address to send from yet: the node's own traffic waits for it.
                    None => BTreeMap::new(),
                }
            }
        };
        let sync = node_routes::sync(&desired, !self.cluster.known())?;
        if !sync.added.is_empty() || !sync.removed.is_empty() {
            tracing::info!(
                added = ?sync.added,
                removed = ?sync.removed,
                "routes to other nodes' pods"
            );
        }
        for (net, error) in &sync.refused {
            tracing::warn!(
                range = %net,
                via = %desired.get(net).map_or_else(String::new, ToString::to_string),
                %error,
                "the route to another node's pods is refused (is that node on a directly \
                 connected network? native routing needs it)"
            );
        }
        Ok(())
    }

    /// After a change of the namespace's addresses: refills `NODE_ADDRS` (returned) and
    /// has source NAT follow the uplink (see [`Self::follow_uplink`]), whether or not
    /// the refill succeeded.
    pub fn sync_node_addrs(&mut self) -> Result<BTreeSet<Ipv4Addr>, NodeError> {
        let addrs = self.node_addrs.sync();
        self.follow_uplink()?;
        // Other nodes' ranges are checked against the node's addresses and networks.
        let local = self.node_addrs.current().clone();
        if self.cluster.set_bounds(self.reserved_ranges(), local) && self.cluster.known() {
            self.sync_cluster_cidrs()?;
            self.sync_node_routes()?;
        }
        Ok(addrs?)
    }

    /// What no other node's pod range may overlap (with link-local, see
    /// [`crate::model::cluster::vet::Bounds`]): the Service ranges, the host-firewall ranges
    /// and the networks the node reaches directly.
    fn reserved_ranges(&self) -> Vec<(Ipv4Net, String)> {
        let named = |nets: &[Ipv4Net], what: &str| {
            nets.iter()
                .map(|net| (*net, what.to_owned()))
                .collect::<Vec<_>>()
        };
        let mut reserved = named(self.datapath.service_cidrs(), "the Service range");
        reserved.extend(named(
            self.datapath.host_firewall_cidrs(),
            "the host-firewall range",
        ));
        reserved.extend(
            self.node_addrs
                .networks()
                .iter()
                .map(|net| (*net, "a network this node reaches directly,".to_owned())),
        );
        reserved
    }

    /// Has source NAT follow the uplink's address, its device and, when the uplink is
    /// the default route's device, the default route ([`Nat::follow_uplink`]).
    pub fn follow_uplink(&mut self) -> Result<(), NodeError> {
        self.nat.follow_uplink(&mut self.datapath)?;
        self.sync_guard()
    }

    /// Has the gateway guard on every Ethernet device of the node that is neither a veth
    /// or netkit device, nor an uplink, nor the overlay (whose programs hide the gateways
    /// themselves): after start, an uplink change and every such device that comes or
    /// goes.
    pub fn sync_guard(&mut self) -> Result<(), NodeError> {
        let uplinks: Vec<String> = self.nat.settings().map_or_else(Vec::new, |settings| {
            settings
                .uplinks
                .iter()
                .map(|uplink| uplink.name.clone())
                .collect()
        });
        let mut skip: Vec<&str> = uplinks.iter().map(String::as_str).collect();
        if self.overlay.is_some() {
            skip.push(overlay::DEVICE);
        }
        self.datapath.sync_guard(&skip)?;
        Ok(())
    }

    /// After a change of link `ifindex`'s root qdisc (`queued`: one other than the
    /// veth's default): the pod on that host veth gets its frames through it or straight
    /// again (`Endpoints::set_queued`). Returns whether anything changed.
    pub fn follow_root_qdisc(&mut self, ifindex: u32, queued: bool) -> Result<bool, NodeError> {
        Ok(self.endpoints.set_queued(ifindex, queued)?)
    }

    /// Has `detached` notified after every endpoint detached (DEL, GC): the NAT sweeper
    /// then removes the pod's flows without waiting for its next round.
    pub fn on_detach(&mut self, detached: Arc<Notify>) {
        self.detached = Some(detached);
    }

    /// The NAT flow tables and their timeouts, for the sweeper to own (`None`: NAT is
    /// off, or already taken).
    pub fn take_nat_flows(&mut self) -> Option<(Flows, Timeouts)> {
        self.nat.take_flows()
    }

    /// Binds `host_veth`'s ingress to the pods' TC block before its endpoint is known
    /// ([`cni_api::Request::Prepare`], sent while the plugin runs IPAM), so that the pod
    /// program runs on it from its first frame; [`Self::attach`] then finds it in place.
    /// Only the plugin's own veths are accepted ([`Datapath::check_pod_veth`]).
    pub fn prepare(&mut self, host_veth: &str) -> Result<(), NodeError> {
        self.datapath.check_pod_veth(host_veth)?;
        self.datapath.attach_pod(host_veth)?;
        self.prepared.insert(host_veth.to_owned());
        Ok(())
    }

    /// Detaches what [`Self::prepare`] attached, unless an endpoint uses it by now.
    /// Returns whether it detached anything.
    /// Only names [`Self::prepare`] accepted are looked at (the veth itself may be
    /// gone by now).
    pub fn unprepare(&mut self, host_veth: &str) -> Result<bool, NodeError> {
        if !cni_api::naming::is_host_veth(host_veth) {
            return Err(DatapathError::NotPodVeth {
                name: host_veth.to_owned(),
                reason: "not a name the plugin gives",
            }
            .into());
        }
        if !self.prepared.remove(host_veth)
            || self
                .endpoints
                .list()
                .any(|endpoint| endpoint.host_veth == host_veth)
        {
            return Ok(false);
        }
        self.datapath.detach_pod(host_veth)?;
        Ok(true)
    }

    /// Binds the pod's veth to the pods' block (unless [`Self::prepare`] did), records
    /// the endpoint, adds its cluster ranges and its hostPort mappings. All or nothing:
    /// everything that can be checked is checked before anything changes, and a later
    /// failure puts back what was there (a re-ADD's live endpoint keeps its record, map
    /// entries, hostPorts and binding; a prepared veth stays prepared).
    pub fn attach(&mut self, endpoint: EndpointRecord) -> Result<(), NodeError> {
        if let Some(conflict) = hostports::conflict(self.endpoints.list(), &endpoint) {
            return Err(HostPortError::Conflict(conflict).into());
        }
        if let Some(overlay) = &self.overlay
            && let Some(taken) = hostports::overlays(&endpoint, overlay.port)
        {
            return Err(HostPortError::Conflict(taken).into());
        }
        if let Some(refused) = hostports::refused_port(&endpoint, &self.denied_ports) {
            return Err(HostPortError::Conflict(refused).into());
        }
        hostports::entries(&endpoint)?;
        self.endpoints.check(&endpoint)?;
        if let Some(addr) = endpoint.ips.iter().map(ipnet::IpNet::addr).find(|addr| {
            matches!(addr, std::net::IpAddr::V4(v4) if self.node_addrs.current().contains(v4))
        }) {
            return Err(NodeError::NodeAddressForPod(addr));
        }
        let veth = endpoint.host_veth.clone();
        let prepared = self.prepared.contains(&veth);
        if !prepared {
            self.datapath.check_pod_veth(&veth)?;
        }
        self.datapath
            .check_pod_link(&veth, endpoint.host_ifindex, endpoint.host_mac.octets())?;
        let previous = self.endpoints.get(&endpoint.id).cloned();
        let mut done = Vec::new();
        if let Err(error) = self.apply_attach(&endpoint, previous, prepared, &mut done) {
            self.undo(done);
            return Err(error);
        }
        self.prepared.remove(&veth);
        self.route_from_gateway(&endpoint);
        Ok(())
    }

    /// The changes of [`Self::attach`] once its checks passed, each recorded in `done`
    /// as it is made, so that a failure can be undone ([`Self::undo`]).
    fn apply_attach(
        &mut self,
        endpoint: &EndpointRecord,
        previous: Option<EndpointRecord>,
        prepared: bool,
        done: &mut Vec<Undo>,
    ) -> Result<(), NodeError> {
        let veth = &endpoint.host_veth;
        // Bound already: prepared, or the live endpoint's own veth (a re-ADD).
        let bound = prepared
            || previous
                .as_ref()
                .is_some_and(|previous| previous.host_veth == *veth);
        if !bound {
            self.datapath.attach_pod(veth)?;
            done.push(Undo::Bind {
                veth: veth.clone(),
                ifindex: endpoint.host_ifindex,
            });
        }
        if let Some(previous) = &previous {
            // Put back whatever part of them `remove` took, should it fail.
            done.push(Undo::RemovedPorts(previous.clone()));
            self.host_ports.remove(previous)?;
        }
        // `add` leaves none of the new mappings behind when it fails.
        self.host_ports.add(endpoint)?;
        done.push(Undo::AddedPorts(endpoint.clone()));
        self.endpoints.attach(endpoint.clone())?;
        done.push(Undo::Record {
            id: endpoint.id.clone(),
            previous,
        });
        self.sync_cluster_cidrs()?;
        self.sync_gateways()?;
        self.sync_rate_limits()?;
        // The pod's policies are in the datapath before its ADD answers.
        self.sync_policies()
    }

    /// Undoes what a failed attach did, last first. Best effort: the attach's own
    /// error is the one reported; a step that cannot be undone is logged.
    fn undo(&mut self, done: Vec<Undo>) {
        for step in done.into_iter().rev() {
            let outcome: Result<(), NodeError> = match &step {
                Undo::Bind { veth, ifindex } => self
                    .datapath
                    .detach_pod(veth)
                    .and_then(|()| self.datapath.forget_counters(*ifindex))
                    .map_err(NodeError::from),
                Undo::RemovedPorts(previous) => {
                    self.host_ports.add(previous).map_err(NodeError::from)
                }
                Undo::AddedPorts(endpoint) => {
                    self.host_ports.remove(endpoint).map_err(NodeError::from)
                }
                Undo::Record { id, previous } => match previous {
                    Some(previous) => self.endpoints.attach(previous.clone()).map(drop),
                    None => self.endpoints.detach(id).map(drop),
                }
                .map_err(NodeError::from)
                .and_then(|()| self.sync_cluster_cidrs())
                .and_then(|()| self.sync_gateways())
                .and_then(|()| self.sync_rate_limits())
                .and_then(|()| self.sync_policies()),
            };
            if let Err(error) = outcome {
                tracing::warn!(%error, ?step, "cannot undo a step of a failed attach");
            }
        }
    }

    /// The node reaches the pod from its gateway, when that is an address of the node
    /// (see `datapath::gateways`). Without it the node's traffic to the pod leaves from
    /// another of its addresses, as before: a warning, not a failed ADD.
    fn route_from_gateway(&self, endpoint: &EndpointRecord) {
        let Some(gateway) = endpoint.ipv4_gateway().filter(|gateway| {
            self.gateways.current().contains(gateway) || self.node_addrs.current().contains(gateway)
        }) else {
            return;
        };
        for pod in endpoint.ipv4_addrs() {
            if let Err(error) =
                crate::datapath::gateways::route_from(pod, endpoint.host_ifindex, gateway)
            {
                tracing::warn!(%error, "the node reaches this pod from another address");
            }
        }
    }

    /// Forgets `id`; returns whether it was known.
    pub fn detach(&mut self, id: &EndpointId) -> Result<Option<EndpointRecord>, NodeError> {
        let Some(endpoint) = self.endpoints.detach(id)? else {
            return Ok(None);
        };
        self.host_ports.remove(&endpoint)?;
        self.datapath.detach_pod(&endpoint.host_veth)?;
        self.datapath.forget_counters(endpoint.host_ifindex)?;
        self.sync_cluster_cidrs()?;
        self.sync_gateways()?;
        self.sync_rate_limits()?;
        self.sync_policies()?;
        if let Some(detached) = &self.detached {
            detached.notify_one();
        }
        Ok(Some(endpoint))
    }

    /// Forgets every endpoint of `network` not in `keep`; returns them.
    pub fn collect(
        &mut self,
        network: &str,
        keep: &[EndpointId],
    ) -> Result<Vec<EndpointRecord>, NodeError> {
        let mut removed = Vec::new();
        for id in self.endpoints.stale(network, keep) {
            removed.extend(self.detach(&id)?);
        }
        // Each detach has brought CLUSTER_CIDRS in step already.
        Ok(removed)
    }

    pub fn get(&self, id: &EndpointId) -> Option<&EndpointRecord> {
        self.endpoints.get(id)
    }

    pub fn list(&self) -> Vec<EndpointRecord> {
        self.endpoints.list().cloned().collect()
    }

    /// The host veths whose pods get their frames through a root qdisc.
    pub fn queued(&self) -> Vec<u32> {
        self.endpoints.queued()
    }

    /// The records' gateways as addresses of the node, and so hostPort addresses at
    /// once (the address watcher would refill `NODE_ADDRS` a moment later).
    fn sync_gateways(&mut self) -> Result<(), NodeError> {
        if self.gateways.sync(&gateways_of(&self.endpoints))? {
            self.node_addrs.sync()?;
        }
        Ok(())
    }

    fn sync_cluster_cidrs(&mut self) -> Result<(), NodeError> {
        let synced = self
            .nat
            .sync_cluster_cidrs(self.endpoints.list(), self.cluster.all_pod_cidrs())
            .map_err(NatError::from)?;
        self.left_out(
            map_names::CLUSTER_CIDRS,
            synced.left_out,
            "pods' traffic to the cluster ranges left out is translated",
        );
        Ok(())
    }

    /// The pods' egress token buckets, in step with the records' limits.
    fn sync_rate_limits(&mut self) -> Result<(), NodeError> {
        self.rate_limits
            .sync(self.endpoints.list())
            .map_err(|error| NodeError::Datapath(DatapathError::from(error)))
    }

    /// Takes a new set of objects from the policy source and applies it.
    pub fn set_policy_objects(
        &mut self,
        objects: Arc<cni_policy::parse::Objects>,
    ) -> Result<(), NodeError> {
        self.policies.set_objects(objects);
        self.sync_policies()
    }

    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Names the policy source for `ebpf-cnid policy`.
    pub fn name_policy_source(&mut self, name: impl Into<String>) {
        self.policies.name_source(name);
    }

    /// The policy maps in step with the endpoints and the source's objects.
    fn sync_policies(&mut self) -> Result<(), NodeError> {
        let started = std::time::Instant::now();
        let synced = self
            .policies
            .sync(self.endpoints.list())
            .map_err(NodeError::Policy)?;
        if synced.changes > 0 {
            tracing::info!(
                changes = synced.changes,
                isolated_pods = synced.isolated,
                took_ms = started.elapsed().as_millis(),
                "network policies applied"
            );
        }
        Ok(())
    }

    /// Notes that `count` entries did not fit in the full `map` (0: all fit again):
    /// warned once per change, with what they miss (`what`), and counted in `/metrics`.
    fn left_out(&mut self, map: &'static str, count: usize, what: &str) {
        let before = self.left_out.insert(map, count).unwrap_or(0);
        if count > 0 && count != before {
            tracing::warn!(map, left_out = count, "{map} is full: {what}");
        } else if count == 0 && before > 0 {
            tracing::info!(map, "{map} holds every entry again");
        }
    }

    /// Adds `ports` (each with what it is: the daemon's own listeners) to the host
    /// ports no mapping may take.
    pub fn deny_host_ports(&mut self, ports: impl IntoIterator<Item = (u16, String)>) {
        self.denied_ports.extend(ports);
    }

    /// Entries of each full map that did not fit, as of its last sync.
    pub fn maps_left_out(&self) -> &BTreeMap<&'static str, usize> {
        &self.left_out
    }
}
