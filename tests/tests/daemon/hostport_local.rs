//! hostPort from the node itself and from its pods. A process of the node (in the
//! daemon's cgroup) reaches a pod through 127.0.0.1:hostPort and the node's address over
//! TCP and UDP, and getpeername()/recvfrom() give back the address it dialled; a mapping
//! with a hostIP is not reachable through loopback; the same cgroup in another namespace
//! is left alone; a pod reaches another pod through the node's address and keeps its own
//! address as the source; a pod reaching its own hostPort (hairpin) sees the connection
//! come from 169.254.42.1; DEL ends the node-local path too.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
};

use ebpf_cni_tests::{
    netns::Netns,
    node::{NODE_ADDR, Node, port_mappings, socket},
    require_root,
    traffic::{EchoServer, UdpEcho, probe, round_trip, udp_round_trip},
};
use serde_json::Value;

const CONTAINER_PORT: u16 = 8080;
const LOOPBACK: &str = "127.0.0.1";
/// The source a pod sees on a connection to its own hostPort (the datapath's
/// HAIRPIN_ADDR).
const HAIRPIN_ADDR: &str = "169.254.42.1";

fn mappings(list: &[(u16, &str, Option<&str>)]) -> Value {
    port_mappings(CONTAINER_PORT, list)
}

/// `ecni-probe <protocol> <to> <message>` from `netns`, inside the node daemon's cgroup.
fn probe_from(
    netns: &Netns,
    node: &Node,
    protocol: &str,
    to: SocketAddr,
    message: &str,
) -> Result<Value, String> {
    probe(
        netns,
        &node.instance.cgroup,
        Path::new(env!("CARGO_BIN_EXE_ecni-probe")),
        &[protocol, &to.to_string(), message],
    )
}

/// The probe reached `to` untranslated and nothing listened there: a refusal, not the
/// timeout a translation to a missing pod would give.
fn assert_refused(outcome: Result<Value, String>, why: &str) {
    match outcome {
        Ok(answer) => panic!("{why}: the probe got an answer {answer}"),
        Err(error) => assert!(error.contains("refused"), "{why}: {error}"),
    }
}

fn ips(peers: &[SocketAddr]) -> Vec<IpAddr> {
    peers.iter().map(SocketAddr::ip).collect()
}

#[test]
fn the_node_reaches_a_pod_at_loopback_and_its_address_over_tcp_and_sees_the_dialled_peer() {
    require_root();
    let node = Node::start("10.244.70.0/24");
    let pod = node.add_pod_with("local-tcp", &mappings(&[(30080, "tcp", None)]));
    let server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    for dialled in [socket(LOOPBACK, 30080), socket(NODE_ADDR, 30080)] {
        let message = format!("node to {dialled}");
        let answer = probe_from(&node.netns, &node, "tcp", dialled, &message)
            .unwrap_or_else(|error| panic!("{dialled}: {error}"));
        assert_eq!(answer["reply"], message.as_str(), "{answer}");
        assert_eq!(
            answer["peer"],
            dialled.to_string().as_str(),
            "getpeername() gives back the address dialled: {answer}"
        );
    }
    assert_eq!(server.peers().len(), 2, "both connections reached the pod");
}

#[test]
fn the_node_reaches_a_pod_at_loopback_and_its_address_over_udp_and_replies_come_from_there() {
    require_root();
    let node = Node::start("10.244.71.0/24");
    let pod = node.add_pod_with("local-udp", &mappings(&[(30053, "udp", None)]));
    let server = UdpEcho::start(&pod.netns, CONTAINER_PORT);
    for dialled in [socket(LOOPBACK, 30053), socket(NODE_ADDR, 30053)] {
        let message = format!("node to {dialled}");
        let answer = probe_from(&node.netns, &node, "udp", dialled, &message)
            .unwrap_or_else(|error| panic!("{dialled}: {error}"));
        assert_eq!(answer["reply"], message.as_str(), "{answer}");
        assert_eq!(
            answer["peer"],
            dialled.to_string().as_str(),
            "recvfrom() gives back the address dialled as the source: {answer}"
        );
    }
    assert_eq!(server.peers().len(), 2, "both datagrams reached the pod");
}

#[test]
fn a_host_ip_mapping_is_reachable_from_the_node_at_that_address_but_not_through_loopback() {
    require_root();
    let node = Node::start("10.244.72.0/24");
    let pod = node.add_pod_with("local-ip", &mappings(&[(30080, "tcp", Some(NODE_ADDR))]));
    let server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let answer = probe_from(
        &node.netns,
        &node,
        "tcp",
        socket(NODE_ADDR, 30080),
        "mapped",
    )
    .expect("the mapped address");
    assert_eq!(answer["reply"], "mapped");
    assert_refused(
        probe_from(
            &node.netns,
            &node,
            "tcp",
            socket(LOOPBACK, 30080),
            "loopback",
        ),
        "127.0.0.1 only reaches mappings without hostIP",
    );
    assert_eq!(server.peers().len(), 1);
}

