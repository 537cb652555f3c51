//! The messages: a request and its response, each in an [`Envelope`] carrying the
//! protocol version.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{MacAddr, Protocol};

/// Bumped on any incompatible change of [`Request`] or [`Response`].
pub const PROTOCOL_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub version: u32,
    pub body: T,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// Is the datapath loaded, and where is it attached?
    Status,
    /// Get a new host veth ready ahead of [`Request::Attach`], while the plugin runs
    /// IPAM (the daemon's `Node::prepare` says what that involves).
    Prepare { host_veth: String },
    /// Undo a [`Request::Prepare`] whose ADD failed before [`Request::Attach`].
    Unprepare { host_veth: String },
    /// Record a pod's endpoint and write it into the datapath (replaces an earlier record
    /// of the same id, so a retried ADD is harmless).
    Attach(Box<Endpoint>),
    /// Forget a pod's endpoint; an unknown id is not an error.
    Detach(EndpointId),
    /// One endpoint's record, for CHECK.
    Get(EndpointId),
    /// Every endpoint record.
    List,
    /// Forget every endpoint of `network` whose id is not in `keep`.
    Gc {
        network: String,
        keep: Vec<EndpointId>,
    },
    /// The cluster's nodes as the daemon's node source gives them.
    Nodes,
    /// The NetworkPolicies in force on this node: each with the pods of this node it
    /// selects, each pod with the directions it is isolated in, and the objects the
    /// policy source refused.
    Policies,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    Status(Status),
    Prepared,
    Unprepared {
        /// Whether the program was detached (false: unknown, or an endpoint uses it).
        detached: bool,
    },
    Attached,
    Detached {
        existed: bool,
    },
    Endpoint {
        endpoint: Option<Endpoint>,
    },
    Endpoints {
        endpoints: Vec<Endpoint>,
        /// What went into each pod through its host veth's transmit (the kernel's TX
        /// counters: the node's stack, and what the datapath redirected there): the
        /// part of "to pod" the datapath does not count. A list, as the tagged enum
        /// cannot carry maps with integer keys through JSON.
        #[serde(default)]
        stack_sent: Vec<LinkCounters>,
        /// The host veths (by index) with a root qdisc, through which the datapath hands
        /// their pods' frames: their TX counters already hold the datapath's deliveries.
        #[serde(default)]
        queued: Vec<u32>,
    },
    Collected {
        removed: Vec<Endpoint>,
    },
    Nodes(NodesView),
    Policies(PoliciesView),
    /// A hostPort another endpoint holds (CNI code 105 for the plugin). Kept beside
    /// [`ErrorKind::PortConflict`] so that plugins reading no kind still give 105.
    PortConflict {
        message: String,
    },
    /// The request was refused or failed; see [`DaemonError`].
    Error(DaemonError),
}

/// Why the daemon refused a request, with what it says of it. Written flat into the
/// response (`{"response": "error", "kind": ..., "message": ...}`); a response without a
/// kind (an older daemon's) reads as [`ErrorKind::Unspecified`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct DaemonError {
    #[serde(default)]
    pub kind: ErrorKind,
    pub message: String,
}

impl DaemonError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// What kind of refusal a [`DaemonError`] is; the plugin maps kinds to CNI codes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A message of another protocol version, or none that decodes.
    Protocol,
    /// The request's own content: an id no file name may carry, a veth that is not
    /// the plugin's or not as described, a malformed port mapping.
    InvalidRequest,
    /// An address another endpoint, or the node itself, has.
    AddressTaken,
    /// A hostPort another endpoint holds.
    PortConflict,
    /// The node could not do it (a map, a file, netlink).
    NodeFailure,
    /// The daemon failed answering (a panicked worker).
    Internal,
    /// No kind given (an older daemon), or one this side does not know.
    #[default]
    #[serde(other)]
    Unspecified,
}

/// What identifies an attachment, as in the CNI spec: (container id, interface name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EndpointId {
    pub container_id: String,
    pub ifname: String,
}

impl EndpointId {
    /// Why this id is not one the CNI spec allows, if it is not: the daemon names its
    /// records after it, so nothing else may reach a file name.
    pub fn problem(&self) -> Option<String> {
        if !crate::naming::is_spec_identifier(&self.container_id) {
            return Some(format!(
                "container id {:?} is not one the CNI spec allows (letters, digits, '_', \
                 '.', '-', starting with a letter or digit)",
                self.container_id
            ));
        }
        crate::naming::ifname_problem(&self.ifname)
            .map(|reason| format!("interface name {:?}: {reason}", self.ifname))
    }
}

