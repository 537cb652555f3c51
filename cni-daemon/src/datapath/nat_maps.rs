//! The maps source NAT's user-space side owns, handed out typed by [`Datapath::take_nat_maps`]:
//! the configuration and the uplinks it writes, the cluster ranges it keeps in step with the
//! endpoints, the flow tables it sweeps, and the program that removes what a sweep decided.

use aya::{
    maps::{Array, HashMap, LpmTrie, Map, MapData, PerCpuArray},
    programs::ProgramFd,
};
use cni_ebpf_common::{
    EndpointInfo, EndpointKey, NatConfig, NatEntry, NatKey, NatReverseKey, ServiceClient,
    ServiceCounts, Uplinks, map_names, program_names,
};

use super::{Datapath, DatapathError, classifier};

/// `NAT_OUT`: the pod side of each flow.
pub type FlowsOut = HashMap<MapData, NatKey, NatEntry>;
/// `NAT_IN`: the node side of each flow.
pub type FlowsIn = HashMap<MapData, NatReverseKey, NatEntry>;
/// `NAT_INBOUND`: flows a host outside opened to a pod's own address (untranslated),
/// keyed from the pod's side as `NAT_OUT` is.
pub type FromOutside = HashMap<MapData, NatKey, NatEntry>;
/// `HOSTPORT_FLOWS`: connections through hostPort mappings, keyed from the pod's side.
pub type HostPortFlows = HashMap<MapData, NatKey, NatEntry>;
/// The Service tables (see `cni_ebpf_common::services`), swept with the flow tables.
pub struct ServiceTables {
    /// `SERVICE_CLIENTS`: pods' sockets with Service connections.
    pub clients: HashMap<MapData, ServiceClient, NatEntry>,
    /// `SERVICE_PEERS`: outside clients' sockets of Services.
    pub peers: HashMap<MapData, ServiceClient, NatEntry>,
    /// `SERVICE_FLOWS`: pods' Service connections, translated or direct.
    pub flows: HashMap<MapData, NatKey, NatEntry>,
    /// `SERVICE_COUNTS`: each party's entries in the three.
    pub counts: HashMap<MapData, [u8; 4], ServiceCounts>,
}
/// `ENDPOINTS`, the node's pods by address (another handle on the map the node keeps).
pub type Endpoints = HashMap<MapData, EndpointKey, EndpointInfo>;
/// `NAT_STATS`: source NAT's counters, per CPU, by `cni_ebpf_common::NatCounter`.
pub type NatStats = PerCpuArray<MapData, u64>;
/// `CLUSTER_CIDRS` as user space sees it: (prefix length, address in network order) -> 1.
pub type ClusterCidrs = LpmTrie<MapData, [u8; 4], u8>;

/// The NAT maps, taken from the loaded object.
pub struct NatMaps {
    pub flows_out: FlowsOut,
    pub flows_in: FlowsIn,
    pub from_outside: FromOutside,
    pub hostport: HostPortFlows,
    pub config: Array<MapData, NatConfig>,
    pub uplinks: Array<MapData, Uplinks>,
    pub cluster_cidrs: ClusterCidrs,
    /// The `nat_sweep` program, which removes what a sweep decided.
    pub sweeper: ProgramFd,
    /// The pinned `ENDPOINTS` map, read by the sweeps: flows of pods no longer there go.
    pub endpoints: Endpoints,
    /// The counters, whose `table_full` and `service_refused` call a sweep at once.
    pub stats: NatStats,
    pub services: ServiceTables,
}

impl Datapath {
    /// Hands the NAT maps to their owner (the node's source NAT).
    pub fn take_nat_maps(&mut self) -> Result<NatMaps, DatapathError> {
        let mut take = |name: &'static str| {
            self.ebpf
                .take_map(name)
                .ok_or(DatapathError::MissingMap(name))
        };
        let flows_out = take(map_names::NAT_OUT)?;
        let flows_in = take(map_names::NAT_IN)?;
        let from_outside = take(map_names::NAT_INBOUND)?;
        let hostport = take(map_names::HOSTPORT_FLOWS)?;
        let config = take(map_names::NAT_CONFIG)?;
        let uplinks = take(map_names::UPLINKS)?;
        let cluster_cidrs = take(map_names::CLUSTER_CIDRS)?;
        let stats = take(map_names::NAT_STATS)?;
        let clients = take(map_names::SERVICE_CLIENTS)?;
        let peers = take(map_names::SERVICE_PEERS)?;
        let service_flows = take(map_names::SERVICE_FLOWS)?;
        let service_counts = take(map_names::SERVICE_COUNTS)?;
        let name = program_names::NAT_SWEEP;
        let program_error = |source| DatapathError::Program {
            program: name,
            source,
        };
        let sweeper = classifier(&mut self.ebpf, name)?
            .fd()
            .map_err(program_error)?
            .try_clone()
            .map_err(|error| program_error(error.into()))?;
        // A second handle on the pinned endpoints map (the node's `Endpoints` owns the
        // object's), for the sweeps to read.
        let endpoints = MapData::from_pin(self.bpf_dir.join(map_names::ENDPOINTS))?;
        Ok(NatMaps {
            endpoints: HashMap::try_from(Map::HashMap(endpoints))?,
            flows_out: HashMap::try_from(flows_out)?,
            flows_in: HashMap::try_from(flows_in)?,
            from_outside: HashMap::try_from(from_outside)?,
            hostport: HashMap::try_from(hostport)?,
            config: Array::try_from(config)?,
            uplinks: Array::try_from(uplinks)?,
            cluster_cidrs: LpmTrie::try_from(cluster_cidrs)?,
            stats: PerCpuArray::try_from(stats)?,
            services: ServiceTables {
                clients: HashMap::try_from(clients)?,
                peers: HashMap::try_from(peers)?,
                flows: HashMap::try_from(service_flows)?,
                counts: HashMap::try_from(service_counts)?,
            },
            sweeper,
        })
    }
}
