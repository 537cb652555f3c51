//! The pods' default gateway answers as an address of their node: `ping` to it, and the
//! node's services listening on all addresses (TCP, UDP) through it. Nobody outside the
//! node sees it: the external host's ARP for it goes unanswered and its packets for it
//! are dropped, on the uplink and on any other network of the node. The address goes with the last pod of its range (or `uninstall`), and a gateway that is
//! already an address of the node is left to whoever put it there.

use std::{thread, time::Duration};

use ebpf_cni_tests::{
    daemon::Daemon,
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, socket},
    require_root,
    traffic::{EchoServer, UdpEcho, round_trip, udp_round_trip},
};
use serde_json::Value;

const PORT: u16 = 8080;

fn ping(from: &Netns, to: &str) -> bool {
    from.run("ping", &["-c", "2", "-i", "0.2", "-W", "2", to])
        .status
        .success()
}

/// The addresses of `lo` in the node that carry the daemon's label.
fn labelled(node: &Node) -> Vec<String> {
    let shown = node.netns.ip(&[
        "-j",
        "-4",
        "addr",
        "show",
        "dev",
        "lo",
        "label",
        "lo:ebpf-cni",
    ]);
    let shown: Value = serde_json::from_str(&shown).expect("ip -j prints JSON");
    shown
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        // `ip -j` lists the filtered-out addresses as empty objects.
        .filter_map(|addr| {
            Some(format!(
                "{}/{} scope {}",
                addr["local"].as_str()?,
                addr["prefixlen"],
                addr["scope"].as_str().unwrap_or_default()
            ))
        })
        .collect()
}

fn peer_ips(server: &EchoServer) -> Vec<String> {
    server
        .peers()
        .iter()
        .map(|peer| peer.ip().to_string())
        .collect()
}

fn status(node: &Node) -> Value {
    node.instance.cli_json(&["status"])
}

fn gateway_drops(node: &Node) -> u64 {
    let status = status(node);
    status["drops"]["gateway_from_outside"]
        .as_u64()
        .unwrap_or_else(|| panic!("no gateway_from_outside counter in {status}"))
}

#[test]
fn a_pod_pings_its_gateway_and_reaches_the_nodes_services_through_it() {
    require_root();
    let node = Node::start("10.244.50.0/24");
    let pod = node.add_pod("gw-a");
    let gateway = "10.244.50.1";
    assert_eq!(
        labelled(&node),
        [format!("{gateway}/32 scope host")],
        "the gateway is a host-scope address of lo"
    );
    assert_eq!(status(&node)["gateways"], serde_json::json!([gateway]));

    assert!(ping(&pod.netns, gateway), "the pod pings its gateway");
    let _tcp = EchoServer::start(&node.netns, PORT);
    let payload = b"through the gateway".to_vec();
    let back = round_trip(&pod.netns, socket(gateway, PORT), &payload)
        .unwrap_or_else(|error| panic!("TCP to the node at {gateway}: {error}"));
    assert_eq!(back, payload);
    let _udp = UdpEcho::start(&node.netns, PORT);
    let back = udp_round_trip(&pod.netns, 0, socket(gateway, PORT), &payload)
        .unwrap_or_else(|error| panic!("UDP to the node at {gateway}: {error}"));
    assert_eq!(back, payload);
    // The node's own connections to its pods come from their gateway, as from a
    // bridge's address; toward outside, from the uplink's address as ever.
    let pod_server = EchoServer::start(&pod.netns, PORT);
    round_trip(&node.netns, socket(&pod.ip.to_string(), PORT), &payload)
        .expect("the node reaches the pod");
    assert_eq!(peer_ips(&pod_server), [gateway]);
    let outside = EchoServer::start(&node.external, PORT);
    round_trip(&node.netns, socket(EXTERNAL_ADDR, PORT), &payload)
        .expect("the node reaches the external host");
    assert_eq!(peer_ips(&outside), [NODE_ADDR]);
}

#[test]
fn hosts_outside_the_node_neither_resolve_nor_reach_the_gateway() {
    require_root();
    let node = Node::start("10.244.51.0/24");
    let _pod = node.add_pod("gw-b");
    let gateway = "10.244.51.1";
    let _tcp = EchoServer::start(&node.netns, PORT);
    assert_eq!(gateway_drops(&node), 0);

    // On the uplink's segment: the external host asks who has it.
    node.external
        .ip(&["route", "add", &format!("{gateway}/32"), "dev", "eth0"]);
    assert!(
        !ping(&node.external, gateway),
        "the gateway answered outside"
    );
    let neighbour = node.external.ip(&["neigh", "show", gateway, "dev", "eth0"]);
    assert!(
        !neighbour.contains("lladdr"),
        "the node answered ARP for its pods' gateway: {neighbour}"
    );
    let asked = gateway_drops(&node);
    assert!(asked > 0, "the ARP requests were dropped and counted");

    // Routed to the node, as another node or a router would send it.
    node.external.ip(&[
        "route",
        "replace",
        &format!("{gateway}/32"),
        "via",
        NODE_ADDR,
    ]);
    assert!(
        !ping(&node.external, gateway),
        "the gateway answered outside"
    );
    assert!(
        round_trip(&node.external, socket(gateway, PORT), b"x").is_err(),
        "a node service answered outside at the gateway"
    );
    assert!(
        gateway_drops(&node) > asked,
        "the packets for the gateway were dropped and counted"
    );
    // The node itself is reachable as ever.
    assert!(ping(&node.external, NODE_ADDR));
}

