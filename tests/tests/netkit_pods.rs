//! Pods on netkit pairs (`"podDevice": "netkit"`): the plugin makes the pair, the
//! daemon puts `from_pod` on the pair's own hook, and the pods talk to each other, to
//! veth pods, to the node and to the outside through it, with the same source checks.
//! Across nodes too, natively routed and over the overlay; hostPorts and rate limits
//! too. A restarted daemon swaps its program in; uninstall takes it off; CHECK accepts
//! the pod; DEL leaves nothing. NetworkPolicy holds a netkit pod as a veth pod (`to_pod`
//! on the pair's primary hook).
//!
//! On a kernel without netkit (the host's here: 6.18 built without `CONFIG_NETKIT`)
//! every test checks instead that ADD is refused with code 2 and leaves nothing behind.
//! `cargo xtask test` runs this binary in Debian 6.12's guest too, whose kernel has
//! netkit and says so ([`netkit::KERNEL_VAR`]): there every test takes the netkit path.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    thread,
    time::Duration,
};

use ebpf_cni_tests::{
    cluster::{TestCluster, last_peer},
    cni::Call,
    daemon::Daemon,
    netkit,
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, Pod, port_mappings, socket},
    require_root,
    traffic::{EchoServer, UdpEcho, round_trip, spoof::send_udp_as},
};
use serde_json::{Value, json};

const PORT: u16 = 8080;

/// Whether the kernel makes netkit pairs. When it does not, checks that ADD asking for
/// one is refused with code 2 naming netkit, and leaves no device, no address and no
/// endpoint behind.
fn netkit_or_refused(node: &Node) -> bool {
    if netkit::supported() {
        return true;
    }
    let (_netns, outcome) = node.try_add_netkit("nk-refused", &Value::Null);
    let error = outcome.error(2);
    assert!(
        error["msg"]
            .as_str()
            .is_some_and(|msg| msg.contains("netkit")),
        "the error names netkit: {error}"
    );
    assert_eq!(node.host_veths(), Vec::<String>::new(), "no device left");
    assert_eq!(
        node.network.allocated(),
        Vec::<String>::new(),
        "no address left"
    );
    let endpoints = node.instance.cli_json(&["endpoints"]);
    assert_eq!(endpoints, json!([]), "no endpoint left");
    false
}

/// The pod's host-side device, by the plugin's naming (for when no daemon answers).
fn host_device_named(node: &Node, pod: &Pod) -> String {
    let name = cni_api::naming::host_veth(&pod.container_id, "eth0");
    assert!(node.host_veths().contains(&name), "no device {name}");
    name
}

fn pings(from: &Netns, to: &str) -> bool {
    from.run("ping", &["-c", "2", "-i", "0.2", "-W", "2", to])
        .status
        .success()
}

fn tcp_ok(from: &Netns, to: &str) {
    let addr: SocketAddr = format!("{to}:{PORT}").parse().expect("address");
    let payload = format!("hello {to}").into_bytes();
    let back = round_trip(from, addr, &payload).unwrap_or_else(|e| panic!("TCP to {addr}: {e}"));
    assert_eq!(back, payload, "the echo of {addr}");
}

