//! The `usePodCidr` placeholder: where it is found, what replaces it, and which pod
//! ranges from the daemon or its file are taken.

use std::{fs, path::Path};

use cni_api::Status;
use ipnet::Ipv4Net;
use serde_json::{Value, json};

use super::{source::MAX_FILE_BYTES, *};
use crate::ipam::tests::TempDir;

fn nets(cidrs: &[&str]) -> Vec<Ipv4Net> {
    cidrs
        .iter()
        .map(|cidr| cidr.parse().expect("a test CIDR"))
        .collect()
}

fn pod_cidrs(cidrs: &[&str]) -> PodCidrs {
    PodCidrs::new(nets(cidrs)).expect("valid test pod ranges")
}

fn conf(ipam: Value) -> Value {
    json!({"cniVersion": "1.0.0", "name": "pods", "type": "ebpf-cni", "ipam": ipam})
}

#[track_caller]
fn code<T: std::fmt::Debug>(outcome: Result<T, CniError>) -> ErrorCode {
    match outcome {
        Ok(value) => panic!("expected a CNI error, got Ok({value:?})"),
        Err(error) => error.code,
    }
}

#[track_caller]
fn filled(config: &Value, cidrs: &[&str]) -> Value {
    assert!(
        needs_pod_cidrs(config).expect("a usable config"),
        "{config} has a placeholder"
    );
    fill(config, &pod_cidrs(cidrs)).expect("the placeholder is filled")
}

#[test]
fn range_placeholder_becomes_one_range_per_pod_cidr_keeping_its_other_keys() {
    let config = conf(json!({
        "type": "host-local",
        "dataDir": "/var/lib/cni/pods",
        "ranges": [[{"subnet": "usePodCidr", "gateway": "10.244.1.1"}]]
    }));
    let expected = conf(json!({
        "type": "host-local",
        "dataDir": "/var/lib/cni/pods",
        "ranges": [[
            {"subnet": "10.244.1.0/24", "gateway": "10.244.1.1"},
            {"subnet": "10.250.0.0/24", "gateway": "10.244.1.1"}
        ]]
    }));
    assert_eq!(
        filled(&config, &["10.244.1.0/24", "10.250.0.0/24"]),
        expected
    );
}

#[test]
fn other_ranges_and_range_sets_are_kept_in_place() {
    let config = conf(json!({
        "type": "host-local",
        "ranges": [
            [{"subnet": "10.9.0.0/24"}, {"subnet": "usePodCidr"}, {"subnet": "10.8.0.0/24"}],
            [{"subnet": "fd00::/64"}]
        ]
    }));
    let expected = conf(json!({
        "type": "host-local",
        "ranges": [
            [{"subnet": "10.9.0.0/24"}, {"subnet": "10.244.1.0/24"}, {"subnet": "10.8.0.0/24"}],
            [{"subnet": "fd00::/64"}]
        ]
    }));
    assert_eq!(filled(&config, &["10.244.1.0/24"]), expected);
}

#[test]
fn top_level_subnet_becomes_one_range_set_with_the_range_keys_moved_in() {
    let config = conf(json!({
        "type": "host-local",
        "subnet": "usePodCidr",
        "rangeStart": "10.244.1.10",
        "routes": [{"dst": "0.0.0.0/0"}]
    }));
    let expected = conf(json!({
        "type": "host-local",
        "routes": [{"dst": "0.0.0.0/0"}],
        "ranges": [[
            {"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.10"},
            {"subnet": "10.244.2.0/24", "rangeStart": "10.244.1.10"}
        ]]
    }));
    assert_eq!(
        filled(&config, &["10.244.1.0/24", "10.244.2.0/24"]),
        expected
    );
}

#[test]
fn placeholder_and_keys_match_without_case_as_calico_and_go_read_them() {
    let config = json!({"cniVersion": "1.0.0", "name": "pods", "type": "ebpf-cni",
        "IPAM": {"type": "host-local", "Ranges": [[{"Subnet": "USEPODCIDR"}]]}});
    let expected = json!({"cniVersion": "1.0.0", "name": "pods", "type": "ebpf-cni",
        "IPAM": {"type": "host-local", "Ranges": [[{"Subnet": "10.244.1.0/24"}]]}});
    assert_eq!(filled(&config, &["10.244.1.0/24"]), expected);

    let top_level =
        conf(json!({"type": "host-local", "SUBNET": "usepodcidr", "Gateway": "10.244.1.1"}));
    let expected = conf(json!({"type": "host-local",
        "ranges": [[{"SUBNET": "10.244.1.0/24", "Gateway": "10.244.1.1"}]]}));
    assert_eq!(filled(&top_level, &["10.244.1.0/24"]), expected);
}

