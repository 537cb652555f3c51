//! The Kubernetes source against a fake API server that speaks the real wire format (see
//! `fake_api` for what it leaves out): list, watch, changes, a `410 Gone`, a cut
//! connection and a watch the server ends; and over TLS, where the client trusts its
//! kubeconfig's CA and no other, and sends its bearer token.

#[path = "../../tests/src/fake_api/mod.rs"]
mod fake_api;
mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use cni_nodes::{ClusterAccess, ClusterError, connect, watch_cluster};
use fake_api::{FakeApi, node, tls::Ca};
use support::{capture_logs, log_lines, set, wait_for, wait_for_log};

/// How long a step may take: a retry after an error backs off about a second.
const STEP: Duration = Duration::from_secs(10);
/// Where the TLS tests' server listens, named by its certificate.
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

async fn client_for(api: &FakeApi, dir: &tempfile::TempDir) -> kube::Client {
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    connect(&ClusterAccess::Kubeconfig(kubeconfig))
        .await
        .expect("a client from the kubeconfig")
}

#[tokio::test]
async fn the_watch_follows_changes_relists_after_410_and_resumes_after_a_cut() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    assert!(
        rx.borrow_and_update().is_empty(),
        "nothing before the first list"
    );

    // The first list, read consistently (no resourceVersion=0), then a watch from it.
    let list = api.expect_list().await;
    assert_eq!(list.param("resourceVersion"), None, "{list:?}");
    list.reply_list("10", &[node("a", "10", "192.0.2.1", &["10.244.1.0/24"])]);
    let watch = api.expect_watch("10").await;
    wait_for(
        &mut rx,
        &set(&[("a", "192.0.2.1", &["10.244.1.0/24"])]),
        STEP,
    )
    .await;

    // A node joins before it has a pod range, then gets one.
    watch.event("ADDED", node("b", "11", "192.0.2.2", &[]));
    wait_for(
        &mut rx,
        &set(&[
            ("a", "192.0.2.1", &["10.244.1.0/24"]),
            ("b", "192.0.2.2", &[]),
        ]),
        STEP,
    )
    .await;
    watch.event("MODIFIED", node("b", "12", "192.0.2.2", &["10.244.2.0/24"]));
    wait_for(
        &mut rx,
        &set(&[
            ("a", "192.0.2.1", &["10.244.1.0/24"]),
            ("b", "192.0.2.2", &["10.244.2.0/24"]),
        ]),
        STEP,
    )
    .await;

    // A node leaves.
    watch.event("DELETED", node("a", "13", "192.0.2.1", &["10.244.1.0/24"]));
    wait_for(
        &mut rx,
        &set(&[("b", "192.0.2.2", &["10.244.2.0/24"])]),
        STEP,
    )
    .await;

    // The version expires: the watcher lists again, and the new list replaces the set,
    // the nodes it no longer names included.
    watch.expire();
    api.expect_list().await.reply_list(
        "30",
        &[
            node("b", "28", "192.0.2.2", &["10.244.12.0/24"]),
            node("c", "29", "192.0.2.3", &["10.244.3.0/24"]),
        ],
    );
    let watch = api.expect_watch("30").await;
    assert_eq!(
        log_lines(&["INFO", "the node watch expired", "too old resource version"]).len(),
        1,
        "a 410 is routine: logged once, as information"
    );
    wait_for(
        &mut rx,
        &set(&[
            ("b", "192.0.2.2", &["10.244.12.0/24"]),
            ("c", "192.0.2.3", &["10.244.3.0/24"]),
        ]),
        STEP,
    )
    .await;

    // A cut connection resumes from the last event's version, without a list.
    watch.event("ADDED", node("d", "35", "192.0.2.4", &["10.244.4.0/24"]));
    let with_d = set(&[
        ("b", "192.0.2.2", &["10.244.12.0/24"]),
        ("c", "192.0.2.3", &["10.244.3.0/24"]),
        ("d", "192.0.2.4", &["10.244.4.0/24"]),
    ]);
    wait_for(&mut rx, &with_d, STEP).await;
    watch.cut();
    let watch = api.expect_watch("35").await;

    // A watch the server ends (its timeout) resumes from the last bookmark.
    watch.bookmark("40");
    drop(watch);
    let watch = api.expect_watch("40").await;
    watch.event(
        "MODIFIED",
        node("d", "41", "192.0.2.4", &["10.244.14.0/24"]),
    );
    wait_for(
        &mut rx,
        &set(&[
            ("b", "192.0.2.2", &["10.244.12.0/24"]),
            ("c", "192.0.2.3", &["10.244.3.0/24"]),
            ("d", "192.0.2.4", &["10.244.14.0/24"]),
        ]),
        STEP,
    )
    .await;
}

