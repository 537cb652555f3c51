//! Pinned maps made fit for this release, before the object loads. A pinned map is
//! reused as it is (aya opens the pin whatever the object asks) and its sizes cannot
//! change, so at every start, before the load ([`before_load`]):
//! - `NAT_OUT` and `NAT_IN` of another size than `--nat-max-flows` are unpinned, and
//!   their flows lost; of that size but an earlier release's 24-byte [`NatEntry`]
//!   (before the sequence numbers), read and unpinned, and their flows written into the
//!   tables the load creates ([`Carried`]);
//! - a `NAT_CONFIG` or `OVERLAY_CONFIG` an earlier release pinned with a shorter value
//!   is unpinned;
//! - a `NODE_ADDRS` of another size (an earlier release's 256) is unpinned;
//! - a `CLUSTER_CIDRS` of another size (an earlier release's 256) is read and unpinned,
//!   and its ranges written into the trie the load creates: pods' traffic to other
//!   nodes' pods keeps its source across the upgrade, before the node source answers;
//! - `NAT_INBOUND` and `HOSTPORT_FLOWS` of another size, or of an earlier release's 8
//!   or 24 bytes a flow, are read and unpinned, and their flows carried likewise;
//! - flow tables an earlier release pinned as LRU hashes (which evicted the least
//!   recently used flow, established or not, to make room) are read and unpinned, and
//!   their flows carried into the plain hashes the load creates;
//! - counters whose layout changed (`NAT_STATS` of 8 slots, `DROPS` of 16, `NAT_REFUSED`
//!   of one count a pod) and a `DEST_PORTS` of another size are unpinned: they start from zero (the
//!   budgets count only flows created from then on, see `cni_ebpf_common::budget`);
//! - `NAT_CURSORS` pinned per CPU (before the CPUs shared the port cursors) is unpinned:
//!   the port searches start again from random ports;
//! - the Service tables an earlier release pinned as LRU hashes of one byte a value
//!   (`SERVICE_CLIENTS`, `SERVICE_PEERS`, `SERVICE_FLOWS`) are read and unpinned, and
//!   their entries carried into the plain hashes the load creates.
//!
//! The load then creates what was unpinned. Links of earlier daemons are upgraded where
//! they are attached: the per-veth links in [`pod`](super::pod), uplink links pinned
//! without their device in [`uplink`](super::uplink).

use std::{fs, path::Path};

use aya::{
    Ebpf, Pod,
    maps::{HashMap, LpmTrie, Map, MapData, MapInfo, MapType, lpm_trie::Key},
};
use cni_ebpf_common::{
    DropReason, MAX_REMOTE_RANGES, NODE_ADDRS_MAX, NatConfig, NatCounter, NatEntry, NatKey,
    NatReverseKey, OverlayConfig, RefusedFlows, ServiceClient, ip_proto, map_names, tcp_state,
    udp_state,
};

use super::{DatapathError, links::pin_error};

