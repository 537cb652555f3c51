//! The uplink as it changes under a running node: translation follows its address (and
//! nothing leaves while it has none), a device created again gets the programs back, the
//! default route moving to another device takes source NAT along, and a second uplink
//! translates to its own address. How the programs attach (TCX or clsact, across
//! restarts) is `uplink_attach.rs`.

use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use ebpf_cni_tests::{
    daemon::{Daemon, eventually},
    kernel,
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    snat::{TCP_PORT, UDP_PORT, external, nat_table, node_ips},
    traffic::{EchoServer, UdpEcho, round_trip, udp_round_trip},
};
use serde_json::Value;

#[test]
fn translation_follows_the_uplink_address_and_nothing_leaves_while_it_has_none() {
    require_root();
    // The first flow must outlive every step up to its last round trip, a restart
    // included: under TCG that is longer than the default 30 s.
    let flags = ["--nat-udp-timeout", "600"];
    let mut node = Node::start_with("10.244.57.0/24", &[], &flags);
    let pod = node.add_pod("follow");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    let node_addr = |node: &Node| nat_table(node)["node_addr"].clone();
    let drops = |node: &Node| {
        node.instance.cli_json(&["status"])["drops"]["nat_no_address"]
            .as_u64()
            .expect("a nat_no_address counter")
    };

    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"before").expect("UDP through NAT");
    let first = udp.peers();
    assert_eq!(node_ips(&first), BTreeSet::from([NODE_ADDR.to_owned()]));

    // The uplink loses its address. A route and the external host's MAC stay (as a
    // device route and a static neighbour would), so pod packets still reach the
    // uplink's egress program: it must drop them, not send them with the pod's address.
    node.netns
        .ip(&["addr", "del", &format!("{NODE_ADDR}/24"), "dev", "uplink0"]);
    // (`ip -j`: /sys/class/net shows the namespace /sys was mounted in, not ours.)
    let link: Value = serde_json::from_str(&node.external.ip(&["-j", "link", "show", "eth0"]))
        .expect("ip -j link");
    let external_mac = link[0]["address"].as_str().expect("a MAC").to_owned();
    node.netns
        .ip(&["route", "replace", "default", "dev", "uplink0"]);
    node.netns.ip(&[
        "neigh",
        "replace",
        EXTERNAL_ADDR,
        "lladdr",
        &external_mac,
        "dev",
        "uplink0",
        "nud",
        "permanent",
    ]);
    assert!(
        eventually(Duration::from_secs(5), || node_addr(&node).is_null()),
        "the daemon saw the address go: {}",
        nat_table(&node)
    );
    let status = node.instance.cli(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("no IPv4 address"), "{status}");
    let table = node.instance.cli(&["nat"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("no IPv4 address"), "{table}");
    let dropped = drops(&node);
    for from_port in [5000, 5001] {
        assert!(
            udp_round_trip(&pod.netns, from_port, external(UDP_PORT), b"none").is_err(),
            "nothing comes back from port {from_port} without a node address"
        );
    }
    assert_eq!(udp.peers(), first, "nothing reached the external host");
    assert!(
        drops(&node) >= dropped + 2,
        "the old flow's and the new flow's datagrams were dropped and counted"
    );

    // A daemon (re)started while the uplink has no address runs, and still drops.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &flags);
    assert!(node_addr(&node).is_null(), "{}", nat_table(&node));
    let dropped = drops(&node);
    assert!(udp_round_trip(&pod.netns, 5003, external(UDP_PORT), b"none").is_err());
    assert_eq!(udp.peers(), first, "nothing reached the external host");
    assert!(
        drops(&node) > dropped,
        "dropped and counted after the restart"
    );

    // A new address: new flows leave from it, and the flow of before goes on from it
    // with its node port.
    let new_addr = "198.18.0.9";
    node.netns
        .ip(&["addr", "add", &format!("{new_addr}/24"), "dev", "uplink0"]);
    node.netns
        .ip(&["route", "replace", "default", "via", EXTERNAL_ADDR]);
    assert!(
        eventually(Duration::from_secs(5), || node_addr(&node) == new_addr),
        "the daemon took the new address: {}",
        nat_table(&node)
    );
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"old flow").expect("the old flow");
    udp_round_trip(&pod.netns, 5002, external(UDP_PORT), b"new flow").expect("a new flow");
    let after: Vec<SocketAddr> = udp.peers()[first.len()..].to_vec();
    assert_eq!(node_ips(&after), BTreeSet::from([new_addr.to_owned()]));
    assert_eq!(
        after[0].port(),
        first[0].port(),
        "the old flow kept its node port"
    );
}

#[test]
fn an_uplink_device_created_again_gets_the_programs_back_and_pods_still_leave_translated() {
    uplink_created_again("10.244.66.0/24", &[]);
}

#[test]
fn with_clsact_filters_an_uplink_device_created_again_gets_them_back_too() {
    uplink_created_again("10.244.90.0/24", &["--enable-tcx", "false"]);
}

