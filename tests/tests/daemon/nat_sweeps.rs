//! Many NAT sweeps in a row, each removing hundreds of expired flows in several chunks
//! of the `nat_sweep` program, and none failing (issue 23, point 12): the daemon logs a
//! warning for a sweep with a failed chunk (and still runs the chunks after it), and
//! none appears.

use std::{net::UdpSocket, thread, time::Duration};

use ebpf_cni_tests::{
    daemon::eventually,
    node::Node,
    require_root,
    snat::{external, nat_table},
    traffic::run_in,
};

const UDP_PORT: u16 = 9094;
/// Rounds of new flows, a second apart: about as many sweeps.
const ROUNDS: u16 = 20;
/// New flows a round: several chunks of the sweep program (64 items each).
const FLOWS_PER_ROUND: u16 = 300;

#[test]
fn twenty_seconds_of_sweeps_over_expiring_flows_see_no_chunk_fail() {
    require_root();
    let node = Node::start_with(
        "10.244.96.0/24",
        &[],
        &["--nat-udp-timeout", "1", "--nat-gc-interval", "1"],
    );
    let pod = node.add_pod("sweeps");
    for round in 0..ROUNDS {
        let first = 20_000 + (round % 2) * FLOWS_PER_ROUND;
        run_in(&pod.netns, move || {
            for port in first..first + FLOWS_PER_ROUND {
                let socket = UdpSocket::bind(("0.0.0.0", port)).expect("bind");
                socket.send_to(b"flow", external(UDP_PORT)).expect("send");
            }
        });
        thread::sleep(Duration::from_secs(1));
    }
    assert!(
        eventually(Duration::from_secs(15), || nat_table(&node)["entries"]
            .as_array()
            .is_some_and(Vec::is_empty)),
        "every expired flow was swept: {}",
        nat_table(&node)
    );
    let log = node.instance.log();
    assert!(
        !log.contains("NAT sweep"),
        "no sweep failed, not even one chunk:\n{log}"
    );
}
