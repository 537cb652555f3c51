//! The flags of `ebpf-cnid run` that name this node and where the cluster's nodes come
//! from.

use std::path::PathBuf;

use cni_nodes::ClusterAccess;

/// This node in its cluster (flattened into `run`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Cluster")]
pub struct ClusterArgs {
    /// This node's name in the cluster, the `metadata.name` of its Node: a DaemonSet
    /// sets `NODE_NAME` from `spec.nodeName`. Default: the host name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The cluster's nodes from a file, as Kubernetes prints them: a `NodeList`, or the
    /// `List` of `kubectl get nodes -o json` (or `-o yaml`). Changes to it (written in
    /// place or replaced by a rename) take effect within a second. For clusters whose
    /// nodes the daemon cannot read from the API, and for tests.
    #[arg(long, env = "EBPF_CNID_NODES_FILE", conflicts_with = "kubeconfig")]
    pub nodes_file: Option<PathBuf>,
    /// The cluster's nodes from the Kubernetes API, reached with this kubeconfig (its
    /// current context): a watch of every Node. Without this flag nor `--nodes-file`, a
    /// daemon in a pod (`KUBERNETES_SERVICE_HOST` set) uses its service account;
    /// elsewhere it runs without a node source, a node on its own.
    #[arg(long, env = "EBPF_CNID_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// How pods reach the pods of other nodes. `vxlan`: through a VXLAN overlay in eBPF
    /// (a collect-metadata device the daemon owns; any underlay that carries UDP
    /// between the nodes' addresses). `native`: the nodes reach each other's pod ranges
    /// without encapsulation (one L2 segment, as flannel's host-gw needs, or an
    /// underlay that routes pod ranges): the daemon routes each other node's pod ranges
    /// via that node's address, and pods' packets follow those routes.
    #[arg(long, env = "EBPF_CNID_ROUTING", value_enum, default_value_t = Routing::Vxlan)]
    pub routing: Routing,
    /// The cluster's pod ranges (kube-controller-manager's `--cluster-cidr`; flannel's
    /// Network, Calico's IP pools): another node's pod range is taken only inside one of
    /// them. Repeatable, or comma-separated. Without it, another node's range is
    /// refused when it covers an address of this node or overlaps the Service ranges,
    /// the host-firewall ranges, link-local, or a network this node reaches directly.
    #[arg(
        long = "cluster-cidr",
        env = "EBPF_CNID_CLUSTER_CIDRS",
        value_delimiter = ','
    )]
    pub cluster_cidrs: Vec<ipnet::Ipv4Net>,
    /// How far packets from other nodes' pods are trusted, with either routing.
    /// `relaxed`: straight into the pod when the frame can be tied to the node it
    /// claims (the node's FIB reaches that node by the device the frame came in by,
    /// through the neighbour that sent it); else through the node's stack. A VXLAN
    /// packet from another neighbour than the node it claims is dropped. `strict`:
    /// always through the node's stack, where its netfilter (and rp_filter) apply. Any
    /// host on the underlay that can forge a node's IP and MAC addresses passes both:
    /// only an encrypted underlay closes that.
    #[arg(
        long,
        env = "EBPF_CNID_UNDERLAY_TRUST",
        value_enum,
        default_value_t = UnderlayTrust::Relaxed
    )]
    pub underlay_trust: UnderlayTrust,
    /// UDP port of the overlay (`--routing vxlan`), the same on every node: 8472, as
    /// flannel and Cilium use (Linux's own VXLAN default), not IANA's 4789.
    #[arg(long, env = "EBPF_CNID_VXLAN_PORT", default_value_t = 8472)]
    pub vxlan_port: u16,
    /// VXLAN network identifier of the overlay, the same on every node (1, as flannel).
    #[arg(
        long,
        env = "EBPF_CNID_VXLAN_VNI",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..(1 << 24))
    )]
    pub vxlan_vni: u32,
}

/// How far packets from other nodes' pods are trusted (`--underlay-trust`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnderlayTrust {
    Relaxed,
    Strict,
}

