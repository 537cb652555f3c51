//! The NAT maps the daemon owns: the configuration it writes, the cluster ranges it keeps
//! in step with the endpoints, and the flow tables it sweeps.

use std::collections::{HashMap as StdHashMap, HashSet};

use aya::{
    maps::{Array, HashMap, IterableMap, MapData, MapError},
    programs::ProgramFd,
};
use cni_api::Endpoint;
use cni_ebpf_common::{NatConfig, NatEntry, NatKey, NatReverseKey, SweepItem, Uplinks, sweep};

use super::{
    NatError, NatSettings, Uplink,
    args::{MAX_NAT_FLOWS, Timeouts},
    batch, cidrs, expiry, uplink,
};

use crate::datapath::{
    Datapath,
    nat_maps::{ClusterCidrs, Endpoints, FlowsIn, FlowsOut, FromOutside, HostPortFlows, NatMaps},
};

/// Most entries one sweep reads from a table: as many as the largest tables hold.
const MAX_SCAN: usize = MAX_NAT_FLOWS as usize;

/// What one sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Flows whose `NAT_OUT` entry (and `NAT_IN` pair) expired.
    pub flows: usize,
    /// Expired `NAT_IN` entries whose `NAT_OUT` pair was gone (evicted by the LRU).
    pub orphans: usize,
    /// Expired notes of flows opened from outside to a pod's own address.
    pub from_outside: usize,
    /// Expired connections through hostPort mappings.
    pub hostport: usize,
}

impl Sweep {
    /// Whether the sweep removed anything.
    pub fn removed_any(&self) -> bool {
        self.flows + self.orphans + self.from_outside + self.hostport > 0
    }
}

/// Source NAT as this daemon runs it: its settings (none: NAT is off) and its maps.
pub struct Nat {
    config: Array<MapData, NatConfig>,
    uplinks: Array<MapData, Uplinks>,
    cluster_cidrs: ClusterCidrs,
    /// The flow tables, until the sweeper takes them ([`Self::take_flows`]).
    flows: Option<Flows>,
    settings: Option<NatSettings>,
    /// `NAT_CONFIG` as the previous daemon left it.
    previous: NatConfig,
    /// `UPLINKS` as the previous daemon left it (empty if it had none).
    previous_uplinks: Uplinks,
}

impl Nat {
    pub fn open(maps: NatMaps, settings: Option<NatSettings>) -> Result<Self, MapError> {
        let NatMaps {
            flows_out,
            flows_in,
            from_outside,
            hostport,
            config,
            uplinks,
            cluster_cidrs,
            sweeper,
            endpoints,
        } = maps;
        let previous = config.get(&0, 0)?;
        let previous_uplinks = uplinks.get(&0, 0)?;
        Ok(Self {
            config,
            uplinks,
            cluster_cidrs,
            flows: Some(Flows {
                out: flows_out,
                inbound: flows_in,
                from_outside,
                hostport,
                sweeper,
                endpoints,
            }),
            settings,
            previous,
            previous_uplinks,
        })
    }

    pub fn settings(&self) -> Option<&NatSettings> {
        self.settings.as_ref()
    }

    /// The devices the previous daemon translated on (none when NAT was off), whose
    /// programs may still be attached: its `UPLINKS`, and the uplink of its
    /// `NAT_CONFIG` (a daemon of one uplink had no `UPLINKS`).
    pub fn previous_uplinks(&self) -> Vec<u32> {
        let mut ifindexes: Vec<u32> = self
            .previous_uplinks
            .iter()
            .map(|(ifindex, _)| ifindex)
            .collect();
        let first = self.previous.uplink_ifindex;
        if first != 0 && !ifindexes.contains(&first) {
            ifindexes.push(first);
        }
        ifindexes
    }

