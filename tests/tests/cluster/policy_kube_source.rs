//! NetworkPolicy from the Kubernetes API (issue 44), against the fake API server that
//! speaks the real list and watch wire format: a daemon with `--kubeconfig` and no
//! policy file lists and watches Namespaces, Pods and NetworkPolicies beside the Nodes.
//! A policy in the first list isolates the pods of its namespace from their first
//! packet, though their Pod objects have not arrived; a pod's label changed by a
//! MODIFIED event lets it through a rule selecting that label; a DELETED policy opens
//! the way again.

use std::time::Duration;

use ebpf_cni_tests::{
    daemon::{Daemon, eventually},
    netpol::{ModelPod, Protocol, add_pod, reaches},
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    traffic::run_in,
};
use serde_json::{Value, json};

use crate::fake_api::{FakeApi, NAMESPACES, NETWORK_POLICIES, PODS, WatchStream, node};

/// How long the daemon may take to apply what the API said.
const APPLIED: Duration = Duration::from_secs(5);

fn namespace(name: &str, version: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "resourceVersion": version,
                     "labels": {"kubernetes.io/metadata.name": name}},
    })
}

fn pod(namespace: &str, name: &str, label: &str, version: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "resourceVersion": version,
                     "labels": {"pod": label}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    })
}

/// In `x`, pods labelled `pod: a` take TCP from pods labelled `pod: b` of `x` only.
fn allow_b_to_a(version: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "x", "name": "allow-b-to-a", "resourceVersion": version},
        "spec": {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        },
    })
}

/// Whether `from` reaches `to` on TCP 80, within [`APPLIED`].
fn comes_to(from: &ModelPod, to: &ModelPod, reached: bool) -> bool {
    eventually(APPLIED, || {
        reaches(&from.pod.netns, to.addr(80), Protocol::Tcp)
            .join()
            .unwrap_or(false)
            == reached
    })
}

#[test]
fn policies_pods_and_namespaces_from_the_kubernetes_api_are_enforced_and_followed() {
    require_root();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut node_1 = Node::start("10.244.180.0/24");
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
    let (pods, policies): (WatchStream, WatchStream) = runtime.block_on(async {
        api.expect_list().await.reply_list(
            "10",
            &[node("node-1", "9", NODE_ADDR, &["10.244.180.0/24"])],
        );
        let nodes = api.expect_watch("10").await;
        api.expect_list_of(NAMESPACES)
            .await
            .reply_list("20", &[namespace("x", "19")]);
        let namespaces = api.expect_watch_of(NAMESPACES, "20").await;
        // No Pod objects yet: this node's pods are known by their ADD alone.
        api.expect_list_of(PODS).await.reply_list("30", &[]);
        let pods = api.expect_watch_of(PODS, "30").await;
        api.expect_list_of(NETWORK_POLICIES)
            .await
            .reply_list("40", &[allow_b_to_a("39")]);
        let policies = api.expect_watch_of(NETWORK_POLICIES, "40").await;
        drop((nodes, namespaces));
        (pods, policies)
    });
    let x_a = add_pod(&node_1, "x", "a");
    let x_b = add_pod(&node_1, "x", "b");
    // x/a has no Pod object yet, hence no label: the policy does not select it.
    assert!(
        comes_to(&x_b, &x_a, true),
        "x/b reaches x/a, selected by nothing yet"
    );

    pods.event("ADDED", pod("x", "a", "a", "41"));
    pods.event("ADDED", pod("x", "b", "c", "42"));
    assert!(
        comes_to(&x_b, &x_a, false),
        "x/a, labelled a, takes nothing from x/b, labelled c"
    );
    assert!(comes_to(&x_a, &x_b, true), "x/b is not isolated");

    pods.event("MODIFIED", pod("x", "b", "b", "43"));
    assert!(
        comes_to(&x_b, &x_a, true),
        "x/b, now labelled b, reaches x/a"
    );

    pods.event("MODIFIED", pod("x", "b", "c", "44"));
    assert!(comes_to(&x_b, &x_a, false), "labelled c again, it does not");

    policies.event("DELETED", allow_b_to_a("45"));
    assert!(
        comes_to(&x_b, &x_a, true),
        "the policy deleted, x/a is open"
    );
}