#[tokio::test]
async fn a_failed_list_is_retried() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    api.expect_list().await.reply_failure(500, "InternalError");
    wait_for_log(
        &[
            "WARN",
            "watching the nodes",
            "InternalError",
            "trying again",
        ],
        STEP,
    )
    .await;
    api.expect_list()
        .await
        .reply_list("7", &[node("a", "6", "192.0.2.1", &[])]);
    let _watch = api.expect_watch("7").await;
    wait_for(&mut rx, &set(&[("a", "192.0.2.1", &[])]), STEP).await;
}

#[tokio::test]
async fn a_node_that_loses_its_ipv4_address_leaves_the_set() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    api.expect_list().await.reply_list(
        "5",
        &[
            node("a", "3", "192.0.2.1", &["10.244.1.0/24"]),
            node("v6", "4", "2001:db8::1", &["fd00:10:244::/64"]),
        ],
    );
    let watch = api.expect_watch("5").await;
    wait_for(
        &mut rx,
        &set(&[("a", "192.0.2.1", &["10.244.1.0/24"])]),
        STEP,
    )
    .await;

    watch.event(
        "MODIFIED",
        node("a", "6", "2001:db8::2", &["10.244.1.0/24"]),
    );
    wait_for(&mut rx, &set(&[]), STEP).await;
}

#[tokio::test]
async fn the_first_list_is_published_even_when_empty() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let mut rx = watch_cluster(client_for(&api, &dir).await);
    rx.borrow_and_update();
    api.expect_list().await.reply_list("1", &[]);
    let _watch = api.expect_watch("1").await;
    tokio::time::timeout(STEP, rx.changed())
        .await
        .expect("the first list is published")
        .expect("the source runs");
    assert!(rx.borrow().is_empty());
}

#[tokio::test]
async fn the_watch_stops_when_every_receiver_is_dropped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let rx = watch_cluster(client_for(&api, &dir).await);
    let second = rx.clone();
    api.expect_list().await.reply_list("1", &[]);
    let watch = api.expect_watch("1").await;
    drop(rx);
    drop(second);
    tokio::time::timeout(STEP, watch.closed())
        .await
        .expect("the client closes the watch's connection");
}

#[tokio::test]
async fn a_missing_kubeconfig_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kubeconfig");
    match connect(&ClusterAccess::Kubeconfig(path)).await {
        Err(err @ ClusterError::Kubeconfig { .. }) => {
            assert!(err.to_string().contains("kubeconfig"), "{err}");
        }
        Err(other) => panic!("a missing kubeconfig gave {other}"),
        Ok(_) => panic!("a missing kubeconfig gave a client"),
    }
}

/// A bearer token as a service account's looks, in shape only.
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJmYWtlIn0.c2lnbmF0dXJl";

/// A client from a kubeconfig for `api` over TLS, trusting `ca` and sending [`TOKEN`].
async fn tls_client_for(api: &FakeApi, ca: &Ca, dir: &tempfile::TempDir) -> kube::Client {
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).expect("write the CA");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.tls_kubeconfig(&ca_file, TOKEN)).expect("write the kubeconfig");
    connect(&ClusterAccess::Kubeconfig(kubeconfig))
        .await
        .expect("a TLS client from the kubeconfig")
}

fn tls_listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1")
}

// Building the client builds its rustls configuration, which panics when the crate's
// build holds no crypto provider, or two of them.
#[tokio::test]
async fn over_tls_the_client_trusts_its_ca_and_sends_its_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new();
    let mut api = FakeApi::start_tls_on(tls_listener(), ca.server_config(LOCALHOST));
    let mut rx = watch_cluster(tls_client_for(&api, &ca, &dir).await);
    let list = api.expect_list().await;
    assert_eq!(
        list.authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str()),
        "{list:?}"
    );
    list.reply_list("3", &[node("a", "3", "192.0.2.1", &["10.244.1.0/24"])]);
    let _watch = api.expect_watch("3").await;
    wait_for(
        &mut rx,
        &set(&[("a", "192.0.2.1", &["10.244.1.0/24"])]),
        STEP,
    )
    .await;
}

#[tokio::test]
async fn over_tls_a_server_another_ca_signed_is_refused() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    // Both CAs are named `kubernetes`: only the signature tells them apart.
    let mut api = FakeApi::start_tls_on(tls_listener(), Ca::new().server_config(LOCALHOST));
    let mut rx = watch_cluster(tls_client_for(&api, &Ca::new(), &dir).await);
    rx.borrow_and_update();
    // Refused, then refused again after the back-off: the client keeps trying.
    for _ in 0..2 {
        let refusal = api.next_refusal().await;
        assert!(refusal.contains("received fatal alert"), "{refusal}");
    }
    wait_for_log(
        &["WARN", "watching the nodes", "invalid peer certificate"],
        STEP,
    )
    .await;
    assert!(api.pending_call().is_none(), "no request got through");
    assert!(
        !rx.has_changed().expect("the source runs"),
        "nothing listed: {:?}",
        rx.borrow()
    );
}