/// A node started with `flags` whose uplink device is deleted and created again: the
/// programs come back on the new device (once each) and the pod's traffic still leaves
/// translated.
fn uplink_created_again(subnet: &str, flags: &[&str]) {
    require_root();
    let node = Node::start_with(subnet, &[], flags);
    let pod = node.add_pod("replug");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"before").expect("UDP through NAT");

    // The uplink goes (its veth peer with it) and a new device of the same name comes,
    // with the same address and route: a NIC replugged, a bond rebuilt.
    node.netns.ip(&["link", "del", "uplink0"]);
    node.netns.link_veth(
        "uplink0",
        &format!("{NODE_ADDR}/24"),
        &node.external,
        "eth0",
        &format!("{EXTERNAL_ADDR}/24"),
    );
    node.netns
        .ip(&["route", "replace", "default", "via", EXTERNAL_ADDR]);
    let link: Value = serde_json::from_str(&node.netns.ip(&["-j", "link", "show", "uplink0"]))
        .expect("ip -j link");
    let ifindex = link[0]["ifindex"].as_u64().expect("an ifindex");
    assert!(
        eventually(
            Duration::from_secs(5),
            || nat_table(&node)["uplink_ifindex"] == ifindex
        ),
        "the datapath learnt the new device: {}",
        nat_table(&node)
    );
    let status = node.instance.cli_json(&["status"]);
    let on_uplink: Vec<&Value> = status["attachments"]
        .as_array()
        .expect("attachments")
        .iter()
        .filter(|a| a["interface"] == "uplink0")
        .collect();
    assert_eq!(
        on_uplink.len(),
        2,
        "egress and ingress, once each: {status}"
    );
    assert!(
        on_uplink.iter().all(|a| a["ifindex"] == ifindex),
        "{status}"
    );
    assert_eq!(
        node.netns.tc_programs("uplink0"),
        ["uplink_ingress", "uplink_egress"],
        "the kernel has both on the new device, once each"
    );

    udp_round_trip(&pod.netns, 5001, external(UDP_PORT), b"after").expect("UDP through NAT");
    assert_eq!(
        node_ips(&udp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "translated before and after: the pod's address never left the node"
    );
}

#[test]
fn the_uplink_follows_the_default_route_to_another_device() {
    uplink_follows_the_default_route("10.244.69.0/24", &[]);
}

#[test]
fn with_clsact_filters_the_uplink_follows_the_default_route_too() {
    uplink_follows_the_default_route("10.244.89.0/24", &["--enable-tcx", "false"]);
}

/// A node started with `flags`, whose default route moves from uplink0 to uplink1: NAT
/// follows, its programs move (off uplink0), and the pod's traffic leaves translated
/// to uplink1's address.
fn uplink_follows_the_default_route(subnet: &str, flags: &[&str]) {
    require_root();
    let node = Node::start_with(subnet, &[], flags);
    let pod = node.add_pod("failover");
    // A second way out: `uplink1` to another external host. Both hosts answer for one
    // remote address (on their loopback), as two paths to the same service would.
    let second = Netns::new("ext2");
    node.netns
        .link_veth("uplink1", "198.19.0.1/24", &second, "eth0", "198.19.0.2/24");
    let remote = "203.0.113.10";
    for host in [&node.external, &second] {
        host.ip(&["addr", "add", &format!("{remote}/32"), "dev", "lo"]);
    }
    let (first_server, second_server) = (
        EchoServer::start(&node.external, TCP_PORT),
        EchoServer::start(&second, TCP_PORT),
    );
    let to: SocketAddr = format!("{remote}:{TCP_PORT}").parse().expect("address");
    round_trip(&pod.netns, to, b"by uplink0").expect("TCP through NAT on uplink0");
    assert_eq!(
        node_ips(&first_server.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );

    // The default route fails over to uplink1.
    node.netns
        .ip(&["route", "replace", "default", "via", "198.19.0.2"]);
    let link: Value = serde_json::from_str(&node.netns.ip(&["-j", "link", "show", "uplink1"]))
        .expect("ip -j link");
    let ifindex = link[0]["ifindex"].as_u64().expect("an ifindex");
    assert!(
        eventually(Duration::from_secs(5), || {
            let table = nat_table(&node);
            table["uplink_ifindex"] == ifindex && table["node_addr"] == "198.19.0.1"
        }),
        "NAT moved to uplink1: {}",
        nat_table(&node)
    );
    let status = node.instance.cli_json(&["status"]);
    let uplink_programs: Vec<&Value> = status["attachments"]
        .as_array()
        .expect("attachments")
        .iter()
        .filter(|a| a["program"] == "uplink_egress" || a["program"] == "uplink_ingress")
        .collect();
    assert_eq!(uplink_programs.len(), 2, "{status}");
    assert!(
        uplink_programs.iter().all(|a| a["interface"] == "uplink1"),
        "{status}"
    );
    assert!(
        node.netns.tc_programs("uplink0").is_empty(),
        "uplink0 kept none"
    );
    assert_eq!(
        node.netns.tc_programs("uplink1"),
        ["uplink_ingress", "uplink_egress"],
        "the kernel has both on uplink1"
    );

    round_trip(&pod.netns, to, b"by uplink1").expect("TCP through NAT on uplink1");
    assert_eq!(
        node_ips(&second_server.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()]),
        "the second host sees uplink1's address, never the pod's"
    );
}