    /// Has translation follow the uplinks, called on every change of the namespace's
    /// addresses and of its default route. For each uplink:
    /// - its address, as iptables MASQUERADE does (it reads the outgoing device's
    ///   address for every new connection): new flows take the uplink's first IPv4
    ///   address now, and while it has none, traffic to translate there is dropped and
    ///   counted (`nat_no_address`), never sent with the pod's address or one the node
    ///   gave up;
    /// - its device: an uplink deleted and created again (a NIC replugged, a bond or
    ///   VLAN rebuilt) is a new device without programs, where pods' traffic would
    ///   leave through the node's stack untranslated; the programs are attached to it
    ///   again (`Datapath::attach_uplink` replaces the dead pinned links) and the
    ///   datapath learns its ifindex. While no device has the uplink's name, there is
    ///   no address either;
    /// - the default route, when the uplink is its device (no `--uplink`): a default
    ///   route that moves to another device (a failover) takes the uplink with it: the
    ///   programs go on the new device, whose address new flows get, and leave the old
    ///   one. Without a default route the uplink stays where it is.
    ///
    /// Decision: flows already in the tables stay. Their node ports are not tied to an
    /// address: a UDP flow goes on from the new address (the remote's replies to it match
    /// the flow's `NAT_IN` entry), and a TCP flow's next packet reaches the remote from
    /// an address it does not know, whose reset reaches the pod the same way, which is
    /// how the connection ends under MASQUERADE too (it forgets the device's
    /// connections when an address goes). The entries then expire as any others.
    pub fn follow_uplink(&mut self, datapath: &mut Datapath) -> Result<(), NatError> {
        let Some(settings) = self.settings.as_mut() else {
            return Ok(());
        };
        // The device the default route left (its ifindex): its programs come off once
        // the new one has them and `UPLINKS` names it.
        let mut left = None;
        if settings.by_default_route {
            let now = uplink::default_route_device_now()?;
            let first = &mut settings.uplinks[0];
            if let Some(device) = now.filter(|device| *device != first.name) {
                tracing::warn!(
                    previous = %first.name,
                    uplink = %device,
                    "the default route moved: source NAT moves to its device"
                );
                first.name = device;
                // Attached below, as a new device.
                left = Some(std::mem::take(&mut first.ifindex));
            }
        }
        let mut changed = left.is_some();
        for uplink in &mut settings.uplinks {
            changed |= follow_device(uplink, datapath)?;
        }
        if !changed {
            return Ok(());
        }
        let keep: Vec<String> = settings.uplinks.iter().map(|u| u.name.clone()).collect();
        self.write_config()?;
        if let Some(ifindex) = left {
            let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
            datapath.detach_uplinks_except(&keep, &[ifindex])?;
        }
        Ok(())
    }

    /// Writes this daemon's configuration; with NAT off, a zero configuration (node
    /// address 0.0.0.0), no uplink and empty flow tables. The uplinks go first: a new
    /// one is translated on before the first uplink's address says NAT is on.
    pub fn write_config(&mut self) -> Result<(), MapError> {
        let (config, uplinks) = self.settings.as_ref().map_or_else(
            || (NatConfig::default(), Uplinks::default()),
            |settings| (settings.config(), settings.uplinks()),
        );
        self.uplinks.set(0, uplinks, 0)?;
        self.config.set(0, config, 0)?;
        if let (None, Some(flows)) = (&self.settings, &mut self.flows) {
            flows.flush()?;
        }
        Ok(())
    }

    /// Makes `CLUSTER_CIDRS` the union of `endpoints`' cluster ranges.
    pub fn sync_cluster_cidrs<'a>(
        &mut self,
        endpoints: impl IntoIterator<Item = &'a Endpoint>,
    ) -> Result<(), MapError> {
        let desired = cidrs::union(endpoints);
        if crate::ranges::sync(&mut self.cluster_cidrs, &desired)? {
            tracing::info!(cidrs = ?desired, "cluster ranges kept untranslated");
        }
        Ok(())
    }

    /// Hands the flow tables, with the timeouts that decide their expiry, to the sweeper
    /// (`None` when NAT is off, or once taken).
    pub fn take_flows(&mut self) -> Option<(Flows, Timeouts)> {
        let timeouts = self.settings.as_ref()?.timeouts;
        Some((self.flows.take()?, timeouts))
    }
}

/// The flow tables, as the sweeper owns them. A sweep needs nothing else of the
/// node, so it runs without the node's lock (ADD and DEL used to wait for it).
pub struct Flows {
    out: FlowsOut,
    inbound: FlowsIn,
    from_outside: FromOutside,
    hostport: HostPortFlows,
    sweeper: ProgramFd,
    endpoints: Endpoints,
}

