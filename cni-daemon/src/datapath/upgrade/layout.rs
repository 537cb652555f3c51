//! The layout version of the pins: read before the load, written after it.
//!
//! Pins of another layout, with no migration from it, are removed and the daemon starts
//! fresh. What is lost: the translations of live connections (source NAT, hostPorts,
//! the notes of connections to pods' own addresses, the Service tables), so their
//! next packets are answered with resets or go unanswered; the counters (drops, NAT
//! counts, per-pod traffic), which start again from zero; the budgets' counts (they
//! count what the new tables hold). What is not: the pods' entries, the node's
//! addresses, gateways, rate limits, hostPorts, other nodes and configuration, which the
//! daemon writes whole at every start from its records and sources. The links pinned
//! under `links/` stay: the attach replaces the programs in them, so the uplinks and the
//! pods are never without a program during the start.

use std::{fs, path::Path};

use aya::{
    Ebpf,
    maps::{Array, Map, MapData},
};
use cni_ebpf_common::{LAYOUT_VERSION, map_names};

use super::super::{DatapathError, links::pin_error};

/// Removes every map pinned under `bpf_dir` unless the pins are of this daemon's
/// layout, or there are none (see the module doc).
pub(super) fn start_fresh_unless_ours(bpf_dir: &Path) -> Result<(), DatapathError> {
    let found = pinned_layout(bpf_dir)?;
    if found == Some(LAYOUT_VERSION) {
        return Ok(());
    }
    let maps = pinned_maps(bpf_dir)?;
    if maps.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        found = found.map_or_else(
            || "none (before the first release)".to_owned(),
            |v| v.to_string()
        ),
        layout = LAYOUT_VERSION,
        maps = maps.len(),
        "the pinned maps are of another layout, with no migration from it: starting fresh; \
         live connections lose their translation and the counters restart from zero"
    );
    for pin in maps {
        fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))?;
    }
    Ok(())
}

/// The layout version the `LAYOUT` pin under `bpf_dir` holds; `None` without one, or
/// when it is no array of one `u32` (not a pin of ours).
fn pinned_layout(bpf_dir: &Path) -> Result<Option<u32>, DatapathError> {
    let pin = bpf_dir.join(map_names::LAYOUT);
    if !pin.exists() {
        return Ok(None);
    }
    let Ok(array) = Array::<_, u32>::try_from(Map::Array(MapData::from_pin(&pin)?)) else {
        return Ok(None);
    };
    Ok(array.get(&0, 0).ok())
}

/// The map pins directly under `bpf_dir` (the links are in a folder of their own).
fn pinned_maps(bpf_dir: &Path) -> Result<Vec<std::path::PathBuf>, DatapathError> {
    let entries = match fs::read_dir(bpf_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(pin_error(bpf_dir, source)),
    };
    let mut maps = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| pin_error(bpf_dir, source))?;
        let is_file = entry
            .file_type()
            .map_err(|source| pin_error(&entry.path(), source))?
            .is_file();
        if is_file {
            maps.push(entry.path());
        }
    }
    maps.sort();
    Ok(maps)
}

/// Writes this daemon's layout version into the loaded object's `LAYOUT` map.
pub(super) fn write(ebpf: &mut Ebpf) -> Result<(), DatapathError> {
    let name = map_names::LAYOUT;
    let map = ebpf.map_mut(name).ok_or(DatapathError::MissingMap(name))?;
    Array::<_, u32>::try_from(map)?.set(0, LAYOUT_VERSION, 0)?;
    Ok(())
}
