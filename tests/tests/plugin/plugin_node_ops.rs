//! STATUS, GC and many pods at once.

use std::thread;

use ebpf_cni_tests::{
    cni::{Call, veths},
    netns::Netns,
    node::Node,
    require_root,
};
use serde_json::{Value, json};

#[test]
fn status_is_ok_with_the_daemon_and_50_without() {
    require_root();
    let mut node = Node::start("10.244.20.0/24");
    let config = node.network.config("1.1.0");
    assert_eq!(
        Call::bare("STATUS", &config).run(&node.netns).ok(),
        Value::Null
    );
    assert!(node.daemon.stop());
    Call::bare("STATUS", &config).run(&node.netns).error(50);
}

#[test]
fn gc_removes_every_attachment_not_listed_as_valid() {
    require_root();
    let node = Node::start("10.244.21.0/24");
    let config = node.network.config("1.1.0");
    let pods: Vec<Netns> = (0..3).map(|_| node.pod("pod")).collect();
    for (n, pod) in pods.iter().enumerate() {
        Call::new("ADD", &format!("gc-{n}"), "eth0", Some(pod), &config)
            .run(&node.netns)
            .ok();
    }
    assert_eq!(node.network.allocated().len(), 3);

    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] = json!([{ "containerID": "gc-1", "ifname": "eth0" }]);
    assert_eq!(Call::bare("GC", &gc).run(&node.netns).ok(), Value::Null);

    assert_eq!(
        node.network.allocated().len(),
        1,
        "only gc-1 keeps its address"
    );
    assert_eq!(node.host_veths().len(), 1, "only gc-1 keeps its veth");
    assert!(veths(&pods[0]).is_empty() && veths(&pods[2]).is_empty());
    assert_eq!(veths(&pods[1]), vec!["eth0".to_owned()]);
    let endpoints = node.instance.cli_json(&["endpoints"]);
    let ids: Vec<&str> = endpoints
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|e| e["id"]["container_id"].as_str())
        .collect();
    assert_eq!(ids, ["gc-1"]);

    // The older key name works too.
    let mut old = config.clone();
    old["cni.dev/attachments"] = json!([]);
    Call::bare("GC", &old).run(&node.netns).ok();
    assert!(node.network.allocated().is_empty());
    assert!(node.host_veths().is_empty());
}

#[test]
fn gc_finds_host_veths_by_their_alias_when_the_daemon_lost_its_records() {
    require_root();
    let mut node = Node::start("10.244.22.0/24");
    let config = node.network.config("1.1.0");
    let pods: Vec<Netns> = (0..2).map(|_| node.pod("pod")).collect();
    for (n, pod) in pods.iter().enumerate() {
        Call::new("ADD", &format!("lost-{n}"), "eth0", Some(pod), &config)
            .run(&node.netns)
            .ok();
    }
    for veth in node.host_veths() {
        let out = node.netns.ip(&["-j", "-d", "link", "show", "dev", &veth]);
        let link: Value = serde_json::from_str(&out).expect("ip -j prints JSON");
        let alias = link[0]["ifalias"].as_str().unwrap_or_default().to_owned();
        assert!(
            alias.starts_with(&format!("ebpf-cni/{}/lost-", node.network.name)),
            "{veth} carries who it belongs to: {link}"
        );
    }
    // The daemon comes back without its records: only the links know the pods.
    assert!(node.daemon.stop());
    std::fs::remove_dir_all(&node.instance.state_dir).expect("remove the records");
    node.daemon = ebpf_cni_tests::daemon::Daemon::start(&node.netns, &node.instance, &[]);

    let mut gc = config.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    assert_eq!(Call::bare("GC", &gc).run(&node.netns).ok(), Value::Null);
    assert!(node.host_veths().is_empty(), "GC found the veths by alias");
    assert!(node.network.allocated().is_empty());
}

#[test]
fn thirty_parallel_adds_then_thirty_parallel_dels_leave_nothing() {
    require_root();
    const PODS: usize = 30;
    let node = Node::start("10.244.22.0/24");
    let config = node.network.config("1.0.0");
    let pods: Vec<Netns> = (0..PODS).map(|_| node.pod("pod")).collect();

    let results: Vec<Value> = thread::scope(|scope| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(n, pod)| {
                let (node, config) = (&node, &config);
                scope.spawn(move || {
                    Call::new("ADD", &format!("par-{n}"), "eth0", Some(pod), config)
                        .run(&node.netns)
                        .ok()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let mut addresses: Vec<&str> = results
        .iter()
        .map(|r| r["ips"][0]["address"].as_str().expect("address"))
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), PODS, "every pod got its own address");
    assert_eq!(node.host_veths().len(), PODS);
    assert_eq!(
        node.instance
            .cli_json(&["endpoints"])
            .as_array()
            .map(Vec::len),
        Some(PODS)
    );

    thread::scope(|scope| {
        for (n, pod) in pods.iter().enumerate() {
            let (node, config) = (&node, &config);
            scope.spawn(move || {
                Call::new("DEL", &format!("par-{n}"), "eth0", Some(pod), config)
                    .run(&node.netns)
                    .ok()
            });
        }
    });
    assert!(node.host_veths().is_empty(), "no host veth left");
    assert!(
        node.network.allocated().is_empty(),
        "every address released"
    );
    assert_eq!(
        node.instance.cli_json(&["endpoints"]),
        Value::Array(Vec::new())
    );
}
