//! Source NAT of pod traffic leaving the node, user-space side. The datapath
//! (`uplink_egress`, `uplink_ingress`) translates; the daemon
//! - finds the uplink and its address ([`uplink`]) and writes them, the port range and
//!   the timeouts into `NAT_CONFIG` at start ([`tables`]);
//! - attaches the uplink programs through pinned links (`Datapath::attach_uplink`);
//! - turns on IPv4 forwarding in its network namespace ([`sysctl`]);
//! - keeps `CLUSTER_CIDRS` equal to the union of the endpoints' cluster ranges
//!   ([`cidrs`]);
//! - sweeps flows idle longer than their timeout ([`expiry`], [`tables`]);
//! - shows flows and counters ([`view`]).

pub mod args;
mod batch;
pub mod cidrs;
pub mod expiry;
pub mod sysctl;
pub mod tables;
pub mod uplink;
pub mod view;

use std::{io, net::Ipv4Addr};

use cni_ebpf_common::{NatConfig, Uplinks};
use nix::time::{ClockId, clock_gettime};

pub use self::{
    args::{NatArgs, PortRange, Timeouts},
    tables::{Flows, Nat, NatMaps, Sweep},
};
use crate::{
    api::Endpoint,
    datapath::{Datapath, DatapathError},
};

#[derive(Debug, thiserror::Error)]
pub enum NatError {
    #[error("cannot read the routes in {path}: {source}")]
    Routes {
        path: &'static str,
        source: io::Error,
    },
    #[error("no interface {0} (the uplink) in the daemon's network namespace")]
    NoUplink(String),
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

/// NAT as this daemon runs it, resolved from [`NatArgs`] and the namespace's routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatSettings {
    pub uplink: String,
    /// The uplink is the default route's device (no `--uplink`): it follows the default
    /// route when that moves to another device (see [`Nat::follow_uplink`]).
    pub by_default_route: bool,
    pub uplink_ifindex: u32,
    /// The uplink's first IPv4 address: the source of translated packets. `None` while
    /// the uplink has none, at start or later (see [`Nat::follow_uplink`]).
    pub node_addr: Option<Ipv4Addr>,
    pub ports: PortRange,
    pub timeouts: Timeouts,
}

impl NatSettings {
    /// The `NAT_CONFIG` value the datapath reads.
    pub fn config(&self) -> NatConfig {
        NatConfig {
            node_addr: self
                .node_addr
                .map_or(NatConfig::NO_ADDRESS, |addr| addr.octets()),
            port_min: self.ports.min,
            port_max: self.ports.max,
            tcp_established_secs: self.timeouts.tcp_established,
            tcp_transitory_secs: self.timeouts.tcp_transitory,
            udp_secs: self.timeouts.udp,
            icmp_secs: self.timeouts.icmp,
            uplink_ifindex: self.uplink_ifindex,
            tcp_closed_secs: self.timeouts.tcp_closed,
        }
    }

    /// The `UPLINKS` value the datapath reads.
    pub fn uplinks(&self) -> Uplinks {
        let mut uplinks = Uplinks::default();
        let addr = self
            .node_addr
            .map_or(NatConfig::NO_ADDRESS, |addr| addr.octets());
        uplinks.push(self.uplink_ifindex, addr);
        uplinks
    }
}

impl NatArgs {
    /// The uplink (`--uplink`, else the default route's device) and its address. No
    /// uplink at all is not an error: NAT is off (`None`), said at warn. An uplink
    /// without an IPv4 address (yet: a node whose DHCP lease comes after the daemon)
    /// is not one either: NAT starts without an address, dropping what it would
    /// translate, and takes the address when it comes ([`Nat::follow_uplink`]).
    /// Failing instead left a DaemonSet restarting with back-off, and no pod could be
    /// created meanwhile.
    pub fn resolve(&self) -> Result<Option<NatSettings>, NatError> {
        let uplink = match &self.uplink {
            Some(uplink) => uplink.clone(),
            None => {
                let Some(uplink) = uplink::default_route_device_now()? else {
                    tracing::warn!(
                        "no --uplink and no default IPv4 route in this network namespace: \
                         source NAT is disabled"
                    );
                    return Ok(None);
                };
                uplink
            }
        };
        let uplink_ifindex = nix::net::if_::if_nametoindex(uplink.as_str())
            .map_err(|_| NatError::NoUplink(uplink.clone()))?;
        let node_addr = uplink::ipv4_address(&uplink)?;
        if node_addr.is_none() {
            tracing::warn!(
                %uplink,
                "the uplink has no IPv4 address yet: pods' traffic to the outside is \
                 dropped (counted as nat_no_address) until it has one"
            );
        }
        Ok(Some(NatSettings {
            uplink,
            by_default_route: self.uplink.is_none(),
            uplink_ifindex,
            node_addr,
            ports: self.nat_port_range,
            timeouts: self.timeouts(),
        }))
    }
}

