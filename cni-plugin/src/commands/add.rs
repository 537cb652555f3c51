//! ADD: IPAM, the veth pair (peer created inside the pod), addresses and routes, the
//! daemon hand-off, the result. Any failure after a change undoes every change.
//!
//! IPAM runs on its own thread while the veth pair is created and the daemon binds its
//! host side to the pods' TC block: neither needs the other.

use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr},
};

use cni_api::{self as api, Endpoint, MacAddr};
use ipnet::{IpNet, Ipv4Net};

use crate::{
    commands::{
        Invocation, block_on,
        teardown::{self, Failures, setup_error},
    },
    ipam::{self, Ipam},
    link::{LinkError, LinkInfo, Netlink, VethPair},
    netns,
    spec::{
        CniError, CniResult, DEFAULT_MTU, ErrorCode, Interface, IpConfig, NetConf, Route, Shaping,
    },
    tbf::Tbf,
};

pub fn run(inv: &Invocation) -> Result<String, CniError> {
    let version = inv.conf.version()?;
    let container_id = inv.container_id()?;
    let ifname = inv.ifname()?;
    let netns_path = inv.netns()?;

    // Validate everything before the first change.
    let pod_netns = inv.open_netns()?;
    if pod_link(&pod_netns, ifname)?.is_some() {
        return Err(CniError::new(
            ErrorCode::InterfaceExists,
            format!("{ifname} already exists in {}", netns_path.display()),
        ));
    }
    let ipam = inv.ipam()?;
    // The daemon's status also says how large the pod's GSO packets may be (BIG TCP,
    // following the node's uplink: see cni_daemon::big_tcp).
    let status = inv.daemon().require_ready()?;
    let gso_max_size = status.pod_gso_max_size;
    let ipam_config = inv.ipam_config(Some(&status))?;
    let delegate = Delegate {
        ipam: &ipam,
        config: &ipam_config,
    };
    let pod_mac = inv.conf.runtime_mac()?;
    refuse_unimplemented(&inv.conf)?;
    // The conflist's, else the daemon's (the overlay's room taken off the uplink's).
    let mtu = inv.conf.mtu.or(status.pod_mtu);
    let shaping = inv.conf.shaping(mtu.unwrap_or(DEFAULT_MTU))?;
    let host_veth = cni_api::naming::host_veth(container_id, ifname);
    let alias = cni_api::naming::host_alias(&inv.conf.name, container_id, ifname);

    let mut applied = Applied::default();
    let veth = VethPair {
        device: inv.conf.pod_device,
        host: &host_veth,
        alias: &alias,
        pod: ifname,
        pod_netns: &pod_netns,
        mtu,
        pod_mac,
        gso_max_size,
    };
    let outcome = apply(inv, &delegate, &veth, shaping, &mut applied);
    match outcome {
        Ok(result) => Ok(result.to_json(version).to_string()),
        Err(error) => Err(applied.roll_back(inv, &delegate, &host_veth, error)),
    }
}

/// The IPAM plugin and the config it gets (`Invocation::ipam_config`), for the ADD and
/// for its rollback's DEL alike.
struct Delegate<'a> {
    ipam: &'a Ipam,
    config: &'a serde_json::Value,
}

/// Which steps have changed the system, so a failure undoes exactly those.
#[derive(Default)]
struct Applied {
    ipam: bool,
    veth: bool,
    prepared: bool,
    daemon: bool,
}

