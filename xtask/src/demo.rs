//! `cargo xtask demo`: a simulated node in network namespaces, pods added by the real
//! plugin, their traffic forwarded by the eBPF datapath, and what the datapath saw; then
//! two nodes whose pods talk through the overlay.
//! Everything it creates is removed at the end, also on failure.

use std::{net::SocketAddr, path::Path, process::Output};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{
    cluster::TestCluster,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    traffic::{EchoServer, round_trip},
};

use crate::{
    build::{self, Profile},
    setup,
};

const SUBNET: &str = "10.244.1.0/24";
const PORT: u16 = 8080;

pub fn run(root: &Path) -> anyhow::Result<()> {
    let tools = setup::full()?;
    build::all(root, &tools, Profile::Dev)?;
    ebpf_cni_tests::sweep_stale();

    say("1. A simulated node: a network namespace with an uplink to an external host,");
    say(&format!(
        "   node {NODE_ADDR} <-> external {EXTERNAL_ADDR}; ebpf-cnid runs inside the node"
    ));
    let mut node = Node::start_with_counters(SUBNET, &["uplink0"]);
    show(&node.instance.cli(&["status"]))?;

    say("2. Two pods, added by the real plugin (ebpf-cni ADD, host-local IPAM from Debian)");
    let a = node.add_pod("demo-pod-a");
    let b = node.add_pod("demo-pod-b");
    say(&format!("   pod a: {} in {}", a.ip, a.netns.name()));
    say(&format!("   pod b: {} in {}", b.ip, b.netns.name()));

    say("\n3. IP forwarding is OFF in the node: pod-to-pod traffic never uses the node's stack");
    node.netns
        .run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=0"]);
    for (from, name, to) in [(&a, "a", b.ip.to_string()), (&b, "b", a.ip.to_string())] {
        ping(&from.netns, &format!("pod {name}"), &to)?;
    }
    let _server = EchoServer::start(&b.netns, PORT);
    let to: SocketAddr = format!("{}:{PORT}", b.ip).parse()?;
    let payload = b"hello from pod a over TCP";
    let echoed = round_trip(&a.netns, to, payload).map_err(anyhow::Error::msg)?;
    ensure!(echoed == payload, "the TCP echo differs");
    say(&format!(
        "   pod a -> {to} TCP: {} bytes echoed back",
        echoed.len()
    ));

    say(
        "\n4. The node and its pods reach each other (/32 route on the pod's veth, ARP answered in eBPF)",
    );
    ping(&a.netns, "pod a", NODE_ADDR)?;
    ping(&node.netns, "node", &a.ip.to_string())?;
    ping(&node.external, "external", NODE_ADDR)?;

    say("\n5. Pods reach the external host through source NAT in eBPF (it has no route to pods)");
    node.netns
        .run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"]);
    let outside = EchoServer::start(&node.external, PORT);
    for (pod, name) in [(&a, "a"), (&b, "b")] {
        let to: SocketAddr = format!("{EXTERNAL_ADDR}:{PORT}").parse()?;
        round_trip(&pod.netns, to, b"hello outside").map_err(anyhow::Error::msg)?;
        ping(&pod.netns, &format!("pod {name}"), EXTERNAL_ADDR)?;
    }
    // Larger than the MTU: only the first fragment carries the echo identifier.
    ping_with(
        &a.netns,
        "pod a, 3,000-byte pings in fragments,",
        EXTERNAL_ADDR,
        &["-s", "3000", "-M", "dont"],
    )?;
    let seen: Vec<String> = outside.peers().iter().map(ToString::to_string).collect();
    say(&format!(
        "   the external host saw TCP from: {}",
        seen.join(", ")
    ));
    show(&node.instance.cli(&["nat"]))?;

    say("6. hostPort in eBPF: pod c maps node port 30080 to its port 8080; no iptables rule");
    let c = node.add_pod_with(
        "demo-pod-c",
        &serde_json::json!({ "portMappings": [
            { "hostPort": 30080, "containerPort": PORT, "protocol": "tcp" }
        ]}),
    );
    let in_c = EchoServer::start(&c.netns, PORT);
    let host_port: SocketAddr = format!("{NODE_ADDR}:30080").parse()?;
    round_trip(&node.external, host_port, b"from outside").map_err(anyhow::Error::msg)?;
    round_trip(&a.netns, host_port, b"from pod a").map_err(anyhow::Error::msg)?;
    round_trip(&c.netns, host_port, b"from pod c itself").map_err(anyhow::Error::msg)?;
    let probe = ebpf_cni_tests::bins::path("ecni-probe");
    ebpf_cni_tests::traffic::probe(
        &node.netns,
        &node.instance.cgroup,
        &probe,
        &["tcp", "127.0.0.1:30080", "from the node"],
    )
    .map_err(anyhow::Error::msg)?;
    let seen: Vec<String> = in_c
        .peers()
        .iter()
        .map(|peer| peer.ip().to_string())
        .collect();
    say(&format!(
        "   {host_port} from the external host, pod a, pod c itself (hairpin) and the node (127.0.0.1:30080)"
    ));
    say(&format!("   pod c saw them come from: {}", seen.join(", ")));
    show(&node.instance.cli(&["ports"]))?;

    say("7. What the datapath knows and counted (ebpf-cnid endpoints, status, counters)");
    show(&node.instance.cli(&["endpoints"]))?;
    show(&node.instance.cli(&["status"]))?;
    show(&node.instance.cli(&["counters"]))?;

    say("8. The daemon is killed (SIGKILL): pods keep talking: the programs live on in the kernel");
    node.daemon.kill();
    ping(&a.netns, "pod a", &b.ip.to_string())?;

    say("\n9. Clean up: DEL the pods, then remove the daemon's pins and every namespace");
    node.daemon = ebpf_cni_tests::daemon::Daemon::start(&node.netns, &node.instance, &["uplink0"]);
    node.del_pod(&a);
    node.del_pod(&b);
    node.del_pod(&c);
    ensure!(node.host_veths().is_empty(), "DEL left a veth behind");
    ensure!(
        node.network.allocated().is_empty(),
        "DEL left an address allocated"
    );
    drop((a, b, c));
    drop(node);

    two_nodes()?;
    say("   done: no namespace, link or pin of the demo is left");
    Ok(())
}

