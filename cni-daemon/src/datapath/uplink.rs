//! The uplink programs (source NAT), attached through TCX links pinned under
//! `<bpf dir>/links/uplink_egress@<device>` and `uplink_ingress@<device>`, one pair per
//! uplink, so translation goes on while the daemon is stopped (without TCX, as clsact
//! filters at a fixed preference instead, see [`clsact`]); and the NAT tables pinned at
//! another size, made fit for this release before the load. (A daemon of one uplink
//! pinned its links without the device: such pins go at the next start, see
//! [`Datapath::detach_uplinks_except`].)

use std::{fs, path::Path};

use aya::maps::{Array, HashMap, Map, MapData, MapInfo};
use aya::programs::TcAttachType;
use cni_api::Attachment;
use cni_ebpf_common::{
    NatConfig, NatEntry, NatKey, Uplinks, ip_proto, map_names, program_names, tcp_state, udp_state,
};

use super::{
    Datapath, DatapathError, classifier, clsact, ensure_clsact,
    links::{attach_pinned, pin_error, remove_pin},
};

/// The two uplink programs: where they attach; their pins are named after them.
const UPLINK_PROGRAMS: [(&str, TcAttachType); 2] = [
    (program_names::UPLINK_EGRESS, TcAttachType::Egress),
    (program_names::UPLINK_INGRESS, TcAttachType::Ingress),
];

