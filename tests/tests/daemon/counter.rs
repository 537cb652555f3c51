//! The toolchain end to end: the eBPF object built in CI is loaded by the daemon,
//! attached to a veth in a network namespace, and counts real pings.

use std::time::Duration;

use ebpf_cni_tests::{
    daemon::{Daemon, Instance, eventually},
    netns::{Netns, run_ok},
    require_root,
};

const NODE_ADDR: &str = "198.18.0.1";
const PEER_ADDR: &str = "198.18.0.2";
/// An ICMP echo request of ping's default 56-byte payload, as TC ingress sees it:
/// 14 (Ethernet) + 20 (IPv4) + 8 (ICMP) + 56.
const ECHO_FRAME_BYTES: u64 = 98;

/// A node namespace and a peer namespace joined by a veth (`up0` on the node side).
fn node_and_peer() -> (Netns, Netns) {
    let node = Netns::new("node");
    let peer = Netns::new("peer");
    node.link_veth("up0", "198.18.0.1/24", &peer, "eth0", "198.18.0.2/24");
    (node, peer)
}

fn ping(from: &Netns, to: &str, count: u32) {
    run_ok(
        from.command("ping")
            .args(["-c", &count.to_string(), "-i", "0.2", "-W", "2", to]),
    );
}

fn counters_of(instance: &Instance, source: &str) -> Option<(u64, u64)> {
    let rows = instance.cli_json(&["counters"]);
    rows.as_array()
        .expect("counters prints a JSON array")
        .iter()
        .find(|row| row["source"] == source)
        .map(|row| {
            (
                row["packets"].as_u64().expect("packets"),
                row["bytes"].as_u64().expect("bytes"),
            )
        })
}

#[test]
fn daemon_counts_pings_per_source_on_the_attached_veth() {
    require_root();
    let (node, peer) = node_and_peer();
    let instance = Instance::new();
    let mut daemon = Daemon::start(&node, &instance, &["up0"]);

    let status = instance.cli_json(&["status"]);
    let all = status["attachments"].as_array().expect("attachments");
    // The socket programs (hostPorts for the node's processes) sit on the cgroup, the
    // pod programs in the pods' TC blocks (from_pod on the veths' ingress, to_pod on
    // their egress).
    let on_cgroup = all.iter().filter(|a| a["mode"] == "cgroup").count();
    assert_eq!(on_cgroup, 4, "status: {status}");
    let in_blocks: Vec<&str> = all
        .iter()
        .filter(|a| a["mode"] == "tc block")
        .filter_map(|a| a["program"].as_str())
        .collect();
    assert_eq!(in_blocks, ["from_pod", "to_pod"], "status: {status}");
    let attachments: Vec<_> = all
        .iter()
        .filter(|a| a["mode"] != "cgroup" && a["mode"] != "tc block")
        .collect();
    assert_eq!(attachments.len(), 1, "status: {status}");
    assert_eq!(attachments[0]["interface"], "up0");
    assert_eq!(attachments[0]["program"], "count_by_source");
    assert!(
        matches!(attachments[0]["mode"].as_str(), Some("tcx" | "clsact")),
        "status: {status}"
    );

    ping(&peer, NODE_ADDR, 5);

    assert_eq!(
        counters_of(&instance, PEER_ADDR),
        Some((5, 5 * ECHO_FRAME_BYTES)),
        "five echo requests entered up0 from the peer"
    );
    // The program sits on ingress only: the node's replies leave through egress.
    assert_eq!(counters_of(&instance, NODE_ADDR), None);
    // aya-log records from the program reach the daemon's tracing output.
    assert!(
        eventually(Duration::from_secs(5), || instance
            .log()
            .contains(&format!("counting a new source {PEER_ADDR}"))),
        "the program's log line is missing from the daemon log:\n{}",
        instance.log()
    );
    assert!(daemon.stop(), "the daemon exits cleanly on SIGTERM");
}

#[test]
fn counters_survive_a_daemon_restart_and_uninstall_removes_the_pins() {
    require_root();
    let (node, peer) = node_and_peer();
    let instance = Instance::new();

    let mut first = Daemon::start(&node, &instance, &["up0"]);
    ping(&peer, NODE_ADDR, 3);
    assert!(first.stop(), "the first daemon exits cleanly");
    assert!(
        instance.bpf_dir.exists(),
        "maps stay pinned after the daemon stops"
    );

    let mut second = Daemon::start(&node, &instance, &["up0"]);
    ping(&peer, NODE_ADDR, 2);
    assert_eq!(
        counters_of(&instance, PEER_ADDR),
        Some((5, 5 * ECHO_FRAME_BYTES)),
        "the restarted daemon reused the pinned map and kept counting"
    );

    let refused = instance.cli(&["uninstall"]);
    assert!(
        !refused.status.success(),
        "uninstall refuses while the daemon runs"
    );
    assert!(instance.bpf_dir.exists());

    assert!(second.stop(), "the second daemon exits cleanly");
    let done = instance.cli(&["uninstall"]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(!instance.bpf_dir.exists(), "uninstall removed every pin");
    assert!(!instance.socket.exists(), "uninstall removed the socket");
    let again = instance.cli(&["uninstall"]);
    assert!(again.status.success(), "a second uninstall is harmless");
}

#[test]
fn daemon_refuses_to_attach_to_a_missing_interface() {
    require_root();
    let (node, _peer) = node_and_peer();
    let instance = Instance::new();
    let out = node
        .command(ebpf_cni_tests::bins::path("ebpf-cnid"))
        .args(instance.flags())
        .args(["run", "--attach", "nosuch0"])
        .output()
        .expect("runs ebpf-cnid");
    assert!(
        !out.status.success(),
        "the daemon must not start half-attached"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nosuch0"),
        "the error names the interface: {stderr}"
    );
    assert!(!instance.socket.exists(), "no socket is left behind");
}
