//! Routes to the other nodes' pod ranges, in the main table, so that the node's own
//! traffic reaches other nodes' pods:
//! - `--routing native` (as flannel's host-gw): `<pod range> via <node address>`; pods'
//!   traffic follows them too (`from_pod`'s FIB lookup finds the same route and hands
//!   the packet to the uplink with the next hop's MAC);
//! - `--routing vxlan`: `<pod range> dev ebpf-vxlan src <overlay address>`, the overlay
//!   device's egress program setting the tunnel key (pods' traffic goes to that device
//!   straight from `from_pod`).
//!
//! Each route carries the protocol [`ROUTE_PROTOCOL`]: the daemon finds its own routes by
//! it, after a restart too, and never touches another's.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    RouteMessageBuilder,
    packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope},
};

use super::{
    DatapathError,
    netlink::{replace_route, with_netlink},
};

/// The routing protocol number of the daemon's routes (`ip route show proto 208`): one
/// no routing daemon in iproute2's list uses.
pub const ROUTE_PROTOCOL: u8 = 208;

/// The main routing table.
const MAIN_TABLE: u8 = 254;

/// Where a route sends its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The node's address, as next hop.
    Gateway(Ipv4Addr),
    /// A device without next hop, with the source address the node's packets take.
    Device { ifindex: u32, source: Ipv4Addr },
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Gateway(addr) => write!(f, "via {addr}"),
            Self::Device { ifindex, source } => write!(f, "dev {ifindex} src {source}"),
        }
    }
}

/// What a sync changed, and the ranges whose route the kernel refused (a node address
/// not on a directly connected network: native routing cannot reach that node).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RouteSync {
    pub added: Vec<Ipv4Net>,
    pub removed: Vec<Ipv4Net>,
    pub refused: Vec<(Ipv4Net, String)>,
}

/// Makes the daemon's routes exactly `desired` (pod range -> where to), or, with
/// `keep_others`, adds and replaces without removing (a start, before the nodes are
/// known). Replacing a route is one `RTM_NEWROUTE` with `NLM_F_REPLACE`: the range is
/// never without one.
pub fn sync(
    desired: &BTreeMap<Ipv4Net, Via>,
    keep_others: bool,
) -> Result<RouteSync, DatapathError> {
    let existing = ours()?;
    let mut sync = RouteSync::default();
    let present: BTreeMap<Ipv4Net, Option<Via>> =
        existing.iter().map(|(net, via, _)| (*net, *via)).collect();
    for (net, via) in desired {
        if present.get(net) == Some(&Some(*via)) {
            continue;
        }
        match add(*net, *via) {
            Ok(()) => sync.added.push(*net),
            Err(error) => sync.refused.push((*net, error)),
        }
    }
    if !keep_others {
        let wanted: BTreeSet<&Ipv4Net> = desired.keys().collect();
        for (net, _, message) in existing {
            if !wanted.contains(&net) {
                remove(message).map_err(|error| {
                    DatapathError::NodeRoutes(format!("cannot remove the route to {net}: {error}"))
                })?;
                sync.removed.push(net);
            }
        }
    }
    Ok(sync)
}

/// The main table's IPv4 routes with [`ROUTE_PROTOCOL`], with where they go (`None`:
/// a shape the daemon does not make, replaced or removed).
fn ours() -> Result<Vec<(Ipv4Net, Option<Via>, RouteMessage)>, DatapathError> {
    let messages: Vec<RouteMessage> = with_netlink(|handle| async move {
        handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(std::io::Error::other)
    })
    .map_err(|error| DatapathError::NodeRoutes(format!("cannot list routes: {error}")))?;
    Ok(messages
        .into_iter()
        .filter(|message| {
            message.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL)
                && message.header.table == MAIN_TABLE
        })
        .filter_map(|message| {
            let mut destination = Ipv4Addr::UNSPECIFIED;
            let (mut gateway, mut device, mut source) = (None, None, None);
            for attribute in &message.attributes {
                match attribute {
                    RouteAttribute::Destination(RouteAddress::Inet(addr)) => destination = *addr,
                    RouteAttribute::Gateway(RouteAddress::Inet(addr)) => gateway = Some(*addr),
                    RouteAttribute::Oif(index) => device = Some(*index),
                    RouteAttribute::PrefSource(RouteAddress::Inet(addr)) => source = Some(*addr),
                    _ => {}
                }
            }
            let net = Ipv4Net::new(destination, message.header.destination_prefix_length).ok()?;
            let via = match (gateway, device, source) {
                (Some(gateway), _, _) => Some(Via::Gateway(gateway)),
                (None, Some(ifindex), Some(source)) => Some(Via::Device { ifindex, source }),
                _ => None,
            };
            Some((net, via, message))
        })
        .collect())
}

fn add(net: Ipv4Net, via: Via) -> Result<(), String> {
    let builder = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(net.network(), net.prefix_len())
        .protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
    let route = match via {
        Via::Gateway(gateway) => builder.gateway(gateway).build(),
        Via::Device { ifindex, source } => builder
            .output_interface(ifindex)
            .pref_source(source)
            .scope(RouteScope::Link)
            .build(),
    };
    replace_route(route).map_err(|error| error.to_string())
}

fn remove(message: RouteMessage) -> Result<(), String> {
    with_netlink(move |handle| async move {
        handle
            .route()
            .del(message)
            .execute()
            .await
            .map_err(std::io::Error::other)
    })
    .map_err(|error: std::io::Error| error.to_string())
}
