//! What the inspection commands show: pinned maps read directly (they need no running
//! daemon), joined with what the daemon answers, as tables or JSON.

use std::{collections::BTreeMap, net::Ipv4Addr, path::Path};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuHashMap};
use cni_ebpf_common::{
    DropReason, EndpointCounters, NatConfig, NatEntry, NatKey, SourceKey, TrafficCounters,
    map_names,
};
use serde::Serialize;

use cni_api::{Endpoint, LinkCounters, Status};

use crate::{
    bpffs, clock, hostports,
    nat::{self, Timeouts},
};

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("cannot open the pinned map {path} (is the daemon installed there?): {source}")]
    Open {
        path: String,
        source: aya::maps::MapError,
    },
    #[error("cannot read the map: {0}")]
    Read(#[from] aya::maps::MapError),
}

/// Counters of one source address, summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceCounters {
    pub source: Ipv4Addr,
    pub packets: u64,
    pub bytes: u64,
}

/// Every source counted so far, sorted by address.
pub fn source_counters(bpf_dir: &Path) -> Result<Vec<SourceCounters>, InspectError> {
    let data = open_pinned(bpf_dir, map_names::SOURCE_STATS)?;
    let map: PerCpuHashMap<_, SourceKey, TrafficCounters> =
        PerCpuHashMap::try_from(Map::PerCpuHashMap(data))?;
    let mut rows = Vec::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        let total = per_cpu
            .iter()
            .fold(TrafficCounters::default(), |sum, cpu| sum.plus(*cpu));
        rows.push(SourceCounters {
            source: Ipv4Addr::from(key.addr),
            packets: total.packets,
            bytes: total.bytes,
        });
    }
    rows.sort_by_key(|row| row.source);
    Ok(rows)
}

/// The map pinned as `name` under `bpf_dir`.
pub(crate) fn open_pinned(bpf_dir: &Path, name: &str) -> Result<MapData, InspectError> {
    let path = bpffs::map_pin(bpf_dir, name);
    MapData::from_pin(&path).map_err(|source| InspectError::Open {
        path: path.display().to_string(),
        source,
    })
}

/// Per-endpoint counters by host veth ifindex, summed over CPUs.
pub fn endpoint_counters(bpf_dir: &Path) -> Result<BTreeMap<u32, EndpointCounters>, InspectError> {
    let data = open_pinned(bpf_dir, map_names::ENDPOINT_COUNTERS)?;
    let map: PerCpuHashMap<_, u32, EndpointCounters> =
        PerCpuHashMap::try_from(Map::PerCpuHashMap(data))?;
    let mut counters = BTreeMap::new();
    for entry in map.iter() {
        let (ifindex, per_cpu) = entry?;
        let total = per_cpu
            .iter()
            .fold(EndpointCounters::default(), |sum, cpu| sum.plus(*cpu));
        counters.insert(ifindex, total);
    }
    Ok(counters)
}

/// Drops per reason, summed over CPUs, every reason listed (zeros too).
pub fn drops(bpf_dir: &Path) -> Result<BTreeMap<&'static str, u64>, InspectError> {
    let data = open_pinned(bpf_dir, map_names::DROPS)?;
    let map: PerCpuArray<_, u64> = PerCpuArray::try_from(Map::PerCpuArray(data))?;
    let mut drops = BTreeMap::new();
    for reason in DropReason::ALL {
        let per_cpu = map.get(&(reason as u32), 0)?;
        drops.insert(reason.name(), per_cpu.iter().sum());
    }
    Ok(drops)
}

/// An endpoint with its counters, as `ebpf-cnid endpoints` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointView {
    #[serde(flatten)]
    pub endpoint: Endpoint,
    pub counters: CountersView,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CountersView {
    pub from_pod_packets: u64,
    pub from_pod_bytes: u64,
    pub to_pod_packets: u64,
    pub to_pod_bytes: u64,
}

impl From<EndpointCounters> for CountersView {
    fn from(c: EndpointCounters) -> Self {
        Self {
            from_pod_packets: c.from_pod_packets,
            from_pod_bytes: c.from_pod_bytes,
            to_pod_packets: c.to_pod_packets,
            to_pod_bytes: c.to_pod_bytes,
        }
    }
}

/// Joins the daemon's endpoints with the pinned counters; "to pod" adds what the node's
/// stack sent (`stack_sent`, the host veths' kernel TX counters) to what the datapath
/// delivered.
pub fn endpoint_views(
    endpoints: Vec<Endpoint>,
    counters: &BTreeMap<u32, EndpointCounters>,
    stack_sent: &[LinkCounters],
) -> Vec<EndpointView> {
    endpoints
        .into_iter()
        .map(|endpoint| {
            let mut view = counters
                .get(&endpoint.host_ifindex)
                .copied()
                .map(CountersView::from)
                .unwrap_or_default();
            let sent = stack_sent
                .iter()
                .find(|sent| sent.ifindex == endpoint.host_ifindex);
            if let Some(sent) = sent {
                view.to_pod_packets += sent.packets;
                view.to_pod_bytes += sent.bytes;
            }
            EndpointView {
                counters: view,
                endpoint,
            }
        })
        .collect()
}

