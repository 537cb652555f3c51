use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::{code_of, error_of};
use crate::spec::{
    Attachment, Bandwidth, CniVersion, Command, Limit, NetConf, PodDevice, PortMapping, Protocol,
    parse_unicast_mac,
};

const ADD_FULL: &str = include_str!("../fixtures/add_full.json");
const GC_VALID: &str = include_str!("../fixtures/gc_valid_attachments.json");
const GC_LEGACY: &str = include_str!("../fixtures/gc_legacy_attachments.json");
const MALFORMED: &str = include_str!("../fixtures/malformed.json");
const MISSING_IPAM: &str = include_str!("../fixtures/missing_ipam.json");

fn parse(text: &str) -> NetConf {
    NetConf::parse(text.as_bytes()).expect("fixture parses")
}

/// The full ADD fixture with `edit` applied to its JSON.
fn add_full_with(edit: impl FnOnce(&mut Value)) -> NetConf {
    let mut value: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
    edit(&mut value);
    NetConf::parse(value.to_string().as_bytes()).expect("edited fixture still parses")
}

/// A minimal valid configuration at `version`.
fn minimal(version: &str) -> NetConf {
    minimal_with(version, json!({}))
}

/// [`minimal`] with the keys of `extra` added.
fn minimal_with(version: &str, extra: Value) -> NetConf {
    let mut value = json!({"cniVersion": version, "name": "n", "type": "ebpf-cni", "ipam": {"type": "host-local"}});
    for (key, field) in extra.as_object().into_iter().flatten() {
        value[key] = field.clone();
    }
    NetConf::parse(value.to_string().as_bytes()).expect("minimal config parses")
}

/// A configuration any command accepts in a version that has the command.
fn complete(version: &str) -> NetConf {
    minimal_with(
        version,
        json!({"prevResult": {}, "cni.dev/valid-attachments": []}),
    )
}

#[test]
fn full_add_config_reads_every_typed_field() {
    let conf = parse(ADD_FULL);
    assert_eq!(conf.cni_version, "1.1.0");
    assert_eq!(conf.version().expect("supported"), CniVersion::V1_1_0);
    assert_eq!(conf.name, "pod-net");
    assert_eq!(conf.plugin_type, "ebpf-cni");
    assert_eq!(conf.mtu, Some(1450));
    assert!(conf.ip_masq);
    assert_eq!(
        conf.daemon_socket,
        Some(PathBuf::from("/run/ebpf-cni/ebpf-cnid.sock"))
    );
    let ipam = conf.ipam.as_ref().expect("ipam present");
    assert_eq!(ipam.plugin_type, "host-local");
    assert_eq!(conf.ipam_type().expect("ipam.type is valid"), "host-local");
    assert_eq!(
        conf.runtime_mac().expect("mac is valid"),
        Some([0xc2, 0x11, 0x22, 0x33, 0x44, 0x55])
    );
    // The rest of `ipam` is the IPAM plugin's: it gets the configuration whole.
    assert_eq!(conf.raw()["ipam"]["dataDir"], "/var/lib/cni/networks");
    assert!(conf.raw()["ipam"]["ranges"].is_array() && conf.raw()["ipam"]["routes"].is_array());
    assert_eq!(conf.prev_result, None);
    assert!(conf.valid_attachments().is_empty());
    conf.validate_for(Command::Add)
        .expect("full config is valid for ADD");
}

#[test]
fn full_add_config_reads_runtime_config() {
    let rc = parse(ADD_FULL).runtime_config;
    let host_ip: IpAddr = "192.0.2.10".parse().expect("address");
    assert_eq!(
        rc.port_mappings,
        [
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: Protocol::Tcp,
                host_ip: None
            },
            PortMapping {
                host_port: 5353,
                container_port: 53,
                protocol: Protocol::Udp,
                host_ip: Some(host_ip)
            },
            PortMapping {
                host_port: 9000,
                container_port: 9000,
                protocol: Protocol::Tcp,
                host_ip: None
            },
        ]
    );
    assert_eq!(rc.mac.as_deref(), Some("c2:11:22:33:44:55"));
    assert_eq!(
        rc.bandwidth,
        Some(Bandwidth {
            ingress_rate: Some(2_048_000),
            ingress_burst: Some(800_000),
            egress_rate: Some(4_096_000),
            egress_burst: Some(800_000)
        })
    );
    assert_eq!(rc.ips, ["10.1.0.42/16"]);
}

