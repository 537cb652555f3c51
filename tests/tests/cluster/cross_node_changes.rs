//! Changes without disruption, with either routing (issue 24, point 4): a daemon
//! SIGKILLed and restarted under a cross-node TCP stream does not interrupt it (its
//! routes, overlay device, programs and maps stay in the kernel), and a node removed
//! from the nodes file loses its route, its `REMOTE_NODES` entry and its place in
//! `ebpf-cnid nodes` within a second, while the others' traffic goes on; a node that
//! moves to another address, then gets another pod range, is followed within a second
//! by the others (routes, tunnel, `ebpf-cnid nodes`) and by itself (its new pods take
//! the new range), pods reach it at each step, and the others' traffic goes on;
//! `ebpf-cnid uninstall` takes the ways to other nodes away (routes, overlay device).

use std::{
    net::{IpAddr, SocketAddr},
    thread,
    time::Duration,
};

use ebpf_cni_tests::{
    cluster::{SEGMENT_PREFIX, TestCluster, daemon_routes, last_peer, node_addr, node_name},
    daemon::{Daemon, eventually},
    require_root,
    traffic::{EchoServer, Stream, round_trip},
};

const PORT: u16 = 9600;

/// Whether `stream` echoes another 64 KiB within 5 s.
fn goes_on(stream: &Stream) -> bool {
    let before = stream.echoed();
    eventually(Duration::from_secs(5), || {
        stream.echoed() > before + 64 * 1024
    })
}

/// Three nodes with `--routing routing`; node 1's daemon killed and restarted under a
/// stream from its pod to node 2's; then node 3 leaves the file.
fn restart_and_removal(routing: &str, ranges: [&str; 3]) {
    let flags = ["--routing", routing];
    let mut cluster = TestCluster::start(&ranges, &flags);
    let a = cluster.node(1).add_pod("changes-a");
    let b = cluster.node(2).add_pod("changes-b");
    let _server = EchoServer::start(&b.netns, PORT);
    let stream = Stream::start(&a.netns, SocketAddr::from((b.ip, PORT)));
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed() > 0),
        "the stream runs"
    );
    let routes = daemon_routes(&cluster.node(1).netns);
    assert_eq!(routes.len(), 2, "{routes:?}");

    let node = &mut cluster.nodes[0];
    node.daemon.kill();
    let before = stream.echoed();
    thread::sleep(Duration::from_millis(300));
    assert!(
        stream.echoed() > before,
        "the stream goes on while no daemon runs"
    );
    let name = node_name(1);
    let [file_flag, path] = cluster.file.flags();
    node.daemon = Daemon::start_with(
        &node.netns,
        &node.instance,
        &[],
        &["--node-name", &name, file_flag, path, flags[0], flags[1]],
    );
    assert!(goes_on(&stream), "the stream goes on after the restart");
    assert_eq!(
        daemon_routes(&cluster.node(1).netns),
        routes,
        "the routes stay as they were"
    );

    let names: Vec<String> = (1..=2).map(node_name).collect();
    let addrs: Vec<String> = (1..=2).map(node_addr).collect();
    cluster.file.replace(&[
        (names[0].as_str(), addrs[0].as_str(), &[ranges[0]]),
        (names[1].as_str(), addrs[1].as_str(), &[ranges[1]]),
    ]);
    assert!(
        eventually(Duration::from_secs(2), || daemon_routes(
            &cluster.node(1).netns
        ) == routes[..1]),
        "only node 2's route is left: {:?}",
        daemon_routes(&cluster.node(1).netns)
    );
    let nodes = cluster.node(1).instance.cli_json(&["nodes"]);
    assert_eq!(
        nodes["nodes"].as_array().map(Vec::len),
        Some(2),
        "node 3 is gone from the list: {nodes}"
    );
    assert!(goes_on(&stream), "node 2's traffic goes on");
    stream.finish().expect("the stream never broke");
}

