//! The NAT flags of `ebpf-cnid run`, and the values they parse into.

use std::{fmt, str::FromStr, time::Duration};

use serde::Serialize;

/// Idle timeouts in seconds, per kind of flow: defined with the rule that applies them,
/// which the datapath shares.
pub use cni_ebpf_common::Timeouts;

/// Source NAT of pod traffic leaving the node (flattened into `run`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Source NAT")]
pub struct NatArgs {
    /// Interfaces pod traffic to the outside leaves by, each translating to its own
    /// first IPv4 address (comma-separated, or the flag repeated, up to 16): a node with
    /// a second network (storage, management) names both, as MASQUERADE would translate
    /// on either. Default: the device of the default IPv4 route of the daemon's network
    /// namespace, followed when the default route moves; without one, NAT is off.
    #[arg(long = "uplink", env = "EBPF_CNID_UPLINK", value_delimiter = ',')]
    pub uplinks: Vec<String>,
    /// Node ports handed to translated flows, MIN-MAX inclusive (MIN >= 1024). The
    /// default sits below Linux's default ephemeral range (net.ipv4.ip_local_port_range,
    /// 32768-60999), so the node's own connections never take a port a translated flow
    /// holds (a reply would otherwise be ambiguous between the node and a pod), and it is
    /// large (31,744 ports per remote address and port) so that high connection churn to
    /// one service does not run out. Servers listening on the node in this range are not
    /// affected: a reply is matched on the whole (remote address, remote port, node port)
    /// tuple, which a client of such a server never reuses.
    #[arg(long, env = "EBPF_CNID_NAT_PORT_RANGE", default_value = "1024-32767")]
    pub nat_port_range: PortRange,
    /// Seconds an idle established TCP flow keeps its translation. Default 24 hours:
    /// what kube-proxy sets for the kernel's conntrack on a Kubernetes node (its
    /// `--conntrack-tcp-timeout-established`), which MASQUERADE follows, and more than
    /// Linux's default TCP keepalive interval (2 hours), so that an idle connection
    /// with keepalives (a database pool's) keeps its translation.
    #[arg(
        long,
        env = "EBPF_CNID_NAT_TCP_ESTABLISHED_TIMEOUT",
        default_value_t = 86_400,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub nat_tcp_established_timeout: u32,
    /// Seconds an idle TCP flow that is opening (SYN sent) or closing (FIN/RST seen) keeps
    /// its translation.
    #[arg(
        long,
        env = "EBPF_CNID_NAT_TCP_TRANSITORY_TIMEOUT",
        default_value_t = 120,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub nat_tcp_transitory_timeout: u32,
    /// Seconds a closed TCP flow (FIN each way, or RST) keeps its translation, so that
    /// late segments still find it while the port soon serves another flow.
    #[arg(
        long,
        env = "EBPF_CNID_NAT_TCP_CLOSED_TIMEOUT",
        default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub nat_tcp_closed_timeout: u32,
    /// Seconds an idle UDP flow that is not a stream keeps its translation: one without a
    /// reply, or a query and its answer (DNS), as conntrack's `nf_conntrack_udp_timeout`.
    #[arg(
        long,
        env = "EBPF_CNID_NAT_UDP_TIMEOUT",
        default_value_t = 30,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub nat_udp_timeout: u32,
    /// Seconds an idle UDP stream keeps its translation: a flow that had a reply and is
    /// still active two seconds after it began (a VPN, QUIC, a media session), as
    /// conntrack's assured UDP flows; so do SCTP and protocols without ports (GRE, ESP)
    /// once they are one (before, they take `--nat-udp-timeout`). Default
    /// 120 s, the kernel's conntrack `nf_conntrack_udp_timeout_stream`, which MASQUERADE
    /// follows for UDP (an SCTP heartbeat, every 30 s, then never races the timeout).
    #[arg(
        long,
        env = "EBPF_CNID_NAT_UDP_STREAM_TIMEOUT",
        default_value_t = 120,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub nat_udp_stream_timeout: u32,
    /// Seconds an idle ICMP echo flow keeps its translation.
    #[arg(
        long,
        env = "EBPF_CNID_NAT_ICMP_TIMEOUT",
        default_value_t = 30,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub nat_icmp_timeout: u32,
    /// Seconds between two sweeps of expired translations.
    #[arg(
        long,
        env = "EBPF_CNID_NAT_GC_INTERVAL",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub nat_gc_interval: u64,
    /// Flows the NAT tables hold, each of `NAT_OUT`, `NAT_IN`, `NAT_INBOUND` (flows
    /// opened from outside to pods' own addresses) and `HOSTPORT_FLOWS` (connections
    /// through hostPort mappings): about 100 bytes of kernel memory per
    /// flow and table, taken when the tables are created (about 100 MiB at the default,
    /// the size of the kernel's own conntrack table on a node of 24 GiB). Nothing is
    /// evicted: a new flow meeting a full table is refused (counted as `table_full`),
    /// and the sweep makes room at once, unanswered and closing flows first. A new size
    /// takes effect at the next start and resets the translated flows: the pinned
    /// tables are created anew (the notes of `NAT_INBOUND` and the hostPort
    /// connections are carried over).
    #[arg(
        long,
        env = "EBPF_CNID_NAT_MAX_FLOWS",
        default_value_t = 262_144,
        value_parser = clap::value_parser!(u32).range(i64::from(MIN_NAT_FLOWS)..=i64::from(MAX_NAT_FLOWS))
    )]
    pub nat_max_flows: u32,
    /// Entries one pod may hold in each flow table (translated flows, flows opened from
    /// outside to its own address, connections through its hostPorts); a new flow past
    /// it is refused and counted for that pod (`flow_budget`). Default: half of
    /// `--nat-max-flows` (131,072 at its default), so that no pod, nor the clients of
    /// one pod's hostPort, can take more than half of a table: the node's other pods
    /// always keep room for new flows. That is room for a pod opening 10,000
    /// connections a second, each held its closed timeout (10 s) after it ends. 0: no
    /// budget.
    #[arg(long, env = "EBPF_CNID_NAT_POD_MAX_FLOWS")]
    pub nat_pod_max_flows: Option<u32>,
    /// Node ports one pod may hold toward one destination (remote address, port and
    /// protocol); past it, a new flow there takes over one of the pod's own expired
    /// ports or is refused (`port_budget`). Default: seven eighths of
    /// `--nat-port-range` (27,776 ports at its default), so that one pod hammering a
    /// shared upstream (a DNS server) leaves the other pods an eighth of the ports
    /// toward it (3,968, about 4,000 short connections a second), while it can still
    /// open some 27,000 short connections a second there itself, more than the
    /// kernel's conntrack manages on the same node: a connection the pod closes holds
    /// its node port one second after its end. 0: no budget.
    #[arg(long, env = "EBPF_CNID_NAT_POD_PORTS_PER_DESTINATION")]
    pub nat_pod_ports_per_destination: Option<u32>,
}

