//! The uplink programs (source NAT) across daemon restarts, attached both ways the daemon
//! knows: TCX links (Linux >= 6.6, the default there) and clsact filters (older kernels,
//! or `--enable-tcx false`, which lets a newer kernel run the older kernels' path). Either way
//! a pod's TCP connection to the external host goes on through every restart, the
//! uplink carries each program once, and uninstall takes them off.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use aya::programs::{
    SchedClassifier, TcAttachType,
    tc::{NlOptions, TcAttachOptions},
};
use cni_ebpf_common::program_names;
use ebpf_cni_tests::{
    bpf_object::BpfObject,
    daemon::{Daemon, eventually},
    kernel,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root, time_scale,
    traffic::{EchoServer, Stream, round_trip, run_in},
};

const PORT: u16 = 8090;

/// How many times [`stream_through_restarts`] restarts the daemon: 8 on this machine,
/// 3 in a slow guest, where each restart takes over a minute (its programs verified under
/// software emulation) and 8 would outlast the stream's and the binary's time limits.
/// Three restarts already show each one replacing the programs in place.
fn restarts() -> usize {
    if time_scale() > 1 { 3 } else { 8 }
}

/// `ebpf-cnid run` flags of the clsact path.
const CLSACT: [&str; 2] = ["--enable-tcx", "false"];

/// The BPF filters on the node's `uplink0` hook `direction` (ingress or egress), as
/// (program name, preference), asked from the kernel with `tc`.
fn uplink_filters(node: &Node, direction: &str) -> Vec<(String, u64)> {
    node.netns.bpf_filters(&["dev", "uplink0", direction])
}

/// How `status` says the uplink programs are attached, one mode per program.
fn uplink_modes(node: &Node) -> Vec<String> {
    let status = node.instance.cli_json(&["status"]);
    let mut modes: Vec<String> = status["attachments"]
        .as_array()
        .expect("status lists attachments")
        .iter()
        .filter(|a| a["interface"] == "uplink0")
        .map(|a| format!("{} {}", a["program"].as_str().unwrap_or("?"), a["mode"]))
        .collect();
    modes.sort();
    modes
}

/// Starts a node with `flags`, a pod streaming to the external host through source NAT,
/// restarts the daemon [`restarts`] times, and checks the stream never broke and the
/// external host only ever saw the node's address. Returns the node, daemon running.
fn stream_through_restarts(subnet: &str, flags: &[&str]) -> Node {
    let mut node = Node::start_with(subnet, &[], flags);
    let pod = node.add_pod("upa-a");
    let server = EchoServer::start(&node.external, PORT);
    let to: SocketAddr = format!("{EXTERNAL_ADDR}:{PORT}").parse().expect("address");
    let stream = Stream::start(&pod.netns, to);
    let flowing = |before: u64| eventually(Duration::from_secs(5), || stream.echoed() > before);
    assert!(flowing(0), "the stream starts");
    for round in 1..=restarts() {
        let before = stream.echoed();
        assert!(node.daemon.stop(), "the daemon stops (round {round})");
        node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], flags);
        assert!(flowing(before), "the stream flows after restart {round}");
    }
    stream
        .finish()
        .expect("the stream never broke across the restarts");
    let peers = server.peers();
    assert!(!peers.is_empty(), "the server saw the stream");
    assert!(
        peers.iter().all(|peer| peer.ip().to_string() == NODE_ADDR),
        "the external host only saw the node's address: {peers:?}"
    );
    node
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Tcx,
    Clsact,
}

/// The daemon's default: TCX links where the kernel has them (6.6), else clsact
/// filters (the path Debian 12's 6.1 takes; `cargo xtask vm-test` runs it there).
fn default_mode() -> Mode {
    if kernel::has_tcx() {
        Mode::Tcx
    } else {
        Mode::Clsact
    }
}

/// The uplink carries each program once, the way `mode` attaches it, and `status`
/// says so.
fn assert_attached(node: &Node, mode: Mode) {
    type Filters = Vec<(String, u64)>;
    let (label, tcx, filters): (&str, &[&str], [Filters; 2]) = match mode {
        Mode::Tcx => (
            "tcx",
            &["uplink_ingress", "uplink_egress"],
            [vec![], vec![]],
        ),
        // One filter per hook at the fixed preference: each restart replaced the
        // program in place, none added a filter.
        Mode::Clsact => (
            "clsact",
            &[],
            [
                vec![("uplink_ingress".to_owned(), 0xc001)],
                vec![("uplink_egress".to_owned(), 0xc001)],
            ],
        ),
    };
    assert_eq!(
        uplink_modes(node),
        [
            format!("uplink_egress \"{label}\""),
            format!("uplink_ingress \"{label}\"")
        ]
    );
    assert_eq!(
        node.netns.tcx_programs("uplink0"),
        tcx,
        "{mode:?}: the uplink's TCX programs"
    );
    for (direction, filters) in ["ingress", "egress"].into_iter().zip(filters) {
        assert_eq!(
            uplink_filters(node, direction),
            filters,
            "{mode:?}: the filters on the uplink's {direction}"
        );
    }
}

#[test]
fn with_the_default_attach_mode_source_nat_goes_on_across_restarts() {
    require_root();
    let node = stream_through_restarts("10.244.82.0/24", &[]);
    assert_attached(&node, default_mode());
}

