use serde_json::{Value, json};

use super::code_of;
use crate::spec::{CniVersion, parse_version_request, version_reply};

#[test]
fn every_supported_version_parses_displays_and_serialises_as_its_string() {
    for version in CniVersion::SUPPORTED {
        let text = version.to_string();
        assert_eq!(
            text.parse::<CniVersion>()
                .expect("supported version parses"),
            version
        );
        assert_eq!(
            serde_json::to_value(version).expect("serialises"),
            json!(text)
        );
        let back: CniVersion = serde_json::from_value(json!(text)).expect("deserialises");
        assert_eq!(back, version);
    }
}

#[test]
fn unknown_versions_are_code_1() {
    for text in ["0.1.0", "0.2.0", "1.0", "1.2.0", "", "v1.0.0", "1.0.0 "] {
        assert_eq!(code_of(text.parse::<CniVersion>()), 1, "{text:?}");
    }
}

#[test]
fn feature_predicates_follow_the_version_that_introduced_each_feature() {
    use CniVersion::*;
    for version in CniVersion::SUPPORTED {
        assert_eq!(
            version.ips_have_version_field(),
            matches!(version, V0_3_0 | V0_3_1 | V0_4_0)
        );
        assert_eq!(version.has_check(), !matches!(version, V0_3_0 | V0_3_1));
        assert_eq!(version.has_gc_and_status(), version == V1_1_0);
    }
}

#[test]
fn supported_list_is_sorted_oldest_first() {
    assert!(
        CniVersion::SUPPORTED
            .windows(2)
            .all(|pair| pair[0] < pair[1])
    );
}

#[test]
fn version_reply_echoes_the_requested_version_and_lists_all_supported() {
    for requested in [
        "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "0.1.0", "9.9.9",
    ] {
        let reply: Value = serde_json::from_str(&version_reply(requested)).expect("reply is JSON");
        assert_eq!(
            reply,
            json!({
                "cniVersion": requested,
                "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
            })
        );
    }
}

#[test]
fn version_request_returns_the_cni_version_as_given() {
    assert_eq!(
        parse_version_request(br#"{"cniVersion": "1.1.0"}"#).expect("parses"),
        "1.1.0"
    );
    assert_eq!(
        parse_version_request(br#"{"cniVersion": "7.0.0"}"#).expect("parses"),
        "7.0.0"
    );
}

#[test]
fn version_request_without_a_version_means_0_1_0() {
    for stdin in [
        &b""[..],
        b"  \n",
        b"{}",
        br#"{"cniVersion": ""}"#,
        br#"{"cniVersion": null}"#,
    ] {
        let requested = parse_version_request(stdin).expect("accepted");
        assert_eq!(requested, "0.1.0", "{:?}", String::from_utf8_lossy(stdin));
    }
}

#[test]
fn malformed_version_request_is_code_6() {
    assert_eq!(code_of(parse_version_request(b"{\"cniVersion\": ")), 6);
    assert_eq!(code_of(parse_version_request(br#"{"cniVersion": 1}"#)), 6);
}