impl Applied {
    fn roll_back(
        &self,
        inv: &Invocation,
        delegate: &Delegate<'_>,
        host_veth: &str,
        error: CniError,
    ) -> CniError {
        let mut failures = Failures::default();
        if let (true, Ok(id)) = (self.daemon, inv.endpoint_id()) {
            failures.record("daemon detach", teardown::detach(&inv.daemon(), id));
        } else if self.prepared {
            failures.record("daemon unprepare", inv.daemon().unprepare(host_veth));
        }
        if self.veth {
            failures.record("veth removal", teardown::delete_host_veth(host_veth));
        }
        if self.ipam {
            let (Ok(container_id), Ok(ifname)) = (inv.container_id(), inv.ifname()) else {
                return error;
            };
            let netns = inv.env.netns.as_deref();
            failures.record(
                "IPAM release",
                teardown::ipam_del(delegate.ipam, delegate.config, container_id, ifname, netns),
            );
        }
        match failures.into_result("rollback") {
            Ok(()) => error,
            Err(rollback) => CniError {
                details: format!(
                    "{}; rollback: {} ({})",
                    error.details, rollback.msg, rollback.details
                ),
                ..error
            },
        }
    }
}

fn apply(
    inv: &Invocation,
    delegate: &Delegate<'_>,
    veth: &VethPair<'_>,
    shaping: Shaping,
    applied: &mut Applied,
) -> Result<CniResult, CniError> {
    let (ifname, host_veth, pod_netns) = (veth.pod, veth.host, veth.pod_netns);
    let (addresses, link) = std::thread::scope(|scope| {
        let addresses = scope.spawn(|| delegate.ipam.add(delegate.config));
        let link = create_link(inv, veth, applied);
        let addresses = addresses
            .join()
            .unwrap_or_else(|_| Err(CniError::internal("the IPAM thread panicked")));
        (addresses, link)
    });
    // Released on failure whatever IPAM answered: a delegate that timed out or printed
    // something unusable may have allocated all the same, and a DEL of an attachment
    // it has nothing for is harmless.
    applied.ipam = true;
    link?;
    let mut result = addresses?;
    if result.ips.is_empty() {
        return Err(CniError::new(
            ErrorCode::IpamFailed,
            "the IPAM plugin returned no address",
        ));
    }
    if let Some(refused) = result.ips.iter().find_map(ipam::checks::refusal) {
        return Err(CniError::new(
            ErrorCode::IpamFailed,
            format!("the IPAM plugin gave an address no pod may have: {refused}"),
        ));
    }

    let routes = pod_routes(&result);
    let egress = shaping.egress.map(Tbf::from);
    let pod = configure_pod(pod_netns, ifname, &result.ips, &routes, egress)?;
    let pod_v4: Vec<Ipv4Addr> = result
        .ips
        .iter()
        .filter_map(|ip| match ip.address {
            IpNet::V4(net) => Some(net.addr()),
            IpNet::V6(_) => None,
        })
        .collect();
    // The node reaches the pod through a /32 route on its veth (the pod answers the
    // node's ARP itself); the route goes with the veth.
    let host = block_on(async {
        let netlink = Netlink::connect()?;
        let host = netlink.require(host_veth).await?;
        // IPv4 is the pods' only family: the node takes no IPv6 from a pod.
        crate::link::keep_ipv6_off(host_veth)?;
        // Before the daemon's hand-off, which sends the pod's frames through this qdisc.
        if let Some(ingress) = shaping.ingress {
            netlink.set_tbf(host.index, &Tbf::from(ingress)).await?;
        }
        netlink.set_up(host.index).await?;
        for addr in pod_v4 {
            netlink.add_host_route(addr, host.index).await?;
        }
        Ok::<_, LinkError>(host)
    })?
    .map_err(setup_error)?;
    let pod_mac = pod
        .mac
        .map(MacAddr::from)
        .ok_or_else(|| CniError::new(ErrorCode::InterfaceSetup, "the pod interface has no MAC"))?;
    let host_mac = host
        .mac
        .map(MacAddr::from)
        .ok_or_else(|| CniError::new(ErrorCode::InterfaceSetup, "the host veth has no MAC"))?;

    inv.daemon().attach(Endpoint {
        id: inv.endpoint_id()?,
        network: inv.conf.name.clone(),
        netns: inv.netns()?.to_path_buf(),
        host_veth: host_veth.to_owned(),
        host_ifindex: host.index,
        host_mac,
        mac: pod_mac,
        ips: result.ips.iter().map(|ip| ip.address).collect(),
        masquerade: inv.conf.ip_masq,
        cluster_cidrs: cluster_cidrs(&inv.conf, &result)
            .into_iter()
            .map(IpNet::V4)
            .collect(),
        port_mappings: port_mappings(&inv.conf),
        bandwidth: bandwidth(&shaping),
        gateway: gateway(&result).map(IpAddr::V4),
        pod: inv.env.args.pod(),
    })?;
    applied.daemon = true;

    result.interfaces = vec![
        Interface {
            name: host_veth.to_owned(),
            mac: host_mac.to_string(),
            mtu: host.mtu,
            ..Interface::default()
        },
        Interface {
            name: ifname.to_owned(),
            mac: pod_mac.to_string(),
            mtu: pod.mtu,
            sandbox: Some(inv.netns()?.display().to_string()),
            ..Interface::default()
        },
    ];
    for ip in &mut result.ips {
        ip.interface = Some(1);
    }
    result.routes = routes
        .iter()
        .map(|(dst, gw)| Route {
            dst: IpNet::V4(*dst),
            gw: gw.map(IpAddr::V4),
            ..Route::default()
        })
        .collect();
    Ok(result)
}