#[test]
fn with_clsact_filters_source_nat_goes_on_across_restarts_and_uninstall_takes_them() {
    require_root();
    let mut node = stream_through_restarts("10.244.83.0/24", &CLSACT);
    assert_attached(&node, Mode::Clsact);

    // The filters outlive the daemon (translation goes on while it is stopped), and
    // uninstall, which removes the maps' pins, takes them off too.
    assert!(node.daemon.stop());
    assert_eq!(
        uplink_filters(&node, "ingress").len(),
        1,
        "kept while stopped"
    );
    let out = node.instance.cli(&["uninstall"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for direction in ["ingress", "egress"] {
        assert_eq!(
            uplink_filters(&node, direction),
            [],
            "uninstall left a filter on the uplink's {direction}"
        );
    }
}

/// Attaches the program pinned at `pin` to `uplink0`'s `direction` inside `node` without
/// a fixed preference: a netlink filter at the preference the kernel chooses, named
/// after the program, left in the kernel.
fn attach_at_the_kernels_preference(node: &Node, pin: PathBuf, direction: TcAttachType) {
    run_in(&node.netns, move || {
        let mut program = SchedClassifier::from_pin(&pin).expect("the pinned program");
        let id = program
            .attach_with_options(
                "uplink0",
                direction,
                TcAttachOptions::Netlink(NlOptions::default()),
            )
            .expect("a netlink filter");
        std::mem::forget(program.take_link(id).expect("the link"));
    });
}

#[test]
fn filters_of_the_programs_at_another_preference_give_way_to_the_daemons() {
    require_root();
    let mut node = Node::start_with("10.244.84.0/24", &[], &CLSACT);
    let pod = node.add_pod("upa-b");
    let _server = EchoServer::start(&node.external, PORT);
    let to: SocketAddr = format!("{EXTERNAL_ADDR}:{PORT}").parse().expect("address");
    assert!(node.daemon.stop());
    // Filters of the same programs at 0xc000 (the kernel's first choice), as a build
    // that let the kernel choose would leave them, in place of the daemon's.
    let mut other = BpfObject::load(
        "upa-other",
        &[program_names::UPLINK_INGRESS, program_names::UPLINK_EGRESS],
    );
    for (direction, name, tc_direction) in [
        (
            "ingress",
            program_names::UPLINK_INGRESS,
            TcAttachType::Ingress,
        ),
        ("egress", program_names::UPLINK_EGRESS, TcAttachType::Egress),
    ] {
        let out = node.netns.run(
            "tc",
            &[
                "filter", "del", "dev", "uplink0", direction, "pref", "49153",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        attach_at_the_kernels_preference(&node, other.pin_program(name), tc_direction);
        assert_eq!(
            uplink_filters(&node, direction),
            [(name.to_owned(), 0xc000)]
        );
    }

    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &CLSACT);
    for (direction, name) in [
        ("ingress", program_names::UPLINK_INGRESS),
        ("egress", program_names::UPLINK_EGRESS),
    ] {
        assert_eq!(
            uplink_filters(&node, direction),
            [(name.to_owned(), 0xc001)],
            "only this release's filter is left on the uplink's {direction}"
        );
    }
    assert_eq!(
        round_trip(&pod.netns, to, b"after the upgrade").as_deref(),
        Ok(&b"after the upgrade"[..]),
        "the pod reaches the external host through this release's programs"
    );
}

#[test]
fn switching_between_tcx_and_clsact_leaves_one_set_of_uplink_programs() {
    require_root();
    let mut node = Node::start("10.244.85.0/24");
    let pod = node.add_pod("upa-c");
    let _server = EchoServer::start(&node.external, PORT);
    let to: SocketAddr = format!("{EXTERNAL_ADDR}:{PORT}").parse().expect("address");
    let reaches = |when: &str| {
        assert_eq!(
            round_trip(&pod.netns, to, when.as_bytes()).as_deref(),
            Ok(when.as_bytes()),
            "the pod reaches the external host {when}"
        );
    };
    assert_attached(&node, default_mode());
    reaches("in the default mode");

    assert!(node.daemon.stop());
    node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &CLSACT);
    assert_attached(&node, Mode::Clsact);
    reaches("with clsact filters");

    assert!(node.daemon.stop());
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_attached(&node, default_mode());
    reaches("in the default mode again");
}

#[test]
fn with_clsact_filters_the_counter_runs_first_and_the_nat_programs_after_it() {
    require_root();
    let mut node = Node::start_with("10.244.86.0/24", &["uplink0"], &CLSACT);
    let pod = node.add_pod("upa-d");
    let _server = EchoServer::start(&node.external, PORT);
    let to: SocketAddr = format!("{EXTERNAL_ADDR}:{PORT}").parse().expect("address");
    for start in ["first start", "restart"] {
        let status = node.instance.cli_json(&["status"]);
        assert!(
            status["attachments"]
                .as_array()
                .expect("attachments")
                .iter()
                .any(|a| a["program"] == "count_by_source" && a["mode"] == "clsact"),
            "the counter is a clsact filter ({start}): {status}"
        );
        // The counter (at the kernel's preference) runs before the NAT program (at
        // 0xc001), as with TCX links in attach order.
        assert_eq!(
            uplink_filters(&node, "ingress"),
            [
                ("count_by_source".to_owned(), 0xc000),
                ("uplink_ingress".to_owned(), 0xc001)
            ],
            "{start}"
        );
        let message = format!("counted and translated ({start})");
        assert_eq!(
            round_trip(&pod.netns, to, message.as_bytes()).as_deref(),
            Ok(message.as_bytes()),
            "replies still get translated back ({start})"
        );
        assert!(
            node.counted(EXTERNAL_ADDR),
            "the counter saw the replies ({start})"
        );
        assert!(node.daemon.stop());
        node.daemon = Daemon::start_with(&node.netns, &node.instance, &["uplink0"], &CLSACT);
    }
}
