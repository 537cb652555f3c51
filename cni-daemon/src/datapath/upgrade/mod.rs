//! The pins a start finds, made fit for this daemon's object before it loads. A pinned
//! map is reused as it is (aya opens the pin whatever the object asks, and a map's type
//! and sizes cannot change), so at every start, before the load ([`before_load`]):
//! - pins of another layout than `cni_ebpf_common::LAYOUT_VERSION` (the `LAYOUT` map beside them holds
//!   another version, or there is none) are removed, every map, unless a migration from
//!   that released layout exists: the daemon starts fresh ([`layout`]);
//! - of this layout, the tables sized by `--nat-max-flows` that were pinned at another
//!   size are created anew, some of them with their flows carried ([`resize`]).
//!
//! After the load ([`Carried::write`]) the carried flows go into the new tables and the
//! layout version into `LAYOUT`.
//!
//! A migration exists only from a released layout: one module per release whose
//! layout a later one changed (`from_v0_1.rs` for 0.1.0's), each with a test that
//! builds that release's pins. 0.1.0 is the first release: there is none yet.

mod layout;
mod resize;

use std::path::Path;

use aya::Ebpf;

use super::DatapathError;

pub(super) use resize::Carried;

/// Makes the pins under `bpf_dir` fit this daemon's object with flow tables of
/// `nat_max_flows` entries (see the module doc); returns what to write once it is
/// loaded.
pub(super) fn before_load(bpf_dir: &Path, nat_max_flows: u32) -> Result<Carried, DatapathError> {
    layout::start_fresh_unless_ours(bpf_dir)?;
    resize::before_load(bpf_dir, nat_max_flows)
}

/// Writes what [`before_load`] carried into the loaded object's tables, then this
/// layout's version into its `LAYOUT` map.
pub(super) fn after_load(ebpf: &mut Ebpf, carried: &Carried) -> Result<(), DatapathError> {
    carried.write(ebpf)?;
    layout::write(ebpf)
}
