use serde_json::{Value, json};

use super::code_of;
use crate::spec::{CniResult, CniVersion, Dns};

const IPAM_040: &str = include_str!("../fixtures/ipam_result_0.4.0.json");
const IPAM_110: &str = include_str!("../fixtures/ipam_result_1.1.0.json");
const PLUGIN_110: &str = include_str!("../fixtures/plugin_result_1.1.0.json");

fn parse(text: &str) -> CniResult {
    CniResult::from_slice(text.as_bytes()).expect("result parses")
}

fn field_names(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .flat_map(|item| item.as_object().into_iter().flat_map(|o| o.keys().cloned()))
        .collect()
}

#[test]
fn ipam_result_0_4_0_is_read_with_both_families() {
    let result = parse(IPAM_040);
    assert!(result.interfaces.is_empty());
    assert_eq!(result.ips.len(), 2);
    assert_eq!(result.ips[0].address.to_string(), "10.1.0.5/16");
    assert_eq!(
        result.ips[0].gateway,
        Some("10.1.0.1".parse().expect("address"))
    );
    assert_eq!(result.ips[1].address.to_string(), "fd00:10:1::5/64");
    assert_eq!(result.ips[0].interface, None);
    assert_eq!(result.routes[0].dst.to_string(), "0.0.0.0/0");
    assert_eq!(result.routes[0].gw, None);
    assert_eq!(
        result.routes[1].gw,
        Some("fd00:10:1::1".parse().expect("address"))
    );
    assert!(result.dns.is_empty());
}

#[test]
fn ipam_result_1_1_0_is_read_with_route_attributes_and_dns() {
    let result = parse(IPAM_110);
    let route = &result.routes[0];
    assert_eq!(
        (
            route.mtu,
            route.advmss,
            route.priority,
            route.table,
            route.scope
        ),
        (Some(1400), Some(1360), Some(100), Some(254), Some(0))
    );
    assert_eq!(
        result.dns,
        Dns {
            nameservers: vec!["10.96.0.10".into()],
            domain: Some("cluster.local".into()),
            search: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into()
            ],
            options: vec!["ndots:5".into()],
        }
    );
}

#[test]
fn plugin_result_1_1_0_is_read_with_interface_attributes() {
    let result = parse(PLUGIN_110);
    let eth0 = &result.interfaces[1];
    assert_eq!(eth0.name, "eth0");
    assert_eq!(eth0.mtu, Some(1450));
    assert_eq!(eth0.sandbox.as_deref(), Some("/var/run/netns/pod-1"));
    assert_eq!(eth0.socket_path.as_deref(), Some("/run/vhost/pod-1.sock"));
    assert_eq!(eth0.pci_id.as_deref(), Some("0000:00:1f.6"));
    assert_eq!(result.interfaces[0].sandbox, None);
    assert_eq!(result.ips[1].interface, Some(1));
}

#[test]
fn ips_carry_a_version_field_below_1_0_0_only() {
    let result = parse(PLUGIN_110);
    for version in CniVersion::SUPPORTED {
        let json = result.to_json(version);
        for ip in json["ips"].as_array().expect("ips present") {
            let expected = version.ips_have_version_field().then_some(
                if ip["address"].as_str().is_some_and(|a| a.contains(':')) {
                    "6"
                } else {
                    "4"
                },
            );
            assert_eq!(
                ip.get("version").and_then(Value::as_str),
                expected,
                "{version}"
            );
        }
    }
}

#[test]
fn the_1_1_0_interface_and_route_fields_appear_at_1_1_0_only() {
    let result = parse(PLUGIN_110);
    let new_fields = [
        "mtu",
        "socketPath",
        "pciID",
        "advmss",
        "priority",
        "table",
        "scope",
    ];
    for version in CniVersion::SUPPORTED {
        let json = result.to_json(version);
        let mut names = field_names(&json["interfaces"]);
        names.extend(field_names(&json["routes"]));
        for field in new_fields {
            let present = names.iter().any(|n| n == field);
            assert_eq!(
                present,
                version == CniVersion::V1_1_0,
                "{field} at {version}"
            );
        }
    }
}

#[test]
fn to_json_sets_the_requested_cni_version() {
    let result = parse(IPAM_040);
    for version in CniVersion::SUPPORTED {
        assert_eq!(result.to_json(version)["cniVersion"], version.as_str());
    }
}

