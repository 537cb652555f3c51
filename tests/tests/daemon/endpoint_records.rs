//! Endpoint records against a crash of the machine (issue 23, point 7): records are
//! root-only; an empty or cut-short record at start is set aside (`<name>.bad`) with a
//! warning and its endpoint rebuilt from the node's veth and endpoints map; a record
//! whose veth is gone is dropped; a half-written temporary file is removed. None of it
//! stops the daemon.

use std::{fs, os::unix::fs::PermissionsExt};

use ebpf_cni_tests::{daemon::Daemon, node::Node, require_root};

#[test]
fn unreadable_records_are_set_aside_and_rebuilt_from_the_node() {
    require_root();
    let mut node = Node::start("10.244.93.0/24");
    let cut = node.add_pod("records-cut");
    let kept = node.add_pod("records-kept");
    let state = node.instance.state_dir.clone();
    let record = |id: &str| state.join(format!("{id}@eth0.json"));
    let mode = fs::metadata(record("records-kept"))
        .expect("a record")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "records are root-only");
    let before = node.endpoint(&cut);
    let kept_before = node.endpoint(&kept);

    assert!(node.daemon.stop(), "the daemon stops cleanly");
    let full = fs::read(record("records-cut")).expect("read");
    fs::write(record("records-cut"), &full[..full.len() / 2]).expect("cut a record short");
    fs::write(record("records-ghost"), b"").expect("an empty record, no veth");
    fs::write(state.join("records-tmp@eth0.json.tmp"), b"{").expect("a half-written file");
    node.daemon = Daemon::start(&node.netns, &node.instance, &[]);

    let after = node.endpoint(&cut);
    assert_eq!(after["host_veth"], before["host_veth"], "{after}");
    assert_eq!(after["host_ifindex"], before["host_ifindex"], "{after}");
    assert_eq!(after["mac"], before["mac"], "{after}");
    let addr = |endpoint: &serde_json::Value| {
        endpoint["ips"][0]
            .as_str()
            .and_then(|ip| ip.split('/').next())
            .map(str::to_owned)
    };
    assert_eq!(addr(&after), Some(cut.ip.to_string()), "{after}");
    assert_eq!(node.endpoint(&kept)["host_veth"], kept_before["host_veth"]);
    assert!(
        state.join("records-cut@eth0.json.bad").exists(),
        "the bad record is kept aside"
    );
    assert!(state.join("records-ghost@eth0.json.bad").exists());
    assert!(!record("records-ghost").exists(), "no veth: no record");
    assert!(
        !state.join("records-tmp@eth0.json.tmp").exists(),
        "temporary file removed"
    );
    let rebuilt = fs::read(record("records-cut")).expect("the record is written again");
    assert!(serde_json::from_slice::<serde_json::Value>(&rebuilt).is_ok());
    assert!(
        node.instance.log().contains("set aside"),
        "a warning says so:\n{}",
        node.instance.log()
    );
    assert_eq!(
        node.instance
            .cli_json(&["endpoints"])
            .as_array()
            .map(Vec::len),
        Some(2),
        "the two pods, no ghost"
    );
    node.del_pod(&cut);
    node.del_pod(&kept);
    assert!(
        node.host_veths().is_empty(),
        "DEL works on a rebuilt endpoint"
    );
}
