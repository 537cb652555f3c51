//! One pod cannot flush the flow tables the node's pods share (issue 23, point 4): with
//! `--nat-max-flows 1024`, a pod opening 15,000 UDP flows to the outside is refused
//! past its budget (half the table), counted for it in `ebpf-cnid nat`, and another
//! pod's idle connection through source NAT keeps its translation and still works. With
//! the LRU tables of before, the flood evicted that connection's flow and its next
//! segment left from a new node port, which the server answered with a reset.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
};

use ebpf_cni_tests::{
    node::{EXTERNAL_ADDR, Node},
    require_root,
    snat::{TCP_PORT, external, nat_table},
    traffic::{EchoServer, many_connections, run_in},
};

const UDP_PORT: u16 = 9095;
const FLOOD: u16 = 15_000;

#[test]
fn a_pod_flooding_new_flows_is_refused_past_its_budget_and_another_pods_connection_lives() {
    require_root();
    let node = Node::start_with("10.244.97.0/24", &[], &["--nat-max-flows", "1024"]);
    let victim = node.add_pod("budget-victim");
    let flooder = node.add_pod("budget-flooder");
    let _server = EchoServer::start(&node.external, TCP_PORT);
    let to_server = SocketAddrV4::new(
        EXTERNAL_ADDR.parse::<Ipv4Addr>().expect("an address"),
        TCP_PORT,
    );
    let mut connection = many_connections(&victim.netns, to_server.into(), 1)
        .expect("a connection")
        .pop()
        .expect("one connection");
    connection.write_all(b"before\n").expect("send");
    let mut back = [0u8; 7];
    connection.read_exact(&mut back).expect("echoed");

    run_in(&flooder.netns, || {
        for port in 20_000..20_000 + FLOOD {
            let socket = UdpSocket::bind(("0.0.0.0", port)).expect("bind");
            // A refused datagram is dropped on the uplink: the send itself succeeds.
            socket.send_to(b"flood", external(UDP_PORT)).expect("send");
        }
    });

    connection
        .write_all(b"after!\n")
        .expect("send after the flood");
    connection
        .read_exact(&mut back)
        .expect("the connection still echoes: its flow was not evicted");
    assert_eq!(&back, b"after!\n");

    let table = nat_table(&node);
    assert_eq!(table["budgets"]["pod_flows"], 512, "half of 1024: {table}");
    let endpoints = table["endpoints"].as_array().expect("endpoints");
    let flooder_addr = flooder.ip.to_string();
    let flooder_view = endpoints
        .iter()
        .find(|view| view["pod"] == flooder_addr.as_str())
        .unwrap_or_else(|| panic!("the flooding pod is listed: {table}"));
    assert_eq!(
        flooder_view["counted"]["out"], 512,
        "it holds its budget: {flooder_view}"
    );
    let refused = flooder_view["refused_by"]["flow_budget"]
        .as_u64()
        .expect("a count");
    assert!(
        refused >= u64::from(FLOOD) - 512 - 1,
        "every flow past the budget refused and counted for it: {flooder_view}"
    );
    let victim_addr = victim.ip.to_string();
    let victim_view = endpoints
        .iter()
        .find(|view| view["pod"] == victim_addr.as_str())
        .unwrap_or_else(|| panic!("the other pod is listed: {table}"));
    assert_eq!(victim_view["refused"], 0, "{victim_view}");
    assert_eq!(
        victim_view["flows"], 1,
        "its connection's flow: {victim_view}"
    );
}