#[test]
fn unknown_top_level_keys_are_kept_and_known_ones_are_not_duplicated() {
    let conf = parse(ADD_FULL);
    assert_eq!(conf.extra["vendorTuning"], json!({"rxQueues": 4}));
    assert!(conf.extra.contains_key("dns") && conf.extra.contains_key("args"));
    for known in [
        "cniVersion",
        "name",
        "type",
        "ipam",
        "mtu",
        "ipMasq",
        "daemonSocket",
        "runtimeConfig",
    ] {
        assert!(
            !conf.extra.contains_key(known),
            "{known} should be typed, not in extra"
        );
    }
}

#[test]
fn raw_config_is_the_whole_stdin_for_delegation() {
    let conf = parse(ADD_FULL);
    let original: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
    assert_eq!(conf.raw(), &original);
    let bytes: Value = serde_json::from_slice(&conf.raw_bytes()).expect("raw bytes are JSON");
    assert_eq!(bytes, original);
}

#[test]
fn gc_attachments_come_from_valid_attachments() {
    let conf = parse(GC_VALID);
    let expected = [
        Attachment {
            container_id: "3f6940ab5ab43bc5".into(),
            ifname: "eth0".into(),
        },
        Attachment {
            container_id: "3f6940ab5ab43bc5".into(),
            ifname: "net1".into(),
        },
    ];
    assert_eq!(conf.valid_attachments(), &expected[..]);
    conf.validate_for(Command::Gc).expect("valid GC config");
}

#[test]
fn gc_attachments_come_from_the_older_attachments_key() {
    let conf = parse(GC_LEGACY);
    let expected = [Attachment {
        container_id: "a1b2c3".into(),
        ifname: "eth0".into(),
    }];
    assert_eq!(conf.valid_attachments(), &expected[..]);
    conf.validate_for(Command::Gc).expect("valid GC config");
}

#[test]
fn gc_with_both_keys_keeps_the_union_so_nothing_listed_is_freed() {
    let text = json!({
        "cniVersion": "1.1.0", "name": "n", "type": "ebpf-cni", "ipam": {"type": "host-local"},
        "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}],
        "cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"}]
    });
    let conf = NetConf::parse(text.to_string().as_bytes()).expect("parses");
    let ids: Vec<&str> = conf
        .valid_attachments()
        .iter()
        .map(|a| a.container_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b"]);
}

#[test]
fn gc_without_a_valid_attachments_list_is_code_7() {
    let err = error_of(minimal("1.1.0").validate_for(Command::Gc));
    assert_eq!(err.code.code(), 7);
    assert!(err.msg.contains("cni.dev/valid-attachments"), "{}", err.msg);
}

#[test]
fn attachment_without_ifname_is_code_7() {
    let text = json!({"cniVersion": "1.1.0", "name": "n", "type": "t", "cni.dev/valid-attachments": [{"containerID": "a"}]});
    assert_eq!(code_of(NetConf::parse(text.to_string().as_bytes())), 7);
}

#[test]
fn malformed_json_is_code_6() {
    assert_eq!(code_of(NetConf::parse(MALFORMED.as_bytes())), 6);
    assert_eq!(code_of(NetConf::parse(b"")), 6);
}

#[test]
fn json_that_is_not_an_object_is_code_6() {
    for text in ["[]", "\"config\"", "42", "null"] {
        assert_eq!(code_of(NetConf::parse(text.as_bytes())), 6, "{text}");
    }
}