#[test]
fn config_without_placeholder_needs_no_pod_range_and_is_unchanged() {
    for config in [
        conf(json!({"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]})),
        conf(json!({"type": "host-local", "subnet": "10.244.1.0/24"})),
        conf(json!({"type": "host-local", "subnet": "usePodCidrs", "ranges": "odd"})),
        conf(json!({"type": "dhcp"})),
        conf(json!({"type": "host-local", "ranges": [{"subnet": "usePodCidr"}]})),
        json!({"cniVersion": "1.0.0", "name": "pods", "type": "ebpf-cni"}),
    ] {
        assert!(
            !needs_pod_cidrs(&config).expect("a usable config"),
            "{config}"
        );
        assert_eq!(
            fill(&config, &pod_cidrs(&["10.244.1.0/24"])).expect("nothing to fill"),
            config
        );
    }
}

#[test]
fn top_level_placeholder_beside_ranges_is_invalid_config() {
    let config = conf(json!({
        "type": "host-local",
        "subnet": "usePodCidr",
        "ranges": [[{"subnet": "10.9.0.0/24"}]]
    }));
    assert_eq!(code(needs_pod_cidrs(&config)), ErrorCode::InvalidConfig);
    assert_eq!(
        code(fill(&config, &pod_cidrs(&["10.244.1.0/24"]))),
        ErrorCode::InvalidConfig
    );
}

#[test]
fn ipv6_placeholder_is_an_unsupported_field() {
    for config in [
        conf(json!({"type": "host-local", "subnet": "usePodCidrIPv6"})),
        conf(
            json!({"type": "host-local", "ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "usePodCidrIPv6"}]]}),
        ),
    ] {
        let error = needs_pod_cidrs(&config).expect_err("IPv6 pod ranges are not known");
        assert_eq!(error.code, ErrorCode::UnsupportedField, "{config}");
        assert!(error.msg.contains("usePodCidrIPv6"), "{}", error.msg);
    }
}

#[test]
fn pod_ranges_that_cannot_be_a_subnet_are_refused() {
    assert_eq!(PodCidrs::new(vec![]), Err(PodCidrsError::Empty));
    let many: Vec<String> = (0..=MAX_POD_CIDRS)
        .map(|i| format!("10.{i}.0.0/16"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(
        PodCidrs::new(nets(&many)),
        Err(PodCidrsError::TooMany(MAX_POD_CIDRS + 1))
    );
    for (cidr, why) in [
        ("10.244.1.7/24", "host bits"),
        ("10.0.0.0/7", "shorter than /8"),
        ("0.0.0.0/8", "overlaps 0.0.0.0/8"),
        ("127.1.0.0/16", "overlaps 127.0.0.0/8"),
        ("169.254.0.0/24", "overlaps 169.254.0.0/16"),
        ("224.0.0.0/24", "overlaps 224.0.0.0/3"),
        ("240.0.0.0/8", "overlaps 224.0.0.0/3"),
    ] {
        let refused = PodCidrs::new(nets(&["10.244.0.0/24", cidr]))
            .expect_err(&format!("{cidr} must be refused"));
        assert!(refused.to_string().contains(why), "{cidr}: {refused}");
    }
    let fine = nets(&[
        "10.244.1.0/24",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "10.0.0.0/8",
    ]);
    assert_eq!(
        PodCidrs::new(fine.clone()).map(|cidrs| cidrs.as_slice().to_vec()),
        Ok(fine)
    );
}

/// A status as the daemon sends it.
fn status(pod_cidrs: &[&str], source: Option<&str>, name: Option<&str>) -> Status {
    serde_json::from_value(json!({
        "daemon_version": "test",
        "bpf_dir": "/sys/fs/bpf/ebpf-cni",
        "datapath_loaded": true,
        "endpoints": 0,
        "attachments": [],
        "node_name": name,
        "node_source": source,
        "pod_cidrs": pod_cidrs,
    }))
    .expect("a daemon's status")
}

#[test]
fn daemon_without_pod_range_is_try_again_later_naming_why() {
    for (source, name, why) in [
        (None, None, "--nodes-file, --kubeconfig or in-cluster"),
        (Some("in-cluster"), Some("node-1"), "gives node node-1 none"),
        (Some("file /etc/nodes.json"), None, "spec.podCIDRs is empty"),
    ] {
        let error = from_status(&status(&[], source, name)).expect_err("no pod range");
        assert_eq!(error.code, ErrorCode::TryAgainLater);
        assert!(
            error.msg.contains("this node has no pod range yet") && error.msg.contains(why),
            "{}",
            error.msg
        );
    }
    assert_eq!(
        from_status(&status(&["10.244.1.0/24"], Some("in-cluster"), None)),
        Ok(pod_cidrs(&["10.244.1.0/24"]))
    );
}

#[test]
fn daemon_pod_ranges_failing_the_checks_are_internal() {
    let error = from_status(&status(&["10.244.1.1/24"], Some("in-cluster"), None))
        .expect_err("host bits set");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.msg.contains("host bits"), "{}", error.msg);
}

#[test]
fn pod_ranges_file_is_a_json_list_of_ipv4_cidrs() {
    assert_eq!(
        PodCidrs::parse_file(br#"["10.244.1.0/24", "10.244.2.0/24"]"#),
        Ok(pod_cidrs(&["10.244.1.0/24", "10.244.2.0/24"]))
    );
    for (bytes, expected) in [
        (&b"[\"10.244.1.0/24\""[..], "not a JSON list"),
        (b"{\"cidrs\": []}", "not a JSON list"),
        (b"[24]", "not a JSON list"),
        (b"", "not a JSON list"),
        (b"[\"fd00::/64\"]", "\"fd00::/64\" is not an IPv4 CIDR"),
        (b"[\"10.244.1.0\"]", "not an IPv4 CIDR"),
        (b"[\"10.244.1.0/33\"]", "not an IPv4 CIDR"),
        (b"[\"10.244.1.1/24\"]", "host bits"),
        (b"[]", "empty"),
    ] {
        let refused = PodCidrs::parse_file(bytes).expect_err("an unusable file");
        assert!(
            refused.to_string().contains(expected),
            "{}: {refused}",
            String::from_utf8_lossy(bytes)
        );
    }
    let many: Vec<String> = (0..=MAX_POD_CIDRS)
        .map(|i| format!("10.{i}.0.0/16"))
        .collect();
    let many = serde_json::to_vec(&many).expect("a JSON list");
    assert_eq!(
        PodCidrs::parse_file(&many),
        Err(PodCidrsError::TooMany(MAX_POD_CIDRS + 1))
    );
}

#[test]
fn pod_ranges_file_is_read_bounded() {
    let dir = TempDir::new("pod-cidrs-file");
    let file = dir.path().join(cni_api::NODE_POD_CIDRS_FILE);
    assert!(matches!(
        PodCidrs::read_file(&file),
        Err(PodCidrsError::Unreadable(_))
    ));
    fs::write(&file, r#"["10.244.1.0/24"]"#).expect("the file is written");
    assert_eq!(
        PodCidrs::read_file(&file),
        Ok(pod_cidrs(&["10.244.1.0/24"]))
    );
    let padded = format!("[{}\"10.244.1.0/24\"]", " ".repeat(MAX_FILE_BYTES as usize));
    fs::write(&file, padded).expect("the file is written");
    assert_eq!(PodCidrs::read_file(&file), Err(PodCidrsError::TooLarge));
}

#[test]
fn pod_ranges_file_that_cannot_be_used_is_try_again_later_naming_the_daemon_too() {
    let dir = TempDir::new("pod-cidrs-fallback");
    let file = dir.path().join(cni_api::NODE_POD_CIDRS_FILE);
    let unreachable = CniError::try_again_later("ebpf-cnid is not running on this node")
        .with_details("connect: no such file");
    for (path, written) in [
        (None, None),
        (Some(file.as_path()), None),
        (Some(file.as_path()), Some("[]")),
        (Some(file.as_path()), Some("[\"10.244.1.0/")),
    ] {
        if let Some(content) = written {
            fs::write(&file, content).expect("the file is written");
        }
        let error = from_file(path, &unreachable).expect_err("nothing usable");
        assert_eq!(error.code, ErrorCode::TryAgainLater, "{}", error.msg);
        assert!(
            error.msg.contains("this node has no pod range yet")
                && error.msg.contains("ebpf-cnid is not running"),
            "{}",
            error.msg
        );
        assert_eq!(error.details, unreachable.details);
        if path.is_some() {
            assert!(
                error.msg.contains(&file.display().to_string()),
                "{}",
                error.msg
            );
        }
    }
    fs::write(&file, r#"["10.244.1.0/24"]"#).expect("the file is written");
    assert_eq!(
        from_file(Some(Path::new(&file)), &unreachable),
        Ok(pod_cidrs(&["10.244.1.0/24"]))
    );
}
