//! The daemon's nodes from the Kubernetes API (issue 24, point 1): `ebpf-cnid run
//! --kubeconfig` against a fake API server that speaks the real list and watch wire
//! format (`cni-nodes/tests/fake_api`, shared by path), on the external host, with
//! `--routing native`. The first list gives this node its pod range (`ebpf-cnid status`)
//! and another node a route; a MODIFIED event moves that route; a `410 Gone` makes the
//! daemon list again and the new list replaces the nodes (the one it no longer names
//! loses its route); a watch the server ends resumes from its last bookmark, one cut
//! mid-stream from the last version seen, and a DELETED event removes the last route.
//!
//! What this leaves untested: the in-cluster configuration (`KUBERNETES_SERVICE_HOST`
//! with the service account's token and CA under /var/run/secrets, over TLS), which is
//! kube's `Config::incluster`; and everything `fake_api` lists as not covered
//! (authentication, TLS, HTTP/2, protobuf, pagination).

// Some of its helpers serve only cni-nodes' own tests.
#[allow(dead_code)]
#[path = "../../cni-nodes/tests/fake_api/mod.rs"]
mod fake_api;

use std::time::Duration;

use ebpf_cni_tests::{
    cluster::daemon_routes,
    daemon::{Daemon, eventually},
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    traffic::run_in,
};
use fake_api::{FakeApi, node};

const OWN_RANGE: &str = "10.244.171.0/24";
/// How long the daemon may take to apply what the API said.
const APPLIED: Duration = Duration::from_secs(3);
/// Another node, at an address of the uplink's network where nobody answers.
const THIRD_ADDR: &str = "198.18.0.3";

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

    let watch = runtime.block_on(async {
        let list = api.expect_list().await;
        list.reply_list(
            "10",
            &[
                node("node-1", "9", NODE_ADDR, &[OWN_RANGE]),
                node("node-2", "10", EXTERNAL_ADDR, &["10.244.172.0/24"]),
            ],
        );
        api.expect_watch("10").await
    });
    assert!(
        eventually(APPLIED, || routes()
            == route("10.244.172.0/24", EXTERNAL_ADDR)),
        "node 2's range routed via its address: {:?}",
        routes()
    );
    let status = node_1.instance.cli_json(&["status"]);
    assert_eq!(
        status["pod_cidrs"],
        serde_json::json!([OWN_RANGE]),
        "this node's range from its Node object: {status}"
    );

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
