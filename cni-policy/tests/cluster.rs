//! The Kubernetes source against cni-nodes' fake API server, which speaks the real wire
//! format (list, then watch from its resourceVersion; bookmarks; `410 Gone`): nothing is
//! published before the three first lists, then changes follow; a policy that does not
//! translate is refused alone; an expired watch relists its own kind only.

#[path = "../../tests/src/fake_api/mod.rs"]
mod fake_api;
mod support;

use std::sync::Arc;
use std::time::Duration;

use cni_nodes::{ClusterAccess, connect};
use cni_policy::{Objects, watch_cluster};
use fake_api::{FakeApi, NAMESPACES, NETWORK_POLICIES, PODS, WatchStream};
use support::{
    allow, bad_protocol, capture_logs, log_lines, namespace, pod, policy, wait_for, wait_for_log,
};
use tokio::sync::watch;

/// How long a step may take: a retry after an error backs off about a second.
const STEP: Duration = Duration::from_secs(10);

async fn client_for(api: &FakeApi, dir: &tempfile::TempDir) -> kube::Client {
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    connect(&ClusterAccess::Kubeconfig(kubeconfig))
        .await
        .expect("a client from the kubeconfig")
}

/// The three watches, past their first lists.
struct Watches {
    namespaces: WatchStream,
    pods: WatchStream,
    policies: WatchStream,
}

/// What the first lists hold, in [`support::summary`]'s words.
const FIRST: [&str; 5] = [
    "namespace x team=x",
    "namespace y team=y",
    "pod x/a 10.0.0.1 app=a",
    "pod x/b 10.0.0.2 app=b",
    "policy x/allow",
];

/// Answers the three first lists: namespaces and pods first, then, once their watches
/// show that both lists were taken, checks that nothing was published, and answers the
/// policies' list.
async fn first_lists(api: &mut FakeApi, rx: &mut watch::Receiver<Arc<Objects>>) -> Watches {
    let list = api.expect_list_of(NAMESPACES).await;
    assert_eq!(
        list.param("resourceVersion"),
        None,
        "a consistent read: {list:?}"
    );
    list.reply_list(
        "10",
        &[
            namespace("x", "8", &["team=x"]),
            namespace("y", "9", &["team=y"]),
        ],
    );
    api.expect_list_of(PODS).await.reply_list(
        "20",
        &[
            pod("x", "a", "18", "10.0.0.1", &["app=a"]),
            pod("x", "b", "19", "10.0.0.2", &["app=b"]),
        ],
    );
    let namespaces = api.expect_watch_of(NAMESPACES, "10").await;
    let pods = api.expect_watch_of(PODS, "20").await;
    // Long enough for a publish that should not come.
    tokio::time::sleep(cni_policy::cluster::DEBOUNCE * 3).await;
    assert!(
        !rx.has_changed().expect("the source runs"),
        "published before the policies were listed: {:?}",
        support::summary(&rx.borrow())
    );
    api.expect_list_of(NETWORK_POLICIES)
        .await
        .reply_list("30", &[policy("x", "allow", "29", allow("a", "b"))]);
    let policies = api.expect_watch_of(NETWORK_POLICIES, "30").await;
    wait_for(rx, &FIRST, STEP).await;
    Watches {
        namespaces,
        pods,
        policies,
    }
}

#[tokio::test]
async fn nothing_is_published_before_the_three_lists_then_each_change_is() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    let watches = first_lists(&mut api, &mut rx).await;

    // A pod's labels change.
    watches
        .pods
        .event("MODIFIED", pod("x", "b", "31", "10.0.0.2", &["app=c"]));
    let relabelled = [
        "namespace x team=x",
        "namespace y team=y",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=c",
        "policy x/allow",
    ];
    wait_for(&mut rx, &relabelled, STEP).await;

    // A namespace's labels change.
    watches
        .namespaces
        .event("MODIFIED", namespace("y", "32", &["team=z"]));
    let y_relabelled = [
        "namespace x team=x",
        "namespace y team=z",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=c",
        "policy x/allow",
    ];
    wait_for(&mut rx, &y_relabelled, STEP).await;

    // A policy is added, then deleted.
    let deny = policy("y", "deny", "33", serde_json::json!({"podSelector": {}}));
    watches.policies.event("ADDED", deny.clone());
    let with_deny = [
        "namespace x team=x",
        "namespace y team=z",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=c",
        "policy x/allow",
        "policy y/deny",
    ];
    wait_for(&mut rx, &with_deny, STEP).await;
    watches.policies.event("DELETED", deny);
    wait_for(&mut rx, &y_relabelled, STEP).await;

    // A pod that ends leaves; a pod deleted leaves.
    let mut ended = pod("x", "a", "34", "10.0.0.1", &["app=a"]);
    ended["status"]["phase"] = "Succeeded".into();
    watches.pods.event("MODIFIED", ended);
    watches
        .pods
        .event("DELETED", pod("x", "b", "35", "10.0.0.2", &["app=c"]));
    wait_for(
        &mut rx,
        &["namespace x team=x", "namespace y team=z", "policy x/allow"],
        STEP,
    )
    .await;
}

