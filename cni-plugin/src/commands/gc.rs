//! GC: removes this network's attachments that are not in `cni.dev/valid-attachments`:
//! daemon records, host veths (found by their alias even when the daemon lost its
//! records), and IPAM allocations. IPAM gets GC when it speaks 1.1.0; an older IPAM
//! (Debian's host-local 1.1.1) gets a DEL per stale attachment instead, so addresses are
//! still freed. Every failure is reported; success prints nothing.

use std::collections::BTreeSet;

use cni_api::EndpointId;

use crate::{
    commands::{
        Invocation, block_on,
        teardown::{self, Failures, setup_error},
    },
    ipam::CallEnv,
    link::Netlink,
    spec::{CniError, CniVersion, Command},
};

pub fn run(inv: &Invocation) -> Result<(), CniError> {
    let network = inv.conf.name.as_str();
    let keep: Vec<EndpointId> = inv
        .conf
        .valid_attachments()
        .iter()
        .map(|attachment| EndpointId {
            container_id: attachment.container_id.clone(),
            ifname: attachment.ifname.clone(),
        })
        .collect();
    let mut failures = Failures::default();
    let mut stale: BTreeSet<EndpointId> = BTreeSet::new();

    if let Some(removed) = failures.record("daemon GC", inv.daemon().gc(network, keep.clone())) {
        stale.extend(removed.into_iter().map(|endpoint| endpoint.id));
    }
    if let Some(ids) = failures.record("listing host veths", stale_links(network, &keep)) {
        stale.extend(ids);
    }
    // A missing veth is success, so a pod known only to the daemon or only to the link
    // table is handled the same way.
    for id in &stale {
        let name = cni_api::naming::host_veth(&id.container_id, &id.ifname);
        failures.record("veth removal", teardown::delete_host_veth(&name));
    }

    if let Some(ipam) = failures.record("IPAM lookup", inv.ipam())
        && let Some(config) = failures.record("IPAM config", inv.ipam_config(None))
    {
        match failures.record("IPAM VERSION", ipam.supports(CniVersion::V1_1_0)) {
            Some(true) => {
                let env = CallEnv::new(Command::Gc);
                failures.record("IPAM GC", ipam.run(&env, &config));
            }
            Some(false) => {
                for id in &stale {
                    failures.record(
                        "IPAM release",
                        teardown::ipam_del(&ipam, &config, &id.container_id, &id.ifname, None),
                    );
                }
            }
            None => {}
        }
    }
    failures.into_result("GC")
}

/// Attachments whose host veth's alias says they belong to `network`, not in `keep`.
fn stale_links(network: &str, keep: &[EndpointId]) -> Result<Vec<EndpointId>, CniError> {
    let links = block_on(async {
        let netlink = Netlink::connect().map_err(setup_error)?;
        netlink.list().await.map_err(setup_error)
    })??;
    Ok(links
        .into_iter()
        .filter_map(|link| {
            let (net, container_id, ifname) = cni_api::naming::parse_alias(link.alias.as_deref()?)?;
            let id = EndpointId {
                container_id: container_id.to_owned(),
                ifname: ifname.to_owned(),
            };
            (net == network && !keep.contains(&id)).then_some(id)
        })
        .collect())
}
