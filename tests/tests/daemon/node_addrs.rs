//! `NODE_ADDRS` with thousands of node addresses (issue 23, point 11): kube-proxy in IPVS
//! mode puts every ClusterIP on the node. A daemon restarted with more addresses than
//! the map holds starts, holds 16,384 addresses (the uplink's first), says it left the
//! rest out, and source NAT still follows the uplink's address when a refill overflows.

use std::{io::Write, time::Duration};

use cni_ebpf_common::{NODE_ADDRS_MAX, map_names};
use ebpf_cni_tests::{
    daemon::{Daemon, eventually},
    node::{NODE_ADDR, Node},
    require_root,
    snat::nat_table,
};

/// More /32 addresses than the map holds, as IPVS's ClusterIPs on the node.
const CLUSTER_IPS: u32 = NODE_ADDRS_MAX + 500;

#[test]
fn thousands_of_node_addresses_neither_stop_the_daemon_nor_the_uplink_following() {
    require_root();
    let mut node = Node::start("10.244.95.0/24");
    assert!(node.daemon.stop(), "the daemon stops cleanly");

    // More ClusterIPs than the map holds.
    let mut batch = tempfile();
    for n in 0..CLUSTER_IPS {
        let [_, _, high, low] = n.to_be_bytes();
        writeln!(batch.1, "addr add 10.96.{high}.{low}/32 dev lo").expect("write");
    }
    batch.1.flush().expect("flush");
    node.netns
        .ip(&["-batch", batch.0.to_str().expect("a UTF-8 path")]);
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);

    assert_eq!(node.pinned_layout(map_names::NODE_ADDRS).1, NODE_ADDRS_MAX);
    let status = node.instance.cli_json(&["status"]);
    let addrs = status["host_port_addrs"].as_array().expect("a list");
    assert_eq!(addrs.len(), NODE_ADDRS_MAX as usize, "the map is full");
    assert!(
        addrs.iter().any(|addr| addr == NODE_ADDR),
        "the uplink's address goes first"
    );
    assert!(
        node.instance
            .log()
            .contains("more node addresses than NODE_ADDRS holds"),
        "{}",
        node.instance.log()
    );

    // The uplink's address changes: NAT follows it through every (overflowing) refill.
    node.netns
        .ip(&["addr", "del", &format!("{NODE_ADDR}/24"), "dev", "uplink0"]);
    assert!(
        eventually(Duration::from_secs(20), || nat_table(&node)["node_addr"]
            .is_null()),
        "NAT sees the uplink's address go: {}",
        nat_table(&node)
    );
    node.netns
        .ip(&["addr", "add", "198.18.0.9/24", "dev", "uplink0"]);
    assert!(
        eventually(Duration::from_secs(20), || nat_table(&node)["node_addr"]
            == "198.18.0.9"),
        "NAT follows the uplink's new address: {}",
        nat_table(&node)
    );
    let _ = std::fs::remove_file(&batch.0);
}

/// A file of the `ip -batch` commands, removed by the test.
fn tempfile() -> (std::path::PathBuf, std::fs::File) {
    let path = std::env::temp_dir().join(format!("{}.batch", ebpf_cni_tests::unique_name("ips")));
    let file = std::fs::File::create(&path).expect("create the batch file");
    (path, file)
}
