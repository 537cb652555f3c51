//! The pods' gateways as addresses of the node, for its pods only.
//!
//! A pod's default gateway (its IPAM range's gateway) needs no address anywhere to
//! route: `from_pod` answers the pod's ARP for it with the host veth's MAC. So that it
//! also answers as a router does (`ping`, the first thing an operator tries) and pods
//! reach the node's services listening on all addresses through it, each gateway in use
//! is a /32 address of `lo`:
//! - with scope host: the node never picks it as a source by itself (which could show
//!   it to other nodes), only where a route names it: each pod's route (`<pod> dev
//!   <veth> src <gateway>`, [`route_from`]), so that the node's own traffic to its pods,
//!   and a UDP server's answers to them, come from their gateway, as from a bridge's
//!   address (replies on TCP leave from it anyway, being the address the pod asked);
//! - labelled [`LABEL`]: the daemon finds its own by it, after a restart too, and
//!   never touches an address of another's (a gateway that is already an address of
//!   the node is left to whoever put it there);
//! - refused from outside the node: the node would answer ARP for it on the uplink and
//!   take packets for it from there, as for any of its addresses, so the uplink's and
//!   the overlay's ingress programs, and the gateway guard on the node's other devices
//!   ([`super::guard`]), drop both (`GATEWAYS`, which is written before an address is
//!   added and cleared after it is removed; drop reason `gateway_from_outside`).
//!
//! Being an address of the node, a gateway is also a hostPort address (`NODE_ADDRS`
//! follows the node's addresses), as on a node whose bridge holds the gateway.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

use aya::maps::{HashMap, MapData};
use futures::TryStreamExt;
use rtnetlink::{
    RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        address::{AddressAttribute, AddressMessage, AddressScope},
        route::RouteScope,
    },
};

use super::{
    DatapathError,
    netlink::{replace_route, with_netlink},
};

/// The label of the daemon's gateway addresses (`ip -4 addr show label lo:ebpf-cni`).
pub const LABEL: &str = "lo:ebpf-cni";

/// The gateways the node answers at, in the kernel and in `GATEWAYS`.
pub struct Gateways {
    map: HashMap<MapData, [u8; 4], u8>,
    current: BTreeSet<Ipv4Addr>,
    /// What the last successful [`Self::sync`] was asked: the same again (every ADD
    /// and DEL of a pod in a range already in use) changes nothing and lists no
    /// addresses, which on a node with kube-proxy's IPVS addresses are thousands.
    asked: Option<BTreeSet<Ipv4Addr>>,
}

/// An IPv4 address of the node as netlink lists it.
struct Address {
    addr: Ipv4Addr,
    ours: bool,
    message: AddressMessage,
}

impl Gateways {
    pub fn open(map: HashMap<MapData, [u8; 4], u8>) -> Self {
        Self {
            map,
            current: BTreeSet::new(),
            asked: None,
        }
    }

    /// The gateways of the last [`Self::sync`] that the daemon answers at.
    pub fn current(&self) -> &BTreeSet<Ipv4Addr> {
        &self.current
    }

    /// Makes the daemon's gateway addresses exactly `desired`, less those already an
    /// address of the node that are not the daemon's; `GATEWAYS` holds the same.
    /// Returns whether an address came or went.
    pub fn sync(&mut self, desired: &BTreeSet<Ipv4Addr>) -> Result<bool, DatapathError> {
        if self.asked.as_ref() == Some(desired) {
            return Ok(false);
        }
        self.asked = None;
        let addresses = list()?;
        let others: BTreeSet<Ipv4Addr> = addresses
            .iter()
            .filter(|address| !address.ours)
            .map(|address| address.addr)
            .collect();
        let wanted: BTreeSet<Ipv4Addr> = desired.difference(&others).copied().collect();
        let present: BTreeSet<Ipv4Addr> = addresses
            .iter()
            .filter(|address| address.ours)
            .map(|address| address.addr)
            .collect();
        for addr in wanted.difference(&present) {
            self.map
                .insert(addr.octets(), 1, 0)
                .map_err(|error| failed(*addr, "cannot note", &error))?;
            add(*addr)?;
            tracing::info!(gateway = %addr, "the node answers its pods at their gateway");
        }
        for address in addresses
            .into_iter()
            .filter(|address| address.ours && !wanted.contains(&address.addr))
        {
            let addr = address.addr;
            remove(address.message)?;
            tracing::info!(gateway = %addr, "no pod uses this gateway any more: removed");
        }
        let changed = wanted != present;
        let noted: Vec<[u8; 4]> = self.map.keys().filter_map(Result::ok).collect();
        for key in noted {
            if !wanted.contains(&Ipv4Addr::from(key)) {
                crate::maps::removed(self.map.remove(&key))
                    .map_err(|error| failed(key.into(), "cannot forget", &error))?;
            }
        }
        self.current = wanted;
        self.asked = Some(desired.clone());
        Ok(changed)
    }
}