impl Flows {
    /// Removes every flow idle for longer than its timeout at `now_ns` (CLOCK_MONOTONIC),
    /// and every flow of a pod no longer in `ENDPOINTS`, both entries of a pair together;
    /// so too the notes of flows opened from outside to a pod's own address
    /// (`NAT_INBOUND`), which follow TCP's state as the translated flows do: a closed
    /// connection's note goes after the closed timeout, and live ones are not crowded out
    /// of the LRU by the closed ones of a busy pod; and so too the connections through
    /// hostPort mappings (`HOSTPORT_FLOWS`), which follow TCP's state the same way.
    ///
    /// A deleted pod's flows go at the next sweep (the daemon sweeps at once after a
    /// DEL, see `run::sweep_nat`) rather than when they expire, an hour later for an
    /// established TCP flow: a new pod given the same address (host-local hands
    /// addresses out again) must not receive the replies of the old pod's connections.
    ///
    /// Both tables are read in batches ([`batch`]: a few syscalls for a whole table) and
    /// the decisions taken on that snapshot ([`expired`], a pure function). The
    /// removals are done in the kernel by the `nat_sweep` program, 64 a syscall
    /// (`cni-ebpf/src/features/sweep.rs`), which re-reads each entry just before deleting it and
    /// keeps it if it saw a packet since: the datapath rewrites expired entries in place
    /// (a flow coming back on its old 4-tuple, a new flow taking an expired port over),
    /// and deleting those by a decision even milliseconds old broke connections (a
    /// batch delete tried here reset connections in the SNAT TCP_CRR benchmark).
    /// `NAT_OUT` first, so a port is never free in `NAT_IN` while `NAT_OUT` still hands
    /// it out.
    ///
    /// Cost, measured during the SNAT TCP_CRR benchmark (~10,000 new connections a
    /// second): reading through aya's iterator (two syscalls an entry and table) and
    /// then re-reading and deleting the expired ones, eight syscalls a flow, took ~11%
    /// of a CPU; with batched reads, the four syscalls a flow of the removals still
    /// made 150-170 ms of CPU a sweep (every 10 s), 50-70 ms with `nat_sweep`.
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
        let mut sweep = Sweep::default();
        let mut frame = vec![0u8; sweep::HEADER + sweep::MAX_ITEMS * size_of::<SweepItem>()];
        for chunk in removals.chunks(sweep::MAX_ITEMS) {
            let len = sweep::HEADER + chunk.len() * size_of::<SweepItem>();
            for (removal, room) in chunk
                .iter()
                .zip(frame[sweep::HEADER..len].chunks_exact_mut(size_of::<SweepItem>()))
            {
                room.copy_from_slice(item_bytes(&removal.item()));
            }
            let gone = batch::run(&self.sweeper, &frame[..len])?;
            let count = |shift: u32| ((gone >> shift) & sweep::COUNT_MASK) as usize;
            sweep.flows += count(0);
            sweep.orphans += count(sweep::ORPHAN_SHIFT);
            sweep.from_outside += count(sweep::FROM_OUTSIDE_SHIFT);
            sweep.hostport += count(sweep::HOSTPORT_SHIFT);
        }
        Ok(sweep)
    }

    /// Empties the flow tables (NAT is off: no program uses them).
    fn flush(&mut self) -> Result<(), MapError> {
        let out: Vec<NatKey> = snapshot(&self.out)?.into_keys().collect();
        batch::delete(self.out.map(), &out)?;
        let inbound: Vec<NatReverseKey> = snapshot(&self.inbound)?.into_keys().collect();
        batch::delete(self.inbound.map(), &inbound)?;
        let notes: Vec<NatKey> = snapshot(&self.from_outside)?.into_keys().collect();
        batch::delete(self.from_outside.map(), &notes)?;
        Ok(())
    }
}

/// What a sweep removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// An expired flow: its `NAT_OUT` entry and, when it has one, its `NAT_IN` pair;
    /// `decided` is the fresher of the two, which each must not have outlived.
    Flow {
        key: NatKey,
        reverse: Option<NatReverseKey>,
        decided: NatEntry,
    },
    /// An expired `NAT_IN` entry whose `NAT_OUT` pair is gone (evicted by the LRU).
    Orphan {
        reverse: NatReverseKey,
        entry: NatEntry,
    },
    /// An expired note of `NAT_INBOUND`, or one of a pod gone.
    FromOutside { key: NatKey, note: NatEntry },
    /// An expired connection of `HOSTPORT_FLOWS`, or one of a pod gone.
    HostPort { key: NatKey, entry: NatEntry },
}

