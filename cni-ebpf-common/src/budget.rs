//! What one pod may hold of the flow tables the node's pods share, and what it was
//! refused: the values of `FLOW_COUNTS`, `DEST_PORTS` and `NAT_REFUSED`.
//!
//! The flow tables (`NAT_OUT`/`NAT_IN`, `NAT_INBOUND`, `HOSTPORT_FLOWS`) are plain
//! hashes: an entry leaves only when the daemon's sweep removes it (idle past its
//! timeout, its pod gone, or, when a table fills up, unanswered and closing flows first),
//! never to make room for another. So that one pod (or the clients of one pod's
//! hostPort) cannot fill a table by itself, each pod has a budget per table
//! ([`FlowCounts`], [`crate::NatConfig::pod_flow_budget`]) and, for translated flows, a
//! budget of node ports per destination ([`crate::NatConfig::dest_port_budget`]). A new
//! flow over a budget, or meeting a full table, is dropped and counted for its pod
//! ([`RefusedFlows`]).
//!
//! The counts are exact and kept in the kernel: the datapath adds one (an atomic add)
//! for each entry it creates, the `nat_sweep` program takes one off for each it removes,
//! and a node port passing from one pod's expired flow to another pod moves between
//! their counts. Entries the datapath rewrites in place (an expired flow back on its
//! 4-tuple) are not new; entries the daemon carries into tables created anew at another
//! size (`--nat-max-flows` changed) start uncounted (a pod may then briefly hold more
//! than its budget).

/// A pod's entries in each flow table (`FLOW_COUNTS`, keyed by its address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct FlowCounts {
    /// Translated flows (`NAT_OUT`).
    pub out: u32,
    /// Notes of flows a host outside opened to the pod's own address (`NAT_INBOUND`).
    pub from_outside: u32,
    /// Connections through the pod's hostPort mappings (`HOSTPORT_FLOWS`).
    pub hostport: u32,
    #[cfg_attr(feature = "user", serde(skip))]
    pub pad: u32,
}

/// The flow tables a pod's budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowTable {
    Out,
    FromOutside,
    HostPort,
}

impl FlowCounts {
    /// The count of `table`.
    #[inline(always)]
    #[must_use]
    pub const fn of(&self, table: FlowTable) -> u32 {
        match table {
            FlowTable::Out => self.out,
            FlowTable::FromOutside => self.from_outside,
            FlowTable::HostPort => self.hostport,
        }
    }

    /// One entry in `table`, none elsewhere.
    #[inline(always)]
    #[must_use]
    pub const fn one(table: FlowTable) -> Self {
        let mut counts = Self {
            out: 0,
            from_outside: 0,
            hostport: 0,
            pad: 0,
        };
        match table {
            FlowTable::Out => counts.out = 1,
            FlowTable::FromOutside => counts.from_outside = 1,
            FlowTable::HostPort => counts.hostport = 1,
        }
        counts
    }
}

/// Why a new flow was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No node port was free toward its destination.
    NoPort,
    /// Its pod holds its budget of entries in the table
    /// ([`crate::NatConfig::pod_flow_budget`]).
    FlowBudget,
    /// Its pod holds its budget of node ports toward that destination
    /// ([`crate::NatConfig::dest_port_budget`]).
    PortBudget,
    /// The table is full.
    TableFull,
}

/// A pod's refused new flows, by [`Refusal`] (`NAT_REFUSED`, per CPU, keyed by its
/// address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct RefusedFlows {
    pub no_port: u64,
    pub flow_budget: u64,
    pub port_budget: u64,
    pub table_full: u64,
}

impl RefusedFlows {
    /// One refusal for `why`.
    #[inline(always)]
    #[must_use]
    pub const fn one(why: Refusal) -> Self {
        let mut refused = Self {
            no_port: 0,
            flow_budget: 0,
            port_budget: 0,
            table_full: 0,
        };
        *refused.slot(why) = 1;
        refused
    }

    /// The counter of `why`.
    #[inline(always)]
    pub const fn slot(&mut self, why: Refusal) -> &mut u64 {
        match why {
            Refusal::NoPort => &mut self.no_port,
            Refusal::FlowBudget => &mut self.flow_budget,
            Refusal::PortBudget => &mut self.port_budget,
            Refusal::TableFull => &mut self.table_full,
        }
    }

    /// Every refusal, whatever the reason.
    #[must_use]
    pub const fn total(&self) -> u64 {
        self.no_port + self.flow_budget + self.port_budget + self.table_full
    }

    /// The sum of `self` and `other` (CPUs' counts added up).
    #[must_use]
    pub const fn add(self, other: &Self) -> Self {
        Self {
            no_port: self.no_port + other.no_port,
            flow_budget: self.flow_budget + other.flow_budget,
            port_budget: self.port_budget + other.port_budget,
            table_full: self.table_full + other.table_full,
        }
    }
}

const _: () = assert!(core::mem::size_of::<FlowCounts>() == 16);
const _: () = assert!(core::mem::size_of::<RefusedFlows>() == 32);

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY (all): #[repr(C)], fixed-width fields, explicit padding, sizes asserted.
    unsafe impl aya::Pod for super::FlowCounts {}
    unsafe impl aya::Pod for super::RefusedFlows {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_counts_in_its_table_alone() {
        for table in [FlowTable::Out, FlowTable::FromOutside, FlowTable::HostPort] {
            let counts = FlowCounts::one(table);
            assert_eq!(counts.of(table), 1);
            assert_eq!(counts.out + counts.from_outside + counts.hostport, 1);
        }
    }

    #[test]
    fn refusals_add_up_by_reason() {
        let sum = RefusedFlows::one(Refusal::TableFull)
            .add(&RefusedFlows::one(Refusal::PortBudget))
            .add(&RefusedFlows::one(Refusal::TableFull));
        assert_eq!((sum.table_full, sum.port_budget, sum.no_port), (2, 1, 0));
        assert_eq!(sum.total(), 3);
    }
}
