//! Node list documents: the shapes the API and kubectl print, and what is skipped.

mod support;

use cni_nodes::{ParseError, parse_nodes};
use support::{capture_logs, log_lines, set};

/// What both fixtures describe: cp-1 dual-stack with podCIDRs, worker-1 with only the old
/// podCIDR field, worker-v6 IPv6-only and so skipped.
fn fixture_nodes() -> cni_nodes::NodeSet {
    set(&[
        ("cp-1", "192.0.2.10", &["10.244.0.0/24"]),
        ("worker-1", "192.0.2.11", &["10.244.1.0/24"]),
    ])
}

#[test]
fn a_node_list_in_json_is_read() {
    let nodes = parse_nodes(include_bytes!("fixtures/nodelist.json")).expect("parses");
    assert_eq!(nodes, fixture_nodes());
}

#[test]
fn kubectls_list_in_yaml_is_read() {
    let nodes = parse_nodes(include_bytes!("fixtures/kubectl-list.yaml")).expect("parses");
    assert_eq!(nodes, fixture_nodes());
}

#[test]
fn kubectls_list_in_json_is_read() {
    // `kubectl get nodes -o json`: the YAML fixture's content, as JSON.
    let yaml: serde_json::Value =
        serde_saphyr::from_slice(include_bytes!("fixtures/kubectl-list.yaml")).expect("fixture");
    let json = serde_json::to_vec_pretty(&yaml).expect("to JSON");
    assert_eq!(parse_nodes(&json).expect("parses"), fixture_nodes());
}

#[test]
fn pod_cidrs_win_over_pod_cidr_and_pod_cidr_alone_is_read() {
    let doc = r#"
kind: NodeList
apiVersion: v1
items:
- metadata: {name: both}
  spec: {podCIDR: 10.9.9.0/24, podCIDRs: [10.1.0.0/24, 10.1.1.0/24]}
  status: {addresses: [{type: InternalIP, address: 192.0.2.1}]}
- metadata: {name: old}
  spec: {podCIDR: 10.2.0.0/24}
  status: {addresses: [{type: InternalIP, address: 192.0.2.2}]}
- metadata: {name: empty-plural}
  spec: {podCIDR: 10.3.0.0/24, podCIDRs: []}
  status: {addresses: [{type: InternalIP, address: 192.0.2.3}]}
- metadata: {name: unassigned}
  spec: {}
  status: {addresses: [{type: InternalIP, address: 192.0.2.4}]}
"#;
    assert_eq!(
        parse_nodes(doc.as_bytes()).expect("parses"),
        set(&[
            ("both", "192.0.2.1", &["10.1.0.0/24", "10.1.1.0/24"]),
            ("old", "192.0.2.2", &["10.2.0.0/24"]),
            ("empty-plural", "192.0.2.3", &["10.3.0.0/24"]),
            ("unassigned", "192.0.2.4", &[]),
        ])
    );
}

#[test]
fn unusable_items_are_skipped_with_a_warning_naming_them() {
    capture_logs();
    let doc = r#"
kind: List
apiVersion: v1
items:
- {kind: Node, apiVersion: v1, metadata: {name: skip-v6-only},
   status: {addresses: [{type: InternalIP, address: "2001:db8::1"}]}}
- {kind: Node, apiVersion: v1, metadata: {name: skip-bad-address},
   status: {addresses: [{type: InternalIP, address: 192.0.2.300}]}}
- {kind: Node, apiVersion: v1, metadata: {name: keep-bad-cidr},
   spec: {podCIDRs: [10.5.0.0/33, 10.5.1.0/24]},
   status: {addresses: [{type: InternalIP, address: 192.0.2.5}]}}
- {kind: Pod, apiVersion: v1, metadata: {name: skip-a-pod}}
- {kind: Node, apiVersion: v1, metadata: {name: skip-malformed}, spec: {podCIDRs: 7}}
- {kind: Node, apiVersion: v1, metadata: {},
   status: {addresses: [{type: InternalIP, address: 192.0.2.6}]}}
- {kind: Node, apiVersion: v1, metadata: {name: keep-twice},
   status: {addresses: [{type: InternalIP, address: 192.0.2.7}]}}
- {kind: Node, apiVersion: v1, metadata: {name: keep-twice},
   status: {addresses: [{type: InternalIP, address: 192.0.2.8}]}}
"#;
    let nodes = parse_nodes(doc.as_bytes()).expect("parses");
    assert_eq!(
        nodes,
        set(&[
            ("keep-bad-cidr", "192.0.2.5", &["10.5.1.0/24"]),
            ("keep-twice", "192.0.2.8", &[]),
        ])
    );
    for (parts, what) in [
        (
            &["WARN", "skip-v6-only", "no IPv4 InternalIP"][..],
            "an IPv6-only node",
        ),
        (
            &["WARN", "skip-bad-address", "192.0.2.300"],
            "a bad address",
        ),
        (&["WARN", "keep-bad-cidr", "10.5.0.0/33"], "a bad CIDR"),
        (&["WARN", "skip-a-pod", "Pod"], "an item of another kind"),
        (
            &["WARN", "skip-malformed", "not a valid Node"],
            "a malformed node",
        ),
        (&["WARN", "without metadata.name"], "a node without a name"),
        (
            &["WARN", "keep-twice", "more than once"],
            "a node listed twice",
        ),
    ] {
        assert_eq!(
            log_lines(parts).len(),
            1,
            "one warning for {what}: {parts:?}"
        );
    }
}

#[test]
fn an_empty_list_is_an_empty_set() {
    for doc in [
        "kind: List\napiVersion: v1\nitems: []\n",
        "{\"kind\":\"NodeList\",\"apiVersion\":\"v1\",\"items\":null}",
        "kind: NodeList\n",
    ] {
        assert!(parse_nodes(doc.as_bytes()).expect(doc).is_empty(), "{doc}");
    }
}

#[test]
fn a_document_that_is_not_a_node_list_is_an_error() {
    type Check = fn(&ParseError) -> bool;
    let cases: [(&str, Check); 6] = [
        ("{\"kind\": \"NodeList\", ", |e| {
            matches!(e, ParseError::Json(_))
        }),
        ("kind: List\nitems: [\n", |e| {
            matches!(e, ParseError::Yaml(_))
        }),
        ("- a\n- b\n", |e| {
            matches!(e, ParseError::NotAnObject("a list"))
        }),
        ("", |e| matches!(e, ParseError::NotAnObject("null"))),
        (
            "kind: Node\nmetadata: {name: a}\n",
            |e| matches!(e, ParseError::Kind(k) if k == "Node"),
        ),
        ("kind: List\nitems: {a: 1}\n", |e| {
            matches!(e, ParseError::Items("an object"))
        }),
    ];
    for (doc, expected) in cases {
        match parse_nodes(doc.as_bytes()) {
            Err(err) => assert!(expected(&err), "{doc:?} gave {err:?}"),
            Ok(set) => panic!("{doc:?} parsed as {set:?}"),
        }
    }
}

#[test]
fn a_yaml_alias_bomb_is_refused() {
    let mut doc = String::from("kind: List\nitems: []\nx0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..9 {
        let prev = level - 1;
        doc.push_str(&format!(
            "x{level}: &a{level} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    assert!(matches!(
        parse_nodes(doc.as_bytes()),
        Err(ParseError::Yaml(_))
    ));
}

#[test]
fn a_document_over_the_bound_is_refused_unread() {
    let doc = vec![b' '; cni_nodes::MAX_DOCUMENT_BYTES + 1];
    assert!(matches!(
        parse_nodes(&doc),
        Err(ParseError::TooLarge { .. })
    ));
}
