//! `ebpf-cni` ADD / CHECK / DEL as a runtime drives it, for every cniVersion, against a
//! real daemon and Debian's host-local.

use ebpf_cni_tests::{
    cni::{Call, VERSIONS, veths},
    netns::Netns,
    node::Node,
    require_root,
};
use serde_json::Value;

fn pod_addresses(pod: &Netns, ifname: &str) -> Vec<String> {
    let out = pod.ip(&["-j", "-4", "addr", "show", "dev", ifname]);
    let links: Value = serde_json::from_str(&out).expect("ip -j prints JSON");
    links[0]["addr_info"]
        .as_array()
        .map(|addrs| {
            addrs
                .iter()
                .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or(""), a["prefixlen"]))
                .collect()
        })
        .unwrap_or_default()
}

fn default_route(pod: &Netns) -> Option<(String, String)> {
    let out = pod.ip(&["-j", "-4", "route", "show", "default"]);
    let routes: Value = serde_json::from_str(&out).expect("ip -j prints JSON");
    let route = routes.as_array()?.first()?;
    Some((
        route["gateway"].as_str()?.to_owned(),
        route["dev"].as_str()?.to_owned(),
    ))
}

#[test]
fn add_check_del_work_for_every_cni_version() {
    require_root();
    let node = Node::start("10.244.1.0/24");
    for (n, version) in VERSIONS.iter().enumerate() {
        let pod = node.pod("pod");
        let container = format!("lifecycle-{n}");
        let config = node.network.config(version);

        let result = Call::new("ADD", &container, "eth0", Some(&pod), &config)
            .run(&node.netns)
            .ok();
        assert_eq!(result["cniVersion"], *version, "{result}");

        // The result's shape for this version.
        let interfaces = result["interfaces"].as_array().expect("interfaces");
        assert_eq!(interfaces.len(), 2, "{result}");
        let host_veth = interfaces[0]["name"].as_str().expect("host name");
        assert!(
            interfaces[0].get("sandbox").is_none(),
            "host side has no sandbox: {result}"
        );
        assert_eq!(interfaces[1]["name"], "eth0");
        assert_eq!(interfaces[1]["sandbox"], pod.path().display().to_string());
        let ip = &result["ips"][0];
        assert_eq!(ip["interface"], 1, "{result}");
        assert_eq!(ip["gateway"], "10.244.1.1", "{result}");
        if version.starts_with("0.") {
            assert_eq!(ip["version"], "4", "ips[].version up to 0.4.0: {result}");
        } else {
            assert!(
                ip.get("version").is_none(),
                "no ips[].version from 1.0.0: {result}"
            );
        }
        let address = ip["address"].as_str().expect("address").to_owned();
        assert!(
            address.starts_with("10.244.1.") && address.ends_with("/24"),
            "{result}"
        );

        // The pod and the node really look like that.
        assert_eq!(pod_addresses(&pod, "eth0"), vec![address.clone()]);
        assert_eq!(
            default_route(&pod),
            Some(("10.244.1.1".to_owned(), "eth0".to_owned()))
        );
        assert!(
            node.host_veths().contains(&host_veth.to_owned()),
            "host veth in the node"
        );
        let mtu = pod.ip(&["-j", "link", "show", "eth0"]);
        assert!(mtu.contains("\"mtu\":1450"), "MTU from the config: {mtu}");
        let endpoints = node.instance.cli_json(&["endpoints"]);
        assert!(
            endpoints
                .as_array()
                .expect("list")
                .iter()
                .any(|e| e["id"]["container_id"] == container.as_str()),
            "the daemon recorded the endpoint: {endpoints}"
        );

        let mut with_prev = config.clone();
        with_prev["prevResult"] = result.clone();
        if *version != "0.3.0" && *version != "0.3.1" {
            Call::new("CHECK", &container, "eth0", Some(&pod), &with_prev)
                .run(&node.netns)
                .ok();
        }

        // DEL twice: the second finds nothing and still succeeds.
        for _ in 0..2 {
            Call::new("DEL", &container, "eth0", Some(&pod), &with_prev)
                .run(&node.netns)
                .ok();
        }
        assert!(
            !node.host_veths().contains(&host_veth.to_owned()),
            "host veth removed"
        );
        assert!(veths(&pod).is_empty(), "pod interface removed");
        assert!(node.network.allocated().is_empty(), "address released");
        assert_eq!(
            node.instance.cli_json(&["endpoints"]),
            Value::Array(Vec::new())
        );
    }
}