/// A pod's interface as the daemon records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: EndpointId,
    /// The CNI network name (GC works per network).
    pub network: String,
    pub netns: PathBuf,
    pub host_veth: String,
    pub host_ifindex: u32,
    /// The host-side veth's MAC: the pod's ARP requests are answered with it.
    pub host_mac: MacAddr,
    /// The pod interface's MAC.
    pub mac: MacAddr,
    pub ips: Vec<ipnet::IpNet>,
    /// Source-NAT this pod's traffic to destinations outside `cluster_cidrs`.
    pub masquerade: bool,
    /// Destinations that keep the pod's address (the cluster's pod ranges).
    #[serde(default)]
    pub cluster_cidrs: Vec<ipnet::IpNet>,
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// The pod's default gateway (the first IPv4 gateway IPAM gave), which the node
    /// answers at as one of its own addresses. Absent in requests of a plugin that
    /// predates it, and in their records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<std::net::IpAddr>,
    /// The Kubernetes pod this interface belongs to, when the runtime said (`CNI_ARGS`).
    /// Absent in requests of a plugin that predates it, and in their records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// The pod as kubelet names it in `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
/// `K8S_POD_UID`); each part is `None` when the runtime did not pass it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    /// The daemon maps `tcp` and `udp`.
    pub protocol: Protocol,
    pub host_ip: Option<std::net::IpAddr>,
}

/// A pod's rate limits, rates in bits per second, bursts in bits, as Kubernetes passes
/// them; a direction without a rate is not limited. The plugin puts a `tbf` qdisc on
/// the pod's interface (egress) and on its host veth (ingress).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub daemon_version: String,
    pub bpf_dir: PathBuf,
    /// The eBPF object is loaded and its maps are pinned: the datapath can take pods.
    pub datapath_loaded: bool,
    pub endpoints: usize,
    pub attachments: Vec<Attachment>,
    /// Source NAT is on: the uplink programs are attached and translate pods' traffic to
    /// `node_addr`.
    #[serde(default)]
    pub nat_enabled: bool,
    /// The first interface translated traffic leaves by (all of them: `uplinks`).
    #[serde(default)]
    pub uplink: Option<String>,
    /// The address pods' traffic out of the first uplink is translated to.
    #[serde(default)]
    pub node_addr: Option<std::net::Ipv4Addr>,
    /// Every interface source NAT translates on, with its address.
    #[serde(default)]
    pub uplinks: Vec<UplinkStatus>,
    /// The Service ranges whose traffic goes through the node's stack (kube-proxy).
    #[serde(default)]
    pub service_cidrs: Vec<ipnet::Ipv4Net>,
    /// Destinations pods' traffic to which always crosses the node's stack and its
    /// netfilter (`--host-firewall-cidr`).
    #[serde(default)]
    pub host_firewall_cidrs: Vec<ipnet::Ipv4Net>,
    /// The node addresses a hostPort mapping without hostIP covers (loopback aside),
    /// as the datapath has them now.
    #[serde(default)]
    pub host_port_addrs: Vec<std::net::Ipv4Addr>,
    /// The pods' gateways the node answers at (addresses of `lo` for its pods only).
    #[serde(default)]
    pub gateways: Vec<std::net::Ipv4Addr>,
    /// The IPv4 GSO/GRO size new pods' veths get (BIG TCP): the uplink's, when above the
    /// 64 KiB default (see `big_tcp`); `None`: the kernel's default.
    #[serde(default)]
    pub pod_gso_max_size: Option<u32>,
    /// This node's name in the cluster (`--node-name`).
    #[serde(default)]
    pub node_name: Option<String>,
    /// Where the cluster's nodes come from (`file <path>`, `kubeconfig <path>`,
    /// `in-cluster`); `None`: no node source, a node on its own.
    #[serde(default)]
    pub node_source: Option<String>,
    /// This node's IPv4 pod ranges (`spec.podCIDRs`), what a `usePodCidr` IPAM range
    /// becomes; empty while the node source has not given any.
    #[serde(default)]
    pub pod_cidrs: Vec<ipnet::Ipv4Net>,
    /// The MTU of pods whose conflist sets none: the uplink's less the overlay's 50
    /// bytes with `--routing vxlan`; `None`: the kernel's default.
    #[serde(default)]
    pub pod_mtu: Option<u32>,
}

/// The cluster's nodes as the daemon knows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesView {
    pub node_name: Option<String>,
    pub node_source: Option<String>,
    /// How pods reach other nodes' pods (`--routing`).
    #[serde(default)]
    pub routing: Option<String>,
    /// Every node, in name order.
    pub nodes: Vec<NodeInfo>,
    /// What is refused of the other nodes (their address or a pod range), with why.
    #[serde(default)]
    pub refused: Vec<RefusedInfo>,
}

