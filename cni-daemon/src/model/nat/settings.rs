//! NAT as this daemon runs it ([`NatSettings`]): the uplinks and their addresses,
//! resolved from the flags ([`NatArgs::resolve`]) and the namespace's routes, and the
//! values the datapath reads from them (`NAT_CONFIG`, `UPLINKS`).

use std::net::Ipv4Addr;

use cni_ebpf_common::{MAX_UPLINKS, NatConfig, Uplinks};

use super::{
    NatError,
    args::{Budgets, NatArgs, PortRange, Timeouts},
    uplink,
};

/// NAT as this daemon runs it, resolved from [`NatArgs`] and the namespace's routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatSettings {
    /// The devices translated traffic leaves by, as `--uplink` lists them: never empty.
    pub uplinks: Vec<Uplink>,
    /// The uplink is the default route's device (no `--uplink`): it follows the default
    /// route when that moves to another device (see [`Nat::follow_uplink`](super::Nat::follow_uplink)).
    pub by_default_route: bool,
    pub ports: PortRange,
    pub timeouts: Timeouts,
    pub budgets: Budgets,
}

/// A device source NAT translates on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    pub name: String,
    pub ifindex: u32,
    /// Its first IPv4 address: the source of packets translated as they leave by it.
    /// `None` while it has none, at start or later (see [`Nat::follow_uplink`](super::Nat::follow_uplink)).
    pub node_addr: Option<Ipv4Addr>,
}

impl Uplink {
    /// The device `name` as it is now.
    pub fn now(name: &str) -> Result<Self, NatError> {
        let ifindex =
            nix::net::if_::if_nametoindex(name).map_err(|_| NatError::NoUplink(name.to_owned()))?;
        let node_addr = uplink::ipv4_address(name)?;
        if node_addr.is_none() {
            tracing::warn!(
                uplink = name,
                "the uplink has no IPv4 address yet: pods' traffic out of it is dropped \
                 (counted as nat_no_address) until it has one"
            );
        }
        Ok(Self {
            name: name.to_owned(),
            ifindex,
            node_addr,
        })
    }

    fn addr_octets(&self) -> [u8; 4] {
        self.node_addr
            .map_or(NatConfig::NO_ADDRESS, |addr| addr.octets())
    }
}

impl NatSettings {
    /// The first uplink (the one `status` names).
    pub fn first(&self) -> &Uplink {
        &self.uplinks[0]
    }

    /// The `NAT_CONFIG` value the datapath reads: the first uplink's address there
    /// says NAT is on.
    pub fn config(&self) -> NatConfig {
        let first = self.first();
        NatConfig {
            node_addr: first.addr_octets(),
            port_min: self.ports.min,
            port_max: self.ports.max,
            tcp_established_secs: self.timeouts.tcp_established,
            tcp_transitory_secs: self.timeouts.tcp_transitory,
            udp_secs: self.timeouts.udp,
            icmp_secs: self.timeouts.icmp,
            uplink_ifindex: first.ifindex,
            tcp_closed_secs: self.timeouts.tcp_closed,
            udp_stream_secs: self.timeouts.udp_stream,
            pod_flow_budget: self.budgets.pod_flows,
            dest_port_budget: self.budgets.ports_per_destination,
        }
    }

    /// The `UPLINKS` value the datapath reads (at most [`MAX_UPLINKS`], which
    /// [`NatArgs::resolve`] checked).
    pub fn uplinks(&self) -> Uplinks {
        let mut uplinks = Uplinks::default();
        for uplink in &self.uplinks {
            uplinks.push(uplink.ifindex, uplink.addr_octets());
        }
        uplinks
    }
}

