//! Configurations as the runtimes in the field send them (Go programs: keys in whatever
//! case their structs have), read for ADD and for DEL.

use std::net::IpAddr;

use serde_json::{Value, json};

use super::code_of;
use crate::spec::{Command, NetConf, PortMapping, Protocol};

/// containerd 1.6/1.7 (go-cni): `PortMapping` has no JSON tags, so its keys are the Go
/// field names, and an unset `HostIP` is "".
const CONTAINERD: &str = include_str!("../fixtures/containerd_1.6_add.json");
/// podman 4.3 (CNI backend): lower camel case, `hostIP` left out when unset, and the
/// `aliases`, `ips` and `mac` capabilities.
const PODMAN: &str = include_str!("../fixtures/podman_4.3_add.json");

fn read_for(text: &str, command: Command) -> NetConf {
    let conf = NetConf::parse_for(text.as_bytes(), command)
        .unwrap_or_else(|err| panic!("{command} must read it: {err:?}"));
    conf.validate_for(command)
        .unwrap_or_else(|err| panic!("{command} must accept it: {err:?}"));
    conf
}

fn edited(text: &str, edit: impl FnOnce(&mut Value)) -> String {
    let mut value: Value = serde_json::from_str(text).expect("fixture is JSON");
    edit(&mut value);
    value.to_string()
}

fn mapping(host_port: u16, container_port: u16, protocol: Protocol) -> PortMapping {
    PortMapping {
        host_port,
        container_port,
        protocol,
        host_ip: None,
    }
}

#[test]
fn containerd_port_mappings_in_go_field_names_are_read_for_add_and_del() {
    for command in [Command::Add, Command::Del] {
        let conf = read_for(CONTAINERD, command);
        assert_eq!(
            conf.runtime_config.port_mappings,
            [mapping(8080, 80, Protocol::Tcp)],
            "{command}"
        );
        assert!(conf.set_aside().is_empty(), "{command}");
    }
}

#[test]
fn podman_payload_is_read_for_add_and_del() {
    for command in [Command::Add, Command::Del] {
        let conf = read_for(PODMAN, command);
        let rc = &conf.runtime_config;
        let host_ip: IpAddr = "192.0.2.10".parse().expect("address");
        assert_eq!(
            rc.port_mappings,
            [
                mapping(8080, 80, Protocol::Tcp),
                PortMapping {
                    host_ip: Some(host_ip),
                    ..mapping(5353, 53, Protocol::Udp)
                }
            ],
            "{command}"
        );
        assert_eq!(rc.ips, ["10.244.1.7"]);
        assert_eq!(rc.mac.as_deref(), Some("c2:11:22:33:44:66"));
        assert_eq!(conf.extra["capabilities"]["aliases"], true, "kept");
    }
}

#[test]
fn mixed_case_keys_at_every_level_are_read_as_go_reads_them() {
    let text = json!({
        "CNIVersion": "1.0.0",
        "Name": "pods",
        "TYPE": "ebpf-cni",
        "MTU": 1400,
        "IPMasq": true,
        "ClusterCIDRs": ["10.244.0.0/16"],
        "DaemonSocket": "/run/x.sock",
        "IPAM": {"Type": "host-local", "Subnet": "10.244.1.0/24"},
        "RuntimeConfig": {
            "PortMappings": [{"hostport": 8080, "CONTAINERPORT": 80, "protocol": "udp", "hostIp": "192.0.2.1"}],
            "Bandwidth": {"IngressRate": 1000, "ingressBURST": 12000},
            "IPs": ["10.244.1.9/24"],
            "MAC": "c2:00:00:00:00:01",
        },
    })
    .to_string();
    for command in [Command::Add, Command::Del] {
        let conf = read_for(&text, command);
        assert_eq!(
            (conf.cni_version.as_str(), conf.name.as_str()),
            ("1.0.0", "pods")
        );
        assert_eq!(conf.plugin_type, "ebpf-cni");
        assert_eq!((conf.mtu, conf.ip_masq), (Some(1400), true));
        assert_eq!(conf.cluster_cidrs.len(), 1);
        assert_eq!(conf.ipam_type().expect("ipam.type"), "host-local");
        let rc = &conf.runtime_config;
        assert_eq!(rc.port_mappings[0].host_port, 8080);
        assert_eq!(rc.port_mappings[0].protocol, Protocol::Udp);
        assert_eq!(
            rc.port_mappings[0].host_ip,
            Some("192.0.2.1".parse().expect("ip"))
        );
        let bandwidth = rc.bandwidth.expect("bandwidth");
        assert_eq!(
            (bandwidth.ingress_rate, bandwidth.ingress_burst),
            (Some(1000), Some(12000))
        );
        assert_eq!(rc.ips, ["10.244.1.9/24"]);
        assert_eq!(rc.mac.as_deref(), Some("c2:00:00:00:00:01"));
        assert!(
            conf.extra.is_empty(),
            "every key was typed: {:?}",
            conf.extra
        );
        // IPAM gets the configuration exactly as the runtime sent it.
        assert_eq!(conf.raw()["IPAM"]["Subnet"], "10.244.1.0/24");
    }
}

