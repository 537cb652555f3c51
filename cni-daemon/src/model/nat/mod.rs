//! Source NAT of pod traffic leaving the node, user-space side. The datapath
//! (`uplink_egress`, `uplink_ingress`) translates; the daemon
//! - reads its flags ([`args`]) and resolves them into the uplinks and their addresses
//!   ([`settings`], [`uplink`]);
//! - at start ([`start`]) turns on IPv4 forwarding in its network namespace
//!   ([`sysctl`]), attaches the uplink programs (`Datapath::attach_uplink`) and writes
//!   the uplinks into `UPLINKS`, the port range and the timeouts into `NAT_CONFIG`
//!   ([`control`]);
//! - keeps them in step with the devices and the default route ([`follow`]);
//! - keeps `CLUSTER_CIDRS` equal to the union of the endpoints' cluster ranges
//!   ([`cidrs`]);
//! - sweeps flows idle longer than their timeout, and those of pods gone ([`sweep`],
//!   on the tables of [`flows`], by the rule the datapath applies too:
//!   `cni_ebpf_common::Timeouts`), and says how long each has left ([`expiry`]).

pub mod args;
mod batch;
pub mod cidrs;
pub mod control;
pub mod expiry;
pub mod flows;
pub mod follow;
pub mod settings;
pub mod sweep;
pub mod sysctl;
pub mod uplink;

use std::io;

pub use self::{
    args::{NatArgs, PortRange, Timeouts},
    control::{Nat, start},
    flows::Flows,
    settings::{NatSettings, Uplink},
    sweep::Sweep,
};
use crate::datapath::DatapathError;

#[derive(Debug, thiserror::Error)]
pub enum NatError {
    #[error("cannot read the routes in {path}: {source}")]
    Routes {
        path: &'static str,
        source: io::Error,
    },
    #[error("no interface {0} (an uplink) in the daemon's network namespace")]
    NoUplink(String),
    #[error("--uplink: {0}")]
    Uplinks(String),
    #[error("cannot list the addresses of {interface}: {source}")]
    Addresses {
        interface: String,
        source: nix::Error,
    },
    #[error("cannot set {path}: {source}")]
    Sysctl {
        path: &'static str,
        source: io::Error,
    },
    #[error("NAT map: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}