#[test]
fn each_missing_required_field_is_code_7_naming_it() {
    let cases = [
        (
            include_str!("../fixtures/missing_cniversion.json"),
            "cniVersion",
        ),
        (include_str!("../fixtures/missing_name.json"), "name"),
        (include_str!("../fixtures/missing_type.json"), "type"),
    ];
    for (text, field) in cases {
        let err = error_of(NetConf::parse(text.as_bytes()));
        assert_eq!(err.code.code(), 7, "{field}");
        assert!(
            err.msg.contains(&format!("`{field}`")),
            "{field}: {}",
            err.msg
        );
    }
}

#[test]
fn required_fields_of_the_wrong_type_or_empty_are_code_7_naming_them() {
    for field in ["cniVersion", "name", "type"] {
        for bad in [json!(1), json!(""), json!(["x"])] {
            let mut value: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
            value[field] = bad.clone();
            let err = error_of(NetConf::parse(value.to_string().as_bytes()));
            assert_eq!(err.code.code(), 7, "{field} = {bad}");
            assert!(err.msg.contains(field), "{field}: {}", err.msg);
        }
    }
}

#[test]
fn missing_ipam_is_code_7_for_every_command_that_delegates() {
    let conf = parse(MISSING_IPAM);
    for command in [
        Command::Add,
        Command::Check,
        Command::Del,
        Command::Gc,
        Command::Status,
    ] {
        let err = error_of(conf.validate_for(command));
        assert_eq!(err.code.code(), 7, "{command}");
        assert!(err.msg.contains("ipam.type"), "{command}: {}", err.msg);
    }
    conf.validate_for(Command::Version)
        .expect("VERSION does not read the config");
}

#[test]
fn ipam_type_empty_or_with_a_path_separator_is_code_7() {
    for ipam_type in ["", "../host-local", "/usr/bin/host-local", "a\\b", ".."] {
        let conf = add_full_with(|v| v["ipam"]["type"] = json!(ipam_type));
        assert_eq!(code_of(conf.validate_for(Command::Add)), 7, "{ipam_type:?}");
    }
}

#[test]
fn unknown_cni_version_is_code_1_and_kept_for_the_error_result() {
    for version in ["0.2.0", "1.2.0", "2.0"] {
        let conf = minimal(version);
        assert_eq!(conf.cni_version, version);
        assert_eq!(code_of(conf.version()), 1);
        for command in [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Gc,
            Command::Status,
        ] {
            assert_eq!(
                code_of(conf.validate_for(command)),
                1,
                "{version} {command}"
            );
        }
    }
}

#[test]
fn gc_and_status_before_1_1_0_are_code_1() {
    for version in CniVersion::SUPPORTED
        .into_iter()
        .filter(|v| !v.has_gc_and_status())
    {
        let conf = complete(version.as_str());
        for command in [Command::Gc, Command::Status] {
            let err = error_of(conf.validate_for(command));
            assert_eq!(err.code.code(), 1, "{version} {command}");
            assert!(err.msg.contains("1.1.0"), "{}", err.msg);
        }
    }
}

#[test]
fn check_before_0_4_0_is_code_1() {
    for version in [CniVersion::V0_3_0, CniVersion::V0_3_1] {
        let conf = complete(version.as_str());
        assert_eq!(code_of(conf.validate_for(Command::Check)), 1, "{version}");
    }
}

#[test]
fn every_command_is_accepted_from_the_version_that_introduced_it() {
    for version in CniVersion::SUPPORTED {
        let conf = complete(version.as_str());
        conf.validate_for(Command::Add)
            .expect("ADD exists in every version");
        conf.validate_for(Command::Del)
            .expect("DEL exists in every version");
        assert_eq!(
            conf.validate_for(Command::Check).is_ok(),
            version.has_check(),
            "{version}"
        );
        assert_eq!(
            conf.validate_for(Command::Gc).is_ok(),
            version.has_gc_and_status(),
            "{version}"
        );
        assert_eq!(
            conf.validate_for(Command::Status).is_ok(),
            version.has_gc_and_status(),
            "{version}"
        );
    }
}