#[test]
fn netkit_pods_talk_through_the_pod_program_on_their_pair() {
    require_root();
    let node = Node::start("10.244.70.0/24");
    if !netkit_or_refused(&node) {
        return;
    }
    let (a, b) = (node.add_netkit_pod("nk-a"), node.add_netkit_pod("nk-b"));
    let veth = node.add_pod("nk-veth");
    for pod in [&a, &b] {
        let device = node.host_veth(pod);
        assert_eq!(netkit::kind(&node.netns, &device), "netkit", "{device}");
        assert_eq!(netkit::kind(&pod.netns, "eth0"), "netkit", "the pod's side");
        let programs: Vec<String> = netkit::peer_programs(&node.netns, &device)
            .into_iter()
            .map(netkit::program_name)
            .collect();
        assert_eq!(programs, ["from_pod"], "the program on {device}'s pair");
        assert_eq!(
            node.netns.tc_programs(&device),
            Vec::<String>::new(),
            "{device} is not bound to the pods' block as well"
        );
    }
    assert_eq!(netkit::kind(&node.netns, &node.host_veth(&veth)), "veth");

    let _servers: Vec<EchoServer> = [&a, &b, &veth]
        .iter()
        .map(|pod| EchoServer::start(&pod.netns, PORT))
        .collect();
    let _node_server = EchoServer::start(&node.netns, PORT);
    let _outside = EchoServer::start(&node.external, PORT);
    for (from, to) in [(&a, &b), (&b, &a), (&a, &veth), (&veth, &a)] {
        let to = to.ip.to_string();
        assert!(pings(&from.netns, &to), "{} -> {to}", from.container_id);
        tcp_ok(&from.netns, &to);
    }
    assert!(pings(&a.netns, NODE_ADDR), "pod -> node");
    tcp_ok(&a.netns, NODE_ADDR);
    assert!(pings(&node.netns, &a.ip.to_string()), "node -> pod");
    tcp_ok(&node.netns, &a.ip.to_string());
    // To the outside, translated to the node's address.
    tcp_ok(&a.netns, EXTERNAL_ADDR);
    let flows = node.instance.cli_json(&["nat"]);
    assert!(
        flows["entries"].as_array().is_some_and(|entries| entries
            .iter()
            .any(|entry| entry.to_string().contains(&a.ip.to_string()))),
        "a's connection to the outside is in the NAT table: {flows}"
    );
    let counters = &node.endpoint(&a)["counters"];
    for field in ["from_pod_packets", "to_pod_packets"] {
        assert!(
            counters[field].as_u64().is_some_and(|n| n > 0),
            "{field}: {counters}"
        );
    }
    // Each packet into a pod counts once, whether the datapath counted it (into a
    // pod from a veth's ingress) or the host side's transmit did (from a netkit hook).
    for (from, to) in [(&b, &a), (&a, &veth)] {
        let to_pod = || {
            node.endpoint(to)["counters"]["to_pod_packets"]
                .as_u64()
                .expect("the pod's counters")
        };
        let before = to_pod();
        let echo = from.netns.run(
            "ping",
            &["-c", "10", "-i", "0.1", "-W", "2", &to.ip.to_string()],
        );
        assert!(
            echo.status.success(),
            "{} -> {}",
            from.container_id,
            to.container_id
        );
        let delivered = to_pod() - before;
        // The ten requests, and perhaps a neighbour's ARP or two.
        assert!(
            (10..=13).contains(&delivered),
            "{} got {delivered} packets counted for 10 echo requests",
            to.container_id
        );
    }
}

#[test]
fn a_netkit_pod_sends_only_as_itself() {
    require_root();
    let node = Node::start("10.244.71.0/24");
    if !netkit_or_refused(&node) {
        return;
    }
    let (a, b) = (
        node.add_netkit_pod("nk-iso-a"),
        node.add_netkit_pod("nk-iso-b"),
    );
    let neighbour = UdpEcho::start(&b.netns, PORT);
    let to_b = SocketAddrV4::new(b.ip, PORT);
    send_udp_as(&a.netns, a.ip, 40000, to_b, b"honest").expect("send");
    for (n, source) in [
        NODE_ADDR.parse().expect("address"),
        Ipv4Addr::new(203, 0, 113, 7),
    ]
    .into_iter()
    .enumerate()
    {
        send_udp_as(&a.netns, source, 41000 + n as u16, to_b, b"spoofed").expect("send");
    }
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        neighbour.peers().len(),
        1,
        "only the honest datagram reached b"
    );
    let status = node.instance.cli_json(&["status"]);
    assert_eq!(status["drops"]["spoofed_ipv4_source"], 2, "{status}");
}

