//! The cluster's nodes from `--nodes-file` (issue 24, points 1 and 2): this node's pod
//! ranges reported by `ebpf-cnid status` and filled into a `usePodCidr` IPAM range,
//! every node listed by `ebpf-cnid nodes`, every node's pod ranges kept untranslated by
//! source NAT, and a change of the file (replaced by a rename, or written in place)
//! followed within a second. A file that cannot be read stops the daemon at start.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use ebpf_cni_tests::{
    cluster::NodesFile,
    daemon::{Instance, eventually},
    netns::Netns,
    node::{NODE_ADDR, Node},
    require_root,
    traffic::{EchoServer, round_trip},
};
use serde_json::Value;

const THIS_RANGE: &str = "10.244.101.0/24";
const OTHER_RANGE: &str = "10.244.102.0/24";
const MOVED_RANGE: &str = "10.244.103.0/24";
/// An address outside in the other node's range, and one past it after its move.
const OTHER_POD: &str = "10.244.102.7";
const PORT: u16 = 9300;

/// A node named `node-a` whose network's IPAM range is `usePodCidr`, reading `file`;
/// native routing (the external host playing another node's pod speaks no VXLAN).
fn node_reading(file: &NodesFile) -> Node {
    let [flag, path] = file.flags();
    Node::start_with(
        "usePodCidr",
        &[],
        &["--node-name", "node-a", flag, path, "--routing", "native"],
    )
}

/// Whether `ip` is in [`THIS_RANGE`].
fn in_this_range(ip: Ipv4Addr) -> bool {
    ip.octets()[..3] == [10, 244, 101]
}

fn node_names(node: &Node) -> Vec<String> {
    let nodes = node.instance.cli_json(&["nodes"]);
    nodes["nodes"]
        .as_array()
        .expect("a list of nodes")
        .iter()
        .map(|n| n["name"].as_str().expect("a name").to_owned())
        .collect()
}

fn status(node: &Node) -> Value {
    node.instance.cli_json(&["status"])
}

/// The source address the external host sees for a connection from `pod` to
/// `OTHER_POD`, an address of the external host; `None` when the connection fails.
fn source_seen(pod: &Netns, server: &EchoServer) -> Option<IpAddr> {
    let to: SocketAddr = (OTHER_POD.parse::<Ipv4Addr>().expect("an address"), PORT).into();
    round_trip(pod, to, b"who am I").ok()?;
    Some(server.peers().last().expect("a connection seen").ip())
}

#[test]
fn this_nodes_ranges_fill_use_pod_cidr_and_every_nodes_pods_keep_their_source() {
    require_root();
    let file = NodesFile::new(&[
        ("node-a", NODE_ADDR, &[THIS_RANGE]),
        ("node-b", "198.18.0.2", &[OTHER_RANGE]),
    ]);
    let node = node_reading(&file);

    let status = status(&node);
    assert_eq!(status["node_name"], "node-a", "{status}");
    assert_eq!(
        status["pod_cidrs"],
        serde_json::json!([THIS_RANGE]),
        "{status}"
    );
    assert_eq!(
        status["node_source"],
        format!("file {}", file.path().display()),
        "{status}"
    );
    assert_eq!(node_names(&node), ["node-a", "node-b"]);

    let pod = node.add_pod("cluster-a");
    assert!(
        in_this_range(pod.ip),
        "usePodCidr became this node's range: {}",
        pod.ip
    );

    // The external host plays a pod of node-b: an address in its range (which the
    // node's default route reaches), and the way back to this node's pods.
    node.external
        .ip(&["addr", "add", &format!("{OTHER_POD}/32"), "dev", "eth0"]);
    node.external
        .ip(&["route", "add", THIS_RANGE, "via", NODE_ADDR]);
    let server = EchoServer::start(&node.external, PORT);
    assert_eq!(
        source_seen(&pod.netns, &server),
        Some(IpAddr::V4(pod.ip)),
        "a pod of another node sees this pod's own address"
    );

    // node-b's range moves: the file is replaced (a rename), and within a second the
    // old range is no longer the cluster's: translated like any outside address. A
    // connection open across the change may be reset (its packets leave translated
    // halfway: the old range's pods are gone), so one failing meanwhile is "not yet".
    file.replace(&[
        ("node-a", NODE_ADDR, &[THIS_RANGE]),
        ("node-b", "198.18.0.2", &[MOVED_RANGE]),
    ]);
    let node_addr: IpAddr = NODE_ADDR.parse().expect("an address");
    assert!(
        eventually(Duration::from_secs(2), || source_seen(&pod.netns, &server)
            == Some(node_addr)),
        "after the move, traffic to the old range is translated: {:?}",
        server.peers()
    );
    let nodes = node.instance.cli_json(&["nodes"]);
    assert_eq!(
        nodes["nodes"][1]["pod_cidrs"],
        serde_json::json!([MOVED_RANGE]),
        "{nodes}"
    );
}

#[test]
fn use_pod_cidr_waits_for_this_nodes_range_with_code_11() {
    require_root();
    let file = NodesFile::new(&[("node-b", "198.18.0.2", &[OTHER_RANGE])]);
    let node = node_reading(&file);
    assert_eq!(status(&node)["pod_cidrs"], serde_json::json!([]));
    let (_netns, outcome) = node.try_add("too-early", &Value::Null);
    let error = outcome.error(11);
    assert!(
        error["msg"]
            .as_str()
            .is_some_and(|m| m.contains("pod range")),
        "the error says what is missing: {error}"
    );
    assert!(node.network.allocated().is_empty(), "nothing allocated");

    // Written in place this time, as an editor saving it does.
    file.write_raw(&ebpf_cni_tests::cluster::list_yaml(&[
        ("node-a", NODE_ADDR, &[THIS_RANGE]),
        ("node-b", "198.18.0.2", &[OTHER_RANGE]),
    ]));
    assert!(
        eventually(Duration::from_secs(2), || status(&node)["pod_cidrs"]
            == serde_json::json!([THIS_RANGE])),
        "the node's range arrives within a second: {}",
        status(&node)
    );
    let pod = node.add_pod("in-time");
    assert!(in_this_range(pod.ip), "{}", pod.ip);
}

#[test]
fn a_nodes_file_that_does_not_parse_stops_the_daemon_at_start() {
    require_root();
    let file = NodesFile::new(&[]);
    file.write_raw("kind: NodeList\nitems: [ {");
    let netns = Netns::new("node");
    let instance = Instance::new();
    let out = netns
        .command(ebpf_cni_tests::bins::path("ebpf-cnid"))
        .args(instance.flags())
        .arg("run")
        .args(file.flags())
        .output()
        .expect("runs ebpf-cnid");
    assert!(
        !out.status.success(),
        "the daemon must not start without its nodes"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&file.path().display().to_string()),
        "the error names the file: {stderr}"
    );
    assert!(!instance.socket.exists(), "no socket is left behind");
}
