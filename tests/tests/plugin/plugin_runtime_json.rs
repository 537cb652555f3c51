//! The real `ebpf-cni` fed what the runtimes in the field send: containerd's port
//! mappings in Go field names (`HostPort`...) work end to end, and a DEL whose
//! `runtimeConfig` or `CNI_ARGS` cannot be read still removes everything and exits 0, so
//! a runtime can always remove the sandbox.

use ebpf_cni_tests::{
    cni::Call,
    node::{NODE_ADDR, Node, socket},
    require_root,
    traffic::{EchoServer, round_trip},
};
use serde_json::{Value, json};

const CONTAINER_PORT: u16 = 8080;

/// `runtimeConfig` as containerd 1.6/1.7 builds it (go-cni's `PortMapping` has no JSON
/// tags).
fn containerd_runtime_config(host_port: u16) -> Value {
    json!({"portMappings": [
        {"HostPort": host_port, "ContainerPort": CONTAINER_PORT, "Protocol": "tcp", "HostIP": ""}
    ]})
}

fn listed(node: &Node, what: &str) -> usize {
    node.instance
        .cli_json(&[what])
        .as_array()
        .map_or(0, Vec::len)
}

#[test]
fn containerd_port_mappings_in_go_field_names_map_a_host_port_and_del_removes_it() {
    require_root();
    let node = Node::start("10.244.70.0/24");
    let pod = node.add_pod_with("go-names", &containerd_runtime_config(30090));
    let _server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let back = round_trip(&node.external, socket(NODE_ADDR, 30090), b"HostPort").expect("TCP");
    assert_eq!(back, b"HostPort");
    assert_eq!(listed(&node, "ports"), 1);

    let mut config = node.network.config("1.0.0");
    config["runtimeConfig"] = containerd_runtime_config(30090);
    for round in ["first", "repeated"] {
        let del =
            Call::new("DEL", &pod.container_id, "eth0", Some(&pod.netns), &config).run(&node.netns);
        assert!(del.success, "{round} DEL: {del:?}");
    }
    assert_eq!(listed(&node, "ports"), 0, "the mapping is gone");
    assert!(round_trip(&node.external, socket(NODE_ADDR, 30090), b"x").is_err());
}

#[test]
fn del_with_unreadable_runtime_config_and_cni_args_cleans_up_and_exits_0() {
    require_root();
    let node = Node::start("10.244.71.0/24");
    let pod = node.add_pod_with("bad-del", &containerd_runtime_config(30091));
    assert_eq!(node.host_veths().len(), 1);
    assert_eq!(node.network.allocated(), [pod.ip.to_string()]);

    let mut config = node.network.config("1.0.0");
    config["runtimeConfig"] = json!({"portMappings": [{"HostPort": "eighty"}], "mac": 7});
    config["mtu"] = json!("large");
    let del = Call::new("DEL", &pod.container_id, "eth0", Some(&pod.netns), &config)
        .var("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME")
        .run(&node.netns);
    assert!(del.success, "DEL must clean up and succeed: {del:?}");
    assert!(del.stdout.trim().is_empty(), "DEL prints nothing: {del:?}");
    assert!(
        del.stderr.contains("ignored") && del.stderr.contains("runtimeConfig"),
        "what was set aside is logged: {del:?}"
    );
    assert!(node.host_veths().is_empty(), "the host veth is gone");
    assert!(node.network.allocated().is_empty(), "the address is freed");
    assert_eq!(listed(&node, "endpoints"), 0);
    assert_eq!(listed(&node, "ports"), 0);

    // ADD, which acts on runtimeConfig, still refuses it with code 7.
    let netns = node.pod("bad-add");
    let refused = Call::new("ADD", "bad-add", "eth0", Some(&netns), &config).run(&node.netns);
    refused.error(7);
    assert!(node.host_veths().is_empty() && node.network.allocated().is_empty());
}
