//! containerd 1.6 as the node's runtime, the test playing kubelet through the CRI:
//! pods get addresses from ebpf-cni, reach each other, the outside and a hostPort;
//! stopping and removing a pod twice succeeds and leaves nothing on the node; pods keep
//! their addresses and traffic across a containerd restart.

use std::time::Duration;

use ebpf_cni_tests::{
    daemon::eventually,
    node::{EXTERNAL_ADDR, Node, socket},
    require_root,
    runtimes::{
        RuntimePod, assert_host_port_serves, assert_nothing_left, containerd::Containerd,
        in_subnet, ping,
    },
    traffic::{EchoServer, Stream},
};

const HOST_PORT: u16 = 8080;
const CONTAINER_PORT: u16 = 80;

/// Both pods are ready with an address of `subnet`, and the daemon maps [`HOST_PORT`]
/// to the second one.
fn assert_pods_ready(node: &Node, containerd: &Containerd, subnet: &str, pods: &[&RuntimePod]) {
    for pod in pods {
        let status = containerd.pod_status(&pod.id).expect("PodSandboxStatus");
        assert!(status.ready, "{} is not ready: {status:?}", pod.id);
        assert_eq!(status.ip, pod.ip.to_string(), "{status:?}");
        assert!(in_subnet(pod.ip, subnet), "{} is outside {subnet}", pod.ip);
    }
    let ports: Vec<u64> = node
        .instance
        .cli_json(&["ports"])
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|row| row["host_port"].as_u64())
        .collect();
    assert_eq!(ports, [u64::from(HOST_PORT)], "the daemon's hostPorts");
}

/// `a` and `b` ping each other and the external host, and the external host reaches a
/// server in `b` through the node's [`HOST_PORT`].
fn assert_traffic(node: &Node, a: &RuntimePod, b: &RuntimePod) {
    for (from, to) in [(a, b), (b, a)] {
        assert!(
            ping(&from.netns, &to.ip.to_string()),
            "{} cannot ping {}",
            from.ip,
            to.ip
        );
    }
    for pod in [a, b] {
        assert!(
            ping(&pod.netns, EXTERNAL_ADDR),
            "{} cannot ping the external host",
            pod.ip
        );
    }
    assert_host_port_serves(node, &b.netns, HOST_PORT, CONTAINER_PORT);
}

/// Stop and remove, each twice (kubelet retries them), then checks the node is clean.
fn remove_pods_twice(node: &Node, containerd: &Containerd, pods: &[&RuntimePod]) {
    for pod in pods {
        containerd.stop_pod(&pod.id);
        containerd.stop_pod(&pod.id);
        containerd.remove_pod(&pod.id);
        containerd.remove_pod(&pod.id);
    }
    assert_eq!(
        containerd.cri().list_pods().expect("ListPodSandbox"),
        Vec::<String>::new(),
        "sandboxes left"
    );
    let netns: Vec<&std::path::Path> = pods.iter().map(|pod| pod.netns_path.as_path()).collect();
    assert_nothing_left(node, &netns);
}

#[test]
fn containerd_pods_reach_each_other_the_outside_and_a_host_port() {
    require_root();
    let subnet = "10.244.80.0/24";
    let node = Node::start(subnet);
    let containerd = Containerd::start(&node);
    let version = containerd.cri().version().expect("Version");
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");

    let plain = containerd.run_pod("plain", &[]);
    let served = containerd.run_pod("served", &[(HOST_PORT, CONTAINER_PORT)]);
    assert_ne!(plain.ip, served.ip);
    assert_pods_ready(&node, &containerd, subnet, &[&plain, &served]);
    assert_traffic(&node, &plain, &served);
}

#[test]
fn containerd_stops_and_removes_pods_twice_and_leaves_nothing_on_the_node() {
    require_root();
    let node = Node::start("10.244.81.0/24");
    let containerd = Containerd::start(&node);
    let plain = containerd.run_pod("plain", &[]);
    let served = containerd.run_pod("served", &[(HOST_PORT, CONTAINER_PORT)]);
    assert_eq!(node.host_veths().len(), 2);
    assert_eq!(node.network.allocated().len(), 2);
    remove_pods_twice(&node, &containerd, &[&plain, &served]);
}

#[test]
fn containerd_restarted_keeps_its_pods_addresses_and_traffic() {
    require_root();
    let subnet = "10.244.82.0/24";
    let node = Node::start(subnet);
    let mut containerd = Containerd::start(&node);
    let plain = containerd.run_pod("plain", &[]);
    let served = containerd.run_pod("served", &[(HOST_PORT, CONTAINER_PORT)]);
    assert_traffic(&node, &plain, &served);

    // A connection between the pods runs through the restart.
    let server = EchoServer::start(&served.netns, CONTAINER_PORT + 1);
    let stream = Stream::start(
        &plain.netns,
        socket(&served.ip.to_string(), CONTAINER_PORT + 1),
    );
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed() > 0),
        "the stream did not start"
    );
    let first = containerd.pid();
    containerd.restart();
    assert_ne!(containerd.pid(), first, "containerd did not restart");
    let before = stream.echoed();
    assert!(
        eventually(Duration::from_secs(5), || stream.echoed() > before),
        "the stream stopped with containerd"
    );
    stream.finish().expect("the stream ran through the restart");
    drop(server);

    assert_pods_ready(&node, &containerd, subnet, &[&plain, &served]);
    assert_traffic(&node, &plain, &served);
    remove_pods_twice(&node, &containerd, &[&plain, &served]);
}