impl Removal {
    /// The `nat_sweep` program's item for this removal.
    fn item(&self) -> SweepItem {
        let (out, inbound, kind, decided) = match *self {
            Self::Flow {
                key,
                reverse: Some(reverse),
                decided,
            } => (key, reverse, sweep::FLOW | sweep::PAIR, decided),
            Self::Flow {
                key,
                reverse: None,
                decided,
            } => (key, key.reverse(decided.node_port), sweep::FLOW, decided),
            Self::Orphan { reverse, entry } => {
                (reverse.forward(&entry), reverse, sweep::ORPHAN, entry)
            }
            // `inbound` unused: the note is keyed as `NAT_OUT` is.
            Self::FromOutside { key, note } => {
                (key, key.reverse(note.node_port), sweep::FROM_OUTSIDE, note)
            }
            Self::HostPort { key, entry } => {
                (key, key.reverse(entry.node_port), sweep::HOSTPORT, entry)
            }
        };
        SweepItem {
            out,
            inbound,
            kind,
            pad: [0; 3],
            decided_ns: decided.last_seen_ns,
        }
    }
}

/// Brings `uplink` to its device as it is now (see [`Nat::follow_uplink`]): the
/// programs onto a new device of its name, its address. Whether anything changed.
fn follow_device(uplink: &mut Uplink, datapath: &mut Datapath) -> Result<bool, NatError> {
    let ifindex = nix::net::if_::if_nametoindex(uplink.name.as_str()).ok();
    let addr = match ifindex {
        Some(_) => uplink::ipv4_address(&uplink.name)?,
        None => None,
    };
    let moved = ifindex.filter(|&ifindex| ifindex != uplink.ifindex);
    if moved.is_none() && addr == uplink.node_addr {
        return Ok(false);
    }
    if let Some(ifindex) = moved {
        if uplink.ifindex != 0 {
            tracing::warn!(
                uplink = %uplink.name,
                previous_ifindex = uplink.ifindex,
                ifindex,
                "the uplink is a new device: attaching the NAT programs to it"
            );
        }
        datapath.attach_uplink(&uplink.name)?;
        uplink.ifindex = ifindex;
    }
    match addr {
        Some(addr) if uplink.node_addr != Some(addr) => tracing::info!(
            uplink = %uplink.name,
            previous = ?uplink.node_addr,
            node_addr = %addr,
            "the uplink's address changed: new flows out of it are translated to it"
        ),
        None if uplink.node_addr.is_some() => tracing::warn!(
            uplink = %uplink.name,
            previous = ?uplink.node_addr,
            "the uplink has no IPv4 address: traffic to translate out of it is dropped \
             (counted as nat_no_address) until it has one"
        ),
        _ => {}
    }
    uplink.node_addr = addr;
    Ok(true)
}

/// The bytes of `item`, as the `nat_sweep` program reads them.
fn item_bytes(item: &SweepItem) -> &[u8] {
    // SAFETY: `SweepItem` is #[repr(C)] plain data without implicit padding (its size
    // is asserted), so all its bytes are initialised.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(item).cast(), size_of::<SweepItem>()) }
}

/// The flows of a snapshot of both tables that are idle past their timeout at `now_ns`,
/// or whose pod is not among `pods` (the node's pod addresses) any more. A flow is as
/// fresh as the latest of its two entries; a `NAT_IN` entry is a flow's pair only when
/// it holds that flow's pod address and port (the port may have passed to another flow
/// since).
fn expired(
    out: &StdHashMap<NatKey, NatEntry>,
    inbound: &StdHashMap<NatReverseKey, NatEntry>,
    pods: &HashSet<[u8; 4]>,
    now_ns: u64,
    timeouts: &Timeouts,
) -> Vec<Removal> {
    let gone = |entry: &NatEntry| !pods.contains(&entry.pod_addr);
    let mut removals = Vec::new();
    for (key, entry) in out {
        let reverse = key.reverse(entry.node_port);
        let pair = inbound
            .get(&reverse)
            .filter(|e| e.pod_addr == key.pod_addr && e.pod_port == key.pod_port);
        let decided = *expiry::latest(entry, pair);
        if gone(&decided) || timeouts.expired(&decided, key.proto, now_ns) {
            removals.push(Removal::Flow {
                key: *key,
                reverse: pair.map(|_| reverse),
                decided,
            });
        }
    }
    for (reverse, entry) in inbound {
        let paired = out
            .get(&reverse.forward(entry))
            .is_some_and(|out| out.node_port == reverse.node_port);
        if !paired && (gone(entry) || timeouts.expired(entry, reverse.proto, now_ns)) {
            removals.push(Removal::Orphan {
                reverse: *reverse,
                entry: *entry,
            });
        }
    }
    removals
}

