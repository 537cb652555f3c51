//! Netlink operations on links, addresses and routes (rtnetlink), for one namespace: the
//! namespace in which the [`Netlink`] connection was opened.

use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr},
    os::fd::AsRawFd,
};

use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use rtnetlink::{
    Handle, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder,
    packet_core::{
        NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
    },
    packet_route::{
        RouteNetlinkMessage,
        address::AddressAttribute,
        link::{
            InfoData, InfoKind, InfoNetkit, InfoVeth, LinkAttribute, LinkFlags, LinkMessage,
            NetkitMode, NetkitPolicy,
        },
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope},
        tc::{TcAttribute, TcHandle, TcMessage},
    },
};

use crate::{
    spec::PodDevice,
    tbf::{self, Tbf},
};

/// The handle of the rate limits' root qdisc (`tc` shows it as `ec01:`).
const TBF_HANDLE: u16 = 0xec01;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot open a netlink socket: {0}")]
    Socket(#[from] std::io::Error),
    #[error("{what}: {source}")]
    Netlink {
        what: String,
        source: rtnetlink::Error,
    },
    #[error("{0} already exists")]
    Exists(String),
    #[error(
        "this node's kernel has no netkit devices (Linux 6.7 or later, built with \
         CONFIG_NETKIT)"
    )]
    NoNetkit,
    #[error("no link named {0}")]
    NotFound(String),
    #[error("cannot write {path}: {source}")]
    Sysctl {
        path: String,
        source: std::io::Error,
    },
}

impl LinkError {
    fn netlink(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> Self {
        let what = what.into();
        move |source| Self::Netlink { what, source }
    }
}

/// Keeps IPv6 off the host side `name` of a pod's pair, in the calling thread's
/// namespace, before the link is up: no address, no Router Advertisement taken from the
/// pod (`accept_ra` 0, then `disable_ipv6` 1). A kernel without IPv6 has nothing to
/// turn off.
pub fn keep_ipv6_off(name: &str) -> Result<(), LinkError> {
    let conf = std::path::Path::new("/proc/sys/net/ipv6/conf").join(name);
    if !std::path::Path::new("/proc/sys/net/ipv6").exists() {
        return Ok(());
    }
    for (setting, value) in [("accept_ra", "0"), ("disable_ipv6", "1")] {
        let path = conf.join(setting);
        std::fs::write(&path, value).map_err(|source| LinkError::Sysctl {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(())
}

/// What the plugin needs to know of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub name: String,
    pub index: u32,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    pub up: bool,
    pub alias: Option<String>,
    pub is_veth: bool,
}

/// A route as the plugin checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
}

/// Errno of a netlink error, positive (EEXIST = 17).
fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => message.code.map(|code| -code.get()),
        _ => None,
    }
}

/// A veth pair (or a netkit pair: `device`) to create, the pod side inside `pod_netns`.
#[derive(Clone, Copy)]
pub struct VethPair<'a> {
    pub device: PodDevice,
    pub host: &'a str,
    /// The host side's alias (who the pair belongs to), set by [`Netlink::set_alias`]
    /// once the pair exists.
    pub alias: &'a str,
    pub pod: &'a str,
    pub pod_netns: &'a File,
    /// Both sides' MTU; `None`: the kernel's default.
    pub mtu: Option<u32>,
    /// The pod side's MAC; `None`: a random one.
    pub pod_mac: Option<[u8; 6]>,
    /// Both sides' IPv4 GSO and GRO size (BIG TCP); `None`: the kernel's default.
    pub gso_max_size: Option<u32>,
}

pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Opens a connection in the calling thread's namespace; must run inside tokio.
    pub fn connect() -> Result<Self, LinkError> {
        let (connection, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(connection);
        Ok(Self { handle })
    }

    /// Creates the pair in one request: the host side here, the pod side directly inside
    /// its namespace (never visible in this namespace).
    ///
    /// A netkit pair is made in L2 mode (Ethernet frames and ARP, as over a veth), the
    /// host side its primary, and with the pod side's policy `drop`: until the daemon's
    /// program is on the pair's hook, nothing the pod sends goes anywhere.
    pub async fn create_veth(&self, pair: &VethPair<'_>) -> Result<(), LinkError> {
        let VethPair { host, pod, .. } = *pair;
        let mut peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(pod.to_owned())
            .setns_by_fd(pair.pod_netns.as_raw_fd());
        let kind = match pair.device {
            PodDevice::Veth => InfoKind::Veth,
            PodDevice::Netkit => InfoKind::Netkit,
        };
        let mut link =
            LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(kind).name(host.to_owned());
        if let Some(mtu) = pair.mtu {
            peer = peer.mtu(mtu);
            link = link.mtu(mtu);
        }
        if let Some(mac) = pair.pod_mac {
            peer = peer.address(mac.to_vec());
        }
        if let Some(size) = pair.gso_max_size {
            for attribute in [
                LinkAttribute::GsoIpv4MaxSize(size),
                LinkAttribute::GroIpv4MaxSize(size),
            ] {
                peer = peer.append_extra_attribute(attribute.clone());
                link = link.append_extra_attribute(attribute);
            }
        }
        let data = match pair.device {
            PodDevice::Veth => InfoData::Veth(InfoVeth::Peer(peer.build())),
            PodDevice::Netkit => InfoData::Netkit(vec![
                InfoNetkit::Mode(NetkitMode::L2),
                InfoNetkit::PeerPolicy(NetkitPolicy::Drop),
                InfoNetkit::Peer(peer.build()),
            ]),
        };
        let message = link.set_info_data(data).build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(|source| match errno(&source) {
                Some(libc::EEXIST) => LinkError::Exists(format!(
                    "a link named {host} (host side) or {pod} (pod side)"
                )),
                // The kernel's answer to a kind it has no driver for.
                Some(libc::EOPNOTSUPP) if pair.device == PodDevice::Netkit => LinkError::NoNetkit,
                _ => LinkError::netlink(format!("creating the pair {host}/{pod}"))(source),
            })
    }

    /// Sets the alias of the link `name`. (The kernel applies IFLA_IFALIAS on a change
    /// of a link, not on its creation, hence a request of its own.)
    pub async fn set_alias(&self, name: &str, alias: &str) -> Result<(), LinkError> {
        let message = LinkUnspec::new_with_name(name)
            .alias(alias.to_owned())
            .build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(LinkError::netlink(format!("setting the alias of {name}")))
    }

    /// The link named `name`, if any.
    pub async fn get(&self, name: &str) -> Result<Option<LinkInfo>, LinkError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(Some(message)) => Ok(Some(link_info(&message))),
            Ok(None) => Ok(None),
            Err(error) if errno(&error) == Some(libc::ENODEV) => Ok(None),
            Err(error) => Err(LinkError::netlink(format!("looking up {name}"))(error)),
        }
    }

    /// Like [`Self::get`], but a missing link is an error.
    pub async fn require(&self, name: &str) -> Result<LinkInfo, LinkError> {
        self.get(name)
            .await?
            .ok_or_else(|| LinkError::NotFound(name.to_owned()))
    }

    /// Every link of the namespace.
    pub async fn list(&self) -> Result<Vec<LinkInfo>, LinkError> {
        let messages: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(LinkError::netlink("listing links"))?;
        Ok(messages.iter().map(link_info).collect())
    }

    pub async fn set_up(&self, index: u32) -> Result<(), LinkError> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(LinkError::netlink(format!("setting link {index} up")))
    }

    /// Deletes the link named `name`; returns false when there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, LinkError> {
        let Some(link) = self.get(name).await? else {
            return Ok(false);
        };
        match self.handle.link().del(link.index).execute().await {
            Ok(()) => Ok(true),
            // Gone in between (its peer's namespace was deleted): the goal is reached.
            Err(error) if errno(&error) == Some(libc::ENODEV) => Ok(false),
            Err(error) => Err(LinkError::netlink(format!("deleting {name}"))(error)),
        }
    }

    pub async fn add_address(&self, index: u32, address: IpNet) -> Result<(), LinkError> {
        self.handle
            .address()
            .add(index, address.addr(), address.prefix_len())
            .execute()
            .await
            .map_err(LinkError::netlink(format!("adding {address}")))
    }

    /// The addresses of link `index`.
    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNet>, LinkError> {
        let messages: Vec<_> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(LinkError::netlink("listing addresses"))?;
        Ok(messages
            .iter()
            .filter_map(|message| {
                message
                    .attributes
                    .iter()
                    .find_map(|attribute| match attribute {
                        AddressAttribute::Address(addr) => {
                            IpNet::new(*addr, message.header.prefix_len).ok()
                        }
                        _ => None,
                    })
            })
            .collect())
    }

    /// Adds an IPv4 route to `dst` through link `index`, via `gateway` when given.
    pub async fn add_route_v4(
        &self,
        dst: ipnet::Ipv4Net,
        gateway: Option<Ipv4Addr>,
        index: u32,
    ) -> Result<(), LinkError> {
        let mut route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .output_interface(index);
        if let Some(gateway) = gateway {
            route = route.gateway(gateway);
        }
        self.handle
            .route()
            .add(route.build())
            .execute()
            .await
            .map_err(LinkError::netlink(format!("adding the route to {dst}")))
    }

    /// `addr/32 dev <index> scope link`: how the node reaches a pod on this veth.
    pub async fn add_host_route(&self, addr: Ipv4Addr, index: u32) -> Result<(), LinkError> {
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(addr, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        self.handle
            .route()
            .add(route)
            .execute()
            .await
            .map_err(LinkError::netlink(format!(
                "adding the host route to {addr}"
            )))
    }

    /// Makes a `tbf` qdisc with `tbf`'s settings the root qdisc of link `index`
    /// (replacing the one there: a veth's default is none).
    pub async fn set_tbf(&self, index: u32, tbf: &Tbf) -> Result<(), LinkError> {
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::ROOT;
        message.header.handle = TcHandle {
            major: TBF_HANDLE,
            minor: 0,
        };
        message
            .attributes
            .push(TcAttribute::Kind(crate::tbf::KIND.to_owned()));
        message.attributes.push(TcAttribute::Options(tbf.options()));
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(message));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
        let what = || format!("setting a rate limit (tbf) on link {index}");
        let mut responses = self
            .handle
            .clone()
            .request(request)
            .map_err(LinkError::netlink(what()))?;
        while let Some(response) = responses.next().await {
            if let NetlinkPayload::Error(error) = response.payload
                && error.code.is_some()
            {
                return Err(LinkError::netlink(what())(rtnetlink::Error::NetlinkError(
                    error,
                )));
            }
        }
        Ok(())
    }

    /// The root qdisc of link `index` when it is a `tbf`.
    pub async fn root_tbf(&self, index: u32) -> Result<Option<tbf::Dumped>, LinkError> {
        let messages: Vec<TcMessage> = self
            .handle
            .qdisc()
            .get()
            .index(index as i32)
            .execute()
            .try_collect()
            .await
            .map_err(LinkError::netlink(format!(
                "listing the qdiscs of link {index}"
            )))?;
        Ok(messages
            .iter()
            .filter(|message| {
                message.header.index == index as i32 && message.header.parent == TcHandle::ROOT
            })
            .find_map(tbf::dumped))
    }

    /// The IPv4 routes of every table but the local one.
    pub async fn routes_v4(&self) -> Result<Vec<RouteInfo>, LinkError> {
        let messages: Vec<RouteMessage> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(LinkError::netlink("listing routes"))?;
        Ok(messages.iter().filter_map(route_info).collect())
    }
}