/// `ebpf-cnid status`: the daemon's answer, the drop and the NAT counters.
#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    #[serde(flatten)]
    pub status: Status,
    pub drops: BTreeMap<&'static str, u64>,
    pub nat_counters: BTreeMap<&'static str, u64>,
}

pub fn status_table(view: &StatusView) -> String {
    let status = &view.status;
    let mut out = format!(
        "daemon {}  bpf dir {}  datapath {}  endpoints {}\n",
        status.daemon_version,
        status.bpf_dir,
        if status.datapath_loaded {
            "loaded"
        } else {
            "not loaded"
        },
        status.endpoints
    );
    let drops: Vec<String> = view.drops.iter().map(|(r, n)| format!("{r}={n}")).collect();
    out.push_str(&format!("drops: {}\n", drops.join(" ")));
    if status.nat_enabled {
        out.push_str("nat: enabled\n");
        for uplink in &status.uplinks {
            let node = uplink.node_addr.map_or_else(
                || crate::nat::view::NO_ADDRESS.to_owned(),
                |addr| addr.to_string(),
            );
            out.push_str(&format!("  uplink {}  node {node}\n", uplink.name));
        }
    } else {
        out.push_str("nat: disabled\n");
    }
    if !status.service_cidrs.is_empty() {
        out.push_str(&format!(
            "services: {} (through the node's stack: kube-proxy)\n",
            joined(&status.service_cidrs, ", ")
        ));
    }
    match status.pod_gso_max_size {
        Some(size) => out.push_str(&format!(
            "new pods: IPv4 GSO/GRO size {size} (BIG TCP, following the uplinks)\n"
        )),
        None => out.push_str("new pods: IPv4 GSO/GRO size default (64 KiB)\n"),
    }
    out.push_str(&format!(
        "nat counters: {}\n",
        crate::nat::view::counters_line(&view.nat_counters)
    ));
    out.push_str(&format!(
        "hostPort addresses: {} (and 127.0.0.0/8 for the node's own processes)\n",
        joined(&status.host_port_addrs, " ")
    ));
    if !status.attachments.is_empty() {
        // Columns as wide as their longest entry: a cgroup path is long.
        let width = |column: &dyn Fn(&cni_api::Attachment) -> usize, title: &str| {
            status
                .attachments
                .iter()
                .map(column)
                .chain([title.len()])
                .max()
                .unwrap_or(0)
        };
        let interface = width(&|a| a.interface.len(), "INTERFACE");
        let program = width(&|a| a.program.len(), "PROGRAM");
        out.push_str(&format!(
            "{:<interface$} {:>8} {:<program$} {}\n",
            "INTERFACE", "IFINDEX", "PROGRAM", "MODE"
        ));
        for a in &status.attachments {
            out.push_str(&format!(
                "{:<interface$} {:>8} {:<program$} {}\n",
                a.interface, a.ifindex, a.program, a.mode
            ));
        }
    }
    out
}

/// A readable table of `rows`.
pub fn counters_table(rows: &[SourceCounters]) -> String {
    let mut out = format!("{:<16} {:>12} {:>14}\n", "SOURCE", "PACKETS", "BYTES");
    for row in rows {
        out.push_str(&format!(
            "{:<16} {:>12} {:>14}\n",
            row.source.to_string(),
            row.packets,
            row.bytes
        ));
    }
    out
}

/// One hostPort mapping, as `ebpf-cnid ports` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortRow {
    pub protocol: String,
    /// `None`: every node address.
    pub host_ip: Option<std::net::IpAddr>,
    pub host_port: u16,
    pub pod_ip: Option<std::net::IpAddr>,
    pub container_port: u16,
    pub container_id: String,
    pub ifname: String,
    /// Connections through the mapping the datapath follows (see
    /// [`hostport_connections`]).
    pub connections: usize,
}