#[test]
fn round_trip_through_every_version_keeps_what_that_version_carries() {
    for fixture in [IPAM_040, IPAM_110, PLUGIN_110] {
        let original = parse(fixture);
        for version in CniVersion::SUPPORTED {
            let back = CniResult::parse(&original.to_json(version)).expect("own output parses");
            assert_eq!(back, original.for_version(version), "{version}");
        }
    }
}

#[test]
fn for_version_drops_only_the_1_1_0_fields() {
    let original = parse(PLUGIN_110);
    assert_eq!(original.for_version(CniVersion::V1_1_0), original);
    let old = original.for_version(CniVersion::V1_0_0);
    assert!(
        old.interfaces
            .iter()
            .all(|i| i.mtu.is_none() && i.socket_path.is_none() && i.pci_id.is_none())
    );
    assert!(
        old.routes
            .iter()
            .all(|r| r.mtu.is_none() && r.table.is_none() && r.scope.is_none())
    );
    assert_eq!(old.interfaces[1].mac, original.interfaces[1].mac);
    assert_eq!(old.ips, original.ips);
    assert_eq!(old.dns, original.dns);
}

#[test]
fn empty_fields_and_empty_dns_are_left_out() {
    let json = parse(IPAM_040).to_json(CniVersion::V1_0_0);
    assert_eq!(
        json,
        json!({
            "cniVersion": "1.0.0",
            "ips": [
                {"address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                {"address": "fd00:10:1::5/64", "gateway": "fd00:10:1::1"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "fd00:20::/64", "gw": "fd00:10:1::1"}]
        })
    );
    assert_eq!(
        CniResult::default().to_json(CniVersion::V1_1_0),
        json!({"cniVersion": "1.1.0"})
    );
}

#[test]
fn go_style_empty_values_read_as_absent() {
    let text = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "", "sandbox": ""}],
        "ips": [{"address": "10.0.0.2/24", "gateway": ""}],
        "routes": null,
        "dns": {"nameservers": null, "domain": ""}
    });
    let result = CniResult::parse(&text).expect("parses");
    assert_eq!(result.interfaces[0].mac, "");
    assert_eq!(result.interfaces[0].sandbox, None);
    assert_eq!(result.ips[0].gateway, None);
    assert!(result.routes.is_empty() && result.dns.is_empty());
}

#[test]
fn result_without_cni_version_is_accepted() {
    let result = CniResult::parse(&json!({"ips": [{"address": "10.1.0.5/16"}]})).expect("parses");
    assert_eq!(result.ips.len(), 1);
}

#[test]
fn garbage_results_are_code_6() {
    let cases = [
        json!([]),
        json!("ok"),
        json!({"ips": [{"address": "10.1.0.5"}]}),
        json!({"ips": [{"address": "not-an-ip/24"}]}),
        json!({"ips": [{"gateway": "10.1.0.1"}]}),
        json!({"routes": [{"gw": "10.1.0.1"}]}),
        json!({"interfaces": [{"mac": "aa:bb:cc:dd:ee:ff"}]}),
        json!({"ips": [{"address": "10.1.0.5/16", "interface": -1}]}),
        json!({"cniVersion": 1}),
    ];
    for value in cases {
        assert_eq!(code_of(CniResult::parse(&value)), 6, "{value}");
    }
    assert_eq!(code_of(CniResult::from_slice(b"{\"ips\": [")), 6);
    assert_eq!(code_of(CniResult::from_slice(b"")), 6);
}

#[test]
fn ip_version_field_disagreeing_with_the_address_is_code_6() {
    for (version, address) in [
        ("6", "10.1.0.5/16"),
        ("4", "fd00::5/64"),
        ("5", "10.1.0.5/16"),
    ] {
        let text =
            json!({"cniVersion": "0.4.0", "ips": [{"version": version, "address": address}]});
        assert_eq!(code_of(CniResult::parse(&text)), 6, "{version} {address}");
    }
}

#[test]
fn unsupported_result_versions_are_code_1() {
    assert_eq!(
        code_of(CniResult::parse(&json!({"cniVersion": "0.2.0", "ips": []}))),
        1
    );
    assert_eq!(
        code_of(CniResult::parse(&json!({"cniVersion": "2.0.0"}))),
        1
    );
    // The 0.2.0 shape without a version would otherwise read as "no addresses".
    assert_eq!(
        code_of(CniResult::parse(&json!({"ip4": {"ip": "10.1.0.5/16"}}))),
        1
    );
}
