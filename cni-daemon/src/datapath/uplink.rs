//! The uplink programs (source NAT), attached through TCX links pinned under
//! `<bpf dir>/links/uplink_egress@<device>` and `uplink_ingress@<device>`, one pair per
//! uplink, so translation goes on while the daemon is stopped (without TCX, as clsact
//! filters at a fixed preference instead, see [`clsact`]).

use std::{fs, path::Path};

use aya::maps::{Array, Map, MapData, MapInfo};
use aya::programs::TcAttachType;
use cni_api::Attachment;
use cni_ebpf_common::{NatConfig, Uplinks, map_names, program_names};

use super::{
    Datapath, DatapathError, classifier, clsact, ensure_clsact,
    links::{attach_pinned, pin_error, remove_pin},
};

/// The two uplink programs: where they attach; their pins are named after them.
const UPLINK_PROGRAMS: [(&str, TcAttachType); 2] = [
    (program_names::UPLINK_EGRESS, TcAttachType::Egress),
    (program_names::UPLINK_INGRESS, TcAttachType::Ingress),
];

/// The device of the uplink pin `name`; `None` when `name` is no uplink pin.
fn pin_device(name: &str) -> Option<&str> {
    UPLINK_PROGRAMS
        .iter()
        .find_map(|(program, _)| name.strip_prefix(program)?.strip_prefix('@'))
        .filter(|device| !device.is_empty())
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
                clsact::attach(program, name, uplink, attach_type, clsact::HANDLE)?;
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
    /// each uplink pin of another device goes, and its
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
                if !keep.contains(&device) {
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
    fn uplink_pins_name_their_device_and_no_other_pin_is_an_uplink_pin() {
        assert_eq!(pin_device(&pin_name("uplink_egress", "eth1")), Some("eth1"));
        assert_eq!(pin_device("uplink_ingress@bond0.100"), Some("bond0.100"));
        for pod in [
            "veth1a2b3c_from_pod",
            "uplink_egressx",
            "uplink_egress",
            "uplink_egress@",
            "cgroup",
            "uplink",
        ] {
            assert_eq!(pin_device(pod), None, "{pod}");
        }
    }
}
