//! The pinned state across restarts: pins of this layout are kept with their flows;
//! pins of another layout (a `LAYOUT` of another version, or none: before the first
//! release) are replaced, the daemon says so and starts fresh, and pods keep working;
//! the NAT tables take the size asked, and a new size creates them anew.

use std::collections::BTreeSet;

use aya::maps::{Array, Map, MapData};
use cni_ebpf_common::{LAYOUT_VERSION, map_names};
use ebpf_cni_tests::{
    daemon::Daemon,
    node::{NODE_ADDR, Node},
    require_root,
    snat::{UDP_PORT, external, nat_table, node_ips},
    traffic::{UdpEcho, udp_round_trip},
};

/// The source-NAT flows `ebpf-cnid nat` lists.
fn flows(node: &Node) -> usize {
    nat_table(node)["entries"].as_array().map_or(0, Vec::len)
}

/// The pinned `LAYOUT`: `None` without a pin.
fn layout(node: &Node) -> Option<u32> {
    let pin = node.instance.bpf_dir.join(map_names::LAYOUT);
    if !pin.exists() {
        return None;
    }
    let map = MapData::from_pin(&pin).expect("a readable LAYOUT");
    let array = Array::<_, u32>::try_from(Map::Array(map)).expect("an array of u32");
    Some(array.get(&0, 0).expect("one version"))
}

/// How often the daemon said it started fresh.
fn fresh_starts(node: &Node) -> usize {
    node.instance.log().matches("of another layout").count()
}

/// Stops the node's daemon cleanly and starts it again with `args`.
fn restart(node: &mut Node, args: &[&str]) {
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], args);
}

/// Asserts that the daemon said `times` fresh starts so far.
fn assert_fresh_starts(node: &Node, times: usize) {
    assert_eq!(
        fresh_starts(node),
        times,
        "said in the log:\n{}",
        node.instance.log()
    );
}

#[test]
fn pins_of_another_layout_are_replaced_and_pods_keep_working() {
    require_root();
    let mut node = Node::start("10.244.68.0/24");
    let pod = node.add_pod("layout");
    let _udp = UdpEcho::start(&node.external, UDP_PORT);
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"first").expect("UDP through NAT");
    assert_eq!(layout(&node), Some(LAYOUT_VERSION), "written at the load");
    assert_eq!(flows(&node), 1);

    // Pins from before the first release: no LAYOUT beside them.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    std::fs::remove_file(node.instance.bpf_dir.join(map_names::LAYOUT)).expect("unpin LAYOUT");
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_fresh_starts(&node, 1);
    assert_eq!(layout(&node), Some(LAYOUT_VERSION));
    assert_eq!(flows(&node), 0, "fresh tables: the old flow is gone");
    udp_round_trip(&pod.netns, 5001, external(UDP_PORT), b"second")
        .expect("the pod's traffic still translated");
    assert_eq!(flows(&node), 1);

    // A later layout's pins: LAYOUT holds another version.
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    let pin = node.instance.bpf_dir.join(map_names::LAYOUT);
    let map = MapData::from_pin(&pin).expect("a readable LAYOUT");
    Array::<_, u32>::try_from(Map::Array(map))
        .expect("an array of u32")
        .set(0, LAYOUT_VERSION + 1, 0)
        .expect("another version");
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_fresh_starts(&node, 2);
    assert_eq!(layout(&node), Some(LAYOUT_VERSION));
    assert_eq!(flows(&node), 0, "fresh tables again");
    udp_round_trip(&pod.netns, 5002, external(UDP_PORT), b"third")
        .expect("the pod's traffic still translated");

    // This layout's pins: kept, with their flows.
    restart(&mut node, &[]);
    assert_eq!(fresh_starts(&node), 2, "no fresh start over its own layout");
    assert_eq!(flows(&node), 1, "the flow kept");
    let status = node.instance.cli_json(&["status"]);
    assert_eq!(
        status["endpoints"].as_u64(),
        Some(1),
        "the pod still recorded: {status}"
    );
}

#[test]
fn the_nat_tables_take_the_asked_size_and_a_new_size_creates_them_anew() {
    require_root();
    let small = ["--nat-max-flows", "4096"];
    let mut node = Node::start_with("10.244.67.0/24", &[], &small);
    let pod = node.add_pod("size");
    let udp = UdpEcho::start(&node.external, UDP_PORT);
    let sizes = |node: &Node| {
        [
            map_names::NAT_OUT,
            map_names::NAT_IN,
            map_names::NAT_INBOUND,
            map_names::HOSTPORT_FLOWS,
            map_names::DEST_PORTS,
        ]
        .map(|name| node.pinned_layout(name).1)
    };
    assert_eq!(sizes(&node), [4096; 5]);
    assert_eq!(nat_table(&node)["max_flows"], 4096);
    udp_round_trip(&pod.netns, 5000, external(UDP_PORT), b"small").expect("UDP through NAT");
    assert_eq!(flows(&node), 1);

    restart(&mut node, &small);
    assert_eq!(
        flows(&node),
        1,
        "the same size keeps the tables and their flows"
    );

    restart(&mut node, &[]);
    assert_eq!(sizes(&node), [262_144; 5], "the default size");
    assert_eq!(flows(&node), 0, "new tables, the old flows gone");
    assert!(
        node.instance.log().contains("the NAT tables change size"),
        "said in the log"
    );
    udp_round_trip(&pod.netns, 5001, external(UDP_PORT), b"default").expect("UDP through NAT");
    assert_eq!(flows(&node), 1);
    assert_eq!(
        node_ips(&udp.peers()),
        BTreeSet::from([NODE_ADDR.to_owned()])
    );
}
