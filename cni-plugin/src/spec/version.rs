//! Spec versions: which ones this plugin speaks, what each allows, and the VERSION command
//! (its stdin and its reply).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::{CniError, ErrorCode};

/// A CNI spec version this plugin speaks. Ordered, so `v >= CniVersion::V1_0_0` reads as
/// the spec's "from 1.0.0 on".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CniVersion {
    #[serde(rename = "0.3.0")]
    V0_3_0,
    #[serde(rename = "0.3.1")]
    V0_3_1,
    #[serde(rename = "0.4.0")]
    V0_4_0,
    #[serde(rename = "1.0.0")]
    V1_0_0,
    #[serde(rename = "1.1.0")]
    V1_1_0,
}

/// A `cniVersion` this plugin does not speak (code 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported cniVersion {0:?} (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)")]
pub struct VersionError(pub String);

impl CniVersion {
    /// Every version, oldest first. 0.1.0 and 0.2.0 are left out: their result format
    /// (`ip4`/`ip6`) predates interfaces, and no current runtime sends them.
    pub const SUPPORTED: [CniVersion; 5] = [
        Self::V0_3_0,
        Self::V0_3_1,
        Self::V0_4_0,
        Self::V1_0_0,
        Self::V1_1_0,
    ];

    /// The newest version, used when a message must carry one and none was given.
    pub const LATEST: CniVersion = Self::V1_1_0;

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_0 => "0.3.0",
            Self::V0_3_1 => "0.3.1",
            Self::V0_4_0 => "0.4.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }

    /// Results before 1.0.0 carry `"version": "4"|"6"` on every IP; 1.0.0 removed it.
    pub fn ips_have_version_field(self) -> bool {
        self < Self::V1_0_0
    }

    /// GC and STATUS, and the interface and route fields added with them, are 1.1.0's.
    pub fn has_gc_and_status(self) -> bool {
        self >= Self::V1_1_0
    }

    /// CHECK was introduced by 0.4.0.
    pub fn has_check(self) -> bool {
        self >= Self::V0_4_0
    }
}

/// [`CniVersion::from_str`] with the layer's own error. Exact match: "1.0" is not "1.0.0".
pub(crate) fn parse_version(s: &str) -> Result<CniVersion, VersionError> {
    CniVersion::SUPPORTED
        .into_iter()
        .find(|v| v.as_str() == s)
        .ok_or_else(|| VersionError(s.to_owned()))
}

impl FromStr for CniVersion {
    type Err = CniError;

    /// Code 1 for a version this plugin does not speak.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(parse_version(s)?)
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The version 0.1.0 had no `cniVersion` field, so a request without one speaks 0.1.0.
/// libcni's decoder makes the same choice.
const UNVERSIONED: &str = "0.1.0";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VersionRequest {
    #[serde(default)]
    cni_version: Option<String>,
}

/// Reads the `cniVersion` the runtime sent with VERSION, as given (it is only echoed).
///
/// Spec 1.0.0 sends `{"cniVersion": "..."}`; runtimes older than that sent nothing on
/// stdin, so empty stdin, a missing or an empty `cniVersion` all mean "0.1.0".
/// Malformed JSON, or a `cniVersion` that is not a string, is code 6.
pub fn parse_version_request(stdin: &[u8]) -> Result<String, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Ok(UNVERSIONED.to_owned());
    }
    let request: VersionRequest = serde_json::from_slice(stdin)
        .and_then(super::go_json::from_value)
        .map_err(|err| {
            CniError::new(
                ErrorCode::DecodeFailure,
                "cannot decode the VERSION request on stdin",
            )
            .with_details(err.to_string())
        })?;
    Ok(request
        .cni_version
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| UNVERSIONED.to_owned()))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct VersionReply<'a> {
    cni_version: &'a str,
    supported_versions: [&'static str; 5],
}

/// The VERSION reply: `cniVersion` echoes the request, whatever it was, because the spec
/// defines it as "the value of cniVersion specified on input"; the runtime then picks
/// from `supportedVersions`.
pub fn version_reply(requested: &str) -> String {
    let reply = VersionReply {
        cni_version: requested,
        supported_versions: CniVersion::SUPPORTED.map(CniVersion::as_str),
    };
    // Serialising strings cannot fail; keep stdout valid JSON even so.
    serde_json::to_string(&reply).unwrap_or_else(|_| {
        r#"{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#
            .to_owned()
    })
}
