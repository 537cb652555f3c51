//! Node objects are input: a node list whose pod ranges cover link-local (cloud
//! metadata), the Service range, the node's own uplink network, or whose addresses are
//! this node's or a pod's, diverts none of this node's traffic. Each refusal is listed by
//! `ebpf-cnid nodes` with its reason, counted in `/metrics` and logged once; the honest
//! node's range is routed. With `--cluster-cidr`, ranges outside it are refused too.

use std::time::Duration;

use ebpf_cni_tests::{
    cluster::{NodeEntry, NodesFile},
    daemon::eventually,
    http,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
};
use serde_json::Value;

const THIS_RANGE: &str = "10.244.104.0/24";
const HONEST_RANGE: &str = "10.244.105.0/24";

/// A node named `node-a` reading `file`, native routing (routes show where each range
/// would go), with `flags`.
fn node_reading(file: &NodesFile, flags: &[&str]) -> Node {
    let [flag, path] = file.flags();
    let mut all = vec!["--node-name", "node-a", flag, path, "--routing", "native"];
    all.extend(flags);
    Node::start_with(THIS_RANGE, &[], &all)
}

/// (node, refused item) pairs `ebpf-cnid nodes` lists, once the daemon has read `count`
/// nodes.
fn refused(node: &Node, count: usize) -> Vec<(String, String, String)> {
    let mut view = Value::Null;
    assert!(
        eventually(Duration::from_secs(10), || {
            view = node.instance.cli_json(&["nodes"]);
            view["nodes"].as_array().map_or(0, Vec::len) == count
        }),
        "the daemon reads the {count} nodes: {view}"
    );
    view["refused"]
        .as_array()
        .unwrap_or_else(|| panic!("a list of refusals: {view}"))
        .iter()
        .map(|refusal| {
            let text = |key: &str| refusal[key].as_str().expect("a string").to_owned();
            (text("node"), text("item"), text("reason"))
        })
        .collect()
}

fn routes(node: &Node) -> String {
    node.netns.ip(&["-4", "route", "show"])
}

#[test]
fn hostile_node_objects_divert_nothing_and_are_refused_with_their_reason() {
    require_root();
    let nodes: [NodeEntry<'_>; 7] = [
        ("node-a", NODE_ADDR, &[THIS_RANGE]),
        ("honest", EXTERNAL_ADDR, &[HONEST_RANGE]),
        ("metadata", "198.18.0.3", &["169.254.169.0/24"]),
        ("services", "198.18.0.4", &["10.96.0.0/24"]),
        ("uplink", "198.18.0.5", &["198.18.0.0/24"]),
        ("impostor", NODE_ADDR, &["10.244.106.0/24"]),
        ("podlike", "10.244.105.9", &["10.244.107.0/24"]),
    ];
    let file = NodesFile::new(&nodes);
    let node = node_reading(&file, &["--service-cidr", "10.96.0.0/12"]);
    let found = refused(&node, nodes.len());
    let items: Vec<(&str, &str)> = found
        .iter()
        .map(|(node, item, _)| (node.as_str(), item.as_str()))
        .collect();
    assert_eq!(
        items,
        [
            ("impostor", NODE_ADDR),
            ("metadata", "169.254.169.0/24"),
            ("podlike", "10.244.105.9"),
            ("services", "10.96.0.0/24"),
            ("uplink", "198.18.0.0/24"),
        ],
        "{found:?}"
    );
    let reason_of = |who: &str| {
        found
            .iter()
            .find(|(node, _, _)| node == who)
            .map(|(_, _, reason)| reason.clone())
            .expect("a refusal")
    };
    assert!(reason_of("metadata").contains("link-local"));
    assert!(reason_of("services").contains("Service range"));
    assert!(reason_of("uplink").contains("an address of this node"));
    assert!(reason_of("impostor").contains("address of this node"));
    assert!(reason_of("podlike").contains("pods' ranges"));

    // Only the honest node's range is routed, and none of the others.
    let table = routes(&node);
    assert!(
        table.contains(&format!("{HONEST_RANGE} via {EXTERNAL_ADDR}")),
        "{table}"
    );
    for range in ["169.254.169.0", "10.96.0.0", "10.244.106.0", "10.244.107.0"] {
        assert!(!table.contains(range), "{range} routed: {table}");
    }
    let metrics = http::scrape(&node.netns);
    assert_eq!(
        metrics.value("ebpf_cni_node_refusals", &[("reason", "range_reserved")]),
        Some(2.0),
        "link-local and the Service range"
    );
    assert_eq!(
        metrics.value(
            "ebpf_cni_node_refusals",
            &[("reason", "range_covers_node_address")]
        ),
        Some(1.0)
    );
    let log = node.instance.log();
    assert!(log.contains("no --cluster-cidr"), "said at start");

    // Another node joins: the refusals stand, logged once all the same.
    let mut more = nodes.to_vec();
    more.push(("late", "198.18.0.9", &["10.244.108.0/24"]));
    file.replace(&more);
    assert_eq!(refused(&node, more.len()).len(), found.len());
    let log = node.instance.log();
    assert_eq!(
        log.matches("refused = 169.254.169.0/24").count()
            + log.matches("refused=169.254.169.0/24").count(),
        1,
        "one warning for the metadata range: {log}"
    );
}

#[test]
fn with_cluster_cidrs_only_ranges_inside_them_are_taken() {
    require_root();
    let nodes: [NodeEntry<'_>; 3] = [
        ("node-a", NODE_ADDR, &[THIS_RANGE]),
        ("honest", EXTERNAL_ADDR, &[HONEST_RANGE]),
        ("outside", "198.18.0.3", &["10.99.0.0/24"]),
    ];
    let file = NodesFile::new(&nodes);
    let node = node_reading(&file, &["--cluster-cidr", "10.244.0.0/16"]);
    let found = refused(&node, nodes.len());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].0.as_str(), found[0].1.as_str()),
        ("outside", "10.99.0.0/24")
    );
    assert!(found[0].2.contains("--cluster-cidr"));
    let table = routes(&node);
    assert!(
        table.contains(HONEST_RANGE) && !table.contains("10.99.0.0"),
        "{table}"
    );
    assert!(!node.instance.log().contains("no --cluster-cidr"));
}
