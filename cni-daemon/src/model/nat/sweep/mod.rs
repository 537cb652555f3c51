//! The sweep: every flow idle past its timeout, or of a pod gone, removed from the flow
//! tables ([`Flows::sweep`]). What to remove is decided on a snapshot ([`decide`]); the
//! `nat_sweep` program removes it, reading the decisions as [`items`] lay them out.

mod decide;
mod items;
mod services;

use std::collections::{HashMap as StdHashMap, HashSet};

use aya::maps::IterableMap;
use aya::maps::MapError;
use cni_ebpf_common::{NatEntry, NatKey, NatReverseKey, SweepItem, sweep};

use self::{
    decide::{Removal, early_drop, expired, expired_notes},
    items::item_bytes,
};
use super::{
    Timeouts, batch, expiry,
    flows::{Flows, snapshot},
};

/// What one sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Flows whose `NAT_OUT` entry (and `NAT_IN` pair) expired.
    pub flows: usize,
    /// Expired `NAT_IN` entries whose `NAT_OUT` pair was gone.
    pub orphans: usize,
    /// Expired notes of flows opened from outside to a pod's own address.
    pub from_outside: usize,
    /// Expired connections through hostPort mappings.
    pub hostport: usize,
    /// Chunks the `nat_sweep` program failed to run (each logged); their flows stay
    /// for the next sweep, and the chunks after them still run.
    pub failed_chunks: usize,
    /// Of the removals decided, those made for room in a table nearly full (early
    /// drop: unanswered, opening and closing flows), not for their timeout.
    pub early_dropped: usize,
    /// Entries of the Service tables, expired, of pods gone or early-dropped (for a
    /// party near its budget, or a table nearly full).
    pub services: usize,
}

impl Sweep {
    /// Whether the sweep removed anything.
    pub fn removed_any(&self) -> bool {
        self.flows + self.orphans + self.from_outside + self.hostport + self.services > 0
    }
}

impl Flows {
    /// Removes every flow idle for longer than its timeout at `now_ns` (CLOCK_MONOTONIC),
    /// and every flow of a pod no longer in `ENDPOINTS`, both entries of a pair together;
    /// so too the notes of flows opened from outside to a pod's own address
    /// (`NAT_INBOUND`), which follow TCP's state as the translated flows do: a closed
    /// connection's note goes after the closed timeout, and the closed ones of a busy pod
    /// do not fill the table; and so too the connections through
    /// hostPort mappings (`HOSTPORT_FLOWS`), which follow TCP's state the same way.
    ///
    /// A deleted pod's flows go at the next sweep (the daemon sweeps at once after a
    /// DEL, see `run::sweep_nat`) rather than when they expire, an hour later for an
    /// established TCP flow: a new pod given the same address (host-local hands
    /// addresses out again) must not receive the replies of the old pod's connections.
    ///
    /// Every table is read in batches (`batch`: a few syscalls for a
    /// whole table) and the decisions taken on that snapshot (`decide`, pure
    /// functions). The removals are done in the kernel by the `nat_sweep` program, 64 a
    /// syscall (`cni-ebpf/src/features/sweep.rs`), which re-reads each entry just before
    /// deleting it and keeps it if it saw a packet since: the datapath rewrites expired
    /// entries in place (a flow coming back on its old 4-tuple, a new flow taking an
    /// expired port over), and a delete decided even milliseconds earlier would break
    /// those connections. `NAT_OUT` first, so a port is never free in `NAT_IN` while
    /// `NAT_OUT` still hands it out. What this costs, and what it replaced: see
    /// docs/decisions.md ("The NAT sweep's removals in the kernel", "The NAT sweep reads
    /// its tables in batches"). A chunk the program fails to run is counted
    /// ([`Sweep::failed_chunks`]) and skipped; the error returned is a table that cannot
    /// be read.
    pub fn sweep(&mut self, now_ns: u64, timeouts: &Timeouts) -> Result<Sweep, MapError> {
        let (out, inbound) = (snapshot(&self.out)?, snapshot(&self.inbound)?);
        let from_outside = snapshot(&self.from_outside)?;
        let hostport = snapshot(&self.hostport)?;
        // Read after the flows: a flow exists only once its pod is an endpoint, so a
        // pod added meanwhile is never taken for one gone (its first flow removed).
        let pods: HashSet<[u8; 4]> = snapshot(&self.endpoints)?
            .into_keys()
            .map(|key| key.addr)
            .collect();
        let mut removals = expired(&out, &inbound, &pods, now_ns, timeouts);
        removals.extend(
            expired_notes(&from_outside, &pods, now_ns, timeouts)
                .map(|(key, note)| Removal::FromOutside { key, note }),
        );
        removals.extend(
            expired_notes(&hostport, &pods, now_ns, timeouts)
                .map(|(key, entry)| Removal::HostPort { key, entry }),
        );
        let decided = removals.len();
        self.early_drop(&out, &inbound, &from_outside, &hostport, &mut removals)?;
        let mut sweep = Sweep {
            early_dropped: removals.len() - decided,
            ..Sweep::default()
        };
        let (service_removals, early) = self.service_removals(&pods, now_ns, timeouts)?;
        sweep.early_dropped += early;
        self.remove(&removals, &mut sweep);
        self.remove(&service_removals, &mut sweep);
        Ok(sweep)
    }

