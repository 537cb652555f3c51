//! The daemon's nodes from the Kubernetes API (issue 24, point 1), against a fake API
//! server that speaks the real list and watch wire format (`ebpf_cni_tests::fake_api`,
//! shared by path), on the external host, with `--routing native`.
//!
//! `ebpf-cnid run --kubeconfig`, over plain HTTP: the first list gives this node its pod
//! range (`ebpf-cnid status`) and another node a route; a MODIFIED event moves that
//! route; a `410 Gone` makes the daemon list again and the new list replaces the nodes
//! (the one it no longer names loses its route); a watch the server ends resumes from its
//! last bookmark, one cut mid-stream from the last version seen, and a DELETED event
//! removes the last route.
//!
//! The in-cluster configuration (kube's `Config::incluster`), over TLS: the daemon with
//! no node-source flag, `KUBERNETES_SERVICE_HOST` and `_PORT` naming the fake server, and
//! a service account's `token`, `ca.crt` and `namespace` bind-mounted under
//! /var/run/secrets in a mount namespace of its own (`ebpf_cni_tests::service_account`).
//! It lists the nodes with `Authorization: Bearer <token>` and routes them; given the
//! `ca.crt` of another CA (of the same name), it refuses the server's certificate, again
//! after the back-off, and no request gets through.
//!
//! What this leaves untested: everything `fake_api` lists as not covered (authorization,
//! client certificates, HTTP/2, protobuf, pagination), and the token's and the CA's
//! reload when kubelet rotates them (kube rereads both about once a minute).

use std::time::Duration;

use crate::fake_api::{FakeApi, WatchStream, node, tls::Ca};
use ebpf_cni_tests::{
    cluster::daemon_routes,
    daemon::{Daemon, eventually},
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    service_account::ServiceAccount,
    traffic::run_in,
};

const OWN_RANGE: &str = "10.244.171.0/24";
/// How long the daemon may take to apply what the API said.
const APPLIED: Duration = Duration::from_secs(3);
/// Another node, at an address of the uplink's network where nobody answers.
const THIRD_ADDR: &str = "198.18.0.3";
/// A bearer token as a service account's looks, in shape only.
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJl";
/// The `kubernetes` Service's port, as pods see it.
const SERVICE_PORT: u16 = 443;

#[test]
fn the_daemon_follows_nodes_from_the_kubernetes_api_through_a_410_and_a_cut() {
    require_root();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut node_1 = Node::start("10.244.170.0/24");
    let listener = run_in(&node_1.external, || {
        std::net::TcpListener::bind((EXTERNAL_ADDR, 6443)).expect("bind the API's port")
    });
    let mut api = {
        let _entered = runtime.enter();
        FakeApi::start_on(listener)
    };
    let kubeconfig = node_1.instance.state_dir.with_file_name("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    node_1.daemon.kill();
    node_1.daemon = Daemon::start_with(
        &node_1.netns,
        &node_1.instance,
        &[],
        &[
            "--node-name",
            "node-1",
            "--kubeconfig",
            kubeconfig.to_str().expect("a UTF-8 path"),
            "--routing",
            "native",
        ],
    );
    let routes = || daemon_routes(&node_1.netns);
    let route = |range: &str, via: &str| vec![format!("{range} via {via} dev uplink0")];

    let (authorization, watch) = runtime.block_on(first_list(&mut api));
    assert_eq!(authorization, None, "a kubeconfig without credentials");
    assert_first_list_applied(&node_1);

    watch.event(
        "MODIFIED",
        node("node-2", "11", EXTERNAL_ADDR, &["10.244.173.0/24"]),
    );
    assert!(
        eventually(APPLIED, || routes()
            == route("10.244.173.0/24", EXTERNAL_ADDR)),
        "the route follows node 2's new range: {:?}",
        routes()
    );

    // The watched version expires: the daemon lists again and the new list is the
    // whole truth (node 2 gone, a third node there).
    watch.expire();
    let watch = runtime.block_on(async {
        api.expect_list().await.reply_list(
            "20",
            &[
                node("node-1", "9", NODE_ADDR, &[OWN_RANGE]),
                node("node-3", "20", THIRD_ADDR, &["10.244.174.0/24"]),
            ],
        );
        api.expect_watch("20").await
    });
    assert!(
        eventually(APPLIED, || routes() == route("10.244.174.0/24", THIRD_ADDR)),
        "after the relist only node 3 is routed: {:?}",
        routes()
    );
    let nodes = node_1.instance.cli_json(&["nodes"]);
    let names: Vec<&str> = nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|node| node["name"].as_str())
        .collect();
    assert!(
        names.contains(&"node-3") && !names.contains(&"node-2"),
        "{nodes}"
    );

    // A watch the server ends (its timeout) resumes from the last bookmark; one cut
    // mid-stream resumes from the last version seen.
    watch.bookmark("25");
    drop(watch);
    let watch = runtime.block_on(api.expect_watch("25"));
    watch.cut();
    let watch = runtime.block_on(api.expect_watch("25"));
    watch.event(
        "DELETED",
        node("node-3", "26", THIRD_ADDR, &["10.244.174.0/24"]),
    );
    assert!(
        eventually(APPLIED, || routes().is_empty()),
        "node 3's route removed: {:?}",
        routes()
    );
}

