use serde_json::{Value, json};

use crate::spec::{CniError, ErrorCode};

fn json_of(err: &CniError, version: &str) -> Value {
    serde_json::from_str(&err.to_json(version)).expect("error JSON parses")
}

#[test]
fn error_json_has_version_code_msg_and_details() {
    let err = CniError::new(ErrorCode::InvalidConfig, "Invalid Configuration")
        .with_details("Network 192.168.0.0/31 too small to allocate from.");
    assert_eq!(
        json_of(&err, "1.0.0"),
        json!({
            "cniVersion": "1.0.0",
            "code": 7,
            "msg": "Invalid Configuration",
            "details": "Network 192.168.0.0/31 too small to allocate from."
        })
    );
}

#[test]
fn error_json_omits_empty_details() {
    let err = CniError::try_again_later("daemon not running");
    assert_eq!(
        json_of(&err, "1.1.0"),
        json!({"cniVersion": "1.1.0", "code": 11, "msg": "daemon not running"})
    );
}

#[test]
fn error_json_echoes_an_unsupported_version_verbatim() {
    let err = CniError::new(ErrorCode::IncompatibleVersion, "unsupported");
    assert_eq!(json_of(&err, "0.2.0")["cniVersion"], "0.2.0");
}

#[test]
fn error_json_keeps_the_spec_field_order() {
    let text = CniError::internal("boom")
        .with_details("why")
        .to_json("1.1.0");
    let positions: Vec<usize> = ["cniVersion", "code", "msg", "details"]
        .iter()
        .map(|key| text.find(&format!("\"{key}\"")).expect("key present"))
        .collect();
    assert!(positions.windows(2).all(|pair| pair[0] < pair[1]), "{text}");
}

#[test]
fn every_named_code_has_its_documented_number_and_maps_back() {
    let table = [
        (ErrorCode::IncompatibleVersion, 1),
        (ErrorCode::UnsupportedField, 2),
        (ErrorCode::UnknownContainer, 3),
        (ErrorCode::InvalidEnvironment, 4),
        (ErrorCode::IoFailure, 5),
        (ErrorCode::DecodeFailure, 6),
        (ErrorCode::InvalidConfig, 7),
        (ErrorCode::TryAgainLater, 11),
        (ErrorCode::PluginNotAvailable, 50),
        (ErrorCode::PluginNotAvailableContainersDamaged, 51),
        (ErrorCode::Internal, 100),
        (ErrorCode::IpamFailed, 101),
        (ErrorCode::InterfaceSetup, 102),
        (ErrorCode::InterfaceExists, 103),
        (ErrorCode::DaemonRefused, 104),
        (ErrorCode::PortConflict, 105),
        (ErrorCode::CheckFailed, 106),
    ];
    for (code, number) in table {
        assert_eq!(code.code(), number, "{code:?}");
        assert_eq!(ErrorCode::from_code(number), code, "{number}");
    }
}

#[test]
fn unknown_codes_pass_through_as_other() {
    for number in [0, 8, 99, 150, 4242] {
        assert_eq!(ErrorCode::from_code(number), ErrorCode::Other(number));
        assert_eq!(ErrorCode::Other(number).code(), number);
    }
}

#[test]
fn a_delegate_error_result_keeps_its_code_msg_and_details() {
    let ipam =
        json!({"cniVersion": "1.0.0", "code": 7, "msg": "no IPs left", "details": "range full"});
    let err = CniError::from_plugin_output(&ipam).expect("is an error result");
    assert_eq!(
        err,
        CniError::new(ErrorCode::InvalidConfig, "no IPs left").with_details("range full")
    );

    let custom = json!({"cniVersion": "1.0.0", "code": 999, "msg": "vendor"});
    let err = CniError::from_plugin_output(&custom).expect("is an error result");
    assert_eq!(err.code, ErrorCode::Other(999));
    assert_eq!(
        err.to_json("1.0.0"),
        r#"{"cniVersion":"1.0.0","code":999,"msg":"vendor"}"#
    );
}

#[test]
fn a_success_result_is_not_read_as_an_error() {
    assert_eq!(
        CniError::from_plugin_output(&json!({"cniVersion": "1.0.0", "ips": []})),
        None
    );
    assert_eq!(
        CniError::from_plugin_output(&json!({"code": -1, "msg": "x"})),
        None
    );
}

#[test]
fn display_shows_message_code_and_details() {
    let err = CniError::internal("boom").with_details("stack");
    assert_eq!(err.to_string(), "boom (CNI error 100): stack");
    assert_eq!(
        CniError::internal("boom").to_string(),
        "boom (CNI error 100)"
    );
}