impl NatArgs {
    /// The uplinks (`--uplink`, else the default route's device) and their addresses.
    /// No uplink at all is not an error: NAT is off (`None`), said at warn. An uplink
    /// without an IPv4 address (yet: a node whose DHCP lease comes after the daemon)
    /// is not one either: NAT starts without its address, dropping what it would
    /// translate there, and takes the address when it comes ([`Nat::follow_uplink`](super::Nat::follow_uplink)).
    /// Failing instead left a DaemonSet restarting with back-off, and no pod could be
    /// created meanwhile. A named device that does not exist, a name given twice, an
    /// empty one or more than [`MAX_UPLINKS`] are errors: the flag is wrong.
    pub fn resolve(&self) -> Result<Option<NatSettings>, NatError> {
        let names = if self.uplinks.is_empty() {
            let Some(uplink) = uplink::default_route_device_now()? else {
                tracing::warn!(
                    "no --uplink and no default IPv4 route in this network namespace: \
                     source NAT is disabled"
                );
                return Ok(None);
            };
            vec![uplink]
        } else {
            self.uplinks.clone()
        };
        if names.len() > MAX_UPLINKS {
            return Err(NatError::Uplinks(format!(
                "{} interfaces, at most {MAX_UPLINKS}",
                names.len()
            )));
        }
        let mut uplinks: Vec<Uplink> = Vec::with_capacity(names.len());
        for name in &names {
            if name.is_empty() {
                return Err(NatError::Uplinks("an empty interface name".to_owned()));
            }
            if uplinks.iter().any(|uplink| uplink.name == *name) {
                return Err(NatError::Uplinks(format!("{name} is named twice")));
            }
            uplinks.push(Uplink::now(name)?);
        }
        Ok(Some(NatSettings {
            uplinks,
            by_default_route: self.uplinks.is_empty(),
            ports: self.nat_port_range,
            timeouts: self.timeouts(),
            budgets: self.budgets(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_become_the_datapath_config() {
        let settings = NatSettings {
            uplinks: vec![
                Uplink {
                    name: "eth0".to_owned(),
                    ifindex: 4,
                    node_addr: Some(Ipv4Addr::new(198, 18, 0, 1)),
                },
                Uplink {
                    name: "eth1".to_owned(),
                    ifindex: 9,
                    node_addr: None,
                },
            ],
            by_default_route: false,
            ports: PortRange {
                min: 61000,
                max: 65535,
            },
            timeouts: Timeouts {
                tcp_established: 3600,
                tcp_transitory: 120,
                tcp_closed: 10,
                udp: 30,
                udp_stream: 120,
                icmp: 20,
            },
            budgets: Budgets {
                pod_flows: 500,
                ports_per_destination: 3000,
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
                udp_stream_secs: 120,
                pod_flow_budget: 500,
                dest_port_budget: 3000,
            }
        );
        let uplinks = settings.uplinks();
        assert_eq!(
            uplinks.iter().collect::<Vec<_>>(),
            [(4, [198, 18, 0, 1]), (9, NatConfig::NO_ADDRESS)],
            "every uplink, in order; one without an address has NO_ADDRESS"
        );
        assert_eq!(uplinks.find(9), Some(NatConfig::NO_ADDRESS));
        assert_eq!(uplinks.find(5), None);
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
                assert_eq!(settings.uplinks.len(), 1);
                let uplink = settings.first();
                assert_eq!(uplink.name, "lo");
                assert!(uplink.node_addr.is_none_or(|addr| addr.is_loopback()));
                assert!(uplink.ifindex > 0);
                assert!(!settings.by_default_route);
                assert_eq!(settings.timeouts.udp, 45);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }

    #[test]
    fn a_wrong_uplink_list_is_an_error_that_says_why() {
        let many: Vec<String> = (0..=MAX_UPLINKS).map(|_| "lo".to_owned()).collect();
        for (list, says) in [
            ("lo,lo", "lo is named twice"),
            ("lo,", "an empty interface name"),
            (many.join(",").as_str(), "17 interfaces, at most 16"),
        ] {
            match args(&["--uplink", list]).resolve() {
                Err(NatError::Uplinks(message)) => assert_eq!(message, says, "{list}"),
                other => panic!("{list}: unexpected outcome {other:?}"),
            }
        }
    }
}