/// The veth pair, its peer created inside the pod, and the pod program on its host side.
fn create_link(
    inv: &Invocation,
    veth: &VethPair<'_>,
    applied: &mut Applied,
) -> Result<(), CniError> {
    // The alias says who the pair belongs to, for GC when the daemon lost its records.
    let aliased = block_on(async {
        let netlink = Netlink::connect().map_err(setup_error)?;
        let created = netlink.create_veth(veth).await;
        created.map_err(|error| match error {
            LinkError::Exists(what) => CniError::new(
                ErrorCode::InterfaceExists,
                format!("cannot create the veth pair: {what} already exists"),
            ),
            LinkError::NoNetkit => CniError::new(
                ErrorCode::UnsupportedField,
                format!(
                    "podDevice \"netkit\": {}; use \"veth\"",
                    LinkError::NoNetkit
                ),
            ),
            other => setup_error(other),
        })?;
        Ok::<_, CniError>(netlink.set_alias(veth.host, veth.alias).await)
    })??;
    applied.veth = true;
    aliased.map_err(setup_error)?;
    inv.daemon().prepare(veth.host)?;
    applied.prepared = true;
    Ok(())
}

/// The IPv4 routes the pod gets: the IPAM result's, with a route without `gw` sent via
/// the first IPv4 gateway (the spec leaves the default to the plugin), plus a default
/// route via that gateway when IPAM gave none.
fn pod_routes(result: &CniResult) -> Vec<(Ipv4Net, Option<Ipv4Addr>)> {
    let gateway = gateway(result);
    let mut routes: Vec<(Ipv4Net, Option<Ipv4Addr>)> = result
        .routes
        .iter()
        .filter_map(|route| match (route.dst, route.gw) {
            (IpNet::V4(dst), Some(IpAddr::V4(gw))) => Some((dst, Some(gw))),
            (IpNet::V4(dst), None) => Some((dst, gateway)),
            _ => None,
        })
        .collect();
    let has_default = routes.iter().any(|(dst, _)| dst.prefix_len() == 0);
    if let (false, Some(gateway)) = (has_default, gateway) {
        routes.push((Ipv4Net::default(), Some(gateway)));
    }
    routes
}

/// The first IPv4 gateway of the IPAM result: the pod's router, which the node answers
/// at (the daemon makes it one of the node's addresses).
fn gateway(result: &CniResult) -> Option<Ipv4Addr> {
    result.ips.iter().find_map(|ip| match ip.gateway {
        Some(IpAddr::V4(gateway)) => Some(gateway),
        _ => None,
    })
}