/// The flows of the tables [`before_load`] unpinned to carry over, by table, to write
/// into the tables the load created ([`Self::write`]).
pub(super) struct Carried {
    /// Tables keyed from the pod's side: `NAT_OUT`, `NAT_INBOUND`, `HOSTPORT_FLOWS`.
    flows: Vec<(&'static str, Vec<(NatKey, NatEntry)>)>,
    /// `NAT_IN`.
    replies: Vec<(NatReverseKey, NatEntry)>,
    /// `CLUSTER_CIDRS`: (prefix length, network) of each range.
    cluster_cidrs: Vec<(u32, [u8; 4])>,
    /// `SERVICE_CLIENTS` and `SERVICE_PEERS` an earlier release kept as LRU hashes.
    service_sockets: Vec<(&'static str, Vec<(ServiceClient, NatEntry)>)>,
}

impl Carried {
    /// Writes the carried flows into the loaded object's tables.
    pub(super) fn write(&self, ebpf: &mut Ebpf) -> Result<(), DatapathError> {
        for (name, flows) in &self.flows {
            write_carried(ebpf, name, flows)?;
        }
        write_carried(ebpf, map_names::NAT_IN, &self.replies)?;
        for (name, sockets) in &self.service_sockets {
            write_carried(ebpf, name, sockets)?;
        }
        if !self.cluster_cidrs.is_empty() {
            let name = map_names::CLUSTER_CIDRS;
            let map = ebpf.map_mut(name).ok_or(DatapathError::MissingMap(name))?;
            let mut trie: LpmTrie<_, [u8; 4], u8> = LpmTrie::try_from(map)?;
            for (prefix_len, network) in &self.cluster_cidrs {
                trie.insert(&Key::new(*prefix_len, *network), 1, 0)?;
            }
        }
        Ok(())
    }
}

/// A [`NatEntry`] as releases before the sequence numbers wrote it (24 bytes): the
/// same fields up to `node_addr`, with a 3-byte padding where `seq_seen` is now.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EarlierNatEntry {
    last_seen_ns: u64,
    pod_addr: [u8; 4],
    pod_port: u16,
    node_port: u16,
    state: u8,
    pad: [u8; 3],
    node_addr: [u8; 4],
}

const _: () = assert!(size_of::<EarlierNatEntry>() == 24);

// SAFETY: #[repr(C)], fixed-width fields, explicit padding, size asserted.
unsafe impl Pod for EarlierNatEntry {}

impl EarlierNatEntry {
    /// This release's entry: the same flow and state, no side's sequence number known
    /// (the datapath takes the first it sees, see `cni_ebpf_common::flow::follow_seq`).
    fn upgrade(self) -> NatEntry {
        NatEntry {
            last_seen_ns: self.last_seen_ns,
            pod_addr: self.pod_addr,
            pod_port: self.pod_port,
            node_port: self.node_port,
            state: self.state,
            seq_seen: 0,
            pad: [0; 2],
            node_addr: self.node_addr,
            seq: [0; 2],
        }
    }
}

/// Makes the pins under `bpf_dir` fit this release's object with NAT tables (and
/// `HOSTPORT_FLOWS`) of `nat_max_flows` entries each (see the module doc); returns the
/// flows to write back once it is loaded.
pub(super) fn before_load(bpf_dir: &Path, nat_max_flows: u32) -> Result<Carried, DatapathError> {
    resize_nat_tables(bpf_dir, nat_max_flows)?;
    let (out, replies) = take_earlier_nat_tables(bpf_dir)?;
    replace_resized_config(bpf_dir, map_names::NAT_CONFIG, size_of::<NatConfig>())?;
    replace_resized_config(
        bpf_dir,
        map_names::OVERLAY_CONFIG,
        size_of::<OverlayConfig>(),
    )?;
    replace_resized_node_addrs(bpf_dir)?;
    let cluster_cidrs = take_resized_cluster_cidrs(bpf_dir)?;
    replace_counters(bpf_dir, nat_max_flows)?;
    let mut flows = [
        (map_names::NAT_INBOUND, earlier_note as fn(&_, _) -> _),
        (map_names::HOSTPORT_FLOWS, earlier_hostport_flow),
    ]
    .into_iter()
    .map(|(name, earlier)| {
        take_resized(bpf_dir, name, nat_max_flows, earlier).map(|flows| (name, flows))
    })
    .collect::<Result<Vec<_>, _>>()?;
    flows.push((map_names::NAT_OUT, out));
    let (service_sockets, service_flows) = take_earlier_service_tables(bpf_dir)?;
    flows.push((map_names::SERVICE_FLOWS, service_flows));
    Ok(Carried {
        flows,
        replies,
        cluster_cidrs,
        service_sockets,
    })
}

/// The entries of the Service tables an earlier release pinned as LRU hashes of one
/// byte a value (which evicted the least recently used socket or connection, live or
/// not, to make room), their pins removed: each comes over as an answered entry of its
/// opener, stamped now, uncounted (see `cni_ebpf_common::budget`: the budgets count
/// entries created from then on); a connection keeps its kind (the same values). Left
/// behind, every live Service connection would lose its replies' way through the
/// stack at the upgrade.
#[expect(
    clippy::type_complexity,
    reason = "the sockets' tables by name, and the flows"
)]
fn take_earlier_service_tables(
    bpf_dir: &Path,
) -> Result<
    (
        Vec<(&'static str, Vec<(ServiceClient, NatEntry)>)>,
        Vec<(NatKey, NatEntry)>,
    ),
    DatapathError,
> {
    let now = crate::clock::monotonic_now_ns().unwrap_or_default();
    let socket = |key: &ServiceClient, _: u8| NatEntry {
        node_port: 0,
        node_addr: [0; 4],
        ..NatEntry::from_outside(&socket_flow(key), answered_proto(key.proto), now)
    };
    let mut sockets = Vec::new();
    for name in [map_names::SERVICE_CLIENTS, map_names::SERVICE_PEERS] {
        sockets.push((name, take_earlier_lru(bpf_dir, name, socket)?));
    }
    let flows = take_earlier_lru(bpf_dir, map_names::SERVICE_FLOWS, |key: &NatKey, kind| {
        NatEntry {
            node_port: u16::from(kind),
            node_addr: [0; 4],
            ..NatEntry::from_outside(key, answered_proto(key.proto), now)
        }
    })?;
    Ok((sockets, flows))
}

/// A socket as a flow key (no remote side): what its entry's opener fields are made of.
fn socket_flow(key: &ServiceClient) -> NatKey {
    NatKey::new((key.addr, key.port), ([0; 4], 0), key.proto)
}

/// The entries of the LRU hash `name` of one-byte values an earlier release pinned,
/// each made an entry by `entry`, its pin removed; nothing when it is not such a map.
fn take_earlier_lru<K: Pod>(
    bpf_dir: &Path,
    name: &'static str,
    entry: impl Fn(&K, u8) -> NatEntry,
) -> Result<Vec<(K, NatEntry)>, DatapathError> {
    let pin = bpf_dir.join(name);
    if !pin.exists() {
        return Ok(Vec::new());
    }
    let info = MapInfo::from_pin(&pin)?;
    if !is_lru(&info) || info.value_size() != 1 {
        return Ok(Vec::new());
    }
    let old: HashMap<_, K, u8> = HashMap::try_from(Map::LruHashMap(MapData::from_pin(&pin)?))?;
    let entries: Vec<(K, NatEntry)> = old
        .iter()
        .filter_map(Result::ok)
        .map(|(key, value)| {
            let made = entry(&key, value);
            (key, made)
        })
        .collect();
    tracing::info!(
        table = name,
        entries = entries.len(),
        "an earlier release's LRU Service table is created anew as a plain hash; its \
         entries are carried over"
    );
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))?;
    Ok(entries)
}