/// Brings NAT to what `settings` asks after a (re)start: cluster ranges from
/// `endpoints`, `NAT_CONFIG`, forwarding, the uplink programs. With NAT off, the
/// previous daemon's uplink links and flows go.
pub fn start<'a>(
    datapath: &mut Datapath,
    settings: Option<NatSettings>,
    endpoints: impl IntoIterator<Item = &'a Endpoint>,
) -> Result<Nat, NatError> {
    let mut nat = Nat::open(datapath.take_nat_maps()?, settings)?;
    nat.sync_cluster_cidrs(endpoints)?;
    let previous = nat.previous_uplink_ifindex();
    let Some(settings) = nat.settings().cloned() else {
        datapath.detach_uplink(previous)?;
        nat.write_config()?;
        return Ok(nat);
    };
    if previous != 0 && previous != settings.uplink_ifindex {
        // The pinned links hold the old uplink; new ones go on the new one.
        datapath.detach_uplink(previous)?;
    }
    nat.write_config()?;
    sysctl::warn_on_port_overlap(&settings.ports);
    let enabled = sysctl::enable_ip_forward().map_err(|source| NatError::Sysctl {
        path: sysctl::IP_FORWARD,
        source,
    })?;
    if enabled {
        tracing::info!(
            "net.ipv4.ip_forward set to 1 in the daemon's network namespace: pods' traffic \
             to the outside is routed to the uplink"
        );
    }
    datapath.attach_uplink(&settings.uplink)?;
    tracing::info!(
        uplink = %settings.uplink,
        node_addr = ?settings.node_addr,
        ports = %settings.ports,
        "source NAT enabled"
    );
    Ok(nat)
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of `bpf_ktime_get_coarse_ns` (which reads it
/// as of the last tick) and so of
/// `NatEntry::last_seen_ns`.
pub fn monotonic_now_ns() -> Result<u64, nix::Error> {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC)?;
    // Both are non-negative for CLOCK_MONOTONIC.
    let secs = u64::try_from(now.tv_sec()).unwrap_or_default();
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or_default();
    Ok(secs * 1_000_000_000 + nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_become_the_datapath_config() {
        let settings = NatSettings {
            uplink: "eth0".to_owned(),
            by_default_route: true,
            uplink_ifindex: 4,
            node_addr: Some(Ipv4Addr::new(198, 18, 0, 1)),
            ports: PortRange {
                min: 61000,
                max: 65535,
            },
            timeouts: Timeouts {
                tcp_established: 3600,
                tcp_transitory: 120,
                tcp_closed: 10,
                udp: 30,
                icmp: 20,
            },
        };
        assert_eq!(
            settings.config(),
            NatConfig {
                node_addr: [198, 18, 0, 1],
                port_min: 61000,
                port_max: 65535,
                tcp_established_secs: 3600,
                tcp_transitory_secs: 120,
                udp_secs: 30,
                icmp_secs: 20,
                uplink_ifindex: 4,
                tcp_closed_secs: 10,
            }
        );
    }

    fn args(extra: &[&str]) -> NatArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            nat: NatArgs,
        }
        let argv = std::iter::once("test").chain(extra.iter().copied());
        <Cli as clap::Parser>::try_parse_from(argv)
            .expect("valid flags")
            .nat
    }

    #[test]
    fn an_uplink_that_does_not_exist_is_an_error() {
        let error = args(&["--uplink", "ecni-no-such-if"])
            .resolve()
            .expect_err("must fail");
        assert!(matches!(error, NatError::NoUplink(name) if name == "ecni-no-such-if"));
    }

    #[test]
    fn an_explicit_uplink_takes_its_first_ipv4_address() {
        // Reads this namespace's loopback only: 127.0.0.1 once up, nothing while down.
        match args(&["--uplink", "lo", "--nat-udp-timeout", "45"]).resolve() {
            Ok(Some(settings)) => {
                assert_eq!(settings.uplink, "lo");
                assert!(settings.node_addr.is_none_or(|addr| addr.is_loopback()));
                assert!(settings.uplink_ifindex > 0);
                assert_eq!(settings.timeouts.udp, 45);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let first = monotonic_now_ns().expect("clock");
        let second = monotonic_now_ns().expect("clock");
        assert!(first > 0 && second >= first);
    }
}