/// Inside the pod: `lo` and the interface up, its egress limit, addresses, routes;
/// returns the interface.
fn configure_pod(
    pod_netns: &File,
    ifname: &str,
    ips: &[IpConfig],
    routes: &[(Ipv4Net, Option<Ipv4Addr>)],
    egress: Option<Tbf>,
) -> Result<LinkInfo, CniError> {
    let ifname = ifname.to_owned();
    let addresses: Vec<IpNet> = ips.iter().map(|ip| ip.address).collect();
    let routes = routes.to_vec();
    let in_pod = netns::run_in(pod_netns, move || {
        block_on(async move {
            let netlink = Netlink::connect()?;
            if let Some(lo) = netlink.get("lo").await? {
                netlink.set_up(lo.index).await?;
            }
            let pod = netlink.require(&ifname).await?;
            if let Some(egress) = egress {
                netlink.set_tbf(pod.index, &egress).await?;
            }
            for address in addresses {
                netlink.add_address(pod.index, address).await?;
            }
            netlink.set_up(pod.index).await?;
            for (dst, gateway) in routes {
                netlink.add_route_v4(dst, gateway, pod.index).await?;
            }
            Ok::<_, crate::link::LinkError>(pod)
        })
    });
    in_pod
        .map_err(|error| CniError::new(ErrorCode::InterfaceSetup, error.to_string()))??
        .map_err(setup_error)
}

/// The pod's link named `ifname`, if any.
pub fn pod_link(pod_netns: &File, ifname: &str) -> Result<Option<LinkInfo>, CniError> {
    let ifname = ifname.to_owned();
    netns::run_in(pod_netns, move || {
        block_on(async move { Netlink::connect()?.get(&ifname).await })
    })
    .map_err(|error| CniError::new(ErrorCode::InterfaceSetup, error.to_string()))??
    .map_err(setup_error)
}

/// runtimeConfig.portMappings in the daemon's terms.
fn port_mappings(conf: &NetConf) -> Vec<api::PortMapping> {
    conf.runtime_config
        .port_mappings
        .iter()
        .map(|mapping| api::PortMapping {
            host_port: mapping.host_port,
            container_port: mapping.container_port,
            protocol: mapping.protocol.into(),
            host_ip: mapping.host_ip,
        })
        .collect()
}

/// The pod's limits in the daemon's terms; `None` when it has none.
pub fn bandwidth(shaping: &Shaping) -> Option<api::Bandwidth> {
    if shaping.is_none() {
        return None;
    }
    Some(api::Bandwidth {
        ingress_rate: shaping.ingress.map(|limit| limit.rate),
        ingress_burst: shaping.ingress.map(|limit| limit.burst),
        egress_rate: shaping.egress.map(|limit| limit.rate),
        egress_burst: shaping.egress.map(|limit| limit.burst),
    })
}

/// Destinations that keep the pod's address under ipMasq: `clusterCIDRs` from the
/// config, else the subnets of the pod's own IPv4 addresses (the IPAM subnet).
fn cluster_cidrs(conf: &NetConf, result: &CniResult) -> Vec<Ipv4Net> {
    if !conf.cluster_cidrs.is_empty() {
        return conf.cluster_cidrs.clone();
    }
    result
        .ips
        .iter()
        .filter_map(|ip| match ip.address {
            IpNet::V4(net) => Some(net.trunc()),
            IpNet::V6(_) => None,
        })
        .collect()
}

/// What the datapath does not implement yet is refused (code 2) rather than silently
/// ignored: a pod asking for an IPv6 hostPort must not come up without it. The runtime only sends them when the conflist declares the capability.
fn refuse_unimplemented(conf: &NetConf) -> Result<(), CniError> {
    let runtime = &conf.runtime_config;
    if runtime
        .port_mappings
        .iter()
        .any(|mapping| mapping.host_ip.is_some_and(|ip| ip.is_ipv6()))
    {
        return Err(CniError::new(
            ErrorCode::UnsupportedField,
            "runtimeConfig.portMappings: an IPv6 hostIP is not supported (the datapath is IPv4)",
        ));
    }
    Ok(())
}