/// The ranges of a `CLUSTER_CIDRS` pinned at another size than this release's
/// ([`MAX_REMOTE_RANGES`]), its pin removed; nothing otherwise.
fn take_resized_cluster_cidrs(bpf_dir: &Path) -> Result<Vec<(u32, [u8; 4])>, DatapathError> {
    let pin = bpf_dir.join(map_names::CLUSTER_CIDRS);
    if !pin.exists() || MapInfo::from_pin(&pin)?.max_entries() == MAX_REMOTE_RANGES {
        return Ok(Vec::new());
    }
    let trie: LpmTrie<_, [u8; 4], u8> = LpmTrie::try_from(Map::LpmTrie(MapData::from_pin(&pin)?))?;
    let ranges = trie
        .keys()
        .map(|key| key.map(|key| (key.prefix_len(), key.data())))
        .collect::<Result<Vec<_>, _>>()?;
    tracing::info!(
        ranges = ranges.len(),
        "CLUSTER_CIDRS pinned by an earlier release is created anew at {MAX_REMOTE_RANGES}, its ranges carried"
    );
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))?;
    Ok(ranges)
}

/// Makes room for `NAT_OUT` and `NAT_IN` of this release's value: pins of an earlier
/// release's [`EarlierNatEntry`] (of the right size, else [`resize_nat_tables`] has
/// removed them) are read and unpinned, and their flows handed back, upgraded, for the
/// tables the load creates. Dropped, every translated connection would lose its node
/// port at the upgrade.
#[expect(clippy::type_complexity, reason = "the two tables' flows, by key type")]
fn take_earlier_nat_tables(
    bpf_dir: &Path,
) -> Result<(Vec<(NatKey, NatEntry)>, Vec<(NatReverseKey, NatEntry)>), DatapathError> {
    let out = take_earlier_layout(bpf_dir, map_names::NAT_OUT)?;
    let replies = take_earlier_layout(bpf_dir, map_names::NAT_IN)?;
    Ok((out, replies))
}

