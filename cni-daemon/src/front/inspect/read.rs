//! Reading the pinned maps (no daemon needed): counters summed over CPUs, the NAT
//! tables and the hostPort connections as the kernel holds them.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    net::Ipv4Addr,
    path::Path,
};

use aya::maps::{Array, HashMap, IterableMap, Map, MapData, PerCpuArray, PerCpuHashMap};
use cni_ebpf_common::{
    DropReason, EndpointCounters, FlowCounts, NatConfig, NatCounter, NatEntry, NatKey,
    NatReverseKey, PolicyCounters, RefusedFlows, SourceKey, TrafficCounters, Uplinks, map_names,
};
use serde::Serialize;

use super::InspectError;
use crate::{
    datapath::bpffs,
    model::nat::{Timeouts, flows},
};

/// The map pinned as `name` under `bpf_dir`.
fn open_pinned(bpf_dir: &Path, name: &str) -> Result<MapData, InspectError> {
    let path = bpffs::map_pin(bpf_dir, name);
    MapData::from_pin(&path).map_err(|source| InspectError::Open {
        path: path.display().to_string(),
        source,
    })
}

/// The map pinned as `name`, typed by what the kernel says it is.
fn pinned(bpf_dir: &Path, name: &str) -> Result<Map, InspectError> {
    Ok(Map::from_map_data(open_pinned(bpf_dir, name)?)?)
}

/// Every entry of the per-CPU hash `name`, its values summed over CPUs with `plus`.
fn per_cpu_totals<K: aya::Pod, V: aya::Pod + Default>(
    bpf_dir: &Path,
    name: &str,
    plus: fn(V, V) -> V,
) -> Result<Vec<(K, V)>, InspectError> {
    let data = open_pinned(bpf_dir, name)?;
    let map: PerCpuHashMap<_, K, V> = PerCpuHashMap::try_from(Map::PerCpuHashMap(data))?;
    let mut totals = Vec::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        let total = per_cpu
            .iter()
            .fold(V::default(), |sum, cpu| plus(sum, *cpu));
        totals.push((key, total));
    }
    Ok(totals)
}

/// The per-CPU array of counters `name`, each of `counters` (its slot and name) summed
/// over CPUs, every one listed (zeros too).
fn counters_by_name(
    bpf_dir: &Path,
    name: &str,
    counters: impl IntoIterator<Item = (u32, &'static str)>,
) -> Result<BTreeMap<&'static str, u64>, InspectError> {
    let data = open_pinned(bpf_dir, name)?;
    let map: PerCpuArray<_, u64> = PerCpuArray::try_from(Map::PerCpuArray(data))?;
    let mut sums = BTreeMap::new();
    for (slot, counter) in counters {
        let per_cpu = map.get(&slot, 0)?;
        sums.insert(counter, per_cpu.iter().sum());
    }
    Ok(sums)
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
    let totals: Vec<(SourceKey, TrafficCounters)> =
        per_cpu_totals(bpf_dir, map_names::SOURCE_STATS, TrafficCounters::plus)?;
    let mut rows: Vec<SourceCounters> = totals
        .into_iter()
        .map(|(key, total)| SourceCounters {
            source: Ipv4Addr::from(key.addr),
            packets: total.packets,
            bytes: total.bytes,
        })
        .collect();
    rows.sort_by_key(|row| row.source);
    Ok(rows)
}

/// What this node's pods sent to each other node, by the node's address, summed over
/// CPUs.
pub fn node_counters(bpf_dir: &Path) -> Result<BTreeMap<Ipv4Addr, TrafficCounters>, InspectError> {
    let totals: Vec<([u8; 4], TrafficCounters)> =
        per_cpu_totals(bpf_dir, map_names::NODE_STATS, TrafficCounters::plus)?;
    Ok(totals
        .into_iter()
        .map(|(addr, total)| (Ipv4Addr::from(addr), total))
        .collect())
}

/// Per-endpoint counters by host veth ifindex, summed over CPUs.
pub fn endpoint_counters(bpf_dir: &Path) -> Result<BTreeMap<u32, EndpointCounters>, InspectError> {
    let totals = per_cpu_totals(
        bpf_dir,
        map_names::ENDPOINT_COUNTERS,
        EndpointCounters::plus,
    )?;
    Ok(totals.into_iter().collect())
}

/// Each NetworkPolicy's counters by its slot (`POLICY_STATS`), summed over CPUs; a
/// policy that counted nothing yet has no entry.
pub fn policy_counters(bpf_dir: &Path) -> Result<BTreeMap<u32, PolicyCounters>, InspectError> {
    let totals = per_cpu_totals(
        bpf_dir,
        map_names::POLICY_STATS,
        |sum, cpu: PolicyCounters| PolicyCounters {
            allowed: sum.allowed + cpu.allowed,
            denied: sum.denied + cpu.denied,
            audited: sum.audited + cpu.audited,
        },
    )?;
    Ok(totals.into_iter().collect())
}

/// Drops per reason, summed over CPUs, every reason listed (zeros too).
pub fn drops(bpf_dir: &Path) -> Result<BTreeMap<&'static str, u64>, InspectError> {
    let reasons = DropReason::ALL.map(|reason| (reason as u32, reason.name()));
    counters_by_name(bpf_dir, map_names::DROPS, reasons)
}

