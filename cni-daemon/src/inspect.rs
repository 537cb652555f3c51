//! Reading pinned maps for the CLI (`ebpf-cnid counters`), without the daemon running.

use std::{net::Ipv4Addr, path::Path};

use aya::maps::{Map, MapData, PerCpuHashMap};
use cni_ebpf_common::{SourceKey, TrafficCounters, map_names};
use serde::Serialize;

use crate::{api::Endpoint, bpffs};

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
    let path = bpffs::map_pin(bpf_dir, map_names::SOURCE_STATS);
    let data = MapData::from_pin(&path).map_err(|source| InspectError::Open {
        path: path.display().to_string(),
        source,
    })?;
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

/// A readable table of endpoint records.
pub fn endpoints_table(endpoints: &[Endpoint]) -> String {
    let mut out = format!(
        "{:<20} {:<8} {:<18} {:<18} {:<16} {:>7}\n",
        "CONTAINER", "IFNAME", "IP", "MAC", "HOST VETH", "IFINDEX"
    );
    for endpoint in endpoints {
        let ips: Vec<String> = endpoint.ips.iter().map(ToString::to_string).collect();
        let container: String = endpoint.id.container_id.chars().take(20).collect();
        out.push_str(&format!(
            "{:<20} {:<8} {:<18} {:<18} {:<16} {:>7}\n",
            container,
            endpoint.id.ifname,
            ips.join(","),
            endpoint.mac,
            endpoint.host_veth,
            endpoint.host_ifindex
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