/// The flows of table `name` when it is pinned with [`EarlierNatEntry`] values, upgraded,
/// or as an LRU hash, its pin removed; nothing otherwise.
fn take_earlier_layout<K: Pod>(
    bpf_dir: &Path,
    name: &'static str,
) -> Result<Vec<(K, NatEntry)>, DatapathError> {
    let pin = bpf_dir.join(name);
    if !pin.exists() {
        return Ok(Vec::new());
    }
    let info = MapInfo::from_pin(&pin)?;
    let value_size = usize::try_from(info.value_size()).unwrap_or(0);
    let earlier = value_size == size_of::<EarlierNatEntry>();
    if !earlier && !is_lru(&info) {
        return Ok(Vec::new());
    }
    let map = Map::LruHashMap(MapData::from_pin(&pin)?);
    let flows: Vec<(K, NatEntry)> = if earlier {
        let old: HashMap<_, K, EarlierNatEntry> = HashMap::try_from(map)?;
        old.iter()
            .filter_map(Result::ok)
            .map(|(key, value)| (key, value.upgrade()))
            .collect()
    } else {
        let old: HashMap<_, K, NatEntry> = HashMap::try_from(map)?;
        old.iter().filter_map(Result::ok).collect()
    };
    tracing::info!(
        table = name,
        flows = flows.len(),
        "created anew at this release's layout; its flows are carried over"
    );
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))?;
    Ok(flows)
}

/// Makes room for NAT tables of `max_flows` entries: pinned tables of another size
/// (an earlier `--nat-max-flows`) are unpinned, both of them, so that the load creates
/// them anew. A pinned map is otherwise reused whatever the object asks (aya opens the
/// pin as it is), and its size cannot change. The flows they held are lost: said at
/// warn. The programs still attached keep the old tables until the new ones replace
/// them, a moment later in the same start.
fn resize_nat_tables(bpf_dir: &Path, max_flows: u32) -> Result<(), DatapathError> {
    let pins = [map_names::NAT_OUT, map_names::NAT_IN].map(|name| bpf_dir.join(name));
    let mut sizes = Vec::new();
    for pin in pins.iter().filter(|pin| pin.exists()) {
        sizes.push(MapInfo::from_pin(pin)?.max_entries());
    }
    if sizes.iter().all(|&size| size == max_flows) {
        return Ok(());
    }
    tracing::warn!(
        ?sizes,
        max_flows,
        "the NAT tables change size: they are created anew, and the flows they held \
         lose their translation"
    );
    for pin in pins.iter().filter(|pin| pin.exists()) {
        fs::remove_file(pin).map_err(|source| pin_error(pin, source))?;
    }
    Ok(())
}

/// Makes room for the configuration array `name` (`NAT_CONFIG`, `OVERLAY_CONFIG`) at
/// this datapath's value `size`: a pin an earlier release left with another
/// (`NatConfig` was shorter before `udp_stream_secs`, `OverlayConfig` before `port`)
/// is unpinned, so that the load creates the map anew, as aya would otherwise reuse it
/// and the programs would not load against it. Nothing is lost: the daemon writes
/// these maps whole at every start. The programs still attached keep the old map until
/// the new ones replace them, a moment later in the same start.
fn replace_resized_config(bpf_dir: &Path, name: &str, size: usize) -> Result<(), DatapathError> {
    let pin = bpf_dir.join(name);
    if !pin.exists() {
        return Ok(());
    }
    let pinned = MapInfo::from_pin(&pin)?.value_size();
    if usize::try_from(pinned).is_ok_and(|pinned| pinned == size) {
        return Ok(());
    }
    tracing::info!(
        size = pinned,
        "{name} pinned by an earlier release is created anew at this release's size"
    );
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))
}

/// Makes room for a `NODE_ADDRS` of [`NODE_ADDRS_MAX`] entries: a pin of another size
/// is unpinned, so that the load creates it anew. Nothing is lost: the daemon fills it
/// whole at start.
fn replace_resized_node_addrs(bpf_dir: &Path) -> Result<(), DatapathError> {
    let pin = bpf_dir.join(map_names::NODE_ADDRS);
    if !pin.exists() || MapInfo::from_pin(&pin)?.max_entries() == NODE_ADDRS_MAX {
        return Ok(());
    }
    tracing::info!("NODE_ADDRS pinned by an earlier release is created anew at {NODE_ADDRS_MAX}");
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))
}