#[test]
fn unknown_keys_are_ignored_in_runtime_config_and_kept_at_the_top() {
    let text = edited(CONTAINERD, |value| {
        value["vendorThing"] = json!({"x": 1});
        value["args"] = json!({"cni": {"labels": [{"key": "a", "value": "b"}]}});
        value["runtimeConfig"]["io.kubernetes.cri.pod-annotations"] = json!({"team": "edge"});
        value["runtimeConfig"]["dns"] = json!({"Servers": ["10.96.0.10"], "Searches": null});
        value["runtimeConfig"]["portMappings"][0]["Name"] = json!("http");
    });
    for command in [Command::Add, Command::Del] {
        let conf = read_for(&text, command);
        assert_eq!(conf.runtime_config.port_mappings.len(), 1);
        assert_eq!(conf.extra["vendorThing"], json!({"x": 1}));
        assert!(conf.extra.contains_key("args"));
    }
}

#[test]
fn del_sets_aside_a_runtime_config_it_cannot_read_and_add_refuses_it() {
    let broken = [
        json!({"portMappings": [{"HostPort": "eighty", "ContainerPort": 80}]}),
        json!({"portMappings": "8080:80"}),
        json!({"portMappings": [{"hostPort": 0, "containerPort": 80}]}),
        json!({"mac": "not a mac", "ips": ["nonsense"]}),
        json!({"bandwidth": [1, 2, 3]}),
        json!("not an object"),
    ];
    for runtime_config in broken {
        let text = edited(CONTAINERD, |value| {
            value["runtimeConfig"] = runtime_config.clone()
        });
        let add = NetConf::parse_for(text.as_bytes(), Command::Add)
            .and_then(|conf| conf.validate_for(Command::Add));
        assert_eq!(code_of(add), 7, "ADD refuses {runtime_config}");
        let text = edited(&text, |value| {
            value["cniVersion"] = json!("1.1.0");
            value["prevResult"] = json!({"cniVersion": "1.1.0"});
            value["cni.dev/valid-attachments"] = json!([]);
        });
        for command in [Command::Del, Command::Check, Command::Gc] {
            let conf = read_for(&text, command);
            // Unreadable: set aside and read as absent; readable but invalid (port 0, a
            // bad MAC): read, and not checked by a verb that does not use it.
            let unreadable = conf.runtime_config == Default::default();
            assert_eq!(
                conf.set_aside().len(),
                usize::from(unreadable),
                "{command} {runtime_config}: {:?}",
                conf.set_aside()
            );
        }
    }
}

#[test]
fn del_sets_aside_unreadable_pod_settings_and_says_so() {
    let text = edited(CONTAINERD, |value| {
        value["mtu"] = json!("big");
        value["ipMasq"] = json!("yes");
        value["clusterCIDRs"] = json!(["not a cidr"]);
        value["runtimeConfig"] = json!({"portMappings": 1});
    });
    let conf = read_for(&text, Command::Del);
    let ignored: Vec<String> = conf.set_aside().iter().map(ToString::to_string).collect();
    assert_eq!(ignored.len(), 4, "{ignored:?}");
    for key in ["mtu", "ipMasq", "clusterCIDRs", "runtimeConfig"] {
        assert!(
            ignored.iter().any(|why| why.contains(key)),
            "{key}: {ignored:?}"
        );
    }
    assert_eq!(conf.mtu, None);
    // What DEL does need is still checked: it cannot find IPAM without `ipam.type`.
    let text = edited(&text, |value| value["ipam"] = json!({"type": 7}));
    assert_eq!(
        code_of(NetConf::parse_for(text.as_bytes(), Command::Del)),
        7
    );
}
