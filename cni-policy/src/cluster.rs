//! The Kubernetes source of what policies are compiled from: watches of every Namespace,
//! every Pod (all namespaces, all nodes) and every `networking.k8s.io/v1` NetworkPolicy,
//! published whole as [`Objects`].
//!
//! Each watch is cni-nodes' ([`cni_nodes::watch_events`], as its Node watch): a list,
//! then a watch from its resourceVersion with bookmarks, resumed after a cut connection,
//! listed again after a `410 Gone`, retried with kube's default back-off. A list replaces
//! that kind's objects whole at its end. Nothing is published until each kind's first list
//! is complete; after that, the whole of [`Objects`] is published again after each batch
//! of changes: a change is published at once when the last publish is [`DEBOUNCE`] old
//! or older, else when it is, with every change that arrived meanwhile. An update that changes nothing policies see (a pod's status
//! conditions, a policy's annotations) publishes nothing.
//!
//! What is kept is what policies need, not Kubernetes' objects: each object is translated
//! as its event arrives and kept under its `namespace/name` (a namespace under its name):
//! a Pod as [`objects::pod`] sees it (or not at all when policies leave it out), a
//! Namespace's labels, a NetworkPolicy as [`translate::policy`] makes it, or why it does
//! not. A policy that does not translate is refused alone: it is in [`Objects::refused`]
//! (`NetworkPolicy namespace/name`), logged once as a warning (again when its reason
//! changes, or after it translated or was deleted), and the others apply.
//!
//! Memory: each object is held twice, translated: in the watches' tables and in the
//! [`Objects`] last published (and once more while a receiver keeps an older
//! `Arc<Objects>`). 10,000 pods (four labels, one address, one named port each) in 100
//! namespaces and 1,000 policies (one ingress rule of a namespace and a pod selector, and
//! two ports, each) take 21.6 MiB in all, the client's leftover buffers included, 8.6 MiB
//! of it the published copy: bytes asked of the allocator, counted by
//! `tests/cluster_memory.rs` after the fake API server served those objects, in 330,000
//! allocations (to which glibc's malloc adds about 16 bytes each, some 5 MiB). While a
//! list is read, its kind's objects are held once more, and kube's watcher holds a page
//! of up to 500 Kubernetes objects.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use cni_nodes::{Reporter, Watched, watch_events};
use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Namespace, Pod as K8sPod},
    networking::v1::NetworkPolicy,
};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::runtime::watcher::Event;
use kube::{Api, Client, Resource};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{
    compile::Pod,
    objects,
    parse::{Objects, Refused},
    policy::Policy,
    selector::Labels,
    translate,
};

/// The least time between two publishes: the changes that arrive meanwhile (a
/// Deployment's pods starting together, say) go out together, in one publish; a change
/// after a quiet time goes out at once, so a policy's edit is enforced within the
/// compile and the map writes, not a wait. Each publish
/// builds the whole of [`Objects`], about 6 ms for 10,000 pods and 1,000 policies in a
/// release build: with a publish at most every 100 ms, a cluster whose pods never stop
/// changing costs this task some 6% of a core, and receivers that compile policies from
/// each value do so at most ten times a second.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

const NAMESPACES: Watched = Watched {
    one: "namespace",
    many: "namespaces",
};
const PODS: Watched = Watched {
    one: "pod",
    many: "pods",
};
const POLICIES: Watched = Watched {
    one: "network policy",
    many: "network policies",
};

/// Watches the cluster's Namespaces, Pods and NetworkPolicies. The receiver starts empty
/// and changes first when the three first lists are complete, then after each batch of
/// changes. The watches run, and retry, until every receiver is dropped.
pub fn watch_cluster(client: Client) -> watch::Receiver<Arc<Objects>> {
    let (tx, rx) = watch::channel(Arc::new(Objects::default()));
    tokio::spawn(run(client, tx));
    rx
}

/// A policy as translated, or why it is refused.
type Translated = Result<Policy, String>;

/// An event of one watch, its object translated (`None`: one policies leave out) and
/// known by its key.
#[derive(Debug)]
enum Change<V> {
    /// A list begins.
    Init,
    Listed(String, Option<V>),
    /// The list is complete.
    InitDone,
    Applied(String, Option<V>),
    Deleted(String),
}

/// A change of one of the three watches.
#[derive(Debug)]
enum Received {
    Namespace(Change<Labels>),
    Pod(Change<Pod>),
    Policy(Change<Translated>),
}