/// A node's address or pod range the daemon does not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedInfo {
    pub node: String,
    /// The range, or the node's address when the whole node is refused.
    pub item: String,
    pub reason: String,
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// Its first IPv4 InternalIP.
    pub address: std::net::Ipv4Addr,
    pub pod_cidrs: Vec<ipnet::Ipv4Net>,
}

/// The NetworkPolicies in force on this node, as the daemon compiled them for its pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoliciesView {
    /// Where the objects come from (`file <path>`); `None`: no policy source, no pod is
    /// isolated.
    pub source: Option<String>,
    /// Whether the source has answered: before it does, the datapath keeps the
    /// policies a previous daemon wrote, and the lists are empty.
    pub answered: bool,
    /// `enforce` (what no policy lets through is dropped) or `audit` (counted and let
    /// through), `--policy-mode`.
    pub mode: String,
    /// Raised at each change of what the datapath holds; a flow's verdicts given under
    /// another generation are asked again.
    pub generation: u32,
    /// Every policy, by namespace and name.
    pub policies: Vec<PolicyInfo>,
    /// This node's Kubernetes pods (those whose runtime named them), by namespace and
    /// name.
    pub pods: Vec<PolicyPodInfo>,
    /// The objects the source left out, with why.
    pub refused: Vec<RefusedObject>,
}

/// One NetworkPolicy of [`PoliciesView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub namespace: String,
    pub name: String,
    /// The key of its counters in the pinned `POLICY_STATS` map.
    pub slot: u32,
    /// Whether it isolates the pods it selects for ingress, for egress.
    pub ingress: bool,
    pub egress: bool,
    /// The pods of this node it selects, as `namespace/name`, sorted.
    pub selects: Vec<String>,
}

/// One pod of this node in [`PoliciesView`], with the directions a policy isolates it
/// in (neither: everything passes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyPodInfo {
    pub namespace: String,
    pub name: String,
    pub ingress: bool,
    pub egress: bool,
}

/// An object the policy source left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedObject {
    /// `NetworkPolicy x/deny-all`, or where it stands when it has no name (`document 2,
    /// item 5`).
    pub object: String,
    pub reason: String,
}

/// A device source NAT translates on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkStatus {
    pub name: String,
    pub ifindex: u32,
    /// The address of what leaves by it; `None` while it has none (that traffic is
    /// dropped).
    pub node_addr: Option<std::net::Ipv4Addr>,
}

/// Packets and bytes through a link, from the kernel's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCounters {
    pub ifindex: u32,
    pub packets: u64,
    pub bytes: u64,
}

/// One program attached to one interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub interface: String,
    pub ifindex: u32,
    pub program: String,
    /// `tcx` (kernel >= 6.6) or `clsact` (netlink, older kernels).
    pub mode: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(pod: Option<PodRef>) -> Endpoint {
        Endpoint {
            id: EndpointId {
                container_id: "c1".to_owned(),
                ifname: "eth0".to_owned(),
            },
            network: "pods".to_owned(),
            netns: "/run/netns/p".into(),
            host_veth: "veb000000000000".to_owned(),
            host_ifindex: 7,
            host_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            mac: MacAddr([2, 0, 0, 0, 0, 2]),
            ips: vec!["10.1.0.2/24".parse().expect("an address")],
            masquerade: true,
            cluster_cidrs: Vec::new(),
            port_mappings: Vec::new(),
            bandwidth: None,
            gateway: None,
            pod,
        }
    }

    #[test]
    fn an_attach_without_the_pod_reads_as_no_pod_and_is_written_without_it() {
        let old = serde_json::to_value(Request::Attach(Box::new(endpoint(None)))).expect("json");
        assert!(old.get("pod").is_none(), "no pod key when unknown: {old}");
        let read: Request = serde_json::from_value(old).expect("an older plugin's request");
        assert_eq!(read, Request::Attach(Box::new(endpoint(None))));
    }

    #[test]
    fn the_pod_travels_with_the_attach() {
        let pod = PodRef {
            namespace: Some("default".to_owned()),
            name: Some("web-0".to_owned()),
            uid: None,
        };
        let request = Request::Attach(Box::new(endpoint(Some(pod))));
        let json = serde_json::to_value(&request).expect("json");
        assert_eq!(
            json["pod"],
            serde_json::json!({"namespace": "default", "name": "web-0"})
        );
        assert_eq!(
            serde_json::from_value::<Request>(json).expect("read"),
            request
        );
    }
}
