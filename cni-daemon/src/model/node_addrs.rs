//! The node's own IPv4 addresses in `NODE_ADDRS`: what a hostPort mapping without
//! hostIP covers (portmap's `--dst-type LOCAL`). The map is filled at start and
//! refilled on every address change the kernel announces (`crate::front::address_watch`), so an
//! address added later is a hostPort address at once. The map holds
//! [`NODE_ADDRS_MAX`] addresses; past that, the node's interface addresses go first and
//! the rest is left out with a warning, never an error that stops the daemon.

use std::{collections::BTreeSet, net::Ipv4Addr};

use ipnet::Ipv4Net;

use aya::maps::{HashMap, MapData, MapError};
use cni_ebpf_common::NODE_ADDRS_MAX;

#[derive(Debug, thiserror::Error)]
pub enum NodeAddrError {
    #[error("cannot list the node's addresses: {0}")]
    List(#[from] nix::Error),
    #[error("node addresses map: {0}")]
    Map(#[from] MapError),
}

pub struct NodeAddrs {
    map: HashMap<MapData, [u8; 4], u8>,
    current: BTreeSet<Ipv4Addr>,
    networks: BTreeSet<Ipv4Net>,
}

impl NodeAddrs {
    pub fn open(map: HashMap<MapData, [u8; 4], u8>) -> Self {
        Self {
            map,
            current: BTreeSet::new(),
            networks: BTreeSet::new(),
        }
    }

    /// The networks the node reaches directly, as of the last [`Self::sync`]: those of
    /// its addresses with a prefix shorter than /32 (an uplink's subnet).
    pub fn networks(&self) -> &BTreeSet<Ipv4Net> {
        &self.networks
    }

    /// The addresses of the last [`Self::sync`].
    pub fn current(&self) -> &BTreeSet<Ipv4Addr> {
        &self.current
    }

    /// Makes the map hold exactly the namespace's IPv4 addresses, loopback aside (the
    /// socket hooks treat 127.0.0.0/8 as the node's by themselves), as many as it holds:
    /// those with a prefix shorter than /32 (an interface's own address, the uplink's)
    /// before the /32 ones (IPVS ClusterIPs). Returns those in the map.
    pub fn sync(&mut self) -> Result<BTreeSet<Ipv4Addr>, NodeAddrError> {
        let mut networks = BTreeSet::new();
        let mut found: Vec<(bool, Ipv4Addr)> = nix::ifaddrs::getifaddrs()?
            .filter_map(|entry| {
                let addr = entry.address?.as_sockaddr_in()?.ip();
                let mask = entry
                    .netmask
                    .and_then(|mask| mask.as_sockaddr_in().map(|sin| sin.ip()));
                let host_route = mask.is_none_or(|mask| mask == Ipv4Addr::BROADCAST);
                if let Some(network) = mask
                    .filter(|_| !host_route && !addr.is_loopback())
                    .and_then(|mask| Ipv4Net::with_netmask(addr, mask).ok())
                {
                    networks.insert(network.trunc());
                }
                Some((host_route, addr))
            })
            .filter(|(_, addr)| !addr.is_loopback())
            .collect();
        found.sort();
        found.dedup_by_key(|(_, addr)| *addr);
        let capacity = usize::try_from(NODE_ADDRS_MAX).unwrap_or(usize::MAX);
        let left_out = found.len().saturating_sub(capacity);
        found.truncate(capacity);
        let current: BTreeSet<Ipv4Addr> = found.into_iter().map(|(_, addr)| addr).collect();
        let listed: Vec<[u8; 4]> = self.map.keys().collect::<Result<_, _>>()?;
        for stale in listed {
            if !current.contains(&Ipv4Addr::from(stale)) {
                crate::maps::removed(self.map.remove(&stale))?;
            }
        }
        for addr in &current {
            self.map.insert(addr.octets(), 1, 0)?;
        }
        if left_out > 0 {
            tracing::warn!(
                left_out,
                capacity,
                "more node addresses than NODE_ADDRS holds: hostPorts without hostIP do \
                 not cover those left out"
            );
        }
        self.current.clone_from(&current);
        self.networks = networks;
        Ok(current)
    }
}
