//! `Prepare` and `Unprepare` touch only the plugin's own host veths (issue 23, point 9):
//! a request naming the uplink, a look-alike with another alias, or a device
//! that is not a veth is refused with an error, and a `clsact` qdisc the daemon did not
//! create (the uplink's, which holds the NAT filters without TCX) is never removed.

use cni_api::{ErrorKind, Request, Response};
use ebpf_cni_tests::{daemon::Daemon, node::Node, require_root};

/// The clsact path for the uplink programs: their filters then sit in a clsact qdisc.
const CLSACT: [&str; 2] = ["--enable-tcx", "false"];

fn qdiscs(node: &Node, device: &str) -> String {
    let out = node.netns.run("tc", &["qdisc", "show", "dev", device]);
    assert!(out.status.success(), "tc qdisc show dev {device} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The daemon's refusal of `request`, which must be of `kind`.
fn refused(node: &Node, request: Request, kind: ErrorKind) -> String {
    match node.instance.request(&request) {
        Response::Error(refusal) => {
            assert_eq!(refusal.kind, kind, "{request:?}: {refusal:?}");
            refusal.message
        }
        other => panic!("{request:?} must be refused, the daemon answered {other:?}"),
    }
}

#[test]
fn prepare_refuses_the_uplink_and_leaves_its_nat_filters_in_place() {
    require_root();
    let node = Node::start_with("10.244.91.0/24", &[], &CLSACT);
    let egress = node.netns.bpf_filters(&["dev", "uplink0", "egress"]);
    assert!(
        !egress.is_empty(),
        "the NAT filters sit on uplink0's clsact"
    );
    let before = qdiscs(&node, "uplink0");

    let message = refused(
        &node,
        Request::Prepare {
            host_veth: "uplink0".into(),
        },
        ErrorKind::InvalidRequest,
    );
    assert!(
        message.contains("uplink0"),
        "the error names the link: {message}"
    );
    // Whatever Unprepare answers, it must not take the uplink's clsact away.
    let _ = node.instance.request(&Request::Unprepare {
        host_veth: "uplink0".into(),
    });
    assert_eq!(
        qdiscs(&node, "uplink0"),
        before,
        "uplink0's qdiscs unchanged"
    );
    assert_eq!(
        node.netns.bpf_filters(&["dev", "uplink0", "egress"]),
        egress,
        "uplink0's NAT filters are still there"
    );

    // A pod still gets its veth prepared and bound.
    let pod = node.add_pod("veths-ok");
    assert_eq!(node.host_veths().len(), 1, "the pod's veth is there");
    node.del_pod(&pod);
}

#[test]
fn prepare_refuses_look_alikes_and_never_removes_a_foreign_clsact() {
    require_root();
    let node = Node::start("10.244.92.0/24");
    // The plugin's name shape, with someone else's alias.
    node.netns.ip(&[
        "link",
        "add",
        "veb0000000000a1",
        "type",
        "veth",
        "peer",
        "name",
        "vebpeera1",
    ]);
    node.netns
        .ip(&["link", "set", "veb0000000000a1", "alias", "someone-else"]);
    let message = refused(
        &node,
        Request::Prepare {
            host_veth: "veb0000000000a1".into(),
        },
        ErrorKind::InvalidRequest,
    );
    assert!(message.contains("alias"), "{message}");
    // The alias, but not a veth.
    node.netns
        .ip(&["link", "add", "veb0000000000a2", "type", "bridge"]);
    node.netns.ip(&[
        "link",
        "set",
        "veb0000000000a2",
        "alias",
        "ebpf-cni/net/c2/eth0",
    ]);
    let message = refused(
        &node,
        Request::Prepare {
            host_veth: "veb0000000000a2".into(),
        },
        ErrorKind::InvalidRequest,
    );
    assert!(
        message.contains("neither a veth nor a netkit primary"),
        "{message}"
    );
    // One of ours by name and alias, with a clsact qdisc someone else put there.
    node.netns.ip(&[
        "link",
        "add",
        "veb0000000000a3",
        "type",
        "veth",
        "peer",
        "name",
        "vebpeera3",
    ]);
    node.netns.ip(&[
        "link",
        "set",
        "veb0000000000a3",
        "alias",
        "ebpf-cni/net/c3/eth0",
    ]);
    let out = node
        .netns
        .run("tc", &["qdisc", "add", "dev", "veb0000000000a3", "clsact"]);
    assert!(out.status.success(), "tc qdisc add clsact failed");
    let before = qdiscs(&node, "veb0000000000a3");
    refused(
        &node,
        Request::Prepare {
            host_veth: "veb0000000000a3".into(),
        },
        ErrorKind::NodeFailure,
    );
    let _ = node.instance.request(&Request::Unprepare {
        host_veth: "veb0000000000a3".into(),
    });
    assert_eq!(
        qdiscs(&node, "veb0000000000a3"),
        before,
        "a clsact the daemon did not create stays"
    );
    for link in ["veb0000000000a1", "veb0000000000a2", "veb0000000000a3"] {
        node.netns.ip(&["link", "del", link]);
    }
}

#[test]
fn a_restart_leaves_a_foreign_clsact_on_a_pods_veth_and_still_starts() {
    require_root();
    let mut node = Node::start("10.244.97.0/24");
    let pod = node.add_pod("veths-foreign");
    let veth = node.host_veths().pop().expect("the pod's veth");
    assert!(node.daemon.stop(), "the daemon stops cleanly");
    // Someone replaces the veth's binding with a clsact of their own.
    for args in [
        ["qdisc", "del", "dev", veth.as_str(), "clsact"],
        ["qdisc", "add", "dev", veth.as_str(), "clsact"],
    ] {
        let out = node.netns.run("tc", &args);
        assert!(out.status.success(), "tc {args:?} failed");
    }
    let before = qdiscs(&node, &veth);
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);
    assert_eq!(qdiscs(&node, &veth), before, "their clsact stays");
    assert!(
        node.instance.log().contains("cannot be bound"),
        "a warning says so:\n{}",
        node.instance.log()
    );
    let other = node.add_pod("veths-after");
    node.del_pod(&other);
    node.del_pod(&pod);
}
