//! What the plugin takes from others is bounded and checked: an IPAM result with an
//! address no pod may have is refused with nothing left behind; stdin larger than any
//! network configuration is refused; an IPAM plugin that hangs or prints without end is
//! killed. The misbehaving IPAM plugins are shell scripts: the reference host-local does
//! neither, and the bounds exist for the ones that do.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::Path,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    cni::{Call, REFERENCE_PLUGINS},
    node::Node,
    require_root,
};
use serde_json::json;

fn assert_nothing_left(node: &Node) {
    assert!(node.host_veths().is_empty(), "a host veth was left");
    assert!(
        node.network.allocated().is_empty(),
        "an address stayed allocated"
    );
    let endpoints = node.instance.cli_json(&["endpoints"]);
    assert_eq!(endpoints.as_array().map(Vec::len), Some(0), "{endpoints}");
}

#[test]
fn an_ipam_result_no_pod_may_have_is_refused_and_nothing_is_left() {
    require_root();
    let node = Node::start("10.244.95.0/24");
    for (n, subnet) in ["169.254.42.0/24", "127.0.0.0/24", "16.0.0.0/4"]
        .iter()
        .enumerate()
    {
        let netns = node.pod(&format!("bad-{n}"));
        let mut config = node.network.config("1.0.0");
        config["ipam"]["subnet"] = json!(subnet);
        let outcome = Call::new(
            "ADD",
            &format!("bad-ipam-{n}"),
            "eth0",
            Some(&netns),
            &config,
        )
        .run(&node.netns);
        let error = outcome.error(101);
        assert!(
            error["msg"]
                .as_str()
                .is_some_and(|msg| msg.contains("no pod may have")),
            "{subnet}: {error}"
        );
        assert_nothing_left(&node);
    }
}

#[test]
fn stdin_larger_than_any_network_configuration_is_refused_with_code_5() {
    require_root();
    let node = Node::start("10.244.96.0/24");
    let netns = node.pod("big-stdin");
    let mut config = node.network.config("1.0.0");
    config["padding"] = json!("x".repeat(50 << 20));
    let outcome = Call::new("ADD", "big-stdin", "eth0", Some(&netns), &config).run(&node.netns);
    let error = outcome.error(5);
    assert!(
        error["msg"]
            .as_str()
            .is_some_and(|msg| msg.contains("more than")),
        "{error}"
    );
    assert_nothing_left(&node);
}

/// Writes an executable shell script `name` into `dir`.
fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write the script");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn an_ipam_plugin_that_hangs_or_prints_without_end_is_killed() {
    require_root();
    let node = Node::start("10.244.97.0/24");
    // Beside host-local's data, in the node's run folder (removed with it).
    let dir = node.network.data_dir.with_file_name("ipam-scripts");
    fs::create_dir_all(&dir).expect("a plugin folder");
    script(&dir, "hangs", "cat >/dev/null; sleep 30");
    script(&dir, "floods", "cat >/dev/null; yes");
    let cni_path = format!("{}:{REFERENCE_PLUGINS}", dir.display());
    for (plugin, why) in [
        ("hangs", "did not finish within 1 s"),
        ("floods", "printed more than"),
    ] {
        let netns = node.pod(plugin);
        let mut config = node.network.config("1.0.0");
        config["ipam"] = json!({"type": plugin});
        config["ipamTimeout"] = json!(1);
        let started = Instant::now();
        let outcome = Call::new("ADD", plugin, "eth0", Some(&netns), &config)
            .var("CNI_PATH", &cni_path)
            .run(&node.netns);
        let error = outcome.error(101);
        assert!(
            error["msg"].as_str().is_some_and(|msg| msg.contains(why)),
            "{plugin}: {error}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{plugin}: took {:?}",
            started.elapsed()
        );
        assert!(
            node.host_veths().is_empty(),
            "{plugin}: a host veth was left"
        );
    }
    fs::remove_dir_all(&dir).expect("remove the plugin folder");
}