/// Makes room for NAT tables of `max_flows` entries: pinned tables of another size
/// (an earlier `--nat-max-flows`) are unpinned, both of them, so that the load creates
/// them anew. A pinned map is otherwise reused whatever the object asks (aya opens the
/// pin as it is), and its size cannot change. The flows they held are lost: said at
/// warn. The programs still attached keep the old tables until the new ones replace
/// them, a moment later in the same start.
pub(super) fn resize_nat_tables(bpf_dir: &Path, max_flows: u32) -> Result<(), DatapathError> {
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

/// Makes room for a `NAT_CONFIG` of this datapath's value size: a pin an earlier release
/// left with another (its `NatConfig` was shorter: `udp_stream_secs` came later) is
/// unpinned, so that the load creates the map anew, as aya would otherwise reuse it and
/// the programs would not load against it. Nothing is lost: the daemon writes the map
/// whole at every start. The programs still attached keep the old map until the new
/// ones replace them, a moment later in the same start.
pub(super) fn replace_resized_config(bpf_dir: &Path) -> Result<(), DatapathError> {
    let pin = bpf_dir.join(map_names::NAT_CONFIG);
    if !pin.exists() {
        return Ok(());
    }
    let size = MapInfo::from_pin(&pin)?.value_size();
    if usize::try_from(size).is_ok_and(|size| size == size_of::<NatConfig>()) {
        return Ok(());
    }
    tracing::info!(
        size,
        "NAT_CONFIG pinned by an earlier release is created anew at this release's size"
    );
    fs::remove_file(&pin).map_err(|source| pin_error(&pin, source))
}

/// Makes room for a table `name` of this release, `NAT_INBOUND` or `HOSTPORT_FLOWS` (a
/// [`NatEntry`] per flow, as many as the NAT tables hold): a pin of another value size
/// (an earlier release kept 8 bytes a flow, in a table of 65,536) or of another size
/// (`--nat-max-flows` changed) is read and unpinned, and its flows handed back for
/// [`write_carried`] into the map the load creates. Dropped, they would have broken
/// live connections at the upgrade: pods' answers to hosts that reached their own
/// address translated, replies on hostPort connections leaving from the pod's port.
/// An earlier release's flows carry no state: they come over as answered flows
/// (established TCP, a stream otherwise), what that release assumed of them, made by
/// `earlier` from the key and the 8 bytes.
pub(super) fn take_resized(
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
    if value_size == size_of::<NatEntry>() && info.max_entries() == max_flows {
        return Ok(Vec::new());
    }
    let map = Map::LruHashMap(MapData::from_pin(&pin)?);
    let flows: Vec<(NatKey, NatEntry)> = if value_size == 8 {
        let old: HashMap<_, NatKey, [u8; 8]> = HashMap::try_from(map)?;
        old.iter()
            .filter_map(Result::ok)
            .map(|(key, value)| (key, earlier(&key, value)))
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

/// The state an earlier release's flow of `key` comes over with: answered.
fn answered(key: &NatKey) -> u8 {
    if key.proto == ip_proto::TCP {
        tcp_state::ESTABLISHED
    } else {
        udp_state::REPLIED
    }
}

/// A note of `NAT_INBOUND` from an earlier release's bare timestamp (`u64`).
pub(super) fn earlier_note(key: &NatKey, value: [u8; 8]) -> NatEntry {
    NatEntry::from_outside(key, answered(key), u64::from_ne_bytes(value))
}

/// A connection of `HOSTPORT_FLOWS` from an earlier release's host address and port (a
/// `HostPortFlow`), which had no timestamp: stamped now.
pub(super) fn earlier_hostport_flow(key: &NatKey, value: [u8; 8]) -> NatEntry {
    let now = crate::clock::monotonic_now_ns().unwrap_or_default();
    NatEntry {
        node_addr: [value[0], value[1], value[2], value[3]],
        node_port: u16::from_ne_bytes([value[4], value[5]]),
        ..NatEntry::from_outside(key, answered(key), now)
    }
}

/// Writes `flows` (see [`take_resized`]) into the loaded table `name`; more than it
/// holds and the LRU keeps the last written.
pub(super) fn write_carried(
    ebpf: &mut aya::Ebpf,
    name: &'static str,
    flows: &[(NatKey, NatEntry)],
) -> Result<(), DatapathError> {
    if flows.is_empty() {
        return Ok(());
    }
    let map = ebpf.map_mut(name).ok_or(DatapathError::MissingMap(name))?;
    let mut table: HashMap<_, NatKey, NatEntry> = HashMap::try_from(map)?;
    for (key, flow) in flows {
        table.insert(key, flow, 0)?;
    }
    Ok(())
}

/// Whether `name`, an entry of the links folder, is an uplink pin (not a pod's).
pub(super) fn is_uplink_pin(name: &str) -> bool {
    pin_device(name).is_some()
}

/// The device of the uplink pin `name`: `Some("")` for a pin without one (an earlier
/// daemon's), `None` when `name` is no uplink pin.
fn pin_device(name: &str) -> Option<&str> {
    UPLINK_PROGRAMS.iter().find_map(|(program, _)| {
        let rest = name.strip_prefix(program)?;
        if rest.is_empty() {
            Some(rest)
        } else {
            rest.strip_prefix('@')
        }
    })
}

/// The pin of `program`'s link on `device`.
fn pin_name(program: &str, device: &str) -> String {
    format!("{program}@{device}")
}

/// Whether `program` is one of the uplink programs.
fn is_uplink_program(program: &str) -> bool {
    UPLINK_PROGRAMS.iter().any(|(name, _)| *name == program)
}

impl Datapath {
    /// Attaches (or re-attaches, replacing the programs in their pinned links) the NAT
    /// programs on `uplink`: `uplink_egress` on TC egress, `uplink_ingress` on ingress.
    pub fn attach_uplink(&mut self, uplink: &str) -> Result<(), DatapathError> {
        let ifindex = nix::net::if_::if_nametoindex(uplink)
            .map_err(|_| DatapathError::NoInterface(uplink.to_owned()))?;
        let links_dir = self.links_dir();
        fs::create_dir_all(&links_dir).map_err(|source| pin_error(&links_dir, source))?;
        let tcx = self.tcx;
        if !tcx {
            ensure_clsact(uplink)?;
        }
        // Attached again (the uplink device was recreated): the old entries go.
        self.attachments.retain(|attachment| {
            !(is_uplink_program(&attachment.program) && attachment.interface == uplink)
        });
        for (name, attach_type) in UPLINK_PROGRAMS {
            let program = classifier(&mut self.ebpf, name)?;
            if tcx {
                let pin = links_dir.join(pin_name(name, uplink));
                if let Err(error) = attach_pinned(program, name, uplink, attach_type, pin.clone()) {
                    if !pin.exists() {
                        return Err(error);
                    }
                    // A link whose device went away cannot take a program: start afresh.
                    tracing::warn!(%error, pin = %pin.display(), "replacing a dead uplink link");
                    remove_pin(&pin)?;
                    let program = classifier(&mut self.ebpf, name)?;
                    attach_pinned(program, name, uplink, attach_type, pin)?;
                }
                // Attached as a filter by a daemon run with `--enable-tcx false`: the
                // link runs first and ends the chain, the filter would only linger.
                clsact::detach(uplink, attach_type, name)?;
            } else {
                clsact::attach(program, name, uplink, attach_type)?;
                // A TCX link of a daemon run with TCX would run before the filter and
                // end the chain: it goes, now that the filter is in.
                let pin = links_dir.join(pin_name(name, uplink));
                if pin.exists() {
                    remove_pin(&pin)?;
                }
            }
            tracing::info!(interface = uplink, ifindex, program = name, "attached");
            self.attachments.push(Attachment {
                interface: uplink.to_owned(),
                ifindex,
                program: name.to_owned(),
                mode: if tcx { "tcx" } else { "clsact" }.to_owned(),
            });
        }
        Ok(())
    }

    /// Detaches the uplink programs from every device but those of `keep`: with TCX,
    /// each uplink pin of another device (or of none: an earlier daemon's) goes, and its
    /// link with it; with clsact filters (no pins), those on the devices `previous`
    /// (ifindexes a previous daemon translated on) go. Nothing attached is not an error.
    pub fn detach_uplinks_except(
        &mut self,
        keep: &[&str],
        previous: &[u32],
    ) -> Result<(), DatapathError> {
        let links_dir = self.links_dir();
        if let Ok(entries) = fs::read_dir(&links_dir) {
            for entry in entries.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(device) = pin_device(&name) else {
                    continue;
                };
                if device.is_empty() || !keep.contains(&device) {
                    let pin = links_dir.join(&name);
                    tracing::info!(pin = %pin.display(), "detaching an uplink program");
                    remove_pin(&pin)?;
                }
            }
        }
        if !self.tcx {
            for &ifindex in previous {
                let Ok(interface) = nix::net::if_::if_indextoname(ifindex) else {
                    continue;
                };
                let interface = interface.to_string_lossy();
                if keep.contains(&interface.as_ref()) {
                    continue;
                }
                for (name, attach_type) in UPLINK_PROGRAMS {
                    clsact::detach(&interface, attach_type, name)?;
                }
            }
        }
        self.attachments.retain(|attachment| {
            !is_uplink_program(&attachment.program) || keep.contains(&attachment.interface.as_str())
        });
        Ok(())
    }
}

/// Removes the uplink programs' clsact filters from the devices the pinned `UPLINKS` and
/// `NAT_CONFIG` name (uninstall; run before the pins go). Filters are not pinned as TCX
/// links are: left, they would go on translating with maps no pin names any more.
/// A device that is gone took its filters with it; missing pins mean nothing to do.
pub fn remove_uplink_filters(bpf_dir: &Path) -> Result<(), DatapathError> {
    let mut ifindexes = Vec::new();
    let uplinks = bpf_dir.join(map_names::UPLINKS);
    if uplinks.exists() {
        let map = Array::<_, Uplinks>::try_from(Map::Array(MapData::from_pin(&uplinks)?))?;
        ifindexes.extend(map.get(&0, 0)?.iter().map(|(ifindex, _)| ifindex));
    }
    let config = bpf_dir.join(map_names::NAT_CONFIG);
    if config.exists()
        && MapInfo::from_pin(&config)?.value_size() as usize == size_of::<NatConfig>()
    {
        let map = Array::<_, NatConfig>::try_from(Map::Array(MapData::from_pin(&config)?))?;
        ifindexes.push(map.get(&0, 0)?.uplink_ifindex);
    }
    ifindexes.sort_unstable();
    ifindexes.dedup();
    for ifindex in ifindexes.into_iter().filter(|ifindex| *ifindex != 0) {
        let Ok(interface) = nix::net::if_::if_indextoname(ifindex) else {
            continue;
        };
        let interface = interface.to_string_lossy();
        for (name, attach_type) in UPLINK_PROGRAMS {
            clsact::detach(&interface, attach_type, name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uplink_pins_name_their_device_and_pod_pins_are_not_uplink_pins() {
        assert_eq!(pin_device(&pin_name("uplink_egress", "eth1")), Some("eth1"));
        assert_eq!(pin_device("uplink_ingress@bond0.100"), Some("bond0.100"));
        // An earlier daemon's pins, without a device.
        assert_eq!(pin_device("uplink_egress"), Some(""));
        for pod in ["veth1a2b3c_from_pod", "uplink_egressx", "cgroup", "uplink"] {
            assert_eq!(pin_device(pod), None, "{pod}");
            assert!(!is_uplink_pin(pod), "{pod}");
        }
    }
}
