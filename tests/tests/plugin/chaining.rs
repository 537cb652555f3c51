//! ebpf-cni first in a conflist, followed by Debian's reference plugins (1.1.1): `tuning`
//! (a sysctl inside the pod), `bandwidth` (for users who keep it: its `tbf` on the host
//! veth, found in our result as the interface without `sandbox`) and `sbr`, which reads
//! `prevResult` strictly (the pod's interface with `sandbox`, the IPs pointing at it)
//! and moves the pod's routes into a table of their own. ADD, CHECK and DEL through the
//! chain as libcni runs it, at every version the chain speaks (the reference plugins
//! stop at 1.0.0).

use ebpf_cni_tests::{
    chain::Conflist,
    cni::first_ip,
    netns::Netns,
    node::Node,
    require_root,
    traffic::iperf::{self, Length},
};
use serde_json::{Value, json};

/// What Debian's 1.1.1 plugins and ours both speak.
const CHAIN_VERSIONS: [&str; 4] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// The reference bandwidth plugin's ingress limit (what the pod receives).
const INGRESS_RATE: u64 = 20_000_000;

fn conflist(node: &Node, version: &str) -> Conflist {
    let mut ours = node.network.config(version);
    let section = ours.as_object_mut().expect("an object");
    section.remove("name");
    section.remove("cniVersion");
    Conflist {
        name: node.network.name.clone(),
        cni_version: version.to_owned(),
        plugins: vec![
            ours,
            json!({"type": "tuning", "sysctl": {"net.core.somaxconn": "512"}}),
            json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            json!({"type": "sbr"}),
        ],
    }
}

fn runtime() -> Value {
    json!({"bandwidth": {"ingressRate": INGRESS_RATE, "ingressBurst": INGRESS_RATE / 8}})
}

fn sysctl(netns: &Netns, key: &str) -> String {
    let out = netns.run("sysctl", &["-n", key]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn the_chain_adds_checks_and_deletes_at_every_version_it_speaks() {
    require_root();
    let node = Node::start("10.244.70.0/24");
    let peer = node.add_pod("chain-peer");
    for (n, version) in CHAIN_VERSIONS.into_iter().enumerate() {
        let chain = conflist(&node, version);
        let pod = Netns::new("chained");
        let container = format!("chained-{n}");
        let attachment = (container.as_str(), "eth0", &pod);
        let result = chain
            .add(attachment, &runtime(), &node.netns)
            .unwrap_or_else(|failed| panic!("{version}: ADD failed: {failed:?}"));
        let ip = first_ip(&result);

        // tuning wrote its sysctl inside the pod; sbr moved the routes to a table
        // looked up for the pod's address; bandwidth put its tbf on the host veth.
        assert_eq!(sysctl(&pod, "net.core.somaxconn"), "512", "{version}");
        let rules = pod.ip(&["rule", "show"]);
        assert!(
            rules.contains(&format!("from {ip} lookup 100")),
            "{version}: {rules}"
        );
        let veth = node
            .instance
            .cli_json(&["endpoints"])
            .as_array()
            .expect("a list")
            .iter()
            .find(|endpoint| endpoint["id"]["container_id"] == container.as_str())
            .and_then(|endpoint| endpoint["host_veth"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("{version}: the daemon has no endpoint"));
        let qdiscs = node
            .netns
            .run("tc", &["qdisc", "show", "dev", &veth, "root"]);
        let qdiscs = String::from_utf8_lossy(&qdiscs.stdout);
        assert!(qdiscs.contains("tbf"), "{version}: {qdiscs}");

        // The pod still reaches another pod and its gateway from its address, the
        // traffic sbr routes (its table holds all the interface's routes now).
        let gateway = result["ips"][0]["gateway"].as_str().expect("a gateway");
        for to in [peer.ip.to_string().as_str(), gateway] {
            let ping = pod.run("ping", &["-c", "1", "-W", "2", "-I", &ip.to_string(), to]);
            assert!(
                ping.status.success(),
                "{version}: ping from {ip} to {to} failed"
            );
        }

        if version != "0.3.0" && version != "0.3.1" {
            chain
                .check(attachment, &runtime(), &result, &node.netns)
                .unwrap_or_else(|failed| panic!("{version}: CHECK failed: {failed:?}"));
        }
        chain
            .del(attachment, &runtime(), &result, &node.netns)
            .unwrap_or_else(|failed| panic!("{version}: DEL failed: {failed:?}"));
        assert!(
            !node.host_veths().contains(&veth),
            "{version}: DEL left {veth}"
        );
        assert!(
            !node.network.allocated().contains(&ip.to_string()),
            "{version}: DEL left {ip} allocated"
        );
    }
}

#[test]
fn the_reference_bandwidth_plugin_after_ours_limits_what_the_pod_receives() {
    require_root();
    let node = Node::start("10.244.71.0/24");
    let peer = node.add_pod("chain-bw-peer");
    let chain = conflist(&node, "1.0.0");
    let pod = Netns::new("chainedbw");
    let attachment = ("chained-bw", "eth0", &pod);
    let result = chain
        .add(attachment, &runtime(), &node.netns)
        .unwrap_or_else(|failed| panic!("ADD failed: {failed:?}"));
    let ip = first_ip(&result);
    // What the datapath hands the pod goes through the reference plugin's tbf, which it
    // put on the host veth after our ADD (the daemon follows the veth's root qdisc).
    let received = iperf::stream(&peer.netns, &pod, ip, Length::Seconds(3), &[])
        .expect("a stream")
        .received_bps;
    println!(
        "{:.1} Mbit/s under the bandwidth plugin's {} Mbit/s",
        received / 1e6,
        INGRESS_RATE / 1_000_000
    );
    assert!(
        (0.85..=1.15).contains(&(received / INGRESS_RATE as f64)),
        "{:.1} Mbit/s under a {} Mbit/s limit",
        received / 1e6,
        INGRESS_RATE / 1_000_000
    );
    chain
        .del(attachment, &runtime(), &result, &node.netns)
        .unwrap_or_else(|failed| panic!("DEL failed: {failed:?}"));
}

#[test]
fn the_reference_bandwidth_plugins_egress_limit_fails_add_and_the_chain_cleans_up() {
    require_root();
    let node = Node::start("10.244.72.0/24");
    let chain = conflist(&node, "1.0.0");
    let pod = Netns::new("chainedeg");
    let attachment = ("chained-egress", "eth0", &pod);
    let runtime =
        json!({"bandwidth": {"egressRate": INGRESS_RATE, "egressBurst": INGRESS_RATE / 8}});
    // Its `ingress` qdisc cannot join the host veth's `clsact` (see docs/configuration.md: declare
    // `bandwidth` on ebpf-cni for egress limits).
    let failed = chain
        .add(attachment, &runtime, &node.netns)
        .expect_err("the reference egress limit cannot be chained after ebpf-cni");
    assert_eq!(failed.plugin, "bandwidth", "{failed:?}");
    assert!(
        failed.outcome.stdout.contains("ingress qdisc"),
        "{failed:?}"
    );
    // The runtime then deletes the attachment through the whole chain.
    chain
        .del(attachment, &runtime, &Value::Null, &node.netns)
        .unwrap_or_else(|failed| panic!("DEL failed: {failed:?}"));
    assert!(node.host_veths().is_empty(), "DEL left a host veth");
    assert!(node.network.allocated().is_empty(), "DEL left an address");
    let links = node.netns.ip(&["-o", "link", "show"]);
    assert!(
        !links.contains("bwp"),
        "DEL left the bandwidth plugin's ifb: {links}"
    );
}
