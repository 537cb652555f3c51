//! Go's decoding rules, checked on small types of their own and on the plugin's own
//! structures as containerd and podman send them.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::spec::go_json::{from_value, same_name};

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Inner {
    #[serde(default)]
    host_port: u16,
    #[serde(rename = "hostIP", default)]
    host_ip: String,
}

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Outer {
    #[serde(default)]
    list: Vec<Inner>,
    #[serde(default)]
    one: Option<Inner>,
    #[serde(default)]
    labels: BTreeMap<String, Value>,
}

fn outer(value: Value) -> Outer {
    from_value(value).expect("reads as Go would")
}

#[test]
fn keys_match_fields_in_any_case_at_every_depth() {
    let read = outer(json!({
        "LIST": [{"HostPort": 1, "HOSTIP": "a"}, {"hostport": 2, "hostIp": "b"}],
        "One": {"hOsTpOrT": 3},
    }));
    assert_eq!(
        read.list,
        [
            Inner {
                host_port: 1,
                host_ip: "a".into()
            },
            Inner {
                host_port: 2,
                host_ip: "b".into()
            }
        ]
    );
    assert_eq!(read.one.map(|inner| inner.host_port), Some(3));
}

#[test]
fn an_exact_spelling_wins_over_a_folded_one_whatever_the_order() {
    for object in [
        json!({"HostPort": 1, "hostPort": 2}),
        json!({"hostPort": 2, "hostport": 1}),
        json!({"HOSTPORT": 1, "hostPort": 2, "Hostport": 1}),
    ] {
        let read: Inner = from_value(object.clone()).expect("reads");
        assert_eq!(read.host_port, 2, "{object}");
    }
}

#[test]
fn null_leaves_a_field_at_its_default() {
    let read = outer(json!({"list": null, "one": null, "labels": null}));
    assert_eq!(read, Outer::default());
    let read: Inner = from_value(json!({"hostPort": 7, "HostIP": null})).expect("reads");
    assert_eq!(read.host_ip, "");
    // A null exact spelling does not bring back a folded one's value either.
    let read: Inner = from_value(json!({"HostPort": 9, "hostPort": null})).expect("reads");
    assert_eq!(read.host_port, 0);
}

#[test]
fn unknown_keys_are_ignored_and_map_keys_are_kept_as_given() {
    let read = outer(json!({
        "Labels": {"Team": "edge", "team": "core"},
        "somethingElse": [1, 2],
        "one": {"hostPort": 4, "extra": {"deep": true}},
    }));
    assert_eq!(
        read.labels.len(),
        2,
        "a map is not folded: {:?}",
        read.labels
    );
    assert_eq!(read.labels["Team"], "edge");
    assert_eq!(read.one.map(|inner| inner.host_port), Some(4));
}

#[test]
fn the_two_non_ascii_letters_that_fold_onto_ascii_match_as_in_go() {
    // KELVIN SIGN folds to `k`, LATIN SMALL LETTER LONG S to `s` (Go's foldName).
    assert!(same_name("ho\u{17F}tPort", "hostPort"));
    assert!(same_name("\u{212A}ey", "key"));
    assert!(!same_name("hostPor", "hostPort"));
    assert!(!same_name("h\u{F6}stPort", "hostPort"));
    let read: Inner = from_value(json!({"HO\u{17F}TPORT": 5})).expect("reads");
    assert_eq!(read.host_port, 5);
}

#[test]
fn wrong_shapes_are_still_errors_naming_what_was_expected() {
    for (value, expected) in [
        (json!({"hostPort": "80"}), "u16"),
        (json!({"HostPort": 70000}), "u16"),
        (json!([1, 2]), "struct Inner"),
        (json!("text"), "struct Inner"),
    ] {
        let err = from_value::<Inner>(value.clone()).expect_err("refused");
        assert!(err.to_string().contains(expected), "{value}: {err}");
    }
}
