//! The policy file source: changes written in place and by rename are published within a
//! second; a file gone bad keeps the last good objects; each refused object is logged
//! once, naming the file.

mod support;

use std::path::Path;
use std::time::Duration;

use cni_policy::{FileError, watch_file};
use serde_json::json;
use support::{
    allow, bad_protocol, capture_logs, log_lines, namespace, pod, policy, wait_for, wait_for_log,
};

/// The promise: a change is published within a second.
const WITHIN: Duration = Duration::from_secs(1);

/// How long a test waits for a warning the poller logs.
const LOG_WAIT: Duration = Duration::from_secs(5);

/// A namespace, its pods `(name, address, app)` and a policy letting `a` into `b`, as a
/// YAML stream: a Namespace, then a `PodList`, then the policy, as `kubectl apply` takes
/// them.
fn yaml(pods: &[(&str, &str, &str)]) -> String {
    let mut text = String::from(
        "apiVersion: v1
kind: Namespace
metadata:
  name: x
  labels: {team: x}
---
apiVersion: v1
kind: PodList
items:
",
    );
    for (name, ip, app) in pods {
        text.push_str(&format!(
            "- metadata: {{name: {name}, namespace: x, labels: {{app: {app}}}}}
  spec:
    containers:
    - name: app
      ports: [{{name: http, containerPort: 8080}}]
  status: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}
"
        ));
    }
    text.push_str(
        "---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
",
    );
    text
}

/// The same objects and `more` as a `List` in JSON, as `kubectl get -o json` prints it.
fn json_list(pods: &[(&str, &str, &str)], more: &[serde_json::Value]) -> String {
    let mut items = vec![namespace("x", "1", &["team=x"])];
    for (name, ip, app) in pods {
        items.push(pod("x", name, "2", ip, &[&format!("app={app}")]));
    }
    items.push(policy("x", "allow", "3", allow("a", "b")));
    items.extend(more.iter().cloned());
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items})
        .to_string()
}

/// Writes in place: truncates and rewrites the same inode.
fn write_in_place(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the policy file");
}

/// Writes a new file beside it and renames it over.
fn replace_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the new file");
    std::fs::rename(&tmp, path).expect("rename it over the policy file");
}

#[tokio::test]
async fn writes_in_place_are_published_within_a_second() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.yaml");
    write_in_place(&path, &yaml(&[("a", "10.0.0.1", "a")]));
    let mut rx = watch_file(&path).await.expect("the file reads");
    let first = [
        "namespace x team=x",
        "pod x/a 10.0.0.1 app=a",
        "policy x/allow",
    ];
    wait_for(&mut rx, &first, Duration::ZERO).await;

    write_in_place(
        &path,
        &yaml(&[("a", "10.0.0.1", "a"), ("b", "10.0.0.2", "b")]),
    );
    let two = [
        "namespace x team=x",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=b",
        "policy x/allow",
    ];
    wait_for(&mut rx, &two, WITHIN).await;

    // Same length, written at once: the mtime may not move, the labels do.
    write_in_place(
        &path,
        &yaml(&[("a", "10.0.0.1", "a"), ("b", "10.0.0.2", "c")]),
    );
    let relabelled = [
        "namespace x team=x",
        "pod x/a 10.0.0.1 app=a",
        "pod x/b 10.0.0.2 app=c",
        "policy x/allow",
    ];
    wait_for(&mut rx, &relabelled, WITHIN).await;

    // JSON in the same file.
    write_in_place(&path, &json_list(&[("d", "10.0.0.4", "d")], &[]));
    let json = [
        "namespace x team=x",
        "pod x/d 10.0.0.4 app=d",
        "policy x/allow",
    ];
    wait_for(&mut rx, &json, WITHIN).await;
}

#[tokio::test]
async fn replacements_by_rename_are_published_within_a_second() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.json");
    replace_by_rename(&path, &json_list(&[("a", "10.0.0.1", "a")], &[]));
    let mut rx = watch_file(&path).await.expect("the file reads");
    wait_for(
        &mut rx,
        &[
            "namespace x team=x",
            "pod x/a 10.0.0.1 app=a",
            "policy x/allow",
        ],
        Duration::ZERO,
    )
    .await;

    for step in 2..5u8 {
        let ip = format!("10.0.0.{step}");
        let deny = policy(
            "x",
            &format!("deny-{step}"),
            "4",
            json!({"podSelector": {}}),
        );
        replace_by_rename(&path, &json_list(&[("b", &ip, "b")], &[deny]));
        let pod_line = format!("pod x/b {ip} app=b");
        let deny_line = format!("policy x/deny-{step}");
        wait_for(
            &mut rx,
            &[
                "namespace x team=x",
                &pod_line,
                "policy x/allow",
                &deny_line,
            ],
            WITHIN,
        )
        .await;
    }
}

