//! The flow tables (`NAT_OUT`, `NAT_IN`, `NAT_INBOUND`, `HOSTPORT_FLOWS`, and the
//! Service tables) as user space holds them: read whole in batches ([`snapshot`]), emptied when NAT is off, swept
//! ([`super::sweep`]).

use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{HashMap, IterableMap, MapData, MapError},
    programs::ProgramFd,
};
use cni_ebpf_common::{NatCounter, NatKey, NatReverseKey};

use super::{args::MAX_NAT_FLOWS, batch};
use crate::datapath::nat_maps::{
    Endpoints, FlowsIn, FlowsOut, FromOutside, HostPortFlows, NatStats, ServiceTables,
};

/// Most entries one sweep reads from a table: as many as the largest tables hold.
const MAX_SCAN: usize = MAX_NAT_FLOWS as usize;

/// The flow tables, as the sweeper owns them. A sweep needs nothing else of the
/// node, so it runs without the node's lock: ADD and DEL never wait for a sweep.
pub struct Flows {
    pub(super) out: FlowsOut,
    pub(super) inbound: FlowsIn,
    pub(super) from_outside: FromOutside,
    pub(super) hostport: HostPortFlows,
    /// The `nat_sweep` program, which removes what a sweep decided.
    pub(super) sweeper: ProgramFd,
    /// The pinned `ENDPOINTS` map: flows of pods no longer there go.
    pub(super) endpoints: Endpoints,
    /// Source NAT's counters: new flows refused for a full table, and new Service
    /// connections refused, call a sweep at once.
    pub(super) stats: NatStats,
    /// The Service tables, swept with the flows.
    pub(super) services: ServiceTables,
    /// Entries one party may hold in each Service table (`--service-party-budget`).
    pub(super) service_budget: u32,
}

impl Flows {
    /// New flows refused so far because their table was full (`table_full`), and new
    /// Service connections refused (`service_refused`), summed over CPUs: when it
    /// moves, a sweep makes room at once rather than at its next tick.
    pub fn refused_for_room(&self) -> Result<u64, MapError> {
        let mut refused = 0;
        for counter in [NatCounter::TableFull, NatCounter::ServiceRefused] {
            refused += self.stats.get(&(counter as u32), 0)?.iter().sum::<u64>();
        }
        Ok(refused)
    }

    /// Sets the budget the sweep holds each party of the Service tables to (the
    /// datapath refuses past it; the sweep early-drops a party's own unanswered
    /// entries as it nears it).
    pub fn set_service_budget(&mut self, budget: u32) {
        self.service_budget = budget;
    }

    /// Empties the flow tables (NAT is off: no program uses them).
    pub(super) fn flush(&mut self) -> Result<(), MapError> {
        let out: Vec<NatKey> = snapshot(&self.out)?.into_keys().collect();
        batch::delete(self.out.map(), &out)?;
        let inbound: Vec<NatReverseKey> = snapshot(&self.inbound)?.into_keys().collect();
        batch::delete(self.inbound.map(), &inbound)?;
        let notes: Vec<NatKey> = snapshot(&self.from_outside)?.into_keys().collect();
        batch::delete(self.from_outside.map(), &notes)?;
        Ok(())
    }
}

/// Every entry of `map`, each key once, at most `MAX_SCAN`, read in batches (a few
/// syscalls a table, where aya's iterator takes two an entry).
pub fn snapshot<K, V>(map: &HashMap<MapData, K, V>) -> Result<StdHashMap<K, V>, MapError>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod,
{
    Ok(batch::read_all(map.map(), MAX_SCAN)?.into_iter().collect())
}
