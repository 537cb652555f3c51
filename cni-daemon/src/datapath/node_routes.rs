//! Routes to the other nodes' pod ranges (`--routing native`, as flannel's host-gw):
//! `<pod range> via <node address>` in the main table, so that the node's own traffic
//! reaches other nodes' pods, and so does pods' traffic: `from_pod`'s FIB lookup finds
//! the same route and hands the packet to the uplink with the next hop's MAC. Each route
//! carries the protocol [`ROUTE_PROTOCOL`]: the daemon finds its own routes by it, after
//! a restart too, and never touches another's.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    RouteMessageBuilder,
    packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol},
};

use super::{DatapathError, netlink::with_netlink};

/// The routing protocol number of the daemon's routes (`ip route show proto 208`): one
/// no routing daemon in iproute2's list uses.
pub const ROUTE_PROTOCOL: u8 = 208;

/// The main routing table.
const MAIN_TABLE: u8 = 254;

/// What a sync changed, and the ranges whose route the kernel refused (a node address
/// not on a directly connected network: native routing cannot reach that node).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RouteSync {
    pub added: Vec<Ipv4Net>,
    pub removed: Vec<Ipv4Net>,
    pub refused: Vec<(Ipv4Net, String)>,
}

/// The daemon's routes now: pod range -> node address.
pub fn current() -> Result<BTreeMap<Ipv4Net, Ipv4Addr>, DatapathError> {
    Ok(ours()?
        .into_iter()
        .map(|(net, gateway, _)| (net, gateway))
        .collect())
}

/// Makes the daemon's routes exactly `desired` (pod range -> node address), or, with
/// `keep_others`, adds and replaces without removing (a start, before the nodes are
/// known). Replacing a route is one `RTM_NEWROUTE` with `NLM_F_REPLACE`: the range is
/// never without one.
pub fn sync(
    desired: &BTreeMap<Ipv4Net, Ipv4Addr>,
    keep_others: bool,
) -> Result<RouteSync, DatapathError> {
    let existing = ours()?;
    let mut sync = RouteSync::default();
    let present: BTreeMap<Ipv4Net, Ipv4Addr> = existing
        .iter()
        .map(|(net, gateway, _)| (*net, *gateway))
        .collect();
    for (net, gateway) in desired {
        if present.get(net) == Some(gateway) {
            continue;
        }
        match add(*net, *gateway) {
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

/// The main table's IPv4 routes with [`ROUTE_PROTOCOL`].
fn ours() -> Result<Vec<(Ipv4Net, Ipv4Addr, RouteMessage)>, DatapathError> {
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
            let mut destination = None;
            let mut gateway = None;
            for attribute in &message.attributes {
                match attribute {
                    RouteAttribute::Destination(RouteAddress::Inet(addr)) => {
                        destination = Some(*addr);
                    }
                    RouteAttribute::Gateway(RouteAddress::Inet(addr)) => gateway = Some(*addr),
                    _ => {}
                }
            }
            let net = Ipv4Net::new(
                destination.unwrap_or(Ipv4Addr::UNSPECIFIED),
                message.header.destination_prefix_length,
            )
            .ok()?;
            Some((net, gateway.unwrap_or(Ipv4Addr::UNSPECIFIED), message))
        })
        .collect())
}

fn add(net: Ipv4Net, gateway: Ipv4Addr) -> Result<(), String> {
    let route = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(net.network(), net.prefix_len())
        .gateway(gateway)
        .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
        .build();
    with_netlink(move |handle| async move {
        handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(std::io::Error::other)
    })
    .map_err(|error: std::io::Error| error.to_string())
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
