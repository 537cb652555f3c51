//! Applies each new set of objects from the policy source (Namespaces, Pods and
//! NetworkPolicies) to the running node, which compiles the policies for its pods and
//! writes them into the datapath.

use std::sync::{Arc, Mutex};

use cni_policy::parse::Objects;
use tokio::sync::watch;

use crate::{
    front::metrics::{NodeView, Telemetry},
    model::node::LocalNode,
};

/// Runs until the policy source ends (it does not: both sources retry on their own),
/// applying every new set of objects to `node`. With `wait_first`, the receiver's first
/// value is a placeholder (the API's watches have not listed everything yet): nothing
/// is applied before the first change, so the pods keep the isolation the maps hold.
pub async fn run(
    mut objects: watch::Receiver<Arc<Objects>>,
    wait_first: bool,
    node: Arc<Mutex<LocalNode>>,
    telemetry: Arc<Telemetry>,
) {
    if wait_first && objects.changed().await.is_err() {
        tracing::error!("the policy source ended before it listed anything");
        return;
    }
    loop {
        let latest = Arc::clone(&objects.borrow_and_update());
        let node = Arc::clone(&node);
        let telemetry = Arc::clone(&telemetry);
        // Compiling and writing maps under the node's lock: on a blocking thread.
        let applied = tokio::task::spawn_blocking(move || {
            let mut node = match node.lock() {
                Ok(node) => node,
                Err(poisoned) => poisoned.into_inner(),
            };
            let outcome = node.set_policy_objects(latest);
            telemetry.publish(NodeView::of(&node));
            outcome
        })
        .await;
        match applied {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot apply the network policies; the next change tries again");
            }
            Err(error) => tracing::error!(%error, "applying the network policies failed"),
        }
        if objects.changed().await.is_err() {
            tracing::error!("the policy source ended; the policies stay as they are");
            return;
        }
    }
}
