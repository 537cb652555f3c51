//! The nodes file source: changes written in place, by rename and by a ConfigMap-style
//! symlink swap are published within a second; a file gone bad keeps the last good set.

mod support;

use std::path::Path;
use std::time::Duration;

use cni_nodes::{FileError, NodeSet, watch_file};
use support::{capture_logs, set, wait_for, wait_for_log};

/// The promise: a change is published within a second.
const WITHIN: Duration = Duration::from_secs(1);

/// How long a test waits for a warning the poller logs.
const LOG_WAIT: Duration = Duration::from_secs(5);

/// A `kubectl get nodes -o yaml` list of `(name, address, pod CIDR)`.
fn list_yaml(nodes: &[(&str, &str, &str)]) -> String {
    let mut doc =
        String::from("apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n");
    for (name, address, cidr) in nodes {
        doc.push_str(&format!(
            "- apiVersion: v1
  kind: Node
  metadata:
    name: {name}
  spec:
    podCIDR: {cidr}
    podCIDRs:
    - {cidr}
  status:
    addresses:
    - address: {address}
      type: InternalIP
    - address: {name}
      type: Hostname
"
        ));
    }
    doc
}

/// The same as a `NodeList` in JSON.
fn list_json(nodes: &[(&str, &str, &str)]) -> String {
    let items: Vec<_> = nodes
        .iter()
        .map(|(name, address, cidr)| {
            serde_json::json!({
                "metadata": {"name": name},
                "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
                "status": {"addresses": [{"type": "InternalIP", "address": address}]},
            })
        })
        .collect();
    serde_json::json!({"kind": "NodeList", "apiVersion": "v1", "items": items}).to_string()
}

fn expected(nodes: &[(&str, &str, &str)]) -> NodeSet {
    let owned: Vec<(&str, &str, [&str; 1])> =
        nodes.iter().map(|(n, a, c)| (*n, *a, [*c])).collect();
    let refs: Vec<(&str, &str, &[&str])> = owned.iter().map(|(n, a, c)| (*n, *a, &c[..])).collect();
    set(&refs)
}

/// Writes in place: truncates and rewrites the same inode.
fn write_in_place(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the nodes file");
}

/// Writes a new file beside it and renames it over, as editors and `kubectl ... > tmp &&
/// mv` do.
fn replace_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the new file");
    std::fs::rename(&tmp, path).expect("rename it over the nodes file");
}

#[tokio::test]
async fn writes_in_place_are_published_within_a_second() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nodes.yaml");
    let one = [("n1", "192.0.2.1", "10.244.1.0/24")];
    write_in_place(&path, &list_yaml(&one));
    let mut rx = watch_file(&path).await.expect("the file reads");
    assert_eq!(*rx.borrow_and_update(), expected(&one));

    let two = [
        ("n1", "192.0.2.1", "10.244.1.0/24"),
        ("n2", "192.0.2.2", "10.244.2.0/24"),
    ];
    write_in_place(&path, &list_yaml(&two));
    wait_for(&mut rx, &expected(&two), WITHIN).await;

    // Same length, written at once: the mtime may not move, the content does.
    let same_length = [
        ("n1", "192.0.2.1", "10.244.1.0/24"),
        ("n2", "192.0.2.2", "10.244.3.0/24"),
    ];
    write_in_place(&path, &list_yaml(&same_length));
    wait_for(&mut rx, &expected(&same_length), WITHIN).await;

    // JSON in the same file.
    let json = [("n3", "192.0.2.3", "10.244.4.0/24")];
    write_in_place(&path, &list_json(&json));
    wait_for(&mut rx, &expected(&json), WITHIN).await;
}

#[tokio::test]
async fn replacements_by_rename_are_published_within_a_second() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nodes.json");
    let one = [("r1", "192.0.2.1", "10.244.1.0/24")];
    replace_by_rename(&path, &list_json(&one));
    let mut rx = watch_file(&path).await.expect("the file reads");
    assert_eq!(*rx.borrow_and_update(), expected(&one));

    for step in 2..5u8 {
        let nodes = [
            ("r1", "192.0.2.1", "10.244.1.0/24"),
            ("r2", "192.0.2.2", &format!("10.244.{step}.0/24")),
        ];
        replace_by_rename(&path, &list_json(&nodes));
        wait_for(&mut rx, &expected(&nodes), WITHIN).await;
    }
}

#[tokio::test]
async fn a_configmap_volume_update_is_published_within_a_second() {
    // A ConfigMap volume: nodes.yaml -> ..data/nodes.yaml, ..data -> a timestamped folder
    // that the kubelet swaps by renaming a new `..data` symlink over the old one.
    let dir = tempfile::tempdir().expect("temp dir");
    let mount = dir.path();
    let version = |name: &str, text: &str| {
        let folder = mount.join(name);
        std::fs::create_dir(&folder).expect("version folder");
        std::fs::write(folder.join("nodes.yaml"), text).expect("version file");
        let link = mount.join("..data_tmp");
        std::os::unix::fs::symlink(name, &link).expect("new ..data link");
        std::fs::rename(&link, mount.join("..data")).expect("swap ..data");
    };
    let one = [("c1", "192.0.2.1", "10.244.1.0/24")];
    version("..2026_11_03_10_00_00.1", &list_yaml(&one));
    std::os::unix::fs::symlink("..data/nodes.yaml", mount.join("nodes.yaml")).expect("file link");
    let mut rx = watch_file(mount.join("nodes.yaml"))
        .await
        .expect("the file reads");
    assert_eq!(*rx.borrow_and_update(), expected(&one));

    let two = [("c2", "192.0.2.2", "10.244.2.0/24")];
    version("..2026_11_03_10_01_00.2", &list_yaml(&two));
    wait_for(&mut rx, &expected(&two), WITHIN).await;
}

#[tokio::test]
async fn a_file_gone_bad_or_missing_keeps_the_last_good_set() {
    capture_logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nodes.yaml");
    let shown = path.display().to_string();
    let good = [("g1", "192.0.2.1", "10.244.1.0/24")];
    write_in_place(&path, &list_yaml(&good));
    let mut rx = watch_file(&path).await.expect("the file reads");
    rx.borrow_and_update();

    write_in_place(&path, "kind: List\nitems: [\n");
    wait_for_log(
        &[&shown, "not valid YAML", "the nodes stay as last read"],
        LOG_WAIT,
    )
    .await;
    assert!(
        !rx.has_changed().expect("the source runs"),
        "a bad file publishes nothing"
    );
    assert_eq!(*rx.borrow(), expected(&good));

    std::fs::remove_file(&path).expect("remove the file");
    wait_for_log(
        &[&shown, "No such file", "the nodes stay as last read"],
        LOG_WAIT,
    )
    .await;
    assert!(
        !rx.has_changed().expect("the source runs"),
        "a missing file publishes nothing"
    );

    let back = [("g2", "192.0.2.2", "10.244.2.0/24")];
    replace_by_rename(&path, &list_yaml(&back));
    wait_for(&mut rx, &expected(&back), WITHIN).await;
}

#[tokio::test]
async fn a_missing_or_unparsable_file_at_start_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nodes.yaml");
    match watch_file(&path).await {
        Err(FileError::Read { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("a missing file gave {other:?}"),
    }
    write_in_place(&path, "kind: Pod\n");
    match watch_file(&path).await {
        Err(err @ FileError::Parse { .. }) => {
            assert!(
                err.to_string().contains("nodes.yaml"),
                "the error names the file: {err}"
            );
        }
        other => panic!("a file that is not a node list gave {other:?}"),
    }
}