/// Removes every gateway address of the daemon's (`uninstall`: before the uplink's
/// programs, which hide them from outside, go).
pub fn remove_all() -> Result<(), DatapathError> {
    for address in list()?.into_iter().filter(|address| address.ours) {
        remove(address.message)?;
    }
    Ok(())
}

/// Has the node reach the pod address `pod` behind the veth `ifindex` from `gateway`:
/// its route (`<pod>/32 dev <veth> scope link`, the plugin's) replaced by one with
/// `src <gateway>`, which must be an address of the node.
pub fn route_from(pod: Ipv4Addr, ifindex: u32, gateway: Ipv4Addr) -> Result<(), DatapathError> {
    let route = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(pod, 32)
        .output_interface(ifindex)
        .scope(RouteScope::Link)
        .pref_source(gateway)
        .build();
    replace_route(route).map_err(|error| {
        DatapathError::Gateways(format!(
            "cannot route {pod} from the gateway {gateway}: {error}"
        ))
    })
}

fn failed(addr: Ipv4Addr, what: &str, error: &dyn std::fmt::Display) -> DatapathError {
    DatapathError::Gateways(format!("{what} the gateway {addr}: {error}"))
}

/// The node's IPv4 addresses, each with whether it is one of the daemon's gateways.
fn list() -> Result<Vec<Address>, DatapathError> {
    let messages: Vec<AddressMessage> = with_netlink(|handle| async move {
        handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(std::io::Error::other)
    })
    .map_err(|error: std::io::Error| {
        DatapathError::Gateways(format!("cannot list the node's addresses: {error}"))
    })?;
    Ok(messages
        .into_iter()
        .filter(|message| message.header.family == AddressFamily::Inet)
        .filter_map(|message| {
            let mut addr = None;
            let mut ours = false;
            for attribute in &message.attributes {
                match attribute {
                    AddressAttribute::Local(IpAddr::V4(local)) => addr = Some(*local),
                    AddressAttribute::Address(IpAddr::V4(address)) if addr.is_none() => {
                        addr = Some(*address);
                    }
                    AddressAttribute::Label(label) => ours = label == LABEL,
                    _ => {}
                }
            }
            Some(Address {
                addr: addr?,
                ours,
                message,
            })
        })
        .collect())
}

fn add(addr: Ipv4Addr) -> Result<(), DatapathError> {
    let lo = nix::net::if_::if_nametoindex("lo")
        .map_err(|error| failed(addr, "cannot add (no lo)", &error))?;
    with_netlink(move |handle| async move {
        let mut request = handle.address().add(lo, IpAddr::V4(addr), 32).replace();
        let message = request.message_mut();
        message.header.scope = AddressScope::Host;
        message
            .attributes
            .push(AddressAttribute::Label(LABEL.to_owned()));
        request.execute().await.map_err(std::io::Error::other)
    })
    .map_err(|error: std::io::Error| failed(addr, "cannot add", &error))
}

fn remove(message: AddressMessage) -> Result<(), DatapathError> {
    let addr = message
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            AddressAttribute::Local(IpAddr::V4(local)) => Some(*local),
            _ => None,
        })
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    with_netlink(move |handle| async move {
        handle
            .address()
            .del(message)
            .execute()
            .await
            .map_err(std::io::Error::other)
    })
    .map_err(|error: std::io::Error| failed(addr, "cannot remove", &error))
}