/// Makes room for a table `name` of this release, `NAT_INBOUND` or `HOSTPORT_FLOWS` (a
/// [`NatEntry`] per flow, as many as the NAT tables hold): a pin of another value size
/// (an earlier release kept 8 bytes a flow, in a table of 65,536; a later one the 24
/// bytes of [`EarlierNatEntry`]) or of another size
/// (`--nat-max-flows` changed) is read and unpinned, and its flows handed back for
/// [`write_carried`] into the map the load creates. Dropped, they would have broken
/// live connections at the upgrade: pods' answers to hosts that reached their own
/// address translated, replies on hostPort connections leaving from the pod's port.
/// An earlier release's flows carry no state: they come over as answered flows
/// (established TCP, a stream otherwise), what that release assumed of them, made by
/// `earlier` from the key and the 8 bytes.
fn take_resized(
    bpf_dir: &Path,
    name: &'static str,
    max_flows: u32,
    earlier: fn(&NatKey, [u8; 8]) -> NatEntry,
) -> Result<Vec<(NatKey, NatEntry)>, DatapathError> {
    let pin = bpf_dir.join(name);
    if !pin.exists() {
        return Ok(Vec::new());
    }
    let info = MapInfo::from_pin(&pin)?;
    let value_size = usize::try_from(info.value_size()).unwrap_or(usize::MAX);
    if value_size == size_of::<NatEntry>() && info.max_entries() == max_flows && !is_lru(&info) {
        return Ok(Vec::new());
    }
    let map = Map::LruHashMap(MapData::from_pin(&pin)?);
    let flows: Vec<(NatKey, NatEntry)> = if value_size == 8 {
        let old: HashMap<_, NatKey, [u8; 8]> = HashMap::try_from(map)?;
        old.iter()
            .filter_map(Result::ok)
            .map(|(key, value)| (key, earlier(&key, value)))
            .collect()
    } else if value_size == size_of::<EarlierNatEntry>() {
        let old: HashMap<_, NatKey, EarlierNatEntry> = HashMap::try_from(map)?;
        old.iter()
            .filter_map(Result::ok)
            .map(|(key, value)| (key, value.upgrade()))
            .collect()
    } else {
        let old: HashMap<_, NatKey, NatEntry> = HashMap::try_from(map)?;
        old.iter().filter_map(Result::ok).collect()
    };
    tracing::info!(
        table = name,
        flows = flows.len(),
        max_flows,
        "created anew at this release's size; its flows are carried over"
    );
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))?;
    Ok(flows)
}

/// Whether the pinned map of `info` is an LRU hash (an earlier release's flow table).
fn is_lru(info: &MapInfo) -> bool {
    matches!(info.map_type(), Ok(MapType::LruHash))
}

/// Whether a pinned map (its info, and `--nat-max-flows`) fits this release.
type Fits = fn(&MapInfo, u32) -> bool;

/// Unpins the counters this release lays out otherwise, for the load to create anew:
/// `NAT_STATS` of fewer slots than [`NatCounter::SLOTS`], `DROPS` of another number of
/// slots than [`DropReason::SLOTS`] (an earlier release's 16), `NAT_REFUSED` of another
/// value than [`RefusedFlows`], `DEST_PORTS` of another size than `max_flows`; and
/// `NAT_CURSORS` of another kind than a plain array (an earlier release's per-CPU
/// cursors). What they counted starts again from zero, the cursors from random ports.
fn replace_counters(bpf_dir: &Path, max_flows: u32) -> Result<(), DatapathError> {
    let fits: [(&str, Fits); 5] = [
        (map_names::NAT_STATS, |info, _| {
            info.max_entries() == NatCounter::SLOTS
        }),
        (map_names::DROPS, |info, _| {
            info.max_entries() == DropReason::SLOTS
        }),
        (map_names::NAT_REFUSED, |info, _| {
            usize::try_from(info.value_size()).is_ok_and(|size| size == size_of::<RefusedFlows>())
        }),
        (map_names::DEST_PORTS, |info, max_flows| {
            info.max_entries() == max_flows
        }),
        (map_names::NAT_CURSORS, |info, _| {
            matches!(info.map_type(), Ok(MapType::Array))
        }),
    ];
    for (name, fits) in fits {
        let pin = bpf_dir.join(name);
        if !pin.exists() || fits(&MapInfo::from_pin(&pin)?, max_flows) {
            continue;
        }
        tracing::info!(
            map = name,
            "created anew at this release's layout; its counts restart"
        );
        fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))?;
    }
    Ok(())
}

