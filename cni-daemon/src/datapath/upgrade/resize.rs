//! The flow tables sized by `--nat-max-flows`, when it changed. A pinned map's size
//! cannot change, so a table pinned at another size is unpinned for the load to create
//! anew:
//! - `NAT_OUT` and `NAT_IN` both, their flows lost (said at warn): the programs still
//!   attached keep the old tables until the new ones replace them, a moment later in
//!   the same start;
//! - `NAT_INBOUND` and `HOSTPORT_FLOWS` read first, and their flows written into the
//!   new tables ([`Carried`]): left behind, pods' answers to hosts that reached their
//!   own address, and replies on hostPort connections, would leave untranslated;
//! - `DEST_PORTS`, whose counts start again from zero with the NAT tables.

use std::{fs, path::Path};

use aya::{
    Ebpf, Pod,
    maps::{HashMap, Map, MapData, MapInfo},
};
use cni_ebpf_common::{NatEntry, NatKey, map_names};

use super::super::{DatapathError, links::pin_error};

/// The flows of the tables [`before_load`] unpinned to carry over, by table, to write
/// into the tables the load created ([`Self::write`]).
pub(in super::super) struct Carried {
    flows: Vec<(&'static str, Vec<(NatKey, NatEntry)>)>,
}

impl Carried {
    /// Writes the carried flows into the loaded object's tables; what does not fit (a
    /// table made smaller) is left out, said at warn.
    pub(super) fn write(&self, ebpf: &mut Ebpf) -> Result<(), DatapathError> {
        for (name, flows) in &self.flows {
            write_carried(ebpf, name, flows)?;
        }
        Ok(())
    }
}

/// Makes room for flow tables of `max_flows` entries under `bpf_dir` (see the module
/// doc); returns the flows to write back once the object is loaded.
pub(super) fn before_load(bpf_dir: &Path, max_flows: u32) -> Result<Carried, DatapathError> {
    resize_nat_tables(bpf_dir, max_flows)?;
    let mut flows = Vec::new();
    for name in [map_names::NAT_INBOUND, map_names::HOSTPORT_FLOWS] {
        flows.push((name, take_resized(bpf_dir, name, max_flows)?));
    }
    let dest_ports = bpf_dir.join(map_names::DEST_PORTS);
    if other_size(&dest_ports, max_flows)? {
        tracing::info!(
            map = map_names::DEST_PORTS,
            max_flows,
            "created anew at the new size; its counts restart"
        );
        fs::remove_file(&dest_ports).map_err(|source| pin_error(&dest_ports, source))?;
    }
    Ok(Carried { flows })
}

/// Whether the map pinned at `pin` holds another number of entries than `max_flows`;
/// false without a pin.
fn other_size(pin: &Path, max_flows: u32) -> Result<bool, DatapathError> {
    Ok(pin.exists() && MapInfo::from_pin(pin)?.max_entries() != max_flows)
}

/// Unpins `NAT_OUT` and `NAT_IN`, both, when either is of another size than
/// `max_flows` (see the module doc).
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

/// The flows of table `name` when it is pinned at another size than `max_flows`, its
/// pin removed; nothing otherwise.
fn take_resized(
    bpf_dir: &Path,
    name: &'static str,
    max_flows: u32,
) -> Result<Vec<(NatKey, NatEntry)>, DatapathError> {
    let pin = bpf_dir.join(name);
    if !other_size(&pin, max_flows)? {
        return Ok(Vec::new());
    }
    let table: HashMap<_, NatKey, NatEntry> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(&pin)?))?;
    let flows: Vec<(NatKey, NatEntry)> = table.iter().filter_map(Result::ok).collect();
    tracing::info!(
        table = name,
        flows = flows.len(),
        max_flows,
        "created anew at the new size; its flows are carried over"
    );
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))?;
    Ok(flows)
}

/// Writes `flows` into the loaded table `name`; what does not fit is left out, said
/// at warn.
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