#[test]
fn check_without_prev_result_is_code_7() {
    let err = error_of(minimal("1.0.0").validate_for(Command::Check));
    assert_eq!(err.code.code(), 7);
    assert!(err.msg.contains("prevResult"), "{}", err.msg);
}

#[test]
fn prev_result_is_kept_as_json_and_null_reads_as_none() {
    let conf = add_full_with(|v| v["prevResult"] = json!({"cniVersion": "1.1.0", "ips": []}));
    assert_eq!(
        conf.prev_result,
        Some(json!({"cniVersion": "1.1.0", "ips": []}))
    );
    let conf = add_full_with(|v| v["prevResult"] = Value::Null);
    assert_eq!(conf.prev_result, None);
}

#[test]
fn mtu_outside_68_to_65535_is_code_7() {
    for mtu in [0, 67, 65536, 100_000] {
        let conf = add_full_with(|v| v["mtu"] = json!(mtu));
        assert_eq!(code_of(conf.validate_for(Command::Add)), 7, "{mtu}");
    }
    for mtu in [68, 1500, 9000, 65535] {
        add_full_with(|v| v["mtu"] = json!(mtu))
            .validate_for(Command::Add)
            .expect("mtu in range");
    }
}

#[test]
fn mtu_of_the_wrong_type_is_code_7_naming_it() {
    for bad in [json!("1500"), json!(-1), json!(1.5)] {
        let mut value: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
        value["mtu"] = bad;
        let err = error_of(NetConf::parse(value.to_string().as_bytes()));
        assert_eq!(err.code.code(), 7);
        assert!(err.msg.contains("`mtu`"), "{}", err.msg);
    }
}

#[test]
fn invalid_or_non_unicast_mac_is_code_7() {
    for mac in [
        "",
        "c2:11:22:33:44",
        "c2:11:22:33:44:55:66",
        "c2-11-22-33-44-55",
        "zz:11:22:33:44:55",
        "+2:11:22:33:44:55",
        "c21:1:22:33:44:55",
        "01:00:5e:00:00:01",
        "ff:ff:ff:ff:ff:ff",
        "00:00:00:00:00:00",
    ] {
        let conf = add_full_with(|v| v["runtimeConfig"]["mac"] = json!(mac));
        let err = error_of(conf.validate_for(Command::Add));
        assert_eq!(err.code.code(), 7, "{mac:?}");
        assert!(err.msg.contains("runtimeConfig.mac"), "{}", err.msg);
    }
}

#[test]
fn unicast_macs_parse_in_either_case() {
    assert_eq!(
        parse_unicast_mac("C2:11:22:33:44:5f"),
        Ok([0xc2, 0x11, 0x22, 0x33, 0x44, 0x5f])
    );
    assert_eq!(
        parse_unicast_mac("02:00:00:00:00:01"),
        Ok([2, 0, 0, 0, 0, 1])
    );
}

#[test]
fn protocol_other_than_lower_case_tcp_or_udp_is_code_7() {
    for protocol in ["sctp", "TCP", "Udp", ""] {
        let mut value: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
        value["runtimeConfig"]["portMappings"][0]["protocol"] = json!(protocol);
        let err = error_of(NetConf::parse(value.to_string().as_bytes()));
        assert_eq!(err.code.code(), 7, "{protocol:?}");
        assert!(err.msg.contains("runtimeConfig"), "{}", err.msg);
    }
}

#[test]
fn port_zero_is_code_7_and_above_65535_fails_parsing_with_7() {
    for field in ["hostPort", "containerPort"] {
        let conf = add_full_with(|v| v["runtimeConfig"]["portMappings"][1][field] = json!(0));
        let err = error_of(conf.validate_for(Command::Add));
        assert_eq!(err.code.code(), 7, "{field}");
        assert!(err.msg.contains("portMappings[1]"), "{}", err.msg);

        let mut value: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
        value["runtimeConfig"]["portMappings"][0][field] = json!(70000);
        assert_eq!(
            code_of(NetConf::parse(value.to_string().as_bytes())),
            7,
            "{field}"
        );
    }
}