/// The state an earlier release's flow of `key` comes over with: answered (a UDP
/// stream, which is what an answered flow was then: it keeps the longer timeout).
fn answered(key: &NatKey) -> u8 {
    answered_proto(key.proto)
}

/// [`answered`] for a flow of `proto`.
fn answered_proto(proto: u8) -> u8 {
    if proto == ip_proto::TCP {
        tcp_state::ESTABLISHED
    } else {
        udp_state::STREAM
    }
}

/// A note of `NAT_INBOUND` from an earlier release's bare timestamp (`u64`).
fn earlier_note(key: &NatKey, value: [u8; 8]) -> NatEntry {
    NatEntry::from_outside(key, answered(key), u64::from_ne_bytes(value))
}

/// A connection of `HOSTPORT_FLOWS` from an earlier release's host address and port (a
/// `HostPortFlow`), which had no timestamp: stamped now.
fn earlier_hostport_flow(key: &NatKey, value: [u8; 8]) -> NatEntry {
    let now = crate::clock::monotonic_now_ns().unwrap_or_default();
    NatEntry {
        node_addr: [value[0], value[1], value[2], value[3]],
        node_port: u16::from_ne_bytes([value[4], value[5]]),
        ..NatEntry::from_outside(key, answered(key), now)
    }
}

/// Writes `flows` (see [`take_resized`]) into the loaded table `name`; what does not fit
/// (a table made smaller) is left out, said at warn.
fn write_carried<K: Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
    flows: &[(K, NatEntry)],
) -> Result<(), DatapathError> {
    if flows.is_empty() {
        return Ok(());
    }
    let map = ebpf.map_mut(name).ok_or(DatapathError::MissingMap(name))?;
    let mut table: HashMap<_, K, NatEntry> = HashMap::try_from(map)?;
    let mut left_out = 0usize;
    for (key, flow) in flows {
        if table.insert(key, flow, 0).is_err() {
            left_out += 1;
        }
    }
    if left_out > 0 {
        tracing::warn!(
            table = name,
            left_out,
            "flows carried over did not fit the table"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_releases_flows_come_over_answered() {
        let tcp = NatKey::new(
            ([10, 244, 0, 2], 8080),
            ([198, 18, 0, 2], 50000),
            ip_proto::TCP,
        );
        let udp = NatKey {
            proto: ip_proto::UDP,
            ..tcp
        };
        let note = earlier_note(&tcp, 1234_u64.to_ne_bytes());
        assert_eq!(
            note,
            NatEntry::from_outside(&tcp, tcp_state::ESTABLISHED, 1234),
            "a note's 8 bytes are its timestamp"
        );
        assert_eq!(earlier_note(&udp, [0; 8]).state, udp_state::STREAM);
        let port = 30080_u16.to_ne_bytes();
        let connection = earlier_hostport_flow(&tcp, [198, 18, 0, 1, port[0], port[1], 0, 0]);
        assert_eq!(
            (connection.node_addr, connection.node_port, connection.state),
            ([198, 18, 0, 1], 30080, tcp_state::ESTABLISHED),
            "a connection's 8 bytes are the host address and port the client reached"
        );
        assert_eq!(
            (connection.pod_addr, connection.pod_port),
            (tcp.pod_addr, tcp.pod_port)
        );
        assert!(connection.last_seen_ns > 0, "stamped now");
    }

    #[test]
    fn a_flow_of_the_layout_before_sequence_numbers_comes_over_with_no_side_known() {
        let earlier = EarlierNatEntry {
            last_seen_ns: 77,
            pod_addr: [10, 244, 0, 2],
            pod_port: 40000,
            node_port: 61000,
            state: tcp_state::CLOSING,
            pad: [0; 3],
            node_addr: [198, 18, 0, 1],
        };
        let entry = earlier.upgrade();
        assert_eq!(
            (
                entry.last_seen_ns,
                entry.pod_addr,
                entry.pod_port,
                entry.node_port
            ),
            (77, [10, 244, 0, 2], 40000, 61000)
        );
        assert_eq!(
            (entry.state, entry.node_addr),
            (tcp_state::CLOSING, [198, 18, 0, 1])
        );
        assert_eq!((entry.seq_seen, entry.seq), (0, [0; 2]), "no side known");
    }
}