/// Each pod's share of the flow tables (see `cni_ebpf_common::budget`), as
/// [`NatArgs::budgets`] resolves it; 0 is no budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budgets {
    /// Entries per pod in each flow table.
    pub pod_flows: u32,
    /// Node ports per pod toward one destination.
    pub ports_per_destination: u32,
}

/// Bounds of `--nat-max-flows`.
pub const MIN_NAT_FLOWS: u32 = 1024;
pub const MAX_NAT_FLOWS: u32 = 1 << 20;

impl NatArgs {
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            tcp_established: self.nat_tcp_established_timeout,
            tcp_transitory: self.nat_tcp_transitory_timeout,
            tcp_closed: self.nat_tcp_closed_timeout,
            udp: self.nat_udp_timeout,
            udp_stream: self.nat_udp_stream_timeout,
            icmp: self.nat_icmp_timeout,
        }
    }

    /// The budgets the flags ask for, or their defaults: half of `--nat-max-flows` and
    /// seven eighths of `--nat-port-range`.
    pub fn budgets(&self) -> Budgets {
        let range = u32::from(self.nat_port_range.max - self.nat_port_range.min) + 1;
        Budgets {
            pod_flows: self.nat_pod_max_flows.unwrap_or(self.nat_max_flows / 2),
            ports_per_destination: self.nat_pod_ports_per_destination.unwrap_or(range / 8 * 7),
        }
    }

    pub fn gc_interval(&self) -> Duration {
        Duration::from_secs(self.nat_gc_interval)
    }
}

/// Inclusive range of node ports, `MIN-MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PortRange {
    pub min: u16,
    pub max: u16,
}