#[test]
fn a_process_of_the_cgroup_in_another_namespace_is_not_translated() {
    require_root();
    let node = Node::start("10.244.73.0/24");
    let pod = node.add_pod_with("local-ns", &mappings(&[(30080, "tcp", None)]));
    let server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    // The same probe and cgroup in the node's namespace is translated...
    probe_from(&node.netns, &node, "tcp", socket(LOOPBACK, 30080), "node")
        .expect("from the node's namespace");
    // ...but the programs act only on sockets of the daemon's namespace.
    assert_refused(
        probe_from(
            &node.external,
            &node,
            "tcp",
            socket(LOOPBACK, 30080),
            "elsewhere",
        ),
        "another namespace's loopback is its own",
    );
    assert_eq!(
        server.peers().len(),
        1,
        "only the node's connection reached the pod"
    );
}

#[test]
fn a_pod_reaches_another_pod_through_the_node_address_and_keeps_its_own_source() {
    require_root();
    let node = Node::start("10.244.74.0/24");
    let target = node.add_pod_with(
        "local-target",
        &mappings(&[(30080, "tcp", None), (30053, "udp", None)]),
    );
    let client = node.add_pod("local-client");
    let tcp = EchoServer::start(&target.netns, CONTAINER_PORT);
    let udp = UdpEcho::start(&target.netns, CONTAINER_PORT);

    let back = round_trip(&client.netns, socket(NODE_ADDR, 30080), b"pod to pod").expect("TCP");
    assert_eq!(back, b"pod to pod");
    let back = udp_round_trip(
        &client.netns,
        0,
        socket(NODE_ADDR, 30053),
        b"pod to pod udp",
    )
    .expect("UDP");
    assert_eq!(back, b"pod to pod udp");
    assert_eq!(ips(&tcp.peers()), [IpAddr::V4(client.ip)]);
    assert_eq!(ips(&udp.peers()), [IpAddr::V4(client.ip)]);
}

#[test]
fn a_pod_reaching_its_own_host_port_sees_the_hairpin_address() {
    require_root();
    let node = Node::start("10.244.75.0/24");
    let pod = node.add_pod_with(
        "local-hairpin",
        &mappings(&[(30080, "tcp", None), (30053, "udp", None)]),
    );
    let tcp = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let udp = UdpEcho::start(&pod.netns, CONTAINER_PORT);

    // Both clients only accept replies from the address they dialled (TCP by its
    // handshake, UDP by connect()), so success also proves the replies are translated.
    let back = round_trip(&pod.netns, socket(NODE_ADDR, 30080), b"to myself").expect("TCP");
    assert_eq!(back, b"to myself");
    let back =
        udp_round_trip(&pod.netns, 0, socket(NODE_ADDR, 30053), b"to myself udp").expect("UDP");
    assert_eq!(back, b"to myself udp");
    let hairpin: IpAddr = HAIRPIN_ADDR.parse().expect("address");
    assert_eq!(ips(&tcp.peers()), [hairpin]);
    assert_eq!(ips(&udp.peers()), [hairpin]);
}

#[test]
fn del_ends_the_node_local_path_to_the_pod() {
    require_root();
    let node = Node::start("10.244.76.0/24");
    let pod = node.add_pod_with("local-del", &mappings(&[(30080, "tcp", None)]));
    let _server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    probe_from(&node.netns, &node, "tcp", socket(LOOPBACK, 30080), "before").expect("before DEL");
    node.del_pod(&pod);
    for dialled in [socket(LOOPBACK, 30080), socket(NODE_ADDR, 30080)] {
        assert_refused(
            probe_from(&node.netns, &node, "tcp", dialled, "after"),
            &format!("{dialled} after DEL"),
        );
    }
}

#[test]
fn the_node_local_path_survives_a_killed_and_restarted_daemon_without_doubling_its_hooks() {
    require_root();
    let mut node = Node::start("10.244.77.0/24");
    let pod = node.add_pod_with("local-restart", &mappings(&[(30080, "tcp", None)]));
    let server = EchoServer::start(&pod.netns, CONTAINER_PORT);
    let dial = |node: &Node, message: &str| {
        probe_from(&node.netns, node, "tcp", socket(LOOPBACK, 30080), message)
            .unwrap_or_else(|error| panic!("{message}: {error}"))
    };
    dial(&node, "before");
    node.daemon.kill();
    dial(&node, "while the daemon is dead");
    node.daemon = ebpf_cni_tests::daemon::Daemon::start(&node.netns, &node.instance, &[]);
    dial(&node, "after the restart");
    assert_eq!(server.peers().len(), 3, "every connection reached the pod");
    // The restarted daemon's programs replaced the old ones on the cgroup.
    let attached = node.netns.run(
        "bpftool",
        &[
            "-j",
            "cgroup",
            "show",
            &node.instance.cgroup.path().display().to_string(),
        ],
    );
    let attached: Value = serde_json::from_slice(&attached.stdout).expect("bpftool's JSON");
    let names: Vec<&str> = attached
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|program| program["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "hostport_connect4",
            "hostport_sendmsg4",
            "hostport_recvmsg4",
            "hostport_getpeername4"
        ],
        "one of each"
    );
}