    /// What the sweep removes from the Service tables (see [`services::removals`]),
    /// and how many of those are early drops.
    fn service_removals(
        &self,
        pods: &HashSet<[u8; 4]>,
        now_ns: u64,
        timeouts: &Timeouts,
    ) -> Result<(Vec<Removal>, usize), MapError> {
        let tables = &self.services;
        let (clients, peers) = (snapshot(&tables.clients)?, snapshot(&tables.peers)?);
        let flows = snapshot(&tables.flows)?;
        let capacity = |info: aya::maps::MapInfo| info.max_entries() as usize;
        let budget = self.service_budget;
        let (mut removals, mut early) = services::removals(
            &services::Table {
                entries: &clients,
                kind: sweep::SERVICE_CLIENT,
                capacity: capacity(tables.clients.map().info()?),
                pods_only: true,
            },
            pods,
            now_ns,
            timeouts,
            budget,
        );
        let (more, more_early) = services::removals(
            &services::Table {
                entries: &peers,
                kind: sweep::SERVICE_PEER,
                capacity: capacity(tables.peers.map().info()?),
                pods_only: false,
            },
            pods,
            now_ns,
            timeouts,
            budget,
        );
        removals.extend(more);
        early += more_early;
        let (more, more_early) = services::removals(
            &services::Table {
                entries: &flows,
                kind: sweep::SERVICE_FLOW,
                capacity: capacity(tables.flows.map().info()?),
                pods_only: true,
            },
            pods,
            now_ns,
            timeouts,
            budget,
        );
        removals.extend(more);
        // Parties that hold nothing any more (their last entries went in an earlier
        // sweep): forged addresses must not fill the counts.
        let parties = snapshot(&tables.counts)?;
        removals.extend(services::forgotten(&parties));
        Ok((removals, early + more_early))
    }

    /// Hands `removals` to the `nat_sweep` program, [`sweep::MAX_ITEMS`] a run, and
    /// counts what went into `sweep`. Service removals come in runs of their own,
    /// whose low bits count them.
    fn remove(&self, removals: &[Removal], sweep: &mut Sweep) {
        let mut frame = vec![0u8; sweep::HEADER + sweep::MAX_ITEMS * size_of::<SweepItem>()];
        for chunk in removals.chunks(sweep::MAX_ITEMS) {
            let len = sweep::HEADER + chunk.len() * size_of::<SweepItem>();
            for (removal, room) in chunk
                .iter()
                .zip(frame[sweep::HEADER..len].chunks_exact_mut(size_of::<SweepItem>()))
            {
                room.copy_from_slice(item_bytes(&removal.item()));
            }
            let gone = match batch::run(&self.sweeper, &frame[..len]) {
                Ok(gone) => gone,
                Err(error) => {
                    sweep.failed_chunks += 1;
                    tracing::warn!(%error, items = chunk.len(), "a NAT sweep chunk failed");
                    continue;
                }
            };
            let count = |shift: u32| ((gone >> shift) & sweep::COUNT_MASK) as usize;
            if matches!(chunk.first(), Some(Removal::Service { .. })) {
                sweep.services += count(0);
                continue;
            }
            sweep.flows += count(0);
            sweep.orphans += count(sweep::ORPHAN_SHIFT);
            sweep.from_outside += count(sweep::FROM_OUTSIDE_SHIFT);
            sweep.hostport += count(sweep::HOSTPORT_SHIFT);
        }
    }

    /// Adds to `removals` what early drop takes from each table nearly full once they
    /// are done (see [`early_drop`]): flows of `NAT_OUT` with their `NAT_IN` pair (the
    /// fresher entry decides), notes of `NAT_INBOUND`, connections of `HOSTPORT_FLOWS`.
    fn early_drop(
        &self,
        out: &StdHashMap<NatKey, NatEntry>,
        inbound: &StdHashMap<NatReverseKey, NatEntry>,
        from_outside: &StdHashMap<NatKey, NatEntry>,
        hostport: &StdHashMap<NatKey, NatEntry>,
        removals: &mut Vec<Removal>,
    ) -> Result<(), MapError> {
        let capacity = self.out.map().info()?.max_entries() as usize;
        let gone_of = |removals: &[Removal], kind: fn(&Removal) -> Option<NatKey>| {
            removals
                .iter()
                .filter_map(kind)
                .collect::<HashSet<NatKey>>()
        };
        let pair = |key: &NatKey, entry: &NatEntry| {
            let reverse = key.reverse(entry.node_port);
            inbound
                .get(&reverse)
                .filter(|e| e.pod_addr == key.pod_addr && e.pod_port == key.pod_port)
                .map(|e| (reverse, e))
        };
        let gone = gone_of(removals, |r| match r {
            Removal::Flow { key, .. } => Some(*key),
            _ => None,
        });
        let flows = out.iter().map(|(key, entry)| {
            let decided = *expiry::latest(entry, pair(key, entry).map(|(_, e)| e));
            (*key, decided, key.proto)
        });
        for (key, decided) in early_drop(flows, out.len(), &gone, capacity) {
            removals.push(Removal::Flow {
                key,
                reverse: pair(&key, &decided).map(|(reverse, _)| reverse),
                decided,
            });
        }
        let gone = gone_of(removals, |r| match r {
            Removal::FromOutside { key, .. } => Some(*key),
            _ => None,
        });
        let notes = from_outside.iter().map(|(k, e)| (*k, *e, k.proto));
        for (key, note) in early_drop(notes, from_outside.len(), &gone, capacity) {
            removals.push(Removal::FromOutside { key, note });
        }
        let gone = gone_of(removals, |r| match r {
            Removal::HostPort { key, .. } => Some(*key),
            _ => None,
        });
        let connections = hostport.iter().map(|(k, e)| (*k, *e, k.proto));
        for (key, entry) in early_drop(connections, hostport.len(), &gone, capacity) {
            removals.push(Removal::HostPort { key, entry });
        }
        Ok(())
    }
}