#[test]
fn a_netkit_pods_host_port_and_rate_limits_work() {
    require_root();
    let node = Node::start("10.244.74.0/24");
    if !netkit_or_refused(&node) {
        return;
    }
    let mut runtime = port_mappings(PORT, &[(18080, "tcp", None)]);
    runtime["bandwidth"] = json!({
        "ingressRate": 100_000_000, "ingressBurst": 10_000_000,
        "egressRate": 100_000_000, "egressBurst": 10_000_000,
    });
    let (netns, outcome) = node.try_add_netkit("nk-hp", &runtime);
    let pod = Pod::added("nk-hp", netns, &outcome);
    let device = node.host_veth(&pod);
    for (netns, link) in [(&node.netns, device.as_str()), (&pod.netns, "eth0")] {
        let qdiscs = netns.run("tc", &["qdisc", "show", "dev", link]);
        assert!(
            String::from_utf8_lossy(&qdiscs.stdout).contains("tbf"),
            "a tbf on {link}: {qdiscs:?}"
        );
    }
    let _server = EchoServer::start(&pod.netns, PORT);
    // From outside to the node's address, and from a veth pod of the node to it: each
    // through the hostPort, into the pod past its limit's qdisc.
    let other = node.add_pod("nk-hp-other");
    let _other_server = EchoServer::start(&other.netns, PORT);
    for from in [&node.external, &other.netns] {
        let payload = b"to the host port".to_vec();
        let back = round_trip(from, socket(NODE_ADDR, 18080), &payload)
            .unwrap_or_else(|error| panic!("TCP to the host port: {error}"));
        assert_eq!(back, payload);
    }
    tcp_ok(&other.netns, &pod.ip.to_string());
    tcp_ok(&pod.netns, &other.ip.to_string());
}

#[test]
fn a_restarted_daemon_swaps_its_program_onto_netkit_pairs() {
    require_root();
    let mut node = Node::start("10.244.72.0/24");
    if !netkit_or_refused(&node) {
        return;
    }
    let (a, b) = (
        node.add_netkit_pod("nk-rs-a"),
        node.add_netkit_pod("nk-rs-b"),
    );
    let device = node.host_veth(&a);
    let before = netkit::peer_programs(&node.netns, &device);
    assert_eq!(before.len(), 1, "one program on {device}'s pair");

    node.daemon.kill();
    // The program stays on the pair while no daemon runs.
    assert!(pings(&a.netns, &b.ip.to_string()), "a -> b, no daemon");
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);

    let after = netkit::peer_programs(&node.netns, &device);
    assert_eq!(after.len(), 1, "still one program on {device}'s pair");
    assert_ne!(
        after, before,
        "the new daemon's program took the old one's place"
    );
    assert_eq!(netkit::program_name(after[0]), "from_pod");
    assert!(pings(&a.netns, &b.ip.to_string()), "a -> b, new daemon");
}

#[test]
fn netkit_pods_on_two_nodes_talk_natively_and_over_the_overlay() {
    require_root();
    for (routing, ranges) in [
        ("native", ["10.244.121.0/24", "10.244.122.0/24"]),
        ("vxlan", ["10.244.123.0/24", "10.244.124.0/24"]),
    ] {
        let cluster = TestCluster::start(&ranges, &["--routing", routing]);
        if !netkit_or_refused(cluster.node(1)) {
            return;
        }
        let a = cluster.node(1).add_netkit_pod(&format!("nk-{routing}-a"));
        let b = cluster.node(2).add_netkit_pod(&format!("nk-{routing}-b"));
        assert!(pings(&a.netns, &b.ip.to_string()), "{routing}: a -> b");
        assert!(pings(&b.netns, &a.ip.to_string()), "{routing}: b -> a");
        let server = EchoServer::start(&b.netns, PORT);
        let payload = format!("across nodes, {routing}").into_bytes();
        let back = round_trip(&a.netns, (b.ip, PORT).into(), &payload)
            .unwrap_or_else(|error| panic!("{routing}: TCP a -> b: {error}"));
        assert_eq!(back, payload);
        assert_eq!(
            last_peer(&server.peers()),
            IpAddr::from(a.ip),
            "{routing}: b sees a's own address"
        );
    }
}

