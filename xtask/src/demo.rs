//! `cargo xtask demo`: a simulated node in network namespaces with the eBPF datapath
//! loaded by `ebpf-cnid`, real traffic, and what the programs saw. Everything it creates
//! is removed at the end, also on failure.

use std::{path::Path, process::Output};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{
    daemon::{Daemon, Instance},
    netns::Netns,
};

use crate::{
    build::{self, Profile},
    setup,
};

/// The simulated hosts: (tag, node-side link, node address, host address).
const PEERS: &[(&str, &str, &str, &str)] = &[
    ("peer-a", "up0", "198.18.0.1/24", "198.18.0.2/24"),
    ("peer-b", "up1", "198.18.1.1/24", "198.18.1.2/24"),
];

pub fn run(root: &Path) -> anyhow::Result<()> {
    let tools = setup::full()?;
    build::all(root, &tools, Profile::Dev)?;
    ebpf_cni_tests::sweep_stale();

    say("1. A simulated node: a network namespace, two hosts joined to it by veth pairs");
    let node = Netns::new("node");
    let peers: Vec<Netns> = PEERS.iter().map(|(tag, ..)| Netns::new(tag)).collect();
    for ((_, link, node_addr, peer_addr), peer) in PEERS.iter().zip(&peers) {
        node.link_veth(link, node_addr, peer, "eth0", peer_addr);
        say(&format!(
            "   {} {node_addr} <-> {peer_addr} in {}",
            link,
            peer.name()
        ));
    }

    say("\n2. ebpf-cnid starts inside the node, loads the eBPF object, pins its maps, attaches");
    let instance = Instance::new();
    let links: Vec<&str> = PEERS.iter().map(|(_, link, ..)| *link).collect();
    let mut daemon = Daemon::start(&node, &instance, &links);
    show(&instance.cli(&["status"]))?;

    say("3. Real packets: ping from each host to the node");
    for ((_, _, node_addr, _), (peer, count)) in PEERS.iter().zip(peers.iter().zip([4, 2])) {
        let target = node_addr.split('/').next().context("address")?;
        let out = peer.run(
            "ping",
            &["-c", &count.to_string(), "-i", "0.2", "-W", "2", target],
        );
        let summary = String::from_utf8_lossy(&out.stdout);
        let line = summary
            .lines()
            .find(|l| l.contains("transmitted"))
            .unwrap_or("no summary");
        say(&format!("   {} -> {target}: {line}", peer.name()));
        ensure!(out.status.success(), "ping from {} failed", peer.name());
    }

    say("\n4. What the TC program counted, per source address (read from the pinned map)");
    show(&instance.cli(&["counters"]))?;

    say("5. What the program itself logged (aya-log, forwarded into the daemon's log)");
    for line in instance.log().lines().filter(|l| l.contains("cni_ebpf")) {
        say(&format!("   {}", line.trim()));
    }

    say("\n6. Clean up: stop the daemon, remove the pins and the namespaces");
    ensure!(
        daemon.stop(),
        "the daemon did not exit cleanly:\n{}",
        instance.log()
    );
    drop(instance);
    drop(peers);
    drop(node);
    say("   done: no namespace, link or pin of the demo is left");
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
