//! Every bad input gives the right CNI error code, an error JSON on stdout, and leaves
//! no veth and no allocated address behind.

use ebpf_cni_tests::{
    cni::{Call, veths},
    node::Node,
    require_root,
};
use serde_json::{Value, json};

#[test]
fn each_bad_input_gives_its_code_and_leaves_nothing() {
    require_root();
    let node = Node::start("10.244.10.0/24");
    let pod = node.pod("pod");
    let good = node.network.config("1.0.0");
    let add = || Call::new("ADD", "bad-input", "eth0", Some(&pod), &good);
    let with = |key: &str, value: Value| {
        let mut config = good.clone();
        config[key] = value;
        config
    };
    let without = |key: &str| {
        let mut config = good.clone();
        config.as_object_mut().expect("object").remove(key);
        config
    };
    let mut bad_subnet = good.clone();
    bad_subnet["ipam"]["subnet"] = json!("10.244.10.0/33");
    let mut host_port = good.clone();
    host_port["runtimeConfig"] = json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "fd00::1"}]});
    let mut rate_without_burst = good.clone();
    rate_without_burst["runtimeConfig"] = json!({"bandwidth": {"ingressRate": 1000000}});
    let mut burst_below_mtu = good.clone();
    burst_below_mtu["egressRate"] = json!(1000000);
    burst_below_mtu["egressBurst"] = json!(8000);
    let mut unknown_ipam = good.clone();
    unknown_ipam["ipam"]["type"] = json!("no-such-ipam");

    let cases: Vec<(&str, Call, u64)> = vec![
        (
            "malformed JSON",
            add().stdin(b"{\"cniVersion\": \"1.0.0\","),
            6,
        ),
        (
            "missing cniVersion",
            add().stdin(&bytes(&without("cniVersion"))),
            7,
        ),
        ("missing name", add().stdin(&bytes(&without("name"))), 7),
        ("missing type", add().stdin(&bytes(&without("type"))), 7),
        ("missing ipam", add().stdin(&bytes(&without("ipam"))), 7),
        (
            "unknown version",
            add().stdin(&bytes(&with("cniVersion", json!("9.9.9")))),
            1,
        ),
        ("missing CNI_COMMAND", add().without("CNI_COMMAND"), 4),
        ("unknown CNI_COMMAND", add().var("CNI_COMMAND", "FROB"), 4),
        (
            "missing CNI_CONTAINERID",
            add().without("CNI_CONTAINERID"),
            4,
        ),
        (
            "invalid CNI_CONTAINERID",
            add().var("CNI_CONTAINERID", "-bad/id"),
            4,
        ),
        ("missing CNI_NETNS", add().without("CNI_NETNS"), 4),
        ("missing CNI_IFNAME", add().without("CNI_IFNAME"), 4),
        (
            "ifname too long",
            add().var("CNI_IFNAME", "abcdefghijklmnop"),
            4,
        ),
        ("missing CNI_PATH", add().without("CNI_PATH"), 4),
        (
            "nonexistent netns",
            add().var("CNI_NETNS", "/run/netns/ecni-does-not-exist"),
            3,
        ),
        ("unknown IPAM type", add().stdin(&bytes(&unknown_ipam)), 101),
        ("invalid subnet", add().stdin(&bytes(&bad_subnet)), 101),
        (
            "hostPort (not implemented yet)",
            add().stdin(&bytes(&host_port)),
            2,
        ),
        (
            "bandwidth rate without a burst",
            add().stdin(&bytes(&rate_without_burst)),
            7,
        ),
        (
            "bandwidth burst below one packet",
            add().stdin(&bytes(&burst_below_mtu)),
            7,
        ),
    ];
    for (what, call, code) in cases {
        let out = call.run(&node.netns);
        assert!(!out.success, "{what}: must fail: {out:?}");
        let error = out.json();
        assert_eq!(error["code"], code, "{what}: {error}");
        assert!(
            error["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {error}"
        );
        assert!(node.host_veths().is_empty(), "{what}: a host veth was left");
        assert!(veths(&pod).is_empty(), "{what}: a pod interface was left");
        // The pod program is attached while IPAM runs: a failure takes it away too.
        let pins = std::fs::read_dir(node.instance.bpf_dir.join("links"))
            .map(|pins| {
                pins.filter_map(Result::ok)
                    .filter(|pin| pin.file_name().to_string_lossy().starts_with("veb"))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(pins, 0, "{what}: a pod program's link was left pinned");
        assert!(
            node.network.allocated().is_empty(),
            "{what}: an address was left allocated"
        );
    }
}

#[test]
fn add_refuses_an_ifname_that_already_exists_in_the_pod_and_changes_nothing() {
    require_root();
    let node = Node::start("10.244.11.0/24");
    let pod = node.pod("pod");
    pod.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let error = Call::new(
        "ADD",
        "exists",
        "eth0",
        Some(&pod),
        &node.network.config("1.1.0"),
    )
    .run(&node.netns)
    .error(103);
    assert!(
        error["msg"].as_str().unwrap_or("").contains("eth0"),
        "{error}"
    );
    assert!(node.host_veths().is_empty());
    assert!(node.network.allocated().is_empty());
}

#[test]
fn version_echoes_the_requested_version_and_lists_every_supported_one() {
    require_root();
    let node = Node::start("10.244.12.0/24");
    for version in ["0.3.0", "0.4.0", "1.1.0"] {
        let reply = Call::bare("VERSION", &json!({ "cniVersion": version }))
            .run(&node.netns)
            .ok();
        assert_eq!(reply["cniVersion"], version);
        assert_eq!(
            reply["supportedVersions"],
            json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
    }
}

#[test]
fn gc_and_status_are_refused_below_1_1_0() {
    require_root();
    let node = Node::start("10.244.13.0/24");
    for command in ["GC", "STATUS"] {
        Call::bare(command, &node.network.config("1.0.0"))
            .run(&node.netns)
            .error(1);
    }
}

fn bytes(config: &Value) -> Vec<u8> {
    serde_json::to_vec(config).expect("encodes")
}
