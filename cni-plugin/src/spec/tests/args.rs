use super::{code_of, error_of};
use crate::spec::CniArgs;

const KUBELET: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;\
                       K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=1f2e";

fn parse(raw: &str) -> CniArgs {
    CniArgs::parse(raw).expect("CNI_ARGS parses")
}

#[test]
fn kubelet_args_keep_their_order_and_values() {
    let args = parse(KUBELET);
    let keys: Vec<&str> = args.pairs().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "IgnoreUnknown",
            "K8S_POD_NAMESPACE",
            "K8S_POD_NAME",
            "K8S_POD_INFRA_CONTAINER_ID",
            "K8S_POD_UID"
        ]
    );
    assert_eq!(args.get("K8S_POD_NAME"), Some("web-0"));
    assert_eq!(args.get("K8S_POD_NAMESPACE"), Some("default"));
    assert_eq!(args.get("MISSING"), None);
    assert!(args.ignore_unknown());
}

#[test]
fn empty_args_are_no_args() {
    let args = parse("");
    assert!(args.pairs().is_empty());
    assert!(!args.ignore_unknown());
}

#[test]
fn trailing_semicolon_and_equals_inside_values_are_accepted() {
    let args = parse("A=1;TOKEN=abc==;");
    assert_eq!(args.get("A"), Some("1"));
    assert_eq!(args.get("TOKEN"), Some("abc=="));
    assert_eq!(args.pairs().len(), 2);
}

#[test]
fn a_repeated_key_reads_as_its_last_value() {
    assert_eq!(parse("A=1;A=2").get("A"), Some("2"));
}

#[test]
fn ignore_unknown_accepts_libcni_spellings() {
    for (value, expected) in [
        ("1", true),
        ("true", true),
        ("TRUE", true),
        ("0", false),
        ("false", false),
    ] {
        assert_eq!(
            parse(&format!("IgnoreUnknown={value}")).ignore_unknown(),
            expected,
            "{value}"
        );
    }
}

#[test]
fn malformed_args_are_code_4_naming_cni_args() {
    for raw in ["A=1;B", "NOEQUALS", "=value", "IgnoreUnknown=yes"] {
        let err = error_of(CniArgs::parse(raw));
        assert_eq!(err.code.code(), 4, "{raw:?}");
        assert!(err.msg.contains("CNI_ARGS"), "{raw:?}: {}", err.msg);
    }
}

#[test]
fn unknown_arg_without_ignore_unknown_is_code_4_naming_the_pair() {
    let args = parse("K8S_POD_NAME=web-0;FOO=bar");
    let err = error_of(args.check_known(&["K8S_POD_NAME"]));
    assert_eq!(err.code.code(), 4);
    assert!(err.msg.contains("FOO=bar"), "{}", err.msg);
}

#[test]
fn unknown_arg_with_ignore_unknown_passes() {
    parse(KUBELET)
        .check_known(&["K8S_POD_NAME"])
        .expect("IgnoreUnknown=1 allows unknown keys");
}

#[test]
fn ignore_unknown_set_to_false_still_rejects_unknown_keys() {
    assert_eq!(
        code_of(parse("IgnoreUnknown=0;FOO=bar").check_known(&[])),
        4
    );
}

#[test]
fn known_args_pass_and_ignore_unknown_is_always_known() {
    parse("IgnoreUnknown=0;K8S_POD_NAME=web-0")
        .check_known(&["K8S_POD_NAME"])
        .expect("all known");
}

#[test]
fn kubelet_args_name_the_pod() {
    let pod = parse(KUBELET).pod().expect("a pod");
    assert_eq!(pod.namespace.as_deref(), Some("default"));
    assert_eq!(pod.name.as_deref(), Some("web-0"));
    assert_eq!(pod.uid.as_deref(), Some("1f2e"));
}

#[test]
fn args_without_pod_keys_name_no_pod() {
    assert_eq!(parse("").pod(), None);
    assert_eq!(parse("FOO=bar;K8S_POD_NAME=").pod(), None);
    // Without IgnoreUnknown too: unknown keys are never refused.
    let pod = parse("FOO=bar;K8S_POD_NAME=web-0").pod().expect("a pod");
    assert_eq!((pod.namespace, pod.name.as_deref()), (None, Some("web-0")));
}