/// The uplink pins in the node's links folder, sorted.
fn uplink_pins(node: &Node) -> Vec<String> {
    let dir = node.instance.bpf_dir.join("links");
    let mut pins: Vec<String> = std::fs::read_dir(&dir)
        .expect("the links folder")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("uplink_"))
        .collect();
    pins.sort();
    pins
}

#[test]
fn a_second_uplink_translates_to_its_own_address() {
    require_root();
    let mut node = Node::start("10.244.70.0/24");
    let pod = node.add_pod("two-nics");
    // A second network (storage, say) on `uplink1`: its hosts are reached there, and
    // know nothing of the pods, as on a real node with a second NIC.
    let storage = Netns::new("storage");
    let storage_addr = "198.19.0.2";
    node.netns.link_veth(
        "uplink1",
        "198.19.0.1/24",
        &storage,
        "eth0",
        &format!("{storage_addr}/24"),
    );
    let (internet, storage_server) = (
        EchoServer::start(&node.external, TCP_PORT),
        EchoServer::start(&storage, TCP_PORT),
    );
    let storage_udp = UdpEcho::start(&storage, UDP_PORT);
    let to_storage =
        |port: u16| -> SocketAddr { format!("{storage_addr}:{port}").parse().expect("address") };

    // Restarted with both uplinks: no device gets the programs twice. clsact filters
    // (kernels before 6.6) have no pins.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    let both = ["--uplink", "uplink0,uplink1"];
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &both);
    let pins: &[&str] = if kernel::has_tcx() {
        &[
            "uplink_egress@uplink0",
            "uplink_egress@uplink1",
            "uplink_ingress@uplink0",
            "uplink_ingress@uplink1",
        ]
    } else {
        &[]
    };
    assert_eq!(
        uplink_pins(&node),
        pins,
        "one pair of pins per uplink (with TCX)"
    );
    for device in ["uplink0", "uplink1"] {
        assert_eq!(
            node.netns.tc_programs(device),
            ["uplink_ingress", "uplink_egress"],
            "the kernel has each program once on {device}"
        );
    }

    round_trip(&pod.netns, to_storage(TCP_PORT), b"to storage").expect("TCP out of uplink1");
    udp_round_trip(&pod.netns, 0, to_storage(UDP_PORT), b"udp").expect("UDP out of uplink1");
    round_trip(&pod.netns, external(TCP_PORT), b"to the internet").expect("TCP out of uplink0");
    assert_eq!(
        node_ips(&storage_server.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()]),
        "the storage host sees uplink1's address, never the pod's"
    );
    assert_eq!(
        node_ips(&storage_udp.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()])
    );
    assert_eq!(
        node_ips(&internet.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "the external host still sees uplink0's"
    );

    let table = nat_table(&node);
    let uplinks: Vec<(&str, &str)> = table["uplinks"]
        .as_array()
        .expect("uplinks")
        .iter()
        .map(|u| {
            (
                u["name"].as_str().expect("a name"),
                u["node_addr"].as_str().expect("an address"),
            )
        })
        .collect();
    assert_eq!(
        uplinks,
        [("uplink0", NODE_ADDR), ("uplink1", "198.19.0.1")],
        "{table}"
    );
    let node_of = |remote: &str| -> BTreeSet<String> {
        table["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["remote"].as_str().is_some_and(|r| r.starts_with(remote)))
            .map(|e| {
                let node: SocketAddr = e["node"].as_str().expect("node").parse().expect("addr");
                node.ip().to_string()
            })
            .collect()
    };
    assert_eq!(
        node_of(storage_addr),
        BTreeSet::from(["198.19.0.1".to_owned()]),
        "{table}"
    );
    assert_eq!(
        node_of(EXTERNAL_ADDR),
        BTreeSet::from([NODE_ADDR.to_owned()]),
        "{table}"
    );
    let status = node.instance.cli_json(&["status"]);
    let names: Vec<&Value> = status["uplinks"]
        .as_array()
        .expect("uplinks")
        .iter()
        .map(|u| &u["name"])
        .collect();
    assert_eq!(names, ["uplink0", "uplink1"], "{status}");

    // Restarted with the second one only: the first loses its programs and pins.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &["--uplink", "uplink1"]);
    assert!(
        node.netns.tc_programs("uplink0").is_empty(),
        "uplink0 kept none"
    );
    let pins: &[&str] = if kernel::has_tcx() {
        &["uplink_egress@uplink1", "uplink_ingress@uplink1"]
    } else {
        &[]
    };
    assert_eq!(uplink_pins(&node), pins);
    round_trip(&pod.netns, to_storage(TCP_PORT), b"again").expect("TCP out of uplink1");
    assert_eq!(
        node_ips(&storage_server.peers()),
        BTreeSet::from(["198.19.0.1".to_owned()])
    );
}
