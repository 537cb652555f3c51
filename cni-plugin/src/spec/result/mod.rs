//! The success result: one model for every spec version, read from whatever version an
//! IPAM plugin or `prevResult` uses, written in the shape of the version requested.

mod emit;
mod parse;

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use super::error::CniError;
use super::serde_helpers::empty_as_none;
use super::version::{CniVersion, VersionError};

/// Why a result could not be read. `Version` is code 1; the others are code 6.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    #[error("result is not valid JSON: {0}")]
    Syntax(String),
    #[error("result is malformed: {0}")]
    Invalid(String),
    #[error("result: {0}")]
    Version(#[from] VersionError),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct CniResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Dns,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    /// Empty when not applicable (e.g. an L3 device); then left out on the wire.
    #[serde(default)]
    pub mac: String,
    /// 1.1.0 and later.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// The netns path for container-side interfaces; `None` on the host.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub sandbox: Option<String>,
    /// 1.1.0 and later.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub socket_path: Option<String>,
    /// 1.1.0 and later.
    #[serde(default, rename = "pciID", deserialize_with = "empty_as_none")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct IpConfig {
    /// Address and prefix, host bits kept ("10.1.0.5/16").
    pub address: IpNet,
    #[serde(default, deserialize_with = "empty_as_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`; IPAM results leave it out.
    #[serde(default)]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, deserialize_with = "empty_as_none")]
    pub gw: Option<IpAddr>,
    // The five below are 1.1.0 and later.
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub advmss: Option<u32>,
    #[serde(default)]
    pub priority: Option<u32>,
    #[serde(default)]
    pub table: Option<u32>,
    #[serde(default)]
    pub scope: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Dns {
    #[serde(default)]
    pub nameservers: Vec<String>,
    #[serde(default, deserialize_with = "empty_as_none")]
    pub domain: Option<String>,
    #[serde(default)]
    pub search: Vec<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

impl CniResult {
    /// Reads a result of any supported version: 0.3.x/0.4.0 (with `ips[].version`) or
    /// 1.x (without). A missing `cniVersion` is accepted, as IPAM plugins may omit it;
    /// an unsupported one is code 1. Anything else malformed is code 6.
    pub fn parse(value: &Value) -> Result<Self, CniError> {
        Ok(parse::parse(value)?)
    }

    /// [`CniResult::parse`] of raw bytes, e.g. an IPAM plugin's stdout.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, CniError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|err| ResultError::Syntax(err.to_string()))?;
        Self::parse(&value)
    }

    /// The JSON for `version`: `cniVersion` set, `ips[].version` below 1.0.0 only, the
    /// 1.1.0 interface and route fields at 1.1.0 only, empty fields and empty `dns` left out.
    pub fn to_json(&self, version: CniVersion) -> Value {
        emit::to_json(self, version)
    }

    /// This result without the fields `version` cannot carry: what a runtime speaking
    /// `version` would read back from [`CniResult::to_json`].
    pub fn for_version(&self, version: CniVersion) -> Self {
        let mut result = self.clone();
        if !version.has_gc_and_status() {
            for interface in &mut result.interfaces {
                interface.mtu = None;
                interface.socket_path = None;
                interface.pci_id = None;
            }
            for route in &mut result.routes {
                route.mtu = None;
                route.advmss = None;
                route.priority = None;
                route.table = None;
                route.scope = None;
            }
        }
        result
    }
}
