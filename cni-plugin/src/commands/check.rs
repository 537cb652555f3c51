//! CHECK: the attachment still looks as prevResult says: the container interface, its
//! MAC, addresses and routes, the host veth, the daemon's endpoint, and the rate limits
//! as the configuration asks them (qdiscs and the daemon's record); then IPAM's CHECK.

use std::net::IpAddr;

use crate::{
    commands::{
        Invocation,
        add::{bandwidth, pod_link},
        block_on,
        teardown::setup_error,
    },
    link::Netlink,
    netns,
    spec::{CniError, CniResult, Command, DEFAULT_MTU, ErrorCode, Limit},
    tbf::{Dumped, Tbf},
};

pub fn run(inv: &Invocation) -> Result<(), CniError> {
    let container_id = inv.container_id()?;
    let ifname = inv.ifname()?;
    let netns_path = inv.netns()?;
    let prev = inv.conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidConfig,
            "CHECK needs prevResult in the config",
        )
    })?;
    let prev = CniResult::parse(prev)?;

    let pod_netns = inv.open_netns()?;
    let pod = pod_link(&pod_netns, ifname)?
        .ok_or_else(|| failed(format!("{ifname} is missing from {}", netns_path.display())))?;
    if let Some(expected) = prev
        .interfaces
        .iter()
        .find(|interface| interface.name == ifname && interface.sandbox.is_some())
    {
        let actual = pod
            .mac
            .map(|mac| cni_api::MacAddr::from(mac).to_string())
            .unwrap_or_default();
        if !expected.mac.eq_ignore_ascii_case(&actual) {
            return Err(failed(format!(
                "{ifname} has MAC {actual}, prevResult says {}",
                expected.mac
            )));
        }
    }
    let shaping = inv.conf.shaping(pod.mtu.unwrap_or(DEFAULT_MTU))?;
    let pod_tbf = check_pod_addresses_and_routes(&pod_netns, pod.index, &prev)?;
    check_limit(&format!("{ifname}'s egress"), pod_tbf, shaping.egress)?;

    let host_veth = cni_api::naming::host_veth(container_id, ifname);
    let (host, host_tbf) = block_on(async {
        let netlink = Netlink::connect()?;
        let Some(host) = netlink.get(&host_veth).await? else {
            return Ok((None, None));
        };
        let tbf = netlink.root_tbf(host.index).await?;
        Ok::<_, crate::link::LinkError>((Some(host), tbf))
    })?
    .map_err(setup_error)?;
    if host.is_none() {
        return Err(failed(format!("the host veth {host_veth} is missing")));
    }
    check_limit(&format!("{ifname}'s ingress"), host_tbf, shaping.ingress)?;

    let endpoint = inv
        .daemon()
        .get(inv.endpoint_id()?)?
        .ok_or_else(|| failed("the node daemon has no endpoint for this attachment"))?;
    for ip in &prev.ips {
        if !endpoint.ips.contains(&ip.address) {
            return Err(failed(format!(
                "the node daemon does not route {}",
                ip.address
            )));
        }
    }

    if endpoint.bandwidth != bandwidth(&shaping) {
        return Err(failed(format!(
            "the node daemon has the limits {:?}, the configuration asks {:?}",
            endpoint.bandwidth,
            bandwidth(&shaping)
        )));
    }

    let ipam = inv.ipam()?;
    let config = inv.ipam_config(None)?;
    ipam.run(&inv.ipam_env(Command::Check), &config)
}

/// Checks the pod's addresses and routes; returns the `tbf` at the root of its
/// interface, if any.
fn check_pod_addresses_and_routes(
    pod_netns: &std::fs::File,
    index: u32,
    prev: &CniResult,
) -> Result<Option<Dumped>, CniError> {
    let (addresses, routes, tbf) = netns::run_in(pod_netns, move || {
        block_on(async move {
            let netlink = Netlink::connect()?;
            Ok::<_, crate::link::LinkError>((
                netlink.addresses(index).await?,
                netlink.routes_v4().await?,
                netlink.root_tbf(index).await?,
            ))
        })
    })
    .map_err(|error| CniError::new(ErrorCode::InterfaceSetup, error.to_string()))??
    .map_err(setup_error)?;
    for ip in &prev.ips {
        if !addresses.contains(&ip.address) {
            return Err(failed(format!(
                "address {} is missing from the pod",
                ip.address
            )));
        }
    }
    for route in prev
        .routes
        .iter()
        .filter(|route| route.dst.addr().is_ipv4())
    {
        let present = routes.iter().any(|actual| {
            actual.dst == route.dst && route.gw.is_none_or(|gw| actual.gateway == Some(gw))
        });
        if !present {
            let via = route
                .gw
                .map(|gw: IpAddr| format!(" via {gw}"))
                .unwrap_or_default();
            return Err(failed(format!(
                "route {}{via} is missing from the pod",
                route.dst
            )));
        }
    }
    Ok(tbf)
}

/// The qdisc found for one direction (`what`) enforces `expected`. Without an expected
/// limit whatever is there is not ours to judge: the reference bandwidth plugin after
/// ebpf-cni in a chain puts its own `tbf` on the host veth, and checks it itself.
fn check_limit(what: &str, found: Option<Dumped>, expected: Option<Limit>) -> Result<(), CniError> {
    match (found, expected.map(Tbf::from)) {
        (_, None) => Ok(()),
        (Some(found), Some(tbf)) if found.matches(&tbf) => Ok(()),
        (None, Some(tbf)) => Err(failed(format!(
            "{what} has no rate limit; the configuration asks {} bytes/s (tbf)",
            tbf.rate
        ))),
        (Some(found), Some(tbf)) => Err(failed(format!(
            "{what} is limited to {} bytes/s with a {}-byte backlog; the configuration asks \
             {} bytes/s and {} bytes",
            found.rate, found.limit, tbf.rate, tbf.limit
        ))),
    }
}

fn failed(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::CheckFailed, msg)
}
