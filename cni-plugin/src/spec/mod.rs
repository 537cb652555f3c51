//! The CNI protocol layer: everything the runtime hands the plugin and everything the
//! plugin prints back, as the CNI specification (containernetworking/cni SPEC.md, versions
//! 0.3.0 to 1.1.0) and CONVENTIONS.md define them.
//!
//! It owns:
//! - [`Environment`]: the `CNI_*` variables, validated per [`Command`], with [`CniArgs`];
//! - [`NetConf`]: the configuration on stdin, typed where the plugin reads it, kept whole
//!   for delegation, and [`NetConf::validate_for`] a command;
//! - [`CniResult`]: one result model, read from any supported version, written in the
//!   version the runtime asked for;
//! - [`CniError`] and [`ErrorCode`]: the error result and the table of codes;
//! - [`CniVersion`] and the VERSION command ([`parse_version_request`], [`version_reply`]).
//!
//! Everything a Go program hands us is read as Go's decoder reads it ([`go_json`]: keys
//! matched case-insensitively, `null` as unset); [`go_json::from_value`] is there for
//! what the plugin's other modules read from Go programs.
//!
//! It does no I/O: callers pass the environment pairs and stdin bytes in and print what
//! comes out, which keeps every rule here testable without a runtime.

mod args;
mod codes;
mod config;
mod env;
mod error;
pub mod go_json;
mod result;
mod serde_helpers;
mod version;

#[cfg(test)]
mod tests;

pub use args::{ArgsError, CniArgs};
pub use config::{
    Attachment, Bandwidth, ConfigError, DEFAULT_MTU, IpamConf, LEGACY_ATTACHMENTS_KEY, Limit,
    NetConf, PodDevice, PortMapping, Protocol, RuntimeConfig, Shaping, VALID_ATTACHMENTS_KEY,
    parse_unicast_mac,
};
pub use env::{Command, EnvError, Environment};
pub use error::{CniError, ErrorCode};
pub use result::{CniResult, Dns, Interface, IpConfig, ResultError, Route};
pub use version::{CniVersion, VersionError, parse_version_request, version_reply};
