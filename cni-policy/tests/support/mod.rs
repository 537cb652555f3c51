//! What cni-policy's tests share: Kubernetes objects as the API server serves them, the
//! published objects in a few words each, waiting on a receiver with a deadline, and
//! (from cni-nodes' tests) reading what the crate logged.

#![allow(dead_code, reason = "each test binary uses a part of it")]

use std::sync::Arc;
use std::time::Duration;

use cni_policy::Objects;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

#[path = "../../../cni-nodes/tests/support/mod.rs"]
mod nodes_support;

#[allow(unused_imports, reason = "each test binary uses a part of it")]
pub use nodes_support::{capture_logs, log_lines, wait_for_log};

/// A Namespace with `labels` (`key=value`), and the name label Kubernetes gives each.
pub fn namespace(name: &str, resource_version: &str, labels: &[&str]) -> Value {
    let mut all = labels_of(labels);
    all["kubernetes.io/metadata.name"] = json!(name);
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": uid(name),
            "resourceVersion": resource_version,
            "creationTimestamp": "2026-11-02T09:14:27Z",
            "labels": all,
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// A running Pod of one container serving a port named `http`, with `labels`.
pub fn pod(
    namespace: &str,
    name: &str,
    resource_version: &str,
    ip: &str,
    labels: &[&str],
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid(&format!("{namespace}/{name}")),
            "resourceVersion": resource_version,
            "creationTimestamp": "2026-11-02T09:20:00Z",
            "labels": labels_of(labels),
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": format!("{name}-rs"),
                "uid": uid(name),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "nodeName": "worker-1",
            "serviceAccountName": "default",
            "containers": [{
                "name": "app",
                "image": "registry.example/app:1.2.3",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }],
        },
        "status": {
            "phase": "Running",
            "hostIP": "192.0.2.11",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": "2026-11-02T09:20:01Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-02T09:20:05Z"}],
        },
    })
}

/// A NetworkPolicy of `spec`.
pub fn policy(namespace: &str, name: &str, resource_version: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid(&format!("policy {namespace}/{name}")),
            "resourceVersion": resource_version,
            "generation": 1,
            "creationTimestamp": "2026-11-02T09:30:00Z",
        },
        "spec": spec,
    })
}

/// A policy letting pods labelled `app: from` into those labelled `app: to` on TCP 8080.
pub fn allow(from: &str, to: &str) -> Value {
    json!({
        "podSelector": {"matchLabels": {"app": to}},
        "policyTypes": ["Ingress"],
        "ingress": [{
            "from": [{"podSelector": {"matchLabels": {"app": from}}}],
            "ports": [{"protocol": "TCP", "port": 8080}],
        }],
    })
}

/// A policy the API server would refuse: ICMP is no protocol of a NetworkPolicy.
pub fn bad_protocol() -> Value {
    json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]})
}

fn labels_of(labels: &[&str]) -> Value {
    let mut all = serde_json::Map::new();
    for label in labels {
        let (key, value) = label.split_once('=').expect("key=value");
        all.insert(key.to_owned(), json!(value));
    }
    Value::Object(all)
}

fn uid(of: &str) -> String {
    let hash = of
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    format!("00000000-0000-4000-8000-{:012x}", hash & 0xffff_ffff_ffff)
}

/// The objects in a few words each, sorted: `namespace x team=x`, `pod x/a 10.0.0.1
/// app=a`, `policy x/allow`, `refused NetworkPolicy x/bad`.
pub fn summary(objects: &Objects) -> Vec<String> {
    let labels = |labels: &cni_policy::Labels| -> String {
        labels
            .iter()
            .filter(|(key, _)| *key != "kubernetes.io/metadata.name")
            .map(|(key, value)| format!(" {key}={value}"))
            .collect()
    };
    let mut lines = Vec::new();
    for (name, namespace_labels) in &objects.namespaces {
        lines.push(format!("namespace {name}{}", labels(namespace_labels)));
    }
    for pod in &objects.pods {
        let addrs: String = pod.addrs.iter().map(|a| format!(" {a}")).collect();
        lines.push(format!(
            "pod {}/{}{addrs}{}",
            pod.namespace,
            pod.name,
            labels(&pod.labels)
        ));
    }
    for policy in &objects.policies {
        lines.push(format!("policy {}/{}", policy.namespace, policy.name));
    }
    for refused in &objects.refused {
        lines.push(format!("refused {}", refused.object));
    }
    lines.sort();
    lines
}

/// Waits until the receiver holds objects whose [`summary`] is `expected`, failing after
/// `within`; returns them.
pub async fn wait_for(
    rx: &mut watch::Receiver<Arc<Objects>>,
    expected: &[&str],
    within: Duration,
) -> Arc<Objects> {
    let deadline = Instant::now() + within;
    loop {
        let objects = rx.borrow_and_update().clone();
        if summary(&objects) == expected {
            return objects;
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("the source stopped before publishing {expected:#?}"),
            Err(_) => panic!(
                "not published within {within:?}: expected {expected:#?}, the receiver holds {:#?}",
                summary(&rx.borrow())
            ),
        }
    }
}
