//! Applies each change of the cluster's nodes to the running node (and publishes the
//! node's view, whose refusals of other nodes `/metrics` counts), and keeps this
//! node's pod ranges in the file beside the socket that the plugin reads when the
//! daemon does not answer (`cni_api::NODE_POD_CIDRS_FILE`).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use ipnet::Ipv4Net;
use tokio::sync::watch;

use cni_nodes::NodeSet;

use crate::{
    front::metrics::{NodeView, Telemetry},
    model::node::LocalNode,
};

/// Runs until the node source ends (it does not: both sources retry on their own), applying
/// every new set of nodes to `node`, and writing this node's pod ranges to
/// `pod_cidrs_file` whenever they change (the first time whatever they are).
pub async fn run(
    mut nodes: watch::Receiver<NodeSet>,
    node: Arc<Mutex<LocalNode>>,
    telemetry: Arc<Telemetry>,
    pod_cidrs_file: PathBuf,
) {
    let mut written: Option<Vec<Ipv4Net>> = None;
    loop {
        let set = nodes.borrow_and_update().clone();
        let node = Arc::clone(&node);
        let telemetry = Arc::clone(&telemetry);
        // Map writes and the node's lock: on a blocking thread.
        let applied = tokio::task::spawn_blocking(move || {
            let mut node = match node.lock() {
                Ok(node) => node,
                Err(poisoned) => poisoned.into_inner(),
            };
            let outcome = node.set_nodes(set);
            // What is refused of the nodes shows in /metrics.
            telemetry.publish(NodeView::of(&node));
            (
                outcome,
                node.cluster().pod_cidrs(),
                node.cluster().name().to_owned(),
            )
        })
        .await;
        match applied {
            Ok((outcome, pod_cidrs, name)) => {
                if let Err(error) = outcome {
                    tracing::warn!(%error, "cannot apply the cluster's nodes; the next change tries again");
                }
                if written.as_ref() != Some(&pod_cidrs) {
                    if pod_cidrs.is_empty() {
                        tracing::warn!(
                            node = %name,
                            "the node source gives this node no pod range: usePodCidr \
                             networks cannot take pods until it does"
                        );
                    } else {
                        tracing::info!(node = %name, ?pod_cidrs, "this node's pod ranges");
                    }
                    match write_pod_cidrs(&pod_cidrs_file, &pod_cidrs) {
                        Ok(()) => written = Some(pod_cidrs),
                        Err(error) => tracing::warn!(
                            %error,
                            file = %pod_cidrs_file.display(),
                            "cannot record this node's pod ranges for the plugin"
                        ),
                    }
                }
            }
            Err(error) => tracing::error!(%error, "applying the cluster's nodes failed"),
        }
        if nodes.changed().await.is_err() {
            tracing::error!("the node source ended; the nodes stay as they are");
            return;
        }
    }
}

/// Writes `cidrs` as a JSON list to `path`, whole or not at all (`cni_api::files`): the
/// plugin never reads half a list.
fn write_pod_cidrs(path: &Path, cidrs: &[Ipv4Net]) -> std::io::Result<()> {
    let text = serde_json::to_vec(cidrs).map_err(std::io::Error::other)?;
    cni_api::files::write_atomic(path, &text, 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranges_file_is_a_json_list_replaced_whole() {
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join(cni_api::NODE_POD_CIDRS_FILE);
        let cidrs: Vec<Ipv4Net> = vec!["10.244.1.0/24".parse().expect("a range")];
        write_pod_cidrs(&path, &cidrs).expect("written");
        let read: Vec<Ipv4Net> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("a list");
        assert_eq!(read, cidrs);
        write_pod_cidrs(&path, &[]).expect("written again");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "[]");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("listed")
            .map(|entry| entry.expect("an entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    }
}