/// Two simulated nodes on one segment, reading one nodes file, whose pods talk through
/// the VXLAN overlay with their own addresses.
fn two_nodes() -> anyhow::Result<()> {
    say("\n10. Two nodes on one segment (198.19.0.1 and .2), the cluster's nodes in a file");
    say("    (`kubectl get nodes -o yaml` form); each daemon makes its VXLAN overlay device");
    let cluster = TestCluster::start(&["10.244.11.0/24", "10.244.12.0/24"], &[]);
    show(&cluster.node(1).instance.cli(&["nodes"]))?;
    let a = cluster.node(1).add_pod("demo-node1-pod");
    let b = cluster.node(2).add_pod("demo-node2-pod");
    say(&format!(
        "    pod on node-1: {} (usePodCidr: node-1's range); pod on node-2: {}",
        a.ip, b.ip
    ));
    ping(&a.netns, "    node-1's pod", &b.ip.to_string())?;
    let server = EchoServer::start(&b.netns, PORT);
    let to: SocketAddr = format!("{}:{PORT}", b.ip).parse()?;
    round_trip(&a.netns, to, b"across nodes").map_err(anyhow::Error::msg)?;
    let seen: Vec<String> = server.peers().iter().map(|p| p.ip().to_string()).collect();
    say(&format!(
        "    TCP across nodes: node-2's pod saw it come from {} (no NAT inside the cluster)",
        seen.join(", ")
    ));
    let routes = cluster.node(1).netns.ip(&["route", "show", "proto", "208"]);
    say(&format!(
        "    node-1's route to node-2's pods: {}",
        routes.trim()
    ));
    Ok(())
}

fn ping(from: &ebpf_cni_tests::netns::Netns, who: &str, to: &str) -> anyhow::Result<()> {
    ping_with(from, who, to, &[])
}

fn ping_with(
    from: &ebpf_cni_tests::netns::Netns,
    who: &str,
    to: &str,
    options: &[&str],
) -> anyhow::Result<()> {
    let args: Vec<&str> = ["-c", "3", "-i", "0.2", "-W", "2"]
        .into_iter()
        .chain(options.iter().copied())
        .chain([to])
        .collect();
    let out = from.run("ping", &args);
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text
        .lines()
        .find(|line| line.contains("transmitted"))
        .context("ping printed no summary")?;
    say(&format!("   {who} -> {to}: {summary}"));
    ensure!(out.status.success(), "ping from {who} to {to} failed");
    Ok(())
}

#[expect(clippy::print_stdout, reason = "the demo's narrative is its output")]
fn say(text: &str) {
    println!("{text}");
}

fn show(out: &Output) -> anyhow::Result<()> {
    ensure!(
        out.status.success(),
        "ebpf-cnid failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        say(&format!("   {line}"));
    }
    say("");
    Ok(())
}