#[test]
fn native_routing_keeps_a_stream_across_a_restart_and_forgets_a_node_removed() {
    require_root();
    restart_and_removal(
        "native",
        ["10.244.131.0/24", "10.244.132.0/24", "10.244.133.0/24"],
    );
}

#[test]
fn the_overlay_keeps_a_stream_across_a_restart_and_forgets_a_node_removed() {
    require_root();
    restart_and_removal(
        "vxlan",
        ["10.244.141.0/24", "10.244.142.0/24", "10.244.143.0/24"],
    );
}

/// Three nodes with `--routing routing` and a stream from node 1's pod to node 2's;
/// node 3 moves from its address to another on the segment, then from its range
/// `ranges[2]` to `moved_range`.
fn address_and_range_change(routing: &str, ranges: [&str; 3], moved_range: &str) {
    let cluster = TestCluster::start(&ranges, &["--routing", routing]);
    let a = cluster.node(1).add_pod("moves-a");
    let b = cluster.node(2).add_pod("moves-b");
    let c = cluster.node(3).add_pod("moves-c");
    let _server = EchoServer::start(&b.netns, PORT);
    let stream = Stream::start(&a.netns, SocketAddr::from((b.ip, PORT)));
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed() > 0),
        "the stream runs"
    );
    let names: Vec<String> = (1..=3).map(node_name).collect();
    let addrs: Vec<String> = (1..=2).map(node_addr).collect();
    let moved = format!("{SEGMENT_PREFIX}.33");
    let node3 = &cluster.node(3).netns;
    // The new address first, then the old one goes (kept as the primary's successor).
    node3.run(
        "sysctl",
        &["-q", "-w", "net.ipv4.conf.uplink0.promote_secondaries=1"],
    );
    node3.ip(&["addr", "add", &format!("{moved}/24"), "dev", "uplink0"]);
    node3.ip(&[
        "addr",
        "del",
        &format!("{}/24", node_addr(3)),
        "dev",
        "uplink0",
    ]);
    let entries = |third_range: &str| {
        [
            (names[0].clone(), addrs[0].clone(), ranges[0].to_owned()),
            (names[1].clone(), addrs[1].clone(), ranges[1].to_owned()),
            (names[2].clone(), moved.clone(), third_range.to_owned()),
        ]
    };
    let write = |entries: &[(String, String, String); 3]| {
        let ranges: Vec<[&str; 1]> = entries
            .iter()
            .map(|(_, _, range)| [range.as_str()])
            .collect();
        cluster.file.replace(&[
            (entries[0].0.as_str(), entries[0].1.as_str(), &ranges[0]),
            (entries[1].0.as_str(), entries[1].1.as_str(), &ranges[1]),
            (entries[2].0.as_str(), entries[2].1.as_str(), &ranges[2]),
        ]);
    };
    // What node 1 says of node 3: its address and ranges.
    let node3_seen_from_1 = || {
        let nodes = cluster.node(1).instance.cli_json(&["nodes"]);
        nodes["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|node| node["name"] == names[2].as_str()))
            .map(|node| (node["address"].to_string(), node["pod_cidrs"].to_string()))
    };

    write(&entries(ranges[2]));
    let expected = (format!("\"{moved}\""), format!("[\"{}\"]", ranges[2]));
    assert!(
        eventually(Duration::from_secs(2), || node3_seen_from_1().as_ref()
            == Some(&expected)),
        "node 1 follows node 3 to {moved}: {:?}",
        node3_seen_from_1()
    );
    if routing == "native" {
        assert!(
            daemon_routes(&cluster.node(1).netns)
                .contains(&format!("{} via {moved} dev uplink0", ranges[2])),
            "{:?}",
            daemon_routes(&cluster.node(1).netns)
        );
    }
    let server_c = EchoServer::start(&c.netns, PORT + 1);
    let to_c: SocketAddr = (c.ip, PORT + 1).into();
    assert!(
        eventually(Duration::from_secs(5), || round_trip(
            &a.netns, to_c, b"moved"
        )
        .is_ok()),
        "pod a reaches pod c on node 3's new address"
    );
    assert_eq!(last_peer(&server_c.peers()), IpAddr::V4(a.ip));

    write(&entries(moved_range));
    let expected = (format!("\"{moved}\""), format!("[\"{moved_range}\"]"));
    assert!(
        eventually(Duration::from_secs(2), || node3_seen_from_1().as_ref()
            == Some(&expected)),
        "node 1 follows node 3 to {moved_range}: {:?}",
        node3_seen_from_1()
    );
    // Node 3's daemon polls the file on its own clock: node 1 may be first.
    let node3_range = || cluster.node(3).instance.cli_json(&["status"])["pod_cidrs"].to_string();
    assert!(
        eventually(Duration::from_secs(2), || node3_range()
            == format!("[\"{moved_range}\"]")),
        "node 3 reports its new range: {}",
        node3_range()
    );
    let c2 = cluster.node(3).add_pod("moves-c2");
    let prefix = moved_range.trim_end_matches("0/24");
    assert!(
        c2.ip.to_string().starts_with(prefix),
        "usePodCidr: {} in {moved_range}",
        c2.ip
    );
    let server_c2 = EchoServer::start(&c2.netns, PORT + 2);
    assert!(
        eventually(Duration::from_secs(5), || round_trip(
            &a.netns,
            (c2.ip, PORT + 2).into(),
            b"new range"
        )
        .is_ok()),
        "pod a reaches node 3's pod in its new range"
    );
    assert_eq!(last_peer(&server_c2.peers()), IpAddr::V4(a.ip));

    assert!(goes_on(&stream), "node 2's traffic goes on");
    stream.finish().expect("the stream never broke");
}

