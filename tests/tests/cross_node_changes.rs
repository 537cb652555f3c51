//! Changes without disruption, with either routing (issue 24, point 4): a daemon
//! SIGKILLed and restarted under a cross-node TCP stream does not interrupt it (its
//! routes, overlay device, programs and maps stay in the kernel), and a node removed
//! from the nodes file loses its route, its `REMOTE_NODES` entry and its place in
//! `ebpf-cnid nodes` within a second, while the others' traffic goes on.

use std::{net::SocketAddr, thread, time::Duration};

use ebpf_cni_tests::{
    cluster::{TestCluster, daemon_routes, node_addr, node_name},
    daemon::{Daemon, eventually},
    require_root,
    traffic::{EchoServer, Stream},
};

const PORT: u16 = 9600;

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
    let restarted = stream.echoed();
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed()
            > restarted + 64 * 1024),
        "the stream goes on after the restart"
    );
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
    let during = stream.echoed();
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed()
            > during + 64 * 1024),
        "node 2's traffic goes on"
    );
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