/// The connections through hostPort mappings the datapath follows (`HOSTPORT_FLOWS`,
/// keyed from the pod's side, the host address and port in the node fields), but those
/// idle past their timeout, which the next sweep removes. While the daemon wrote no
/// timeouts (NAT off) nothing expires them: all of them.
pub fn hostport_connections(bpf_dir: &Path) -> Result<Vec<(NatKey, NatEntry)>, InspectError> {
    let table: HashMap<_, NatKey, NatEntry> = HashMap::try_from(Map::LruHashMap(open_pinned(
        bpf_dir,
        map_names::HOSTPORT_FLOWS,
    )?))?;
    let config: Array<_, NatConfig> =
        Array::try_from(Map::Array(open_pinned(bpf_dir, map_names::NAT_CONFIG)?))?;
    let config = config.get(&0, 0)?;
    let timeouts = config
        .has_timeouts()
        .then(|| Timeouts::from_config(&config));
    let now_ns = clock::monotonic_now_ns().unwrap_or_default();
    let mut live = Vec::new();
    for (key, connection) in nat::tables::snapshot(&table)? {
        let expired = timeouts
            .as_ref()
            .is_some_and(|timeouts| timeouts.expired(&connection, key.proto, now_ns));
        if !expired {
            live.push((key, connection));
        }
    }
    Ok(live)
}

/// Whether `connection` (keyed by `key`) goes through the mapping `row`.
fn through(row: &PortRow, key: &NatKey, connection: &NatEntry) -> bool {
    let Some(proto) = hostports::ip_proto(&row.protocol) else {
        return false;
    };
    let host_matches = match row.host_ip {
        None => true,
        Some(std::net::IpAddr::V4(ip)) => ip.octets() == connection.node_addr,
        Some(std::net::IpAddr::V6(_)) => false,
    };
    key.proto == proto
        && connection.node_port == row.host_port
        && host_matches
        && row.pod_ip == Some(std::net::IpAddr::V4(Ipv4Addr::from(key.pod_addr)))
        && key.pod_port == row.container_port
}

/// Every endpoint's mappings, sorted by protocol and host port, each with the number of
/// `connections` (see [`hostport_connections`]) through it.
pub fn port_rows(endpoints: &[Endpoint], connections: &[(NatKey, NatEntry)]) -> Vec<PortRow> {
    let mut rows: Vec<PortRow> = endpoints
        .iter()
        .flat_map(|endpoint| {
            let pod_ip = endpoint
                .ips
                .iter()
                .map(ipnet::IpNet::addr)
                .find(std::net::IpAddr::is_ipv4);
            endpoint.port_mappings.iter().map(move |mapping| PortRow {
                protocol: mapping.protocol.clone(),
                host_ip: mapping.host_ip.filter(|ip| !ip.is_unspecified()),
                host_port: mapping.host_port,
                pod_ip,
                container_port: mapping.container_port,
                container_id: endpoint.id.container_id.clone(),
                ifname: endpoint.id.ifname.clone(),
                connections: 0,
            })
        })
        .collect();
    for row in &mut rows {
        row.connections = connections
            .iter()
            .filter(|(key, connection)| through(row, key, connection))
            .count();
    }
    rows.sort_by(|a, b| (&a.protocol, a.host_port).cmp(&(&b.protocol, b.host_port)));
    rows
}

pub fn ports_table(rows: &[PortRow]) -> String {
    let mut out = format!(
        "{:<5} {:<22} {:<22} {:>5} {}\n",
        "PROTO", "HOST", "POD", "CONNS", "CONTAINER"
    );
    for row in rows {
        let host = format!(
            "{}:{}",
            row.host_ip
                .map_or_else(|| "*".to_owned(), |ip| ip.to_string()),
            row.host_port
        );
        let pod = format!(
            "{}:{}",
            row.pod_ip
                .map_or_else(|| "?".to_owned(), |ip| ip.to_string()),
            row.container_port
        );
        out.push_str(&format!(
            "{:<5} {:<22} {:<22} {:>5} {}/{}\n",
            row.protocol, host, pod, row.connections, row.container_id, row.ifname
        ));
    }
    out
}

/// A readable table of endpoints and their counters.
pub fn endpoints_table(views: &[EndpointView]) -> String {
    let mut out = format!(
        "{:<20} {:<8} {:<18} {:<17} {:<15} {:>7} {:>10} {:>10}\n",
        "CONTAINER", "IFNAME", "IP", "MAC", "HOST VETH", "IFINDEX", "PKTS OUT", "PKTS IN"
    );
    for view in views {
        let endpoint = &view.endpoint;
        let ips: Vec<String> = endpoint.ips.iter().map(ToString::to_string).collect();
        let container: String = endpoint.id.container_id.chars().take(20).collect();
        out.push_str(&format!(
            "{:<20} {:<8} {:<18} {:<17} {:<15} {:>7} {:>10} {:>10}\n",
            container,
            endpoint.id.ifname,
            ips.join(","),
            endpoint.mac,
            endpoint.host_veth,
            endpoint.host_ifindex,
            view.counters.from_pod_packets,
            view.counters.to_pod_packets,
        ));
    }
    out
}