#[test]
fn native_routing_follows_a_node_to_another_address_and_range() {
    require_root();
    address_and_range_change(
        "native",
        ["10.244.151.0/24", "10.244.152.0/24", "10.244.153.0/24"],
        "10.244.154.0/24",
    );
}

#[test]
fn the_overlay_follows_a_node_to_another_address_and_range() {
    require_root();
    address_and_range_change(
        "vxlan",
        ["10.244.161.0/24", "10.244.162.0/24", "10.244.163.0/24"],
        "10.244.164.0/24",
    );
}

/// Node 1 of a three-node cluster with `--routing routing`, uninstalled: no daemon
/// route, no overlay device, no pin left.
fn uninstall_removes_the_ways_to_other_nodes(routing: &str, ranges: [&str; 3]) {
    let mut cluster = TestCluster::start(&ranges, &["--routing", routing]);
    let node = &mut cluster.nodes[0];
    assert_eq!(daemon_routes(&node.netns).len(), 2);
    let has_overlay = |netns: &ebpf_cni_tests::netns::Netns| {
        netns
            .run("ip", &["link", "show", "ebpf-vxlan"])
            .status
            .success()
    };
    assert_eq!(has_overlay(&node.netns), routing == "vxlan");
    assert!(node.daemon.stop());
    let out = node.instance.cli(&["uninstall"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(daemon_routes(&node.netns), Vec::<String>::new());
    assert!(!has_overlay(&node.netns), "the overlay device is gone");
    assert!(!node.instance.bpf_dir.exists(), "every pin is gone");
}

#[test]
fn uninstall_removes_the_overlay_device_and_the_routes_to_other_nodes() {
    require_root();
    uninstall_removes_the_ways_to_other_nodes(
        "vxlan",
        ["10.244.181.0/24", "10.244.182.0/24", "10.244.183.0/24"],
    );
    uninstall_removes_the_ways_to_other_nodes(
        "native",
        ["10.244.184.0/24", "10.244.185.0/24", "10.244.186.0/24"],
    );
}