#[test]
fn uninstall_takes_the_pod_program_off_netkit_pairs() {
    require_root();
    let mut node = Node::start("10.244.75.0/24");
    if !netkit_or_refused(&node) {
        return;
    }
    let (a, b) = (
        node.add_netkit_pod("nk-un-a"),
        node.add_netkit_pod("nk-un-b"),
    );
    assert!(pings(&a.netns, &b.ip.to_string()), "a -> b before");
    let device = node.host_veth(&a);
    assert!(node.daemon.stop());
    let done = node.instance.cli(&["uninstall"]);
    assert!(done.status.success(), "uninstall: {done:?}");
    for pod in [&a, &b] {
        let device = host_device_named(&node, pod);
        assert_eq!(
            netkit::peer_programs(&node.netns, &device),
            Vec::<u32>::new(),
            "nothing left on {device}'s pair"
        );
    }
    // The pair's policy drops what the pod sends now.
    assert!(
        !pings(&a.netns, &b.ip.to_string()),
        "a -> b after, on {device}"
    );
}

#[test]
fn del_takes_the_netkit_pair_and_its_address_away() {
    require_root();
    let node = Node::start("10.244.73.0/24");
    if !netkit_or_refused(&node) {
        return;
    }
    let (netns, outcome) = node.try_add_netkit("nk-del", &Value::Null);
    let mut config = node.network.config("1.1.0");
    config["podDevice"] = json!("netkit");
    config["prevResult"] = outcome.ok();
    Call::new("CHECK", "nk-del", "eth0", Some(&netns), &config)
        .run(&node.netns)
        .ok();
    let a = Pod::added("nk-del", netns, &outcome);
    assert_eq!(node.host_veths().len(), 1);
    node.del_pod(&a);
    assert_eq!(node.host_veths(), Vec::<String>::new(), "the pair is gone");
    assert_eq!(node.network.allocated(), Vec::<String>::new());
    assert_eq!(node.instance.cli_json(&["endpoints"]), json!([]));
    let links = a.netns.ip(&["-j", "link", "show"]);
    assert!(!links.contains("eth0"), "no eth0 left in the pod: {links}");
}

/// A netkit pod under a policy denying ingress in its namespace: a veth pod does not
/// reach it, its own connections' replies come back (through `to_pod` on the pair's
/// primary hook as well as the delivery into it), and the node still reaches it.
#[test]
fn a_netkit_pod_is_held_to_network_policy() {
    use ebpf_cni_tests::netpol::{
        PolicyFile, Protocol, add_netkit_pod, add_pod, namespace_yaml, pod_yaml, reaches, stream,
    };
    require_root();
    let deny = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: deny-ingress
spec:
  podSelector: {}
  policyTypes: [Ingress]
";
    let file = PolicyFile::new(&stream(&[
        namespace_yaml("x", &[]),
        namespace_yaml("y", &[]),
        pod_yaml("x", "a", &[("pod", "a")], None),
        pod_yaml("y", "a", &[("pod", "a")], None),
        deny.to_owned(),
    ]));
    let node = Node::start_with("10.79.9.0/24", &[], &file.flags());
    if !netkit_or_refused(&node) {
        return;
    }
    let x_a = add_netkit_pod(&node, "x", "a");
    let y_a = add_pod(&node, "y", "a");
    let probe =
        |from: &Netns, to: SocketAddr| reaches(from, to, Protocol::Tcp).join().expect("a probe");
    assert!(
        !probe(&y_a.pod.netns, x_a.addr(80)),
        "y/a reaches the netkit pod x/a under a policy denying it"
    );
    assert!(
        probe(&x_a.pod.netns, y_a.addr(80)),
        "x/a's own connection is answered"
    );
    round_trip(&node.netns, x_a.addr(80), b"kubelet").expect("the node reaches x/a");
}
