//! The node's own IPv4 addresses in `NODE_ADDRS`: what a hostPort mapping without
//! hostIP covers (portmap's `--dst-type LOCAL`). The map is filled at start and
//! refilled on every address change the kernel announces (rtnetlink's IPv4 address
//! group), so an address added later is a hostPort address at once.

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    sync::{Arc, Mutex},
};

use aya::maps::{HashMap, MapData, MapError};
use futures::StreamExt;
use rtnetlink::{
    constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE},
    packet_core::NetlinkPayload,
    packet_route::RouteNetlinkMessage,
    sys::{AsyncSocket, SocketAddr},
};

use crate::node::Node;

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

/// Refills `NODE_ADDRS`, and has source NAT follow the uplink's address and device (see
/// `Nat::follow_uplink`), on every IPv4 address change, and has NAT follow the default
/// route on every change of it, until the task is dropped. A watcher that cannot start
/// is logged: hostPorts then cover the addresses known at start, and NAT keeps the
/// uplink and address it started with.
pub async fn watch(node: Arc<Mutex<Node>>) {
    let (mut connection, _handle, mut messages) = match rtnetlink::new_connection() {
        Ok(parts) => parts,
        Err(error) => {
            tracing::warn!(%error, "cannot watch the node's addresses");
            return;
        }
    };
    let groups = SocketAddr::new(0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE);
    if let Err(error) = connection.socket_mut().socket_mut().bind(&groups) {
        tracing::warn!(%error, "cannot watch the node's addresses");
        return;
    }
    let connection = tokio::spawn(connection);
    while let Some((message, _)) = messages.next().await {
        let Some(change) = Change::of(&message.payload) else {
            continue;
        };
        let node = Arc::clone(&node);
        let synced = tokio::task::spawn_blocking(move || {
            let mut node = match node.lock() {
                Ok(node) => node,
                Err(poisoned) => poisoned.into_inner(),
            };
            match change {
                Change::Address => node.sync_node_addrs().map(Some),
                Change::DefaultRoute => node.follow_uplink().map(|()| None),
            }
        })
        .await;
        match synced {
            Ok(Ok(Some(addrs))) => tracing::info!(?addrs, "node addresses changed"),
            Ok(Ok(None)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "cannot refresh the node's addresses"),
            Err(error) => tracing::warn!(%error, "node address task failed"),
        }
    }
    connection.abort();
}

/// What a netlink announcement changed, among what the watcher follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// An IPv4 address came or went.
    Address,
    /// A default IPv4 route (0.0.0.0/0) came or went: source NAT may have to follow it.
    /// Other routes (a pod's /32 at every ADD) change nothing here.
    DefaultRoute,
}

impl Change {
    fn of(payload: &NetlinkPayload<RouteNetlinkMessage>) -> Option<Self> {
        match payload {
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewAddress(_) | RouteNetlinkMessage::DelAddress(_),
            ) => Some(Self::Address),
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewRoute(route) | RouteNetlinkMessage::DelRoute(route),
            ) if route.header.destination_prefix_length == 0 => Some(Self::DefaultRoute),
            _ => None,
        }
    }
}