/// The node's address on its second network (see the test below).
const SECOND_ADDR: &str = "192.168.77.1";

#[test]
fn hosts_on_another_network_of_the_node_neither_resolve_nor_reach_the_gateway() {
    require_root();
    let node = Node::start("10.244.53.0/24");
    let _pod = node.add_pod("gw-e");
    let gateway = "10.244.53.1";
    let _tcp = EchoServer::start(&node.netns, PORT);
    // A second network of the node, which is no uplink: a bridge (a device the daemon
    // finds after it started) whose port leads to a host on that network.
    let host = Netns::new("gw-second");
    node.netns.ip(&["link", "add", "second0", "type", "bridge"]);
    node.netns.ip(&[
        "addr",
        "add",
        &format!("{SECOND_ADDR}/24"),
        "dev",
        "second0",
    ]);
    node.netns.ip(&["link", "set", "second0", "up"]);
    node.netns.ip(&[
        "link",
        "add",
        "second-port",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        host.name(),
    ]);
    node.netns
        .ip(&["link", "set", "second-port", "master", "second0", "up"]);
    host.ip(&["addr", "add", "192.168.77.2/24", "dev", "eth0"]);
    host.ip(&["link", "set", "eth0", "up"]);
    // The node itself answers there.
    assert!(
        ping(&host, SECOND_ADDR),
        "the node answers on its second network"
    );
    let guarded = wait_for_guard(&node, "second0");
    assert!(
        guarded,
        "the guard is on the bridge: {}",
        status(&node)["attachments"]
    );
    let before = gateway_drops(&node);

    // On that segment the host asks who has the gateway.
    host.ip(&["route", "add", &format!("{gateway}/32"), "dev", "eth0"]);
    assert!(
        !ping(&host, gateway),
        "the gateway answered on another network"
    );
    let neighbour = host.ip(&["neigh", "show", gateway, "dev", "eth0"]);
    assert!(
        !neighbour.contains("lladdr"),
        "the node answered ARP for its pods' gateway: {neighbour}"
    );
    let asked = gateway_drops(&node);
    assert!(asked > before, "the ARP requests were dropped and counted");

    // Routed to the node's address there.
    host.ip(&[
        "route",
        "replace",
        &format!("{gateway}/32"),
        "via",
        SECOND_ADDR,
    ]);
    assert!(
        !ping(&host, gateway),
        "the gateway answered on another network"
    );
    assert!(
        round_trip(&host, socket(gateway, PORT), b"x").is_err(),
        "a node service answered at the gateway on another network"
    );
    assert!(
        gateway_drops(&node) > asked,
        "the packets were dropped and counted"
    );
    // The node's own address there still serves.
    assert!(round_trip(&host, socket(SECOND_ADDR, PORT), b"x").is_ok());
}

/// Waits up to 5 s for the daemon to list `gateway_guard` on `device`.
fn wait_for_guard(node: &Node, device: &str) -> bool {
    for _ in 0..50 {
        let status = status(node);
        let on = status["attachments"].as_array().is_some_and(|all| {
            all.iter()
                .any(|a| a["program"] == "gateway_guard" && a["interface"] == device)
        });
        if on {
            return true;
        }
        thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn the_gateway_goes_with_the_last_pod_of_its_range_or_uninstall_and_a_node_address_stays() {
    require_root();
    let mut node = Node::start("10.244.52.0/24");
    let gateway = "10.244.52.1";
    let a = node.add_pod("gw-c");
    let b = node.add_pod("gw-d");
    assert_eq!(labelled(&node), [format!("{gateway}/32 scope host")]);

    // A restart keeps it, and pods answered, while they are there.
    node.daemon.kill();
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(labelled(&node), [format!("{gateway}/32 scope host")]);
    assert!(
        ping(&a.netns, gateway),
        "the gateway answers after a restart"
    );

    node.del_pod(&a);
    assert_eq!(
        labelled(&node),
        [format!("{gateway}/32 scope host")],
        "b still routes through it"
    );
    node.del_pod(&b);
    assert!(labelled(&node).is_empty(), "the gateway outlived its pods");
    assert_eq!(status(&node)["gateways"], serde_json::json!([]));

    // A gateway the node already has (an operator's address, say) is the node's own:
    // the daemon neither adds it again nor takes it away.
    let own = format!("{gateway}/32");
    node.netns.ip(&["addr", "add", &own, "dev", "uplink0"]);
    let c = node.add_pod("gw-e");
    assert!(labelled(&node).is_empty(), "the daemon added it again");
    assert!(ping(&c.netns, gateway), "the node's own address answers");
    node.del_pod(&c);
    thread::sleep(Duration::from_millis(200));
    let shown = node.netns.ip(&["-4", "addr", "show", "dev", "uplink0"]);
    assert!(
        shown.contains(&own),
        "the node's own address was removed: {shown}"
    );

    // `uninstall` takes the daemon's gateways with it (the uplink's programs that hide
    // them from outside go too).
    node.netns.ip(&["addr", "del", &own, "dev", "uplink0"]);
    let _d = node.add_pod("gw-f");
    assert_eq!(labelled(&node), [format!("{gateway}/32 scope host")]);
    assert!(node.daemon.stop(), "the daemon exits cleanly");
    let done = node.instance.cli(&["uninstall"]);
    assert!(done.status.success(), "uninstall: {done:?}");
    assert!(labelled(&node).is_empty(), "uninstall left the gateway");
}