async fn run(client: Client, tx: watch::Sender<Arc<Objects>>) {
    let namespaces = changes(Api::<Namespace>::all(client.clone()), NAMESPACES, |ns| {
        objects::namespace(ns).map(|(_, labels)| labels)
    });
    let pods = changes(Api::<K8sPod>::all(client.clone()), PODS, objects::pod);
    let policies = changes(Api::<NetworkPolicy>::all(client), POLICIES, |policy| {
        Some(translate::policy(policy).map_err(|error| error.to_string()))
    });
    let mut received = pin!(stream::select(
        stream::select(namespaces.map(Received::Namespace), pods.map(Received::Pod)),
        policies.map(Received::Policy),
    ));
    let mut state = State::default();
    // When the changes not published yet are, and when the last publish was.
    let mut due: Option<Instant> = None;
    let mut published: Option<Instant> = None;
    loop {
        let publish = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let change = tokio::select! {
            () = tx.closed() => return,
            () = publish => {
                due = None;
                published = Some(Instant::now());
                state.publish(&tx);
                continue;
            }
            change = received.next() => change,
        };
        let Some(change) = change else {
            tracing::error!(
                "the namespace, pod and network policy watches ended; the policy objects stay as they are"
            );
            return;
        };
        if state.apply(change) && state.synced() && due.is_none() {
            let now = Instant::now();
            due = Some(published.map_or(now, |last| (last + DEBOUNCE).max(now)));
        }
    }
}

/// The watch of every object of `api`, each translated by `translate` as it arrives.
fn changes<K, V>(
    api: Api<K>,
    watched: Watched,
    translate: fn(&K) -> Option<V>,
) -> impl Stream<Item = Change<V>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    V: Send + 'static,
{
    watch_events(api, watched).map(move |event| match event {
        Event::Init => Change::Init,
        Event::InitApply(object) => Change::Listed(key(&object), translate(&object)),
        Event::InitDone => Change::InitDone,
        Event::Apply(object) => Change::Applied(key(&object), translate(&object)),
        Event::Delete(object) => Change::Deleted(key(&object)),
    })
}

/// `namespace/name`, or the name of an object in no namespace.
fn key<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

/// One kind's objects, translated, by key.
struct Store<V> {
    watched: Watched,
    items: BTreeMap<String, V>,
    /// The objects of a list in progress, which replace `items` at its end.
    listing: BTreeMap<String, V>,
    /// Whether a list has completed.
    synced: bool,
}

impl<V: PartialEq> Store<V> {
    fn new(watched: Watched) -> Self {
        Self {
            watched,
            items: BTreeMap::new(),
            listing: BTreeMap::new(),
            synced: false,
        }
    }

    /// Applies a change; true when `items` changed, or the first list completed.
    fn apply(&mut self, change: Change<V>) -> bool {
        match change {
            Change::Init => {
                self.listing.clear();
                false
            }
            Change::Listed(key, value) => {
                if let Some(value) = value {
                    self.listing.insert(key, value);
                }
                false
            }
            Change::InitDone => {
                let listing = std::mem::take(&mut self.listing);
                tracing::info!("listed {} {}", listing.len(), self.watched.many);
                let changed = !self.synced || listing != self.items;
                self.items = listing;
                self.synced = true;
                changed
            }
            Change::Applied(key, Some(value)) => {
                if self.items.get(&key) == Some(&value) {
                    return false;
                }
                self.items.insert(key, value);
                true
            }
            // A pod that ended is one policies leave out, as one deleted.
            Change::Applied(key, None) | Change::Deleted(key) => self.items.remove(&key).is_some(),
        }
    }
}

/// What the three watches have shown.
struct State {
    namespaces: Store<Labels>,
    pods: Store<Pod>,
    policies: Store<Translated>,
    /// The policies refused, by key, so that each is logged once.
    refusals: Reporter<String>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            namespaces: Store::new(NAMESPACES),
            pods: Store::new(PODS),
            policies: Store::new(POLICIES),
            refusals: Reporter::default(),
        }
    }
}

impl State {
    /// Applies a change; true when what is published changes.
    fn apply(&mut self, received: Received) -> bool {
        match received {
            Received::Namespace(change) => self.namespaces.apply(change),
            Received::Pod(change) => self.pods.apply(change),
            Received::Policy(change) => {
                self.report(&change);
                let list_done = matches!(change, Change::InitDone);
                let changed = self.policies.apply(change);
                if list_done {
                    let items = &self.policies.items;
                    self.refusals.keep_only(|key| items.contains_key(key));
                }
                changed
            }
        }
    }

    /// Logs a policy's refusal when it is news.
    fn report(&mut self, change: &Change<Translated>) {
        match change {
            Change::Listed(key, value) | Change::Applied(key, value) => {
                let reasons = match value {
                    Some(Err(reason)) => std::slice::from_ref(reason),
                    _ => &[],
                };
                for reason in self.refusals.news(key, reasons) {
                    tracing::warn!("NetworkPolicy {key} left out: {reason}");
                }
            }
            Change::Deleted(key) => self.refusals.forget(key),
            Change::Init | Change::InitDone => {}
        }
    }

