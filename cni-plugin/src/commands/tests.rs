//! Which config each verb hands its IPAM plugin ([`Invocation::ipam_config`]): where the
//! node's pod ranges come from for a `usePodCidr` range, with a fake daemon or none.

use std::{
    borrow::Cow,
    io::{Read, Write},
    os::unix::net::UnixListener,
    path::Path,
    thread::JoinHandle,
};

use cni_api::{Envelope, PROTOCOL_VERSION, Response};
use serde_json::json;

use super::*;
use crate::ipam::tests::TempDir;

const SOCKET: &str = "ebpf-cnid.sock";

/// The invocation of `command` for a network whose daemon listens (or not) in `dir`.
fn invocation(command: &str, dir: &Path, ipam: &Value) -> Invocation {
    let env = Environment::from_vars(
        [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/var/run/netns/c1"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .map(|(var, value)| (var.to_owned(), value.to_owned())),
    )
    .expect("a valid environment");
    let stdin = json!({
        "cniVersion": "1.1.0",
        "name": "pods",
        "type": "ebpf-cni",
        "daemonSocket": dir.join(SOCKET),
        "ipam": ipam,
    });
    let conf = NetConf::parse(stdin.to_string().as_bytes()).expect("a valid config");
    Invocation { env, conf }
}

fn use_pod_cidr() -> Value {
    json!({"type": "host-local", "ranges": [[{"subnet": "usePodCidr"}]]})
}

fn filled(cidr: &str) -> Value {
    json!({"type": "host-local", "ranges": [[{"subnet": cidr}]]})
}

/// A daemon in `dir` answering one request with a status giving `pod_cidrs`.
fn fake_daemon(dir: &Path, pod_cidrs: &[&str]) -> JoinHandle<()> {
    let listener = UnixListener::bind(dir.join(SOCKET)).expect("the fake daemon listens");
    let status = serde_json::from_value(json!({
        "daemon_version": "test",
        "bpf_dir": "/sys/fs/bpf/ebpf-cni",
        "datapath_loaded": true,
        "endpoints": 0,
        "attachments": [],
        "node_source": "in-cluster",
        "pod_cidrs": pod_cidrs,
    }))
    .expect("a daemon's status");
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("the plugin connects");
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).expect("a request frame");
        let mut request = vec![0u8; u32::from_be_bytes(len) as usize];
        stream.read_exact(&mut request).expect("a request body");
        let reply = Envelope {
            version: PROTOCOL_VERSION,
            body: Response::Status(status),
        };
        let frame = cni_api::encode(&reply).expect("the reply encodes");
        stream.write_all(&frame).expect("the reply is sent");
    })
}

fn write_pod_cidrs_file(dir: &Path, content: &str) {
    std::fs::write(dir.join(cni_api::NODE_POD_CIDRS_FILE), content)
        .expect("the pod ranges file is written");
}

#[test]
fn config_without_placeholder_goes_as_received_without_asking_the_daemon() {
    let dir = TempDir::new("ipam-config-as-received");
    let ipam = filled("10.244.1.0/24");
    for command in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
        let inv = invocation(command, dir.path(), &ipam);
        // No daemon listens: asking it would fail.
        match inv.ipam_config(None) {
            Ok(Cow::Borrowed(config)) => assert!(std::ptr::eq(config, inv.conf.raw())),
            other => panic!("{command}: the raw config, got {other:?}"),
        }
    }
}

#[test]
fn placeholder_is_filled_from_the_daemon_when_it_answers() {
    let dir = TempDir::new("ipam-config-daemon");
    // The file says otherwise: the daemon's answer wins.
    write_pod_cidrs_file(dir.path(), r#"["10.9.0.0/24"]"#);
    let daemon = fake_daemon(dir.path(), &["10.244.7.0/24"]);
    let inv = invocation("DEL", dir.path(), &use_pod_cidr());
    let config = inv.ipam_config(None).expect("the daemon gives a pod range");
    daemon.join().expect("the fake daemon answered");
    assert_eq!(config["ipam"], filled("10.244.7.0/24"));
}

#[test]
fn daemon_without_pod_range_is_try_again_later() {
    let dir = TempDir::new("ipam-config-daemon-empty");
    let daemon = fake_daemon(dir.path(), &[]);
    let inv = invocation("CHECK", dir.path(), &use_pod_cidr());
    let error = inv.ipam_config(None).expect_err("no pod range");
    daemon.join().expect("the fake daemon answered");
    assert_eq!(error.code, ErrorCode::TryAgainLater);
    assert!(
        error.msg.contains("this node has no pod range yet"),
        "{}",
        error.msg
    );
}

#[test]
fn verbs_but_add_read_the_pod_ranges_file_when_the_daemon_does_not_answer() {
    let dir = TempDir::new("ipam-config-file");
    write_pod_cidrs_file(dir.path(), r#"["10.244.3.0/24"]"#);
    for command in ["DEL", "CHECK", "GC", "STATUS"] {
        let inv = invocation(command, dir.path(), &use_pod_cidr());
        let config = inv
            .ipam_config(None)
            .unwrap_or_else(|error| panic!("{command}: the file is read: {error}"));
        assert_eq!(config["ipam"], filled("10.244.3.0/24"), "{command}");
    }
}

#[test]
fn del_without_daemon_nor_file_is_try_again_later_naming_both() {
    let dir = TempDir::new("ipam-config-nothing");
    let inv = invocation("DEL", dir.path(), &use_pod_cidr());
    let error = inv.ipam_config(None).expect_err("no source of pod ranges");
    assert_eq!(error.code, ErrorCode::TryAgainLater);
    assert!(
        error.msg.contains("ebpf-cnid is not running")
            && error.msg.contains(cni_api::NODE_POD_CIDRS_FILE),
        "{}",
        error.msg
    );
}

#[test]
fn add_never_reads_the_file() {
    let dir = TempDir::new("ipam-config-add");
    write_pod_cidrs_file(dir.path(), r#"["10.244.3.0/24"]"#);
    let inv = invocation("ADD", dir.path(), &use_pod_cidr());
    let error = inv.ipam_config(None).expect_err("ADD needs the daemon");
    assert_eq!(error.code, ErrorCode::TryAgainLater);
    assert_eq!(error.msg, "ebpf-cnid is not running on this node");
}
