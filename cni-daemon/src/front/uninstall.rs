//! `ebpf-cnid uninstall`: everything `run` left on the node removed, in the order that
//! keeps pods from being half served: the CNI configuration first (no new pods), then
//! the pods' program, the ways to other nodes, the gateways, the uplink and guard
//! filters, the pins, the records, the socket and the files beside it. Refused while a
//! daemon answers.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use cni_api as api;

use crate::{
    datapath::{self, bpffs, sock, tc_block},
    files,
    front::install,
};

/// Where the daemon kept what it made.
pub struct Paths {
    pub bpf_dir: PathBuf,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    /// The CNI config folder to remove the conflist from, when given.
    pub cni_conf_dir: Option<PathBuf>,
}

/// Removes everything the daemon left (see the module doc).
pub fn uninstall(paths: &Paths) -> anyhow::Result<()> {
    if api::Client::new(paths.socket.clone(), Duration::from_secs(2)).answers() {
        bail!(
            "a daemon still answers on {}; stop it before uninstalling",
            paths.socket.display()
        );
    }
    // First: a runtime stops handing new pods to this network before its datapath goes.
    if let Some(conf_dir) = &paths.cni_conf_dir {
        let removed = install::remove_conflist(conf_dir).with_context(|| {
            format!(
                "cannot remove the CNI configuration from {}",
                conf_dir.display()
            )
        })?;
        tracing::info!(dir = %conf_dir.display(), removed, "CNI configuration");
    }
    remove_pod_block(&paths.state_dir)?;
    let pairs = datapath::detach_netkit_pods()
        .context("cannot take the pod program off the pods' netkit pairs")?;
    tracing::info!(pairs, "pod program taken off the netkit pairs");
    // The ways to other nodes' pods: the overlay device and the daemon's routes.
    datapath::overlay::remove_device()?;
    datapath::node_routes::sync(&std::collections::BTreeMap::new(), false)
        .context("cannot remove the routes to other nodes' pods")?;
    // The pods' gateways, before the uplink's programs that keep them the pods'.
    datapath::gateways::remove_all().context("cannot remove the pods' gateways")?;
    datapath::remove_uplink_filters(&paths.bpf_dir)
        .context("cannot remove the uplink programs' filters")?;
    datapath::remove_guard_filters().context("cannot remove the gateway guard's filters")?;
    bpffs::remove(&paths.bpf_dir)?;
    // Emptied, and left when it is a mount point (uninstall run in the DaemonSet's pod,
    // whose state folder is the host's, mounted).
    files::empty_and_remove_dir(&paths.state_dir)
        .with_context(|| format!("cannot remove {}", paths.state_dir.display()))?;
    // The socket, the plugin's cache of IPAM versions and this node's pod ranges beside
    // it, and their folder when nothing else is in it, go too.
    let _ = std::fs::remove_file(&paths.socket);
    if let Some(folder) = paths.socket.parent() {
        let _ = std::fs::remove_file(folder.join(api::IPAM_VERSIONS_FILE));
        let _ = std::fs::remove_file(folder.join(api::NODE_POD_CIDRS_FILE));
        let _ = std::fs::remove_dir(folder);
    }
    tracing::info!(bpf_dir = %paths.bpf_dir.display(), "uninstalled");
    Ok(())
}

/// Removes the pods' TC block filter and its anchor. They live in the daemon's network
/// namespace, which the daemon recorded (`<state dir>/tc-block-netns`): from any other
/// namespace uninstall refuses before removing anything, rather than leave the pods'
/// program running without its maps' pins, or touch another namespace's block.
fn remove_pod_block(state_dir: &Path) -> anyhow::Result<()> {
    let recorded = std::fs::read_to_string(state_dir.join(tc_block::NETNS_FILE)).ok();
    let Some(recorded) = recorded.and_then(|text| text.trim().parse::<u64>().ok()) else {
        return Ok(());
    };
    if sock::netns_cookie().context("cannot read this namespace's cookie")? != recorded {
        bail!(
            "the daemon ran in another network namespace: run uninstall inside it (for \
             example with nsenter --net=<its netns path>); nothing was removed"
        );
    }
    tc_block::remove().context("cannot remove the pods' TC block")
}