    /// Whether each kind's first list is complete.
    fn synced(&self) -> bool {
        self.namespaces.synced && self.pods.synced && self.policies.synced
    }

    /// The objects as they stand.
    fn objects(&self) -> Objects {
        let mut objects = Objects {
            namespaces: self.namespaces.items.clone(),
            pods: self.pods.items.values().cloned().collect(),
            ..Objects::default()
        };
        for (key, policy) in &self.policies.items {
            match policy {
                Ok(policy) => objects.policies.push(policy.clone()),
                Err(reason) => objects.refused.push(Refused {
                    object: format!("NetworkPolicy {key}"),
                    reason: reason.clone(),
                }),
            }
        }
        objects
    }

    /// Publishes the objects as they stand.
    fn publish(&self, tx: &watch::Sender<Arc<Objects>>) {
        let objects = Arc::new(self.objects());
        tracing::debug!("policy objects from the cluster: {}", objects.summary());
        tx.send_replace(objects);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(key: &str, app: &str) -> Change<Pod> {
        let (namespace, name) = key.split_once('/').expect("namespace/name");
        Change::Applied(
            key.to_owned(),
            Some(Pod {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                labels: Labels::from([("app".to_owned(), app.to_owned())]),
                ..Pod::default()
            }),
        )
    }

    fn listed<V>(change: Change<V>) -> Change<V> {
        match change {
            Change::Applied(key, value) => Change::Listed(key, value),
            other => other,
        }
    }

    fn refused(key: &str, reason: &str) -> Change<Translated> {
        Change::Applied(key.to_owned(), Some(Err(reason.to_owned())))
    }

    fn pod_names(state: &State) -> Vec<String> {
        state
            .objects()
            .pods
            .iter()
            .map(|pod| format!("{}/{}", pod.namespace, pod.name))
            .collect()
    }

    #[test]
    fn nothing_is_synced_until_each_kind_is_listed() {
        let mut state = State::default();
        for received in [
            Received::Pod(Change::Init),
            Received::Pod(listed(pod("x/a", "a"))),
            Received::Pod(Change::InitDone),
            Received::Namespace(Change::Init),
            Received::Namespace(Change::InitDone),
            Received::Policy(Change::Init),
        ] {
            state.apply(received);
            assert!(!state.synced());
        }
        assert!(
            state.apply(Received::Policy(Change::InitDone)),
            "an empty first list is news"
        );
        assert!(state.synced());
        assert_eq!(pod_names(&state), ["x/a"]);
    }

    #[test]
    fn a_list_replaces_its_kind_whole_at_its_end() {
        let mut state = State::default();
        state.apply(Received::Pod(pod("x/a", "a")));
        state.apply(Received::Pod(pod("x/b", "b")));
        assert!(!state.apply(Received::Pod(pod("x/b", "b"))), "no change");
        assert!(!state.apply(Received::Pod(Change::Init)));
        assert!(!state.apply(Received::Pod(listed(pod("x/b", "b2")))));
        assert_eq!(pod_names(&state), ["x/a", "x/b"], "the list is not done");
        assert!(state.apply(Received::Pod(Change::InitDone)));
        assert_eq!(pod_names(&state), ["x/b"]);
        assert_eq!(
            state.objects().pods[0]
                .labels
                .get("app")
                .map(String::as_str),
            Some("b2")
        );
        // A pod policies leave out (ended, say) leaves, as a deleted one does.
        assert!(state.apply(Received::Pod(Change::Applied("x/b".into(), None))));
        assert!(pod_names(&state).is_empty());
        assert!(!state.apply(Received::Pod(Change::Deleted("x/b".into()))));
    }

    #[test]
    fn a_refused_policy_is_listed_as_refused_and_reported_once() {
        let mut state = State::default();
        assert!(state.apply(Received::Policy(refused("x/bad", "spec: wrong"))));
        assert!(!state.apply(Received::Policy(refused("x/bad", "spec: wrong"))));
        let objects = state.objects();
        assert_eq!(
            objects.refused,
            [Refused {
                object: "NetworkPolicy x/bad".into(),
                reason: "spec: wrong".into()
            }]
        );
        assert!(objects.policies.is_empty());
        // Logged when it came: the reporter holds it, so the same reason is no news.
        let reasons = ["spec: wrong".to_owned()];
        assert!(state.refusals.news("x/bad", &reasons).is_empty());
        // A relist without it forgets it.
        state.apply(Received::Policy(Change::Init));
        state.apply(Received::Policy(Change::InitDone));
        assert_eq!(state.refusals.news("x/bad", &reasons).len(), 1);
    }
}