fn link_info(message: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        name: String::new(),
        index: message.header.index,
        mac: None,
        mtu: None,
        up: message.header.flags.contains(LinkFlags::Up),
        alias: None,
        is_veth: false,
    };
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => info.name.clone_from(name),
            LinkAttribute::Address(bytes) => info.mac = bytes.as_slice().try_into().ok(),
            LinkAttribute::Mtu(mtu) => info.mtu = Some(*mtu),
            LinkAttribute::IfAlias(alias) => info.alias = Some(alias.clone()),
            LinkAttribute::LinkInfo(infos) => {
                info.is_veth = infos.iter().any(|i| {
                    matches!(
                        i,
                        rtnetlink::packet_route::link::LinkInfo::Kind(InfoKind::Veth)
                    )
                });
            }
            _ => {}
        }
    }
    info
}

fn route_info(message: &RouteMessage) -> Option<RouteInfo> {
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Destination(RouteAddress::Inet(addr)) => dst = Some(*addr),
            RouteAttribute::Gateway(RouteAddress::Inet(addr)) => gateway = Some(IpAddr::V4(*addr)),
            RouteAttribute::Oif(index) => oif = Some(*index),
            _ => {}
        }
    }
    let dst = IpNet::new(
        IpAddr::V4(dst.unwrap_or(Ipv4Addr::UNSPECIFIED)),
        message.header.destination_prefix_length,
    )
    .ok()?;
    // Every table but the local one (local and broadcast routes): a chained `sbr` moves
    // the pod's routes from the main table to one of their own.
    (message.header.table != libc::RT_TABLE_LOCAL).then_some(RouteInfo { dst, gateway, oif })
}
