//! A failed Attach leaves the node exactly as it was (issue 23, point 13): a re-ADD
//! refused for an address of another pod keeps the live endpoint's record, its map
//! entries, its hostPorts and its veth's binding to the pods' block; one with more
//! addresses than the endpoints map holds leaves no record of them.

use cni_api::{EndpointId, ErrorKind, Request, Response};
use ebpf_cni_tests::{
    node::{NODE_ADDR, Node, Pod, port_mappings, socket},
    require_root,
    traffic::{EchoServer, round_trip},
};

const CONTAINER_PORT: u16 = 8080;

/// `pod`'s endpoint id and the record the daemon holds for it.
fn record_of(node: &Node, pod: &Pod) -> (EndpointId, cni_api::Endpoint) {
    let id = EndpointId {
        container_id: pod.container_id.clone(),
        ifname: "eth0".into(),
    };
    let Response::Endpoint {
        endpoint: Some(record),
    } = node.instance.request(&Request::Get(id.clone()))
    else {
        panic!("{} is known", pod.container_id);
    };
    (id, record)
}
const HOST_PORT: u16 = 30094;

#[test]
fn a_refused_re_add_keeps_the_live_endpoint_its_host_ports_and_binding() {
    require_root();
    let node = Node::start("10.244.94.0/24");
    let live = node.add_pod_with(
        "reattach-live",
        &port_mappings(CONTAINER_PORT, &[(HOST_PORT, "tcp", None)]),
    );
    let other = node.add_pod("reattach-other");
    let (id, record) = record_of(&node, &live);
    let list = |node: &Node| match node.instance.request(&Request::List) {
        Response::Endpoints { endpoints, .. } => endpoints,
        other => panic!("List answered {other:?}"),
    };
    let qdiscs = |node: &Node| {
        let out = node
            .netns
            .run("tc", &["qdisc", "show", "dev", &record.host_veth]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let file = node
        .instance
        .state_dir
        .join(format!("{}@eth0.json", id.container_id));
    let before = (
        list(&node),
        node.instance.cli_json(&["ports"]),
        qdiscs(&node),
        std::fs::read(&file).expect("the record"),
    );
    assert!(before.2.contains("ingress_block"), "bound: {}", before.2);

    // The same pod again, with the other pod's address.
    let mut conflicting = record.clone();
    conflicting.ips = vec![format!("{}/24", other.ip).parse().expect("a prefix")];
    match node
        .instance
        .request(&Request::Attach(Box::new(conflicting)))
    {
        Response::Error(refusal) => {
            assert!(
                refusal.message.contains(&other.ip.to_string()),
                "{refusal:?}"
            );
            assert_eq!(refusal.kind, ErrorKind::AddressTaken);
        }
        other => panic!("a taken address must be refused, the daemon answered {other:?}"),
    }
    let after = (
        list(&node),
        node.instance.cli_json(&["ports"]),
        qdiscs(&node),
        std::fs::read(&file).expect("the record"),
    );
    assert_eq!(after.0, before.0, "the records are as they were");
    assert_eq!(after.1, before.1, "the hostPorts are as they were");
    assert_eq!(after.2, before.2, "the veth is still bound");
    assert_eq!(after.3, before.3, "the record file is as it was");
    let _server = EchoServer::start(&live.netns, CONTAINER_PORT);
    let back = round_trip(&node.external, socket(NODE_ADDR, HOST_PORT), b"still there")
        .expect("the hostPort still leads to the live pod");
    assert_eq!(back, b"still there");
}

/// Entries of the `ENDPOINTS` map (`cni-ebpf/src/primitives/maps.rs`).
const MAX_ENDPOINTS: u32 = 4096;

#[test]
fn a_re_add_past_the_endpoints_map_size_leaves_no_stale_record() {
    require_root();
    let node = Node::start("10.244.98.0/24");
    let live = node.add_pod("reattach-full");
    let id = EndpointId {
        container_id: live.container_id.clone(),
        ifname: "eth0".into(),
    };
    let get = |node: &Node| match node.instance.request(&Request::Get(id.clone())) {
        Response::Endpoint {
            endpoint: Some(record),
        } => record,
        other => panic!("Get answered {other:?}"),
    };
    let record = get(&node);
    let file = node
        .instance
        .state_dir
        .join(format!("{}@eth0.json", id.container_id));
    let bytes = std::fs::read(&file).expect("the record");

    let mut huge = record.clone();
    huge.ips = (0..MAX_ENDPOINTS + 100)
        .map(|n| {
            let [_, _, high, low] = n.to_be_bytes();
            format!("10.250.{high}.{low}/32").parse().expect("a prefix")
        })
        .collect();
    match node.instance.request(&Request::Attach(Box::new(huge))) {
        Response::Error(_) => {}
        other => panic!("more addresses than the map holds must fail, got {other:?}"),
    }
    assert_eq!(get(&node), record, "the record is as it was");
    assert_eq!(
        std::fs::read(&file).expect("the record"),
        bytes,
        "and so is its file"
    );
    let out = node
        .netns
        .run("ping", &["-c", "1", "-W", "2", &live.ip.to_string()]);
    assert!(
        out.status.success(),
        "the pod is still reachable at its address"
    );
}

#[test]
fn an_attach_that_misnames_its_veth_takes_a_node_address_or_a_path_is_refused() {
    require_root();
    let node = Node::start("10.244.99.0/24");
    let live = node.add_pod("attach-checked");
    let (id, record) = record_of(&node, &live);
    let file = node
        .instance
        .state_dir
        .join(format!("{}@eth0.json", id.container_id));
    let bytes = std::fs::read(&file).expect("the record");

    let mut other_index = record.clone();
    other_index.host_ifindex = record.host_ifindex + 1000;
    let mut other_mac = record.clone();
    other_mac.host_mac = "02:00:00:00:00:01".parse().expect("a MAC");
    let mut node_address = record.clone();
    node_address.ips = vec![format!("{NODE_ADDR}/24").parse().expect("a prefix")];
    let mut path = record.clone();
    path.id.container_id = "../../escaped".into();
    let mut ifname = record.clone();
    ifname.id.ifname = "../eth0".into();
    let (invalid, taken) = (ErrorKind::InvalidRequest, ErrorKind::AddressTaken);
    for (endpoint, expected, kind) in [
        (other_index, "index", invalid),
        (other_mac, "MAC", invalid),
        (node_address, "address of this node", taken),
        (path, "container id", invalid),
        (ifname, "interface name", invalid),
    ] {
        match node.instance.request(&Request::Attach(Box::new(endpoint))) {
            Response::Error(refusal) => {
                assert!(
                    refusal.message.contains(expected),
                    "{expected}: {refusal:?}"
                );
                assert_eq!(refusal.kind, kind, "{expected}: {refusal:?}");
            }
            other => panic!("{expected}: must be refused, the daemon answered {other:?}"),
        }
    }
    let escaped = EndpointId {
        container_id: "../escaped".into(),
        ifname: "eth0".into(),
    };
    assert!(
        matches!(
            node.instance.request(&Request::Detach(escaped)),
            Response::Error(refusal) if refusal.kind == ErrorKind::InvalidRequest
        ),
        "a Detach naming a path is refused"
    );
    let parent = node.instance.state_dir.parent().expect("a parent folder");
    assert!(
        !parent.join("escaped@eth0.json").exists()
            && !parent
                .parent()
                .expect("a grandparent")
                .join("escaped@eth0.json")
                .exists(),
        "no record outside the state folder"
    );
    assert_eq!(
        node.instance.request(&Request::Get(id)),
        Response::Endpoint {
            endpoint: Some(record)
        },
        "the record is as it was"
    );
    assert_eq!(std::fs::read(&file).expect("the record"), bytes);
}