/// `items` as text, separated by `separator`.
fn joined<T: std::fmt::Display>(items: &[T], separator: &str) -> String {
    let texts: Vec<String> = items.iter().map(ToString::to_string).collect();
    texts.join(separator)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The view of a daemon with nothing attached and NAT off, for a test to change.
    fn view(status: Status) -> StatusView {
        StatusView {
            status,
            drops: BTreeMap::new(),
            nat_counters: BTreeMap::new(),
        }
    }

    fn idle() -> Status {
        Status {
            daemon_version: "0".into(),
            bpf_dir: "/sys/fs/bpf/x".into(),
            datapath_loaded: true,
            endpoints: 0,
            attachments: Vec::new(),
            nat_enabled: false,
            uplink: None,
            node_addr: None,
            uplinks: Vec::new(),
            service_cidrs: Vec::new(),
            host_port_addrs: Vec::new(),
            pod_gso_max_size: None,
        }
    }

    #[test]
    fn a_connection_counts_for_the_mapping_it_went_through_only() {
        let row = |protocol: &str, host_ip: Option<&str>| PortRow {
            protocol: protocol.into(),
            host_ip: host_ip.map(|ip| ip.parse().expect("an address")),
            host_port: 30080,
            pod_ip: Some("10.244.0.2".parse().expect("an address")),
            container_port: 8080,
            container_id: "c".into(),
            ifname: "eth0".into(),
            connections: 0,
        };
        let key = NatKey::new(([10, 244, 0, 2], 8080), ([198, 18, 0, 2], 50000), 6);
        let connection = NatEntry {
            node_addr: [198, 18, 0, 1],
            node_port: 30080,
            ..NatEntry::from_outside(&key, 0, 0)
        };
        assert!(through(&row("tcp", None), &key, &connection));
        assert!(through(&row("tcp", Some("198.18.0.1")), &key, &connection));
        assert!(
            !through(&row("tcp", Some("198.18.0.9")), &key, &connection),
            "another host address"
        );
        assert!(
            !through(&row("udp", None), &key, &connection),
            "another protocol"
        );
        let other_port = NatEntry {
            node_port: 30081,
            ..connection
        };
        assert!(
            !through(&row("tcp", None), &key, &other_port),
            "another host port"
        );
        let other_pod = NatKey::new(([10, 244, 0, 3], 8080), ([198, 18, 0, 2], 50000), 6);
        assert!(
            !through(&row("tcp", None), &other_pod, &connection),
            "another pod"
        );
    }

    #[test]
    fn status_columns_are_as_wide_as_the_longest_attachment() {
        let attachment = |interface: &str, program: &str| cni_api::Attachment {
            interface: interface.into(),
            ifindex: 2,
            program: program.into(),
            mode: "m".into(),
        };
        let view = view(Status {
            attachments: vec![
                attachment("uplink0", "uplink_egress"),
                attachment(
                    "/sys/fs/cgroup/unified/a-long-cgroup",
                    "hostport_getpeername4",
                ),
            ],
            ..idle()
        });
        let table = status_table(&view);
        let rows: Vec<&str> = table
            .lines()
            .skip_while(|line| !line.starts_with("INTERFACE"))
            .collect();
        assert_eq!(rows.len(), 3, "{table}");
        let mode_at: Vec<Option<usize>> = rows.iter().map(|row| row.rfind(' ')).collect();
        assert!(
            mode_at.iter().all(|at| *at == mode_at[0]),
            "the last column starts at one place: {table}"
        );
    }

    #[test]
    fn status_names_every_uplink_and_the_service_ranges() {
        let uplink = |name: &str, ifindex, node_addr| cni_api::UplinkStatus {
            name: name.into(),
            ifindex,
            node_addr,
        };
        let view = view(Status {
            nat_enabled: true,
            uplink: Some("eth0".into()),
            node_addr: Some([198, 18, 0, 1].into()),
            uplinks: vec![
                uplink("eth0", 2, Some([198, 18, 0, 1].into())),
                uplink("eth1", 3, None),
            ],
            service_cidrs: vec!["10.96.0.0/12".parse().expect("a range")],
            ..idle()
        });
        let table = status_table(&view);
        let nat: Vec<&str> = table
            .lines()
            .skip_while(|line| *line != "nat: enabled")
            .take(4)
            .collect();
        assert_eq!(
            nat,
            [
                "nat: enabled",
                "  uplink eth0  node 198.18.0.1",
                &format!("  uplink eth1  node {}", crate::nat::view::NO_ADDRESS),
                "services: 10.96.0.0/12 (through the node's stack: kube-proxy)",
            ],
            "{table}"
        );
    }

    #[test]
    fn table_lists_each_source_with_its_counters() {
        let rows = [SourceCounters {
            source: Ipv4Addr::new(198, 18, 0, 2),
            packets: 5,
            bytes: 490,
        }];
        let table = counters_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["198.18.0.2", "5", "490"]
        );
    }
}