#[tokio::test]
async fn a_file_gone_bad_or_missing_keeps_the_last_good_objects() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.yaml");
    let shown = format!("policy file {}", path.display());
    write_in_place(&path, &yaml(&[("a", "10.0.0.1", "a")]));
    let mut rx = watch_file(&path).await.expect("the file reads");
    let good = rx.borrow_and_update().clone();

    write_in_place(&path, "kind: List\nitems: [\n");
    wait_for_log(
        &[
            "WARN",
            &shown,
            "not valid YAML",
            "the policy objects stay as last read",
        ],
        LOG_WAIT,
    )
    .await;
    // Polls of the same bad file log nothing more.
    tokio::time::sleep(WITHIN).await;
    assert_eq!(log_lines(&[&shown, "not valid YAML"]).len(), 1);
    assert!(
        !rx.has_changed().expect("the source runs"),
        "a bad file publishes nothing"
    );
    assert_eq!(**rx.borrow(), *good);

    std::fs::remove_file(&path).expect("remove the file");
    wait_for_log(
        &[
            &shown,
            "No such file",
            "the policy objects stay as last read",
        ],
        LOG_WAIT,
    )
    .await;
    assert!(
        !rx.has_changed().expect("the source runs"),
        "a missing file publishes nothing"
    );

    replace_by_rename(&path, &yaml(&[("b", "10.0.0.2", "b")]));
    wait_for(
        &mut rx,
        &[
            "namespace x team=x",
            "pod x/b 10.0.0.2 app=b",
            "policy x/allow",
        ],
        WITHIN,
    )
    .await;
    wait_for_log(&["INFO", &shown, "reads again"], LOG_WAIT).await;
}

#[tokio::test]
async fn each_refused_object_is_logged_once_and_the_rest_taken() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.json");
    let shown = format!("policy file {}", path.display());
    let bad = policy("x", "bad", "5", bad_protocol());
    write_in_place(
        &path,
        &json_list(&[("a", "10.0.0.1", "a")], std::slice::from_ref(&bad)),
    );
    let mut rx = watch_file(&path).await.expect("the file reads");
    let with_bad = [
        "namespace x team=x",
        "pod x/a 10.0.0.1 app=a",
        "policy x/allow",
        "refused NetworkPolicy x/bad",
    ];
    let objects = wait_for(&mut rx, &with_bad, Duration::ZERO).await;
    assert!(
        objects.refused[0]
            .reason
            .contains("spec.ingress[0].ports[0].protocol"),
        "{:?}",
        objects.refused
    );
    let refusal = [
        "WARN",
        shown.as_str(),
        "NetworkPolicy x/bad left out",
        "ICMP",
    ];
    assert_eq!(log_lines(&refusal).len(), 1, "logged at the first read");

    // Rereads of a file that still refuses it, for the same reason, log nothing more.
    for ip in ["10.0.0.2", "10.0.0.3"] {
        replace_by_rename(
            &path,
            &json_list(&[("a", ip, "a")], std::slice::from_ref(&bad)),
        );
        let pod_line = format!("pod x/a {ip} app=a");
        wait_for(
            &mut rx,
            &[
                "namespace x team=x",
                &pod_line,
                "policy x/allow",
                "refused NetworkPolicy x/bad",
            ],
            WITHIN,
        )
        .await;
    }
    assert_eq!(log_lines(&refusal).len(), 1, "not logged again");

    // Another reason is news.
    let worse = policy(
        "x",
        "bad",
        "6",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 0}]}]}),
    );
    replace_by_rename(&path, &json_list(&[("a", "10.0.0.3", "a")], &[worse]));
    wait_for_log(
        &[
            "WARN",
            &shown,
            "NetworkPolicy x/bad left out",
            "0 is not a port",
        ],
        LOG_WAIT,
    )
    .await;

    // Mended, then broken again as first: logged again.
    replace_by_rename(&path, &json_list(&[("a", "10.0.0.3", "a")], &[]));
    wait_for(
        &mut rx,
        &[
            "namespace x team=x",
            "pod x/a 10.0.0.3 app=a",
            "policy x/allow",
        ],
        WITHIN,
    )
    .await;
    replace_by_rename(&path, &json_list(&[("a", "10.0.0.3", "a")], &[bad]));
    wait_for(
        &mut rx,
        &[
            "namespace x team=x",
            "pod x/a 10.0.0.3 app=a",
            "policy x/allow",
            "refused NetworkPolicy x/bad",
        ],
        WITHIN,
    )
    .await;
    assert_eq!(
        log_lines(&refusal).len(),
        2,
        "news again after it was mended"
    );
}

#[tokio::test]
async fn a_missing_or_unreadable_file_at_start_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.yaml");
    match watch_file(&path).await {
        Err(err @ FileError::Read { .. }) => {
            assert!(
                err.to_string().starts_with("policy file ")
                    && err.to_string().contains("policy.yaml"),
                "{err}"
            );
        }
        other => panic!("a missing file gave {other:?}"),
    }
    write_in_place(&path, "kind: List\nitems: [\n");
    match watch_file(&path).await {
        Err(err @ FileError::Parse { .. }) => {
            let shown = format!("policy file {}: not valid YAML", path.display());
            assert!(err.to_string().starts_with(&shown), "{err}");
        }
        other => panic!("a file that does not read gave {other:?}"),
    }
}
