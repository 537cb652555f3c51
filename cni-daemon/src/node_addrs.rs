//! The node's own IPv4 addresses in `NODE_ADDRS`: what a hostPort mapping without
//! hostIP covers (portmap's `--dst-type LOCAL`). The map is filled at start and
//! refilled on every address change the kernel announces (`crate::address_watch`), so an
//! address added later is a hostPort address at once.

use std::{collections::BTreeSet, net::Ipv4Addr};

use aya::maps::{HashMap, MapData, MapError};

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
}

impl NodeAddrs {
    pub fn open(map: HashMap<MapData, [u8; 4], u8>) -> Self {
        Self {
            map,
            current: BTreeSet::new(),
        }
    }

    /// The addresses of the last [`Self::sync`].
    pub fn current(&self) -> &BTreeSet<Ipv4Addr> {
        &self.current
    }

    /// Makes the map hold exactly the namespace's IPv4 addresses, loopback aside (the
    /// socket hooks treat 127.0.0.0/8 as the node's by themselves). Returns them.
    pub fn sync(&mut self) -> Result<BTreeSet<Ipv4Addr>, NodeAddrError> {
        let current: BTreeSet<Ipv4Addr> = nix::ifaddrs::getifaddrs()?
            .filter_map(|entry| entry.address?.as_sockaddr_in().map(|sin| sin.ip()))
            .filter(|addr| !addr.is_loopback())
            .collect();
        let listed: Vec<[u8; 4]> = self.map.keys().collect::<Result<_, _>>()?;
        for stale in listed {
            if !current.contains(&Ipv4Addr::from(stale)) {
                crate::maps::removed(self.map.remove(&stale))?;
            }
        }
        for addr in &current {
            self.map.insert(addr.octets(), 1, 0)?;
        }
        self.current.clone_from(&current);
        Ok(current)
    }
}