/// The entries of `table` (`NAT_INBOUND`'s notes or `HOSTPORT_FLOWS`'s connections,
/// keyed from the pod's side) idle past their timeout at `now_ns`, or whose pod is not
/// among `pods` any more.
fn expired_notes<'a>(
    table: &'a StdHashMap<NatKey, NatEntry>,
    pods: &'a HashSet<[u8; 4]>,
    now_ns: u64,
    timeouts: &'a Timeouts,
) -> impl Iterator<Item = (NatKey, NatEntry)> + 'a {
    table
        .iter()
        .filter(move |(key, entry)| {
            !pods.contains(&entry.pod_addr) || timeouts.expired(entry, key.proto, now_ns)
        })
        .map(|(key, entry)| (*key, *entry))
}

/// Every entry of `map`, each key once, at most [`MAX_SCAN`], read in batches (a few
/// syscalls a table, where aya's iterator takes two an entry).
pub fn snapshot<K, V>(map: &HashMap<MapData, K, V>) -> Result<StdHashMap<K, V>, MapError>
where
    K: aya::Pod + Eq + std::hash::Hash,
    V: aya::Pod,
{
    Ok(batch::read_all(map.map(), MAX_SCAN)?.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const NOW: u64 = 100_000 * SEC;
    const TIMEOUTS: Timeouts = Timeouts {
        tcp_established: 3600,
        tcp_transitory: 120,
        tcp_closed: 10,
        udp: 30,
        udp_stream: 120,
        icmp: 30,
    };

    /// The pods of the node: the one pod the flows below belong to.
    fn pods() -> HashSet<[u8; 4]> {
        HashSet::from([[10, 244, 1, 2]])
    }

    fn flow(pod_port: u16) -> NatKey {
        NatKey {
            pod_addr: [10, 244, 1, 2],
            remote_addr: [198, 18, 0, 9],
            pod_port,
            remote_port: 443,
            proto: 17,
            pad: [0; 3],
        }
    }

    /// A UDP flow's entry (30 s timeout), idle for `idle_secs`.
    fn entry(key: &NatKey, node_port: u16, idle_secs: u64) -> NatEntry {
        NatEntry {
            last_seen_ns: NOW - idle_secs * SEC,
            pod_addr: key.pod_addr,
            pod_port: key.pod_port,
            node_port,
            state: 0,
            pad: [0; 3],
            node_addr: [198, 18, 0, 1],
        }
    }

    fn tables(
        flows: &[(NatKey, NatEntry, Option<NatEntry>)],
    ) -> (
        StdHashMap<NatKey, NatEntry>,
        StdHashMap<NatReverseKey, NatEntry>,
    ) {
        let out = flows.iter().map(|(key, out, _)| (*key, *out)).collect();
        let inbound = flows
            .iter()
            .filter_map(|(key, out, inbound)| inbound.map(|e| (key.reverse(out.node_port), e)))
            .collect();
        (out, inbound)
    }

    #[test]
    fn an_idle_flow_goes_with_its_pair_and_a_live_one_stays() {
        let (idle, live) = (flow(1000), flow(1001));
        let (out, inbound) = tables(&[
            (idle, entry(&idle, 2000, 31), Some(entry(&idle, 2000, 40))),
            (live, entry(&live, 2001, 29), Some(entry(&live, 2001, 29))),
        ]);
        assert_eq!(
            expired(&out, &inbound, &pods(), NOW, &TIMEOUTS),
            [Removal::Flow {
                key: idle,
                reverse: Some(idle.reverse(2000)),
                decided: entry(&idle, 2000, 31),
            }]
        );
    }

    #[test]
    fn a_live_flow_of_a_pod_that_is_gone_goes_with_its_pair_and_its_orphans() {
        let (flowing, orphaned) = (flow(1000), flow(1001));
        let (out, mut inbound) = tables(&[(
            flowing,
            entry(&flowing, 2000, 1),
            Some(entry(&flowing, 2000, 1)),
        )]);
        inbound.insert(orphaned.reverse(2001), entry(&orphaned, 2001, 1));
        let mut removals = expired(&out, &inbound, &HashSet::new(), NOW, &TIMEOUTS);
        removals.sort_by_key(|removal| matches!(removal, Removal::Orphan { .. }));
        assert_eq!(
            removals,
            [
                Removal::Flow {
                    key: flowing,
                    reverse: Some(flowing.reverse(2000)),
                    decided: entry(&flowing, 2000, 1),
                },
                Removal::Orphan {
                    reverse: orphaned.reverse(2001),
                    entry: entry(&orphaned, 2001, 1),
                },
            ]
        );
        assert_eq!(
            expired(&out, &inbound, &pods(), NOW, &TIMEOUTS),
            [],
            "while the pod is there, fresh entries stay"
        );
    }

    #[test]
    fn a_recent_reply_keeps_a_flow_whose_outbound_entry_is_old() {
        let key = flow(1000);
        let (out, inbound) = tables(&[(key, entry(&key, 2000, 60), Some(entry(&key, 2000, 5)))]);
        assert_eq!(expired(&out, &inbound, &pods(), NOW, &TIMEOUTS), []);
    }

    #[test]
    fn a_port_held_by_another_flow_is_not_this_flows_pair() {
        // `old` expired and its node port 2000 passed to `new` (another pod port).
        let (old, new) = (flow(1000), flow(1001));
        let mut out = StdHashMap::from([(old, entry(&old, 2000, 31)), (new, entry(&new, 2000, 1))]);
        let inbound = StdHashMap::from([(new.reverse(2000), entry(&new, 2000, 1))]);
        let removals = expired(&out, &inbound, &pods(), NOW, &TIMEOUTS);
        assert_eq!(
            removals,
            [Removal::Flow {
                key: old,
                reverse: None,
                decided: entry(&old, 2000, 31),
            }],
            "the old flow goes alone; the new flow's NAT_IN entry stays"
        );
        out.remove(&new);
        assert_eq!(
            expired(&out, &inbound, &pods(), NOW, &TIMEOUTS).len(),
            1,
            "a fresh entry without its pair is not removed as an orphan yet"
        );
    }

    #[test]
    fn an_expired_entry_without_its_pair_goes_as_an_orphan() {
        let key = flow(1000);
        let orphan = entry(&key, 2000, 31);
        let inbound = StdHashMap::from([(key.reverse(2000), orphan)]);
        assert_eq!(
            expired(&StdHashMap::new(), &inbound, &pods(), NOW, &TIMEOUTS),
            [Removal::Orphan {
                reverse: key.reverse(2000),
                entry: orphan,
            }]
        );
    }

    #[test]
    fn each_removal_becomes_the_sweep_program_item_that_says_the_same() {
        let key = flow(1000);
        let decided = entry(&key, 2000, 31);
        let pair = Removal::Flow {
            key,
            reverse: Some(key.reverse(2000)),
            decided,
        }
        .item();
        assert_eq!(
            (pair.out, pair.inbound, pair.kind, pair.decided_ns),
            (
                key,
                key.reverse(2000),
                sweep::FLOW | sweep::PAIR,
                decided.last_seen_ns
            )
        );
        let alone = Removal::Flow {
            key,
            reverse: None,
            decided,
        }
        .item();
        assert_eq!((alone.out, alone.kind), (key, sweep::FLOW));
        let orphan = Removal::Orphan {
            reverse: key.reverse(2000),
            entry: decided,
        }
        .item();
        assert_eq!(
            (orphan.inbound, orphan.kind, orphan.decided_ns),
            (key.reverse(2000), sweep::ORPHAN, decided.last_seen_ns)
        );
        // The bytes the program reads: the item as laid out, key first.
        let bytes = item_bytes(&pair);
        assert_eq!(bytes.len(), 40);
        assert_eq!(bytes[..4], key.pod_addr);
        assert_eq!(bytes[28], sweep::FLOW | sweep::PAIR);
        assert_eq!(bytes[32..], decided.last_seen_ns.to_ne_bytes());
    }

    #[test]
    fn reverse_and_forward_keys_name_the_same_flow() {
        let key = NatKey {
            pod_addr: [10, 244, 1, 2],
            remote_addr: [198, 18, 0, 9],
            pod_port: 40000,
            remote_port: 443,
            proto: 6,
            pad: [0; 3],
        };
        let entry = NatEntry {
            last_seen_ns: 1,
            pod_addr: key.pod_addr,
            pod_port: key.pod_port,
            node_port: 61007,
            state: 2,
            pad: [0; 3],
            node_addr: [198, 18, 0, 1],
        };
        let reverse = key.reverse(entry.node_port);
        assert_eq!(
            reverse,
            NatReverseKey {
                remote_addr: [198, 18, 0, 9],
                node_port: 61007,
                remote_port: 443,
                proto: 6,
                pad: [0; 3],
            }
        );
        assert_eq!(reverse.forward(&entry), key);
    }
}
