//! The protocol between `ebpf-cni` (the plugin, one short-lived process per CNI call) and
//! `ebpf-cnid` (the node daemon), and the names both must agree on. Both binaries link
//! this crate and nothing of each other.
//!
//! - [`messages`]: the requests and responses, versioned by [`PROTOCOL_VERSION`];
//! - [`frame`]: their framing on the unix socket, and one synchronous exchange [`call`];
//! - [`client`]: the typed [`Client`] the plugin and the daemon's CLI use;
//! - [`naming`]: the pods' host veth names and aliases;
//! - [`files`]: files written whole or not at all, as both keep them;
//! - [`values`]: the typed values the messages carry as strings ([`MacAddr`],
//!   [`Protocol`]).

pub mod client;
pub mod files;
pub mod frame;
pub mod messages;
pub mod naming;
pub mod values;

pub use client::{CallError, Client, EndpointList};
pub use frame::{ClientError, MAX_FRAME, call, encode, frame_len};
pub use messages::*;
pub use values::{MacAddr, MacError, Protocol};

/// Where the daemon listens unless told otherwise (`ebpf-cnid --socket`, the plugin's
/// `daemonSocket`).
pub const DEFAULT_SOCKET: &str = "/run/ebpf-cni/ebpf-cnid.sock";

/// The plugin's cache of IPAM plugins' VERSION answers, kept beside the socket; the
/// daemon's `uninstall` removes it.
pub const IPAM_VERSIONS_FILE: &str = "ipam-versions.json";

/// This node's pod ranges as the daemon last learnt them from its node source (a JSON
/// list of IPv4 CIDRs), kept beside the socket by the daemon: what the plugin fills a
/// `usePodCidr` IPAM range with when the daemon does not answer (a DEL while it
/// restarts). The daemon's `uninstall` removes it.
pub const NODE_POD_CIDRS_FILE: &str = "node-pod-cidrs.json";