#[test]
fn empty_host_ip_means_every_address_and_a_bad_one_is_code_7() {
    let conf = add_full_with(|v| v["runtimeConfig"]["portMappings"][1]["hostIP"] = json!(""));
    assert_eq!(conf.runtime_config.port_mappings[1].host_ip, None);
    let mut value: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
    value["runtimeConfig"]["portMappings"][1]["hostIP"] = json!("300.1.1.1");
    assert_eq!(code_of(NetConf::parse(value.to_string().as_bytes())), 7);
}

#[test]
fn runtime_ips_that_are_not_addresses_or_cidrs_are_code_7() {
    let conf =
        add_full_with(|v| v["runtimeConfig"]["ips"] = json!(["10.0.0.1", "fd00::1/64", "pod-ip"]));
    assert_eq!(code_of(conf.validate_for(Command::Add)), 7);
}

#[test]
fn null_or_missing_runtime_config_lists_are_empty() {
    let conf = add_full_with(|v| {
        v["runtimeConfig"] = json!({"portMappings": null, "ips": null});
    });
    assert!(conf.runtime_config.port_mappings.is_empty() && conf.runtime_config.ips.is_empty());
    assert_eq!(minimal("1.1.0").runtime_config, Default::default());
}

#[test]
fn network_name_outside_the_spec_shape_is_code_7() {
    for name in ["-net", "my net", "net/1"] {
        let conf = add_full_with(|v| v["name"] = json!(name));
        assert_eq!(code_of(conf.validate_for(Command::Add)), 7, "{name:?}");
    }
}

#[test]
fn ip_masq_defaults_to_false() {
    assert!(!minimal("1.0.0").ip_masq);
}

#[test]
fn ipam_type_and_runtime_mac_accessors_report_code_7() {
    assert_eq!(code_of(parse(MISSING_IPAM).ipam_type()), 7);
    let conf = add_full_with(|v| v["runtimeConfig"]["mac"] = json!("01:00:5e:00:00:01"));
    assert_eq!(code_of(conf.runtime_mac()), 7);
    assert_eq!(
        minimal("1.1.0").runtime_mac().expect("no mac is fine"),
        None
    );
}

#[test]
fn protocol_displays_its_wire_spelling() {
    assert_eq!(Protocol::Tcp.to_string(), "tcp");
    assert_eq!(Protocol::Udp.to_string(), "udp");
}

#[test]
fn cluster_cidrs_are_read_and_bad_ones_are_code_7() {
    let conf = add_full_with(|v| v["clusterCIDRs"] = json!(["10.244.0.0/16", "10.96.0.0/12"]));
    let cidrs: Vec<String> = conf.cluster_cidrs.iter().map(ToString::to_string).collect();
    assert_eq!(cidrs, ["10.244.0.0/16", "10.96.0.0/12"]);
    assert!(
        parse(ADD_FULL).cluster_cidrs.is_empty(),
        "absent means empty"
    );

    let mut bad: Value = serde_json::from_str(ADD_FULL).expect("fixture is JSON");
    bad["clusterCIDRs"] = json!(["10.244.0.0/33"]);
    let error = NetConf::parse(bad.to_string().as_bytes()).expect_err("an invalid prefix");
    assert_eq!(error.code.code(), 7, "{error:?}");
}