#[tokio::test]
async fn a_policy_that_does_not_translate_is_refused_alone_and_logged_once() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    let watches = first_lists(&mut api, &mut rx).await;

    watches
        .policies
        .event("ADDED", policy("y", "bad", "31", bad_protocol()));
    watches
        .policies
        .event("ADDED", policy("y", "good", "32", allow("b", "a")));
    let with_bad = [
        "namespace x team=x",
        "namespace y team=y",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=b",
        "policy x/allow",
        "policy y/good",
        "refused NetworkPolicy y/bad",
    ];
    let objects = wait_for(&mut rx, &with_bad, STEP).await;
    assert!(
        objects.refused[0]
            .reason
            .contains("spec.ingress[0].ports[0].protocol"),
        "{:?}",
        objects.refused
    );
    let refusal = ["WARN", "NetworkPolicy y/bad left out", "ICMP"];
    wait_for_log(&refusal, STEP).await;

    // The same policy again (its status or annotations changed, say): no news.
    watches
        .policies
        .event("MODIFIED", policy("y", "bad", "33", bad_protocol()));
    watches
        .pods
        .event("ADDED", pod("y", "c", "34", "10.0.0.3", &["app=c"]));
    let with_c = [
        "namespace x team=x",
        "namespace y team=y",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=b",
        "pod y/c 10.0.0.3 app=c",
        "policy x/allow",
        "policy y/good",
        "refused NetworkPolicy y/bad",
    ];
    wait_for(&mut rx, &with_c, STEP).await;
    assert_eq!(log_lines(&refusal).len(), 1, "{:?}", log_lines(&[]));

    // Mended, it applies.
    watches
        .policies
        .event("MODIFIED", policy("y", "bad", "35", allow("c", "c")));
    let mended = [
        "namespace x team=x",
        "namespace y team=y",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=b",
        "pod y/c 10.0.0.3 app=c",
        "policy x/allow",
        "policy y/bad",
        "policy y/good",
    ];
    wait_for(&mut rx, &mended, STEP).await;
}

#[tokio::test]
async fn an_expired_watch_relists_its_own_kind_and_the_rest_carries_on() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    let watches = first_lists(&mut api, &mut rx).await;
    watches.policies.event(
        "ADDED",
        policy("y", "deny", "31", serde_json::json!({"podSelector": {}})),
    );
    wait_for(
        &mut rx,
        &[
            "namespace x team=x",
            "namespace y team=y",
            "pod x/a 10.0.0.1 app=a",
            "pod x/b 10.0.0.2 app=b",
            "policy x/allow",
            "policy y/deny",
        ],
        STEP,
    )
    .await;

    // The policies' version is compacted away: while their watch was down, y/deny was
    // deleted and x/other created, which only the relist shows.
    watches.policies.expire();
    let relist = api.expect_list_of(NETWORK_POLICIES).await;
    // Meanwhile the pods' watch goes on.
    watches
        .pods
        .event("ADDED", pod("y", "c", "41", "10.0.0.3", &["app=c"]));
    relist.reply_list(
        "50",
        &[
            policy("x", "allow", "29", allow("a", "b")),
            policy("x", "other", "45", allow("b", "a")),
        ],
    );
    let _policies = api.expect_watch_of(NETWORK_POLICIES, "50").await;
    let after = [
        "namespace x team=x",
        "namespace y team=y",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=b",
        "pod y/c 10.0.0.3 app=c",
        "policy x/allow",
        "policy x/other",
    ];
    wait_for(&mut rx, &after, STEP).await;
    assert_eq!(
        log_lines(&[
            "INFO",
            "the network policy watch expired",
            "listing the network policies again"
        ])
        .len(),
        1,
        "a 410 is routine: logged once, as information"
    );

    // The other kinds were not listed again, and their watches still work.
    assert!(api.pending_call().is_none(), "no other request");
    watches
        .namespaces
        .event("DELETED", namespace("y", "51", &["team=y"]));
    let mut without_y = after.to_vec();
    without_y.retain(|line| *line != "namespace y team=y");
    wait_for(&mut rx, &without_y, STEP).await;
}

#[tokio::test]
async fn the_watches_stop_when_every_receiver_is_dropped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    let watches = first_lists(&mut api, &mut rx).await;
    drop(rx);
    for watch in [&watches.namespaces, &watches.pods, &watches.policies] {
        tokio::time::timeout(STEP, watch.closed())
            .await
            .expect("the client closes each watch's connection");
    }
}
