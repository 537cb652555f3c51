//! The Kubernetes source (`--kubeconfig`, or in-cluster): a watch on every `Node`, and
//! the watch of any kind of object every watch here uses ([`watch_events`], cni-policy's
//! watches of Namespaces, Pods and NetworkPolicies too).
//!
//! kube's watcher lists the objects, then watches from the list's resourceVersion with
//! bookmarks on, so a dropped connection resumes where it stopped; a `410 Gone` (the
//! version was compacted away) makes it list again. Errors back off as kube's default
//! does (0.8 s doubling to 30 s, with jitter). Lists are read with the default semantic
//! (a consistent read) rather than `resourceVersion=0`, so a relist never goes back in
//! time; see docs/decisions.md.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::PathBuf;
use std::pin::pin;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node as K8sNode;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config, Resource};
use tokio::sync::watch;

use crate::node::{Node, NodeSet};
use crate::report::Reporter;
use crate::translate::{Problem, translate};

/// How the API server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterAccess {
    /// The pod's service account, at `KUBERNETES_SERVICE_HOST` and `_PORT`: the
    /// `kubernetes` Service's ClusterIP, which needs kube-proxy (or a replacement) on the
    /// node; a daemon that starts before it is given a kubeconfig instead.
    InCluster,
    /// A kubeconfig file, at its current context.
    Kubeconfig(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("in-cluster config: {0}")]
    InCluster(Box<InClusterError>),
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        source: Box<KubeconfigError>,
    },
    #[error("Kubernetes client: {0}")]
    Client(Box<kube::Error>),
    #[error("reading the cluster config failed: {0}")]
    Thread(String),
}

/// A client for the cluster. Reads the config files but does not reach the server yet.
pub async fn connect(access: &ClusterAccess) -> Result<Client, ClusterError> {
    let config = match access {
        ClusterAccess::InCluster => tokio::task::spawn_blocking(Config::incluster)
            .await
            .map_err(|err| ClusterError::Thread(err.to_string()))?
            .map_err(|err| ClusterError::InCluster(Box::new(err)))?,
        ClusterAccess::Kubeconfig(path) => {
            let kubeconfig_error = |source| ClusterError::Kubeconfig {
                path: path.clone(),
                source: Box::new(source),
            };
            let read = path.clone();
            let kubeconfig = tokio::task::spawn_blocking(move || Kubeconfig::read_from(read))
                .await
                .map_err(|err| ClusterError::Thread(err.to_string()))?
                .map_err(kubeconfig_error)?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error)?
        }
    };
    Client::try_from(config).map_err(|err| ClusterError::Client(Box::new(err)))
}

/// Watches the cluster's nodes. The receiver starts empty and changes first when the
/// first list is complete, then at every change of a node's name, address or ranges. The
/// watch runs, and retries, until every receiver is dropped.
pub fn watch_cluster(client: Client) -> watch::Receiver<NodeSet> {
    let (tx, rx) = watch::channel(NodeSet::new());
    tokio::spawn(run(Api::all(client), tx));
    rx
}

/// What a watch follows, for its log lines: `node` (the node watch expired), `nodes`
/// (listing the nodes again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watched {
    pub one: &'static str,
    pub many: &'static str,
}

const NODES: Watched = Watched {
    one: "node",
    many: "nodes",
};

/// The events of a list and watch of every object of `api`, with the watcher's
/// configuration and back-off the module describes. Errors are logged and retried, not
/// yielded: a `410 Gone` as information (the relist that follows is routine), the rest
/// as warnings with their causes. The stream does not end.
pub fn watch_events<K>(api: Api<K>, watched: Watched) -> impl Stream<Item = Event<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    kube::runtime::watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let event = match event {
                Ok(event) => Some(event),
                Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                    tracing::info!(
                        "the {} watch expired ({}); listing the {} again",
                        watched.one,
                        status.message,
                        watched.many
                    );
                    None
                }
                Err(err) => {
                    tracing::warn!(
                        "watching the {}: {}; trying again",
                        watched.many,
                        with_causes(&err)
                    );
                    None
                }
            };
            std::future::ready(event)
        })
}

async fn run(api: Api<K8sNode>, tx: watch::Sender<NodeSet>) {
    let mut events = pin!(watch_events(api, NODES));
    let mut nodes = WatchedNodes::default();
    loop {
        let event = tokio::select! {
            () = tx.closed() => return,
            event = events.next() => event,
        };
        let Some(event) = event else {
            tracing::error!("the node watch ended; the nodes stay as they are");
            return;
        };
        tx.send_if_modified(|set| nodes.apply(event, set));
    }
}

/// `err` and the causes its message leaves out: kube's errors name a failed connection
/// ("client error (Connect)") and keep why in their sources (a refused certificate, a
/// refused connection, an unknown host).
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.contains(&cause_text) {
            message.push_str(": ");
            message.push_str(&cause_text);
        }
        source = cause.source();
    }
    message
}

