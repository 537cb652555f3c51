//! podman 4.3 with its CNI backend on a simulated node: a container on ebpf-cni's
//! network gets an address from it, reaches the outside and serves a hostPort, and
//! `podman rm -f` leaves nothing on the node.

use std::{collections::BTreeSet, fs, path::Path};

use ebpf_cni_tests::{
    node::{EXTERNAL_ADDR, Node},
    require_root,
    runtimes::{assert_host_port_serves, assert_nothing_left, in_subnet, ping, podman::Podman},
};

const HOST_PORT: u16 = 8080;
const CONTAINER_PORT: u16 = 80;

/// The names in a folder.
fn listing(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The namespaces in /run/netns that are not other tests' own (`ecni-...`).
fn runtime_namespaces() -> BTreeSet<String> {
    listing(Path::new("/run/netns"))
        .into_iter()
        .filter(|name| !name.starts_with(ebpf_cni_tests::PREFIX))
        .collect()
}

#[test]
fn podman_container_gets_an_address_reaches_out_serves_a_host_port_and_leaves_nothing() {
    require_root();
    let subnet = "10.244.85.0/24";
    let node = Node::start(subnet);
    let podman = Podman::new(&node);
    let pins = listing(&node.instance.bpf_dir);
    let namespaces = runtime_namespaces();

    let container = podman
        .try_run(&[(HOST_PORT, CONTAINER_PORT)])
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(
        in_subnet(container.ip, subnet),
        "{} is outside {subnet}",
        container.ip
    );
    assert_eq!(node.host_veths().len(), 1);
    assert_eq!(node.network.allocated(), [container.ip.to_string()]);
    assert!(
        ping(&container.netns, EXTERNAL_ADDR),
        "the container cannot ping the external host"
    );
    assert_host_port_serves(&node, &container.netns, HOST_PORT, CONTAINER_PORT);

    podman.remove(&container.id);
    assert_nothing_left(&node, &[container.netns_path.as_path()]);
    assert_eq!(
        listing(&node.instance.bpf_dir),
        pins,
        "the daemon's pins changed"
    );
    assert_eq!(runtime_namespaces(), namespaces, "namespaces left");
}