/// NAT counters by name, summed over CPUs, every counter listed (zeros too).
pub fn nat_counters(bpf_dir: &Path) -> Result<BTreeMap<&'static str, u64>, InspectError> {
    let counters = NatCounter::ALL.map(|counter| (counter as u32, counter.name()));
    counters_by_name(bpf_dir, map_names::NAT_STATS, counters)
}

/// The connections through hostPort mappings the datapath follows (`HOSTPORT_FLOWS`,
/// keyed from the pod's side, the host address and port in the node fields), with the
/// timeouts that expire them.
pub struct HostPortConnections {
    pub connections: StdHashMap<NatKey, NatEntry>,
    /// `None` while the daemon wrote no timeouts (NAT off): nothing expires them.
    pub timeouts: Option<Timeouts>,
    /// CLOCK_MONOTONIC when they were read.
    pub now_ns: u64,
}

/// Reads [`HostPortConnections`].
pub fn hostport_connections(bpf_dir: &Path) -> Result<HostPortConnections, InspectError> {
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
    let now_ns = crate::clock::monotonic_now_ns().unwrap_or_default();
    Ok(HostPortConnections {
        connections: flows::snapshot(&table)?,
        timeouts,
        now_ns,
    })
}

/// Source NAT's maps as the kernel holds them: its configuration, the uplinks, the
/// counters and the flow tables, each read whole (each key once).
pub struct NatTables {
    pub config: NatConfig,
    pub uplinks: Uplinks,
    /// Flows each table holds at most (`--nat-max-flows`).
    pub max_flows: u32,
    pub counters: BTreeMap<&'static str, u64>,
    /// `NAT_OUT`: the pod side of each translated flow.
    pub flows_out: StdHashMap<NatKey, NatEntry>,
    /// `NAT_IN`: the node side of each translated flow.
    pub flows_in: StdHashMap<NatReverseKey, NatEntry>,
    /// `NAT_INBOUND`: flows a host outside opened to a pod's own address.
    pub from_outside: StdHashMap<NatKey, NatEntry>,
    /// `NAT_REFUSED`: new flows refused per pod address, by reason, summed over CPUs.
    pub refused: BTreeMap<[u8; 4], RefusedFlows>,
    /// `FLOW_COUNTS`: each pod's entries in the flow tables, as its budget counts them.
    pub counts: BTreeMap<[u8; 4], FlowCounts>,
}

/// Flows each NAT table holds at most (`--nat-max-flows`, as `NAT_OUT` was created).
pub fn nat_capacity(bpf_dir: &Path) -> Result<u32, InspectError> {
    let flows_out: HashMap<_, NatKey, NatEntry> =
        HashMap::try_from(pinned(bpf_dir, map_names::NAT_OUT)?)?;
    Ok(flows_out.map().info()?.max_entries())
}

/// Reads [`NatTables`].
pub fn nat_tables(bpf_dir: &Path) -> Result<NatTables, InspectError> {
    let config: Array<_, NatConfig> = Array::try_from(pinned(bpf_dir, map_names::NAT_CONFIG)?)?;
    let config = config.get(&0, 0)?;
    let flows_out: HashMap<_, NatKey, NatEntry> =
        HashMap::try_from(pinned(bpf_dir, map_names::NAT_OUT)?)?;
    let max_flows = flows_out.map().info()?.max_entries();
    let flows_in: HashMap<_, NatReverseKey, NatEntry> =
        HashMap::try_from(pinned(bpf_dir, map_names::NAT_IN)?)?;
    let uplinks: Array<_, Uplinks> = Array::try_from(pinned(bpf_dir, map_names::UPLINKS)?)?;
    let uplinks = uplinks.get(&0, 0)?;
    let flows_in = flows::snapshot(&flows_in)?;
    let flows_out = flows::snapshot(&flows_out)?;
    let notes: HashMap<_, NatKey, NatEntry> =
        HashMap::try_from(pinned(bpf_dir, map_names::NAT_INBOUND)?)?;
    let from_outside = flows::snapshot(&notes)?;
    Ok(NatTables {
        config,
        uplinks,
        max_flows,
        counters: nat_counters(bpf_dir)?,
        flows_out,
        flows_in,
        from_outside,
        refused: refused_flows(bpf_dir)?,
        counts: flow_counts(bpf_dir)?,
    })
}

/// New flows refused per pod address (`NAT_REFUSED`), by reason, summed over CPUs.
pub fn refused_flows(bpf_dir: &Path) -> Result<BTreeMap<[u8; 4], RefusedFlows>, InspectError> {
    let data = open_pinned(bpf_dir, map_names::NAT_REFUSED)?;
    let map: PerCpuHashMap<_, [u8; 4], RefusedFlows> =
        PerCpuHashMap::try_from(Map::PerCpuLruHashMap(data))?;
    let mut refused = BTreeMap::new();
    for entry in map.iter() {
        let (pod, per_cpu) = entry?;
        let sum = per_cpu
            .iter()
            .fold(RefusedFlows::default(), |sum, cpu| sum.add(cpu));
        refused.insert(pod, sum);
    }
    Ok(refused)
}

/// Each pod's entries in the flow tables (`FLOW_COUNTS`).
pub fn flow_counts(bpf_dir: &Path) -> Result<BTreeMap<[u8; 4], FlowCounts>, InspectError> {
    let map: HashMap<_, [u8; 4], FlowCounts> =
        HashMap::try_from(pinned(bpf_dir, map_names::FLOW_COUNTS)?)?;
    Ok(flows::snapshot(&map)?.into_iter().collect())
}