#[test]
fn bandwidth_keys_of_the_config_win_over_the_runtimes_and_zero_means_no_limit() {
    let runtime = json!({"bandwidth": {"ingressRate": 50_000_000, "ingressBurst": 5_000_000}});
    let conf = minimal_with(
        "1.1.0",
        json!({"EgressRate": 8_000_000, "egressBurst": 80_000, "runtimeConfig": runtime}),
    );
    let shaping = conf.shaping(1500).expect("valid limits");
    assert_eq!(shaping.ingress, None, "the runtime's keys are not read");
    assert_eq!(
        shaping.egress,
        Some(Limit {
            rate: 8_000_000,
            burst: 80_000
        })
    );
    let conf = minimal_with("1.1.0", json!({"runtimeConfig": runtime}));
    assert_eq!(
        conf.shaping(1500).expect("valid").ingress,
        Some(Limit {
            rate: 50_000_000,
            burst: 5_000_000
        })
    );
    let zero = json!({"bandwidth": {"ingressRate": 0, "ingressBurst": 0}});
    let conf = minimal_with("1.1.0", json!({"runtimeConfig": zero}));
    assert!(conf.shaping(1500).expect("valid").is_none());
}

#[test]
fn bandwidth_without_its_pair_or_out_of_range_is_code_7_naming_the_key() {
    let cases = [
        (json!({"ingressRate": 1_000_000}), "ingressBurst"),
        (json!({"egressBurst": 1_000_000}), "egressRate"),
        (
            json!({"ingressRate": 7, "ingressBurst": 100_000}),
            "ingressRate",
        ),
        (
            json!({"egressRate": 1_000_000, "egressBurst": 8 * (1u64 << 32)}),
            "egressBurst",
        ),
        // One packet of the 1500-byte MTU is 12000 bits.
        (
            json!({"egressRate": 1_000_000, "egressBurst": 11_999}),
            "egressBurst",
        ),
    ];
    for (keys, named) in cases {
        let conf = minimal_with("1.1.0", keys.clone());
        let error = error_of(conf.validate_for(Command::Add));
        assert_eq!(error.code.code(), 7, "{keys}");
        let text = format!("{} {}", error.msg, error.details);
        assert!(text.contains(named), "{keys}: {text}");
        let in_runtime = minimal_with("1.1.0", json!({"runtimeConfig": {"bandwidth": keys}}));
        let error = error_of(in_runtime.validate_for(Command::Add));
        let text = format!("{} {}", error.msg, error.details);
        assert!(
            text.contains(&format!("runtimeConfig.bandwidth.{named}")),
            "{text}"
        );
    }
    // DEL does not refuse what it does not act on.
    let conf = minimal_with("1.1.0", json!({"ingressRate": 1_000_000}));
    conf.validate_for(Command::Del).expect("DEL passes");
}

#[test]
fn pod_device_is_veth_unless_netkit_is_asked_and_anything_else_is_code_7() {
    assert_eq!(
        parse(ADD_FULL).pod_device,
        PodDevice::Veth,
        "absent means veth"
    );
    let netkit = minimal_with("1.1.0", json!({"podDevice": "netkit"}));
    assert_eq!(netkit.pod_device, PodDevice::Netkit);
    let veth = minimal_with("1.1.0", json!({"podDevice": "veth"}));
    assert_eq!(veth.pod_device, PodDevice::Veth);
    // The key is matched as Go matches it; the value is not.
    let spelled = minimal_with("1.1.0", json!({"PODDEVICE": "netkit"}));
    assert_eq!(spelled.pod_device, PodDevice::Netkit);
    for bad in [json!("Netkit"), json!("macvlan"), json!(1)] {
        let text = json!({"cniVersion": "1.1.0", "name": "n", "type": "ebpf-cni",
            "ipam": {"type": "host-local"}, "podDevice": bad});
        let error = NetConf::parse(text.to_string().as_bytes()).expect_err("not a device");
        assert_eq!(error.code.code(), 7, "{bad}: {error:?}");
        assert!(error.msg.contains("podDevice"), "{bad}: {error:?}");
    }
    // DEL does not act on it: a value it cannot read is set aside, not an error.
    let text = json!({"cniVersion": "1.1.0", "name": "n", "type": "ebpf-cni",
        "ipam": {"type": "host-local"}, "podDevice": "macvlan"});
    let del = NetConf::parse_for(text.to_string().as_bytes(), Command::Del).expect("DEL parses");
    assert_eq!(del.pod_device, PodDevice::Veth);
    assert_eq!(del.set_aside().len(), 1);
}
