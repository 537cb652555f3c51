//! A cluster of Kubernetes' tested size (5,000 nodes) and past what the tables hold:
//! two real nodes on one segment and the rest in the nodes file only. With 5,000 nodes,
//! every table holds every node, ADD works, a pod reaches a pod of the other real node
//! through the overlay, and `ebpf-cnid nodes` lists them all; the daemon's memory is
//! printed. With more ranges than the tables hold, the ranges left out are counted in
//! `/metrics` and logged, and ADD, the routes and the real pods' traffic still work.

use std::{net::Ipv4Addr, time::Duration};

use ebpf_cni_tests::{
    cluster::{NodeEntry, TestCluster, node_addr, node_name},
    daemon::eventually,
    http,
    node::Node,
    require_root,
    traffic::{UdpEcho, udp_round_trip},
};

const RANGES: [&str; 2] = ["10.244.201.0/24", "10.244.202.0/24"];
const PORT: u16 = 9600;
/// How long a daemon may take to apply a whole cluster (a debug build, routes one by
/// one over netlink).
const APPLY: Duration = Duration::from_secs(120);

/// The two real nodes and `fakes` more, each fake with `ranges_each` pod ranges that no
/// two of which are adjacent (none collapses into another), at addresses no host has.
fn cluster_entries(fakes: u32, ranges_each: u32) -> Vec<(String, String, Vec<String>)> {
    let mut entries: Vec<(String, String, Vec<String>)> = (1..=2)
        .map(|n| (node_name(n), node_addr(n), vec![RANGES[n - 1].to_owned()]))
        .collect();
    for n in 0..fakes {
        let [_, _, high, low] = n.to_be_bytes();
        let ranges = (0..ranges_each)
            .map(|r| {
                // The first half of a /24 of 10.128.0.0/9 (11.128.0.0/9 for a second
                // range): no two are adjacent.
                format!("{}.{}.{}.0/25", 10 + r, 128 + u32::from(high), low)
            })
            .collect();
        let address = Ipv4Addr::new(100, 64 + high, low, 1);
        entries.push((format!("fake-{n:05}"), address.to_string(), ranges));
    }
    entries
}

fn write(cluster: &TestCluster, entries: &[(String, String, Vec<String>)]) {
    let ranges: Vec<Vec<&str>> = entries
        .iter()
        .map(|(_, _, ranges)| ranges.iter().map(String::as_str).collect())
        .collect();
    let list: Vec<NodeEntry<'_>> = entries
        .iter()
        .zip(&ranges)
        .map(|((name, address, _), ranges)| (name.as_str(), address.as_str(), &ranges[..]))
        .collect();
    cluster.file.replace(&list);
}

fn listed(node: &Node) -> usize {
    node.instance.cli_json(&["nodes"])["nodes"]
        .as_array()
        .map_or(0, Vec::len)
}

/// The daemon's resident memory in KiB.
fn rss_kib(node: &Node) -> u64 {
    let pid = node.daemon.pid().expect("the daemon runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS")
}

/// `ebpf_cni_map_left_out` for `table`, 0 when absent.
fn left_out(node: &Node, table: &str) -> f64 {
    http::scrape(&node.netns)
        .value("ebpf_cni_map_left_out", &[("table", table)])
        .unwrap_or(0.0)
}

/// Pods on the two real nodes reach each other, and a new pod can be added.
fn real_pods_talk(cluster: &TestCluster, tag: &str) {
    let a = cluster.node(1).add_pod(&format!("{tag}-a"));
    let b = cluster.node(2).add_pod(&format!("{tag}-b"));
    let _echo = UdpEcho::start(&b.netns, PORT);
    udp_round_trip(&a.netns, 0, (b.ip, PORT).into(), b"across a big cluster")
        .expect("a pod reaches a pod of the other node");
}

#[test]
fn five_thousand_nodes_fit_every_table() {
    require_root();
    let cluster = TestCluster::start(&RANGES, &[]);
    let before = rss_kib(cluster.node(1));
    write(&cluster, &cluster_entries(4998, 1));
    for n in 1..=2 {
        assert!(
            eventually(APPLY, || listed(cluster.node(n)) == 5000),
            "node {n} lists the 5,000 nodes"
        );
    }
    // Every range routed (the two real nodes' own aside).
    assert!(
        eventually(APPLY, || {
            let routes = cluster
                .node(1)
                .netns
                .ip(&["-4", "route", "show", "dev", "ebpf-vxlan"]);
            routes.lines().count() >= 4999
        }),
        "node 1 routes every other node's range through the overlay"
    );
    for table in ["CLUSTER_CIDRS", "REMOTE_NODES", "CLUSTER_NODES"] {
        assert_eq!(
            left_out(cluster.node(1), table),
            0.0,
            "{table} holds them all"
        );
    }
    real_pods_talk(&cluster, "scale");
    let after = rss_kib(cluster.node(1));
    println!(
        "ebpf-cnid resident memory: {before} KiB with 2 nodes, {after} KiB with 5,000 \
         (debug build)"
    );
    assert!(after < 256 * 1024, "the daemon stays small: {after} KiB");
}

#[test]
fn past_what_the_tables_hold_one_thing_degrades_and_is_counted() {
    require_root();
    let cluster = TestCluster::start(&RANGES, &[]);
    // 8,300 nodes of two ranges each: 16,600 ranges, past the 16,384 the tables hold.
    write(&cluster, &cluster_entries(8298, 2));
    let node = cluster.node(1);
    assert!(
        eventually(APPLY, || left_out(node, "REMOTE_NODES") > 0.0),
        "REMOTE_NODES's ranges left out are counted"
    );
    assert!(left_out(node, "CLUSTER_CIDRS") > 0.0, "and CLUSTER_CIDRS's");
    assert!(
        node.instance.log().contains("REMOTE_NODES is full"),
        "and logged"
    );
    // The routes still follow the nodes, and ADD and the real pods' traffic work.
    assert!(
        eventually(APPLY, || {
            let routes = node.netns.ip(&["-4", "route", "show", "dev", "ebpf-vxlan"]);
            routes.lines().count() >= 16_000
        }),
        "the routes are all there"
    );
    real_pods_talk(&cluster, "full");
}