impl UnderlayTrust {
    /// The value the datapath reads (`OverlayConfig::underlay_trust`).
    pub fn datapath_value(self) -> u8 {
        match self {
            Self::Relaxed => cni_ebpf_common::underlay_trust::RELAXED,
            Self::Strict => cni_ebpf_common::underlay_trust::STRICT,
        }
    }
}

/// How pods reach the pods of other nodes (`--routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Routing {
    Vxlan,
    Native,
}

impl std::fmt::Display for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Vxlan => "vxlan",
            Self::Native => "native",
        })
    }
}

/// Where the nodes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSource {
    File(PathBuf),
    Cluster(ClusterAccess),
}

impl std::fmt::Display for NodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Cluster(ClusterAccess::Kubeconfig(path)) => {
                write!(f, "kubeconfig {}", path.display())
            }
            Self::Cluster(ClusterAccess::InCluster) => f.write_str("in-cluster"),
        }
    }
}

impl ClusterArgs {
    /// The node's name: the flag, else the host name.
    pub fn node_name(&self) -> anyhow::Result<String> {
        if let Some(name) = &self.node_name {
            anyhow::ensure!(!name.is_empty(), "--node-name is empty");
            return Ok(name.clone());
        }
        let host = nix::unistd::gethostname()
            .map_err(|errno| anyhow::anyhow!("cannot read the host name: {errno}"))?;
        host.into_string()
            .map_err(|_| anyhow::anyhow!("the host name is not UTF-8: give --node-name"))
    }

    /// The node source the flags and the environment (`in_cluster`: whether
    /// `KUBERNETES_SERVICE_HOST` is set) name; `None`: no node source.
    pub fn source(&self, in_cluster: bool) -> Option<NodeSource> {
        match (&self.nodes_file, &self.kubeconfig) {
            (Some(path), _) => Some(NodeSource::File(path.clone())),
            (None, Some(path)) => {
                Some(NodeSource::Cluster(ClusterAccess::Kubeconfig(path.clone())))
            }
            (None, None) if in_cluster => Some(NodeSource::Cluster(ClusterAccess::InCluster)),
            (None, None) => None,
        }
    }
}

/// Whether the daemon runs in a pod of the cluster: kubelet sets this in every pod.
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|host| !host.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        cluster: ClusterArgs,
    }

    fn parse(args: &[&str]) -> Result<ClusterArgs, clap::Error> {
        Flags::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .map(|flags| flags.cluster)
    }

    #[test]
    fn a_nodes_file_or_a_kubeconfig_or_in_cluster_or_nothing() {
        let file = parse(&["--nodes-file", "/etc/nodes.yaml"]).expect("parses");
        assert_eq!(
            file.source(true),
            Some(NodeSource::File("/etc/nodes.yaml".into()))
        );
        let kubeconfig = parse(&["--kubeconfig", "/etc/kubeconfig"]).expect("parses");
        assert_eq!(
            kubeconfig.source(true),
            Some(NodeSource::Cluster(ClusterAccess::Kubeconfig(
                "/etc/kubeconfig".into()
            )))
        );
        let neither = parse(&[]).expect("parses");
        assert_eq!(
            neither.source(true),
            Some(NodeSource::Cluster(ClusterAccess::InCluster))
        );
        assert_eq!(neither.source(false), None);
    }

    #[test]
    fn a_nodes_file_and_a_kubeconfig_are_refused_together() {
        assert!(parse(&["--nodes-file", "a", "--kubeconfig", "b"]).is_err());
    }

    #[test]
    fn the_node_name_is_the_flag_else_the_host_name() {
        let named = parse(&["--node-name", "worker-1"]).expect("parses");
        assert_eq!(named.node_name().expect("a name"), "worker-1");
        let empty = parse(&["--node-name", ""]).expect("parses");
        assert!(empty.node_name().is_err());
        let host = nix::unistd::gethostname().expect("a host name");
        let unnamed = ClusterArgs {
            node_name: None,
            nodes_file: None,
            kubeconfig: None,
            routing: Routing::Native,
            cluster_cidrs: Vec::new(),
            underlay_trust: UnderlayTrust::Relaxed,
            vxlan_port: 8472,
            vxlan_vni: 1,
        };
        assert_eq!(unnamed.node_name().expect("a name"), host.to_string_lossy());
    }
}
