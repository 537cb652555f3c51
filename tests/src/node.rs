//! A simulated Kubernetes node: a network namespace running `ebpf-cnid`, with one CNI
//! network whose IPAM is Debian's host-local.

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
}

impl Node {
    /// Starts a node whose pods get addresses from `subnet`.
    pub fn start(subnet: &str) -> Self {
        let netns = Netns::new("node");
        let instance = Instance::new();
        let daemon = Daemon::start(&netns, &instance, &[]);
        let network = Network::new(&instance, subnet);
        Self {
            daemon,
            network,
            instance,
            netns,
        }
    }

    /// A new, empty pod network namespace.
    pub fn pod(&self, tag: &str) -> Netns {
        Netns::new(tag)
    }
}