/// Answers the daemon's first list with this node (its range [`OWN_RANGE`]) and node 2
/// on the external host; returns the list's `Authorization` header and the watch that
/// follows.
async fn first_list(api: &mut FakeApi) -> (Option<String>, WatchStream) {
    let list = api.expect_list().await;
    let authorization = list.authorization.clone();
    list.reply_list(
        "10",
        &[
            node("node-1", "9", NODE_ADDR, &[OWN_RANGE]),
            node("node-2", "10", EXTERNAL_ADDR, &["10.244.172.0/24"]),
        ],
    );
    (authorization, api.expect_watch("10").await)
}

/// What [`first_list`] gives the daemon: node 2's range routed via its address, and this
/// node's range (`ebpf-cnid status`).
fn assert_first_list_applied(node_1: &Node) {
    let routes = || daemon_routes(&node_1.netns);
    assert!(
        eventually(APPLIED, || routes()
            == vec![format!("10.244.172.0/24 via {EXTERNAL_ADDR} dev uplink0")]),
        "node 2's range routed via its address: {:?}",
        routes()
    );
    let status = node_1.instance.cli_json(&["status"]);
    assert_eq!(
        status["pod_cidrs"],
        serde_json::json!([OWN_RANGE]),
        "this node's range from its Node object: {status}"
    );
}

/// A node whose daemon reads its nodes through the in-cluster configuration of
/// `account`, from a fake API server on the external host that presents a certificate
/// `server_ca` signed.
fn in_cluster_node(
    runtime: &tokio::runtime::Runtime,
    account: &ServiceAccount,
    server_ca: &Ca,
) -> (Node, FakeApi) {
    let mut node_1 = Node::start("10.244.170.0/24");
    let listener = run_in(&node_1.external, || {
        std::net::TcpListener::bind((EXTERNAL_ADDR, SERVICE_PORT)).expect("bind the API's port")
    });
    let server = server_ca.server_config(EXTERNAL_ADDR.parse().expect("an address"));
    let api = {
        let _entered = runtime.enter();
        FakeApi::start_tls_on(listener, server)
    };
    let wrapper = account.wrapper(EXTERNAL_ADDR, SERVICE_PORT);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    node_1.daemon.kill();
    node_1.daemon = Daemon::start_under(
        &node_1.netns,
        &node_1.instance,
        &wrapper,
        &[],
        &["--node-name", "node-1", "--routing", "native"],
    );
    (node_1, api)
}

#[test]
fn in_cluster_the_daemon_lists_the_nodes_over_tls_with_its_service_account_token() {
    require_root();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let ca = Ca::new();
    let account = ServiceAccount::new(TOKEN, &ca.pem());
    let (node_1, mut api) = in_cluster_node(&runtime, &account, &ca);

    let (authorization, _watch) = runtime.block_on(first_list(&mut api));
    assert_eq!(
        authorization,
        Some(format!("Bearer {TOKEN}")),
        "the list carries the service account's token"
    );
    assert_first_list_applied(&node_1);
    let nodes = node_1.instance.cli_json(&["nodes"]);
    assert_eq!(nodes["node_source"], "in-cluster", "{nodes}");
    assert_eq!(
        account.mounts_outside(),
        Vec::<String>::new(),
        "the service account is mounted in the daemon's mount namespace only"
    );
}

#[test]
fn in_cluster_the_daemon_refuses_an_api_server_its_ca_did_not_sign() {
    require_root();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Another CA of the same name: only the signature tells them apart.
    let account = ServiceAccount::new(TOKEN, &Ca::new().pem());
    let (node_1, mut api) = in_cluster_node(&runtime, &account, &Ca::new());

    // Refused, then refused again after the back-off: the daemon keeps trying.
    runtime.block_on(async {
        for _ in 0..2 {
            let refusal = api.next_refusal().await;
            assert!(
                refusal.contains("received fatal alert"),
                "the daemon ends the handshake: {refusal}"
            );
        }
    });
    assert!(
        api.pending_call().is_none(),
        "no request got through to the server"
    );
    let status = node_1.instance.cli_json(&["status"]);
    assert_eq!(
        status["pod_cidrs"],
        serde_json::json!([]),
        "no pod range without the nodes: {status}"
    );
    let log = node_1.instance.log();
    assert!(
        log.contains("watching the nodes") && log.contains("invalid peer certificate"),
        "the daemon says why it has no nodes:\n{log}"
    );
}
