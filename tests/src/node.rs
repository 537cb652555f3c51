//! A simulated Kubernetes node: a network namespace running `ebpf-cnid`, with one CNI
//! network whose IPAM is Debian's host-local, and an uplink to an "external" host.

use crate::{
    cni::Network,
    daemon::{Daemon, Instance},
    netns::Netns,
};

/// Fields drop in order: the daemon stops before its instance is uninstalled, and the
/// namespace goes last.
pub struct Node {
    pub daemon: Daemon,
    pub network: Network,
    pub instance: Instance,
    pub netns: Netns,
    /// A host outside the node, at [`EXTERNAL_ADDR`], joined by the node's `uplink0`.
    pub external: Netns,
}

/// The node's address on its uplink.
pub const NODE_ADDR: &str = "198.18.0.1";
/// The external host's address.
pub const EXTERNAL_ADDR: &str = "198.18.0.2";

impl Node {
    /// Starts a node whose pods get addresses from `subnet`.
    pub fn start(subnet: &str) -> Self {
        let netns = Netns::new("node");
        let external = Netns::new("ext");
        netns.link_veth(
            "uplink0",
            "198.18.0.1/24",
            &external,
            "eth0",
            "198.18.0.2/24",
        );
        let instance = Instance::new();
        let daemon = Daemon::start(&netns, &instance, &[]);
        let network = Network::new(&instance, subnet);
        Self {
            daemon,
            network,
            instance,
            netns,
            external,
        }
    }

    /// The pods' host-side veths in the node (the plugin names them `veb...`; the
    /// uplink is not one of them).
    pub fn host_veths(&self) -> Vec<String> {
        crate::cni::veths(&self.netns)
            .into_iter()
            .filter(|name| name.starts_with("veb"))
            .collect()
    }

    /// A new, empty pod network namespace.
    pub fn pod(&self, tag: &str) -> Netns {
        Netns::new(tag)
    }
}