/// What the watch has shown so far, beside the published set.
#[derive(Default)]
struct WatchedNodes {
    /// The nodes of a list in progress, published whole at its end.
    listing: NodeSet,
    /// The names that list has shown, skipped nodes included.
    listed: BTreeSet<String>,
    reporter: Reporter<Problem>,
    /// Whether a list has completed: the first one is published even when empty.
    synced: bool,
}

impl WatchedNodes {
    /// Applies a watch event to the published set; true when its receivers should hear
    /// of it.
    fn apply(&mut self, event: Event<K8sNode>, set: &mut NodeSet) -> bool {
        match event {
            Event::Init => {
                self.listing = NodeSet::new();
                self.listed.clear();
                false
            }
            Event::InitApply(k8s) => {
                let (name, node) = self.translate(&k8s);
                self.listed.insert(name);
                if let Some(node) = node {
                    self.listing.insert(node);
                }
                false
            }
            Event::InitDone => {
                let listing = std::mem::take(&mut self.listing);
                let listed = std::mem::take(&mut self.listed);
                self.reporter.keep_only(|name| listed.contains(name));
                tracing::info!("listed {} usable nodes", listing.len());
                let changed = !self.synced || *set != listing;
                *set = listing;
                self.synced = true;
                changed
            }
            Event::Apply(k8s) => match self.translate(&k8s) {
                (_, Some(node)) => set.insert(node),
                // A node that lost its address or name is no longer a place to send to.
                (name, None) => set.remove(&name),
            },
            Event::Delete(k8s) => {
                let name = k8s.metadata.name.unwrap_or_default();
                self.reporter.forget(&name);
                set.remove(&name)
            }
        }
    }

    fn translate(&mut self, k8s: &K8sNode) -> (String, Option<Node>) {
        let name = k8s.metadata.name.clone().unwrap_or_default();
        let translation = translate(k8s);
        self.reporter.report(&name, &translation.problems);
        (name, translation.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn k8s_node(name: &str, address: &str, cidr: &str) -> K8sNode {
        K8sNode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: Some(cidr.into()),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: address.into(),
                }]),
                ..NodeStatus::default()
            }),
        }
    }

    fn names(set: &NodeSet) -> Vec<&str> {
        set.names().collect()
    }

    #[derive(Debug, thiserror::Error)]
    enum Layer {
        #[error("client error (Connect)")]
        Connect(#[source] std::io::Error),
        #[error("list failed: {0}")]
        Shown(#[source] Box<Layer>),
    }

    #[test]
    fn a_logged_error_names_each_cause_once() {
        let refused = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let err = Layer::Shown(Box::new(Layer::Connect(refused)));
        assert_eq!(
            with_causes(&err),
            "list failed: client error (Connect): invalid peer certificate: UnknownIssuer"
        );
    }

    #[test]
    fn a_list_is_published_whole_at_its_end() {
        let mut nodes = WatchedNodes::default();
        let mut set = NodeSet::new();
        assert!(!nodes.apply(Event::Init, &mut set));
        assert!(!nodes.apply(
            Event::InitApply(k8s_node("a", "10.0.0.1", "10.244.1.0/24")),
            &mut set
        ));
        assert!(set.is_empty(), "nothing is published before InitDone");
        assert!(nodes.apply(Event::InitDone, &mut set));
        assert_eq!(names(&set), ["a"]);

        // A relist replaces the set: what it does not name is gone.
        assert!(!nodes.apply(Event::Init, &mut set));
        assert!(!nodes.apply(
            Event::InitApply(k8s_node("b", "10.0.0.2", "10.244.2.0/24")),
            &mut set
        ));
        assert_eq!(names(&set), ["a"]);
        assert!(nodes.apply(Event::InitDone, &mut set));
        assert_eq!(names(&set), ["b"]);

        // The same list again changes nothing.
        nodes.apply(Event::Init, &mut set);
        nodes.apply(
            Event::InitApply(k8s_node("b", "10.0.0.2", "10.244.2.0/24")),
            &mut set,
        );
        assert!(!nodes.apply(Event::InitDone, &mut set));
    }

    #[test]
    fn the_first_list_is_published_even_when_empty() {
        let mut nodes = WatchedNodes::default();
        let mut set = NodeSet::new();
        nodes.apply(Event::Init, &mut set);
        assert!(nodes.apply(Event::InitDone, &mut set));
    }

    #[test]
    fn a_node_that_loses_its_address_leaves_the_set() {
        let mut nodes = WatchedNodes::default();
        let mut set = NodeSet::new();
        assert!(nodes.apply(
            Event::Apply(k8s_node("a", "10.0.0.1", "10.244.1.0/24")),
            &mut set
        ));
        assert!(!nodes.apply(
            Event::Apply(k8s_node("a", "10.0.0.1", "10.244.1.0/24")),
            &mut set
        ));
        assert!(nodes.apply(
            Event::Apply(k8s_node("a", "fd00::1", "10.244.1.0/24")),
            &mut set
        ));
        assert!(set.is_empty());
        assert!(!nodes.apply(Event::Delete(k8s_node("a", "fd00::1", "")), &mut set));
    }
}