#[test]
fn check_fails_when_the_container_interface_was_deleted_by_hand() {
    require_root();
    let node = Node::start("10.244.2.0/24");
    let pod = node.pod("pod");
    let config = node.network.config("1.1.0");
    let result = Call::new("ADD", "hand-deleted", "eth0", Some(&pod), &config)
        .run(&node.netns)
        .ok();
    let mut with_prev = config.clone();
    with_prev["prevResult"] = result;
    Call::new("CHECK", "hand-deleted", "eth0", Some(&pod), &with_prev)
        .run(&node.netns)
        .ok();

    pod.ip(&["link", "del", "eth0"]);
    let error = Call::new("CHECK", "hand-deleted", "eth0", Some(&pod), &with_prev)
        .run(&node.netns)
        .error(106);
    assert!(
        error["msg"].as_str().unwrap_or("").contains("eth0"),
        "{error}"
    );

    Call::new("DEL", "hand-deleted", "eth0", Some(&pod), &with_prev)
        .run(&node.netns)
        .ok();
    assert!(node.network.allocated().is_empty());
}

#[test]
fn del_of_a_container_never_added_succeeds() {
    require_root();
    let node = Node::start("10.244.3.0/24");
    let pod = node.pod("pod");
    let out = Call::new(
        "DEL",
        "never-added",
        "eth0",
        Some(&pod),
        &node.network.config("1.0.0"),
    )
    .run(&node.netns);
    assert_eq!(out.ok(), Value::Null, "DEL prints nothing on success");
}

#[test]
fn del_after_the_netns_was_deleted_frees_the_address_and_the_veth() {
    require_root();
    let node = Node::start("10.244.4.0/24");
    let config = node.network.config("1.0.0");
    let pod = node.pod("pod");
    let pod_path = pod.path().display().to_string();
    Call::new("ADD", "netns-gone", "eth0", Some(&pod), &config)
        .run(&node.netns)
        .ok();
    assert_eq!(node.network.allocated().len(), 1);
    drop(pod);

    Call::new("DEL", "netns-gone", "eth0", None, &config)
        .var("CNI_NETNS", &pod_path)
        .run(&node.netns)
        .ok();
    assert!(node.network.allocated().is_empty(), "the IP is freed");
    assert!(node.host_veths().is_empty(), "no host veth is left");
    assert_eq!(
        node.instance.cli_json(&["endpoints"]),
        Value::Array(Vec::new())
    );
}

#[test]
fn add_with_the_daemon_stopped_fails_with_code_11_and_leaves_nothing() {
    require_root();
    let mut node = Node::start("10.244.5.0/24");
    assert!(node.daemon.stop());
    let pod = node.pod("pod");
    let config = node.network.config("1.1.0");
    let error = Call::new("ADD", "daemon-down", "eth0", Some(&pod), &config)
        .run(&node.netns)
        .error(11);
    assert_eq!(error["cniVersion"], "1.1.0");
    assert!(node.host_veths().is_empty(), "no host veth");
    assert!(veths(&pod).is_empty(), "no pod interface");
    assert!(node.network.allocated().is_empty(), "no address allocated");
}

#[test]
fn del_with_the_daemon_stopped_still_frees_the_address_and_the_veth() {
    require_root();
    let mut node = Node::start("10.244.6.0/24");
    let pod = node.pod("pod");
    let config = node.network.config("1.1.0");
    Call::new("ADD", "daemon-down-del", "eth0", Some(&pod), &config)
        .run(&node.netns)
        .ok();
    assert!(node.daemon.stop());
    Call::new("DEL", "daemon-down-del", "eth0", Some(&pod), &config)
        .run(&node.netns)
        .ok();
    assert!(node.network.allocated().is_empty(), "the IP is freed");
    assert!(node.host_veths().is_empty(), "the veth is gone");

    // The restarted daemon drops the record whose veth is gone.
    node.daemon = ebpf_cni_tests::daemon::Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(
        node.instance.cli_json(&["endpoints"]),
        Value::Array(Vec::new())
    );
}