/// The lowest port NAT may use: the well-known ports below belong to node services.
pub const LOWEST_NAT_PORT: u16 = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortRangeError {
    #[error("{0:?} is not MIN-MAX")]
    Format(String),
    #[error("{0:?} is not a port number")]
    Port(String),
    #[error("MIN {min} is above MAX {max}")]
    Reversed { min: u16, max: u16 },
    #[error("MIN {0} is below {LOWEST_NAT_PORT}: the well-known ports belong to node services")]
    Privileged(u16),
}

impl FromStr for PortRange {
    type Err = PortRangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (min, max) = text
            .split_once('-')
            .ok_or_else(|| PortRangeError::Format(text.to_owned()))?;
        let port = |part: &str| {
            part.trim()
                .parse::<u16>()
                .map_err(|_| PortRangeError::Port(part.to_owned()))
        };
        let (min, max) = (port(min)?, port(max)?);
        if min > max {
            return Err(PortRangeError::Reversed { min, max });
        }
        if min < LOWEST_NAT_PORT {
            return Err(PortRangeError::Privileged(min));
        }
        Ok(Self { min, max })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

impl PortRange {
    pub fn overlaps(&self, other: &PortRange) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_range_parses_min_and_max() {
        assert_eq!(
            "61000-65535".parse(),
            Ok(PortRange {
                min: 61000,
                max: 65535
            })
        );
        assert_eq!(
            "2000-2000".parse(),
            Ok(PortRange {
                min: 2000,
                max: 2000
            })
        );
    }

    #[test]
    fn port_range_refuses_malformed_text() {
        for bad in [
            "",
            "61000",
            "61000:65535",
            "a-b",
            "61000-",
            "-65535",
            "0-70000",
        ] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn port_range_refuses_min_above_max() {
        assert_eq!(
            "65000-61000".parse::<PortRange>(),
            Err(PortRangeError::Reversed {
                min: 65000,
                max: 61000
            })
        );
    }

    #[test]
    fn port_range_refuses_well_known_ports() {
        assert_eq!(
            "1023-2000".parse::<PortRange>(),
            Err(PortRangeError::Privileged(1023))
        );
        assert!("1024-2000".parse::<PortRange>().is_ok());
    }

    #[test]
    fn default_port_range_stays_clear_of_linux_ephemeral_ports() {
        let nat: PortRange = "1024-32767".parse().expect("valid");
        let linux = PortRange {
            min: 32768,
            max: 60999,
        };
        assert!(!nat.overlaps(&linux));
        assert!(nat.overlaps(&PortRange {
            min: 32767,
            max: 60999
        }));
    }

    #[test]
    fn nat_flags_parse_with_their_defaults() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            nat: NatArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["test"]).expect("defaults parse");
        assert!(cli.nat.uplinks.is_empty());
        assert_eq!(
            cli.nat.nat_port_range,
            PortRange {
                min: 1024,
                max: 32767
            }
        );
        assert_eq!(
            cli.nat.timeouts(),
            Timeouts {
                tcp_established: 86_400,
                tcp_transitory: 120,
                tcp_closed: 10,
                udp: 30,
                udp_stream: 120,
                icmp: 30
            }
        );
        assert_eq!(cli.nat.gc_interval(), Duration::from_secs(10));
        assert!(
            <Cli as clap::Parser>::try_parse_from(["test", "--nat-port-range", "100-200"]).is_err()
        );
        assert!(<Cli as clap::Parser>::try_parse_from(["test", "--nat-udp-timeout", "0"]).is_err());
        assert_eq!(cli.nat.nat_max_flows, 262_144);
        assert_eq!(
            cli.nat.budgets(),
            Budgets {
                pod_flows: 131_072,
                ports_per_destination: 27_776,
            },
            "half the table per pod, seven eighths of the ports per destination"
        );
        for (size, ok) in [
            ("1023", false),
            ("1024", true),
            ("1048576", true),
            ("1048577", false),
        ] {
            assert_eq!(
                <Cli as clap::Parser>::try_parse_from(["test", "--nat-max-flows", size]).is_ok(),
                ok,
                "--nat-max-flows {size}"
            );
        }
        for argv in [
            &["test", "--uplink", "eth0,eth1"][..],
            &["test", "--uplink", "eth0", "--uplink", "eth1"],
        ] {
            let cli = <Cli as clap::Parser>::try_parse_from(argv).expect("uplinks parse");
            assert_eq!(cli.nat.uplinks, ["eth0", "eth1"], "{argv:?}");
        }
    }
}
