//! The CNI error result: the numeric codes, the error value every layer ends in, and its
//! JSON form on stdout. Which code each module's error gets is `codes.rs`.

use std::fmt;

use serde::Serialize;

/// Error codes printed in the `code` field of an error result.
///
/// Codes 0-99 are reserved by the CNI specification; 100 and above are this plugin's own.
///
/// | code | variant | meaning |
/// |---|---|---|
/// | 1 | `IncompatibleVersion` | The `cniVersion` is not one this plugin speaks, or the command does not exist in that version (CHECK before 0.4.0, GC and STATUS before 1.1.0). |
/// | 2 | `UnsupportedField` | A configuration field is not supported; the message names the key and value. |
/// | 3 | `UnknownContainer` | The container is unknown or does not exist; the runtime need not clean up. |
/// | 4 | `InvalidEnvironment` | A `CNI_*` environment variable is missing or invalid; the message names it. |
/// | 5 | `IoFailure` | An I/O failure, e.g. reading the configuration from stdin. |
/// | 6 | `DecodeFailure` | Content could not be decoded: stdin or a plugin's result is not valid JSON of the expected shape. |
/// | 7 | `InvalidConfig` | The network configuration failed validation (a field missing, out of range or malformed). |
/// | 11 | `TryAgainLater` | A transient condition (e.g. the node daemon is not up yet); the runtime should retry. |
/// | 50 | `PluginNotAvailable` | STATUS: the plugin cannot service ADD requests. |
/// | 51 | `PluginNotAvailableContainersDamaged` | STATUS: the plugin cannot service ADD requests and existing containers may have limited connectivity. |
/// | 100 | `Internal` | A bug or an unexpected state in the plugin, including a panic. |
/// | 101 | `IpamFailed` | The IPAM plugin could not be run or returned an unusable result. |
/// | 102 | `InterfaceSetup` | Creating or configuring the veth pair, addresses or routes failed. |
/// | 103 | `InterfaceExists` | An interface named `CNI_IFNAME` already exists in the container. |
/// | 104 | `DaemonRefused` | The node daemon rejected the request. |
/// | 105 | `PortConflict` | A requested host port is already mapped to another container. |
/// | 106 | `CheckFailed` | CHECK found the attachment missing or different from `prevResult`. |
/// | any | `Other(n)` | A code returned by another plugin (e.g. IPAM), passed through unchanged. |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    IncompatibleVersion,
    UnsupportedField,
    UnknownContainer,
    InvalidEnvironment,
    IoFailure,
    DecodeFailure,
    InvalidConfig,
    TryAgainLater,
    PluginNotAvailable,
    PluginNotAvailableContainersDamaged,
    Internal,
    IpamFailed,
    InterfaceSetup,
    InterfaceExists,
    DaemonRefused,
    PortConflict,
    CheckFailed,
    /// A code none of the variants above names; only [`ErrorCode::from_code`] builds it
    /// so that a known number always compares equal to its named variant.
    Other(u32),
}

impl ErrorCode {
    const NAMED: [ErrorCode; 17] = [
        Self::IncompatibleVersion,
        Self::UnsupportedField,
        Self::UnknownContainer,
        Self::InvalidEnvironment,
        Self::IoFailure,
        Self::DecodeFailure,
        Self::InvalidConfig,
        Self::TryAgainLater,
        Self::PluginNotAvailable,
        Self::PluginNotAvailableContainersDamaged,
        Self::Internal,
        Self::IpamFailed,
        Self::InterfaceSetup,
        Self::InterfaceExists,
        Self::DaemonRefused,
        Self::PortConflict,
        Self::CheckFailed,
    ];

    /// The number printed on the wire.
    pub const fn code(self) -> u32 {
        match self {
            Self::IncompatibleVersion => 1,
            Self::UnsupportedField => 2,
            Self::UnknownContainer => 3,
            Self::InvalidEnvironment => 4,
            Self::IoFailure => 5,
            Self::DecodeFailure => 6,
            Self::InvalidConfig => 7,
            Self::TryAgainLater => 11,
            Self::PluginNotAvailable => 50,
            Self::PluginNotAvailableContainersDamaged => 51,
            Self::Internal => 100,
            Self::IpamFailed => 101,
            Self::InterfaceSetup => 102,
            Self::InterfaceExists => 103,
            Self::DaemonRefused => 104,
            Self::PortConflict => 105,
            Self::CheckFailed => 106,
            Self::Other(code) => code,
        }
    }

    /// The variant for a number read from another plugin's error result.
    pub fn from_code(code: u32) -> Self {
        Self::NAMED
            .into_iter()
            .find(|named| named.code() == code)
            .unwrap_or(Self::Other(code))
    }
}

/// An error as the CNI protocol reports it: a code, a short message and optional details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: ErrorCode,
    pub msg: String,
    pub details: String,
}

/// Field order matches the spec's example, so the printed JSON reads the same way.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ErrorJson<'a> {
    cni_version: &'a str,
    code: u32,
    msg: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    details: &'a str,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, msg)
    }

    pub fn try_again_later(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::TryAgainLater, msg)
    }

    /// Reads the error result another plugin (e.g. IPAM) printed, keeping its code, so the
    /// runtime sees the delegate's reason. `None` when the value is not an error result.
    pub fn from_plugin_output(value: &serde_json::Value) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct PluginError {
            code: u32,
            #[serde(default)]
            msg: String,
            #[serde(default)]
            details: String,
        }
        let error: PluginError = super::go_json::from_value(value.clone()).ok()?;
        Some(Self::new(ErrorCode::from_code(error.code), error.msg).with_details(error.details))
    }

    /// The error result as printed on stdout; `details` is left out when empty.
    pub fn to_json(&self, cni_version: &str) -> String {
        let json = ErrorJson {
            cni_version,
            code: self.code.code(),
            msg: &self.msg,
            details: &self.details,
        };
        // Serialising borrowed strings and an integer cannot fail; the fallback still
        // keeps stdout a valid error result if that ever changes.
        serde_json::to_string(&json).unwrap_or_else(|_| {
            format!(
                r#"{{"cniVersion":"","code":{},"msg":"unprintable error"}}"#,
                ErrorCode::Internal.code()
            )
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (CNI error {})", self.msg, self.code.code())?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}
