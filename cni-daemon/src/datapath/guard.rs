//! The gateway guard (`gateway_guard`) on the ingress of the node's other devices:
//! every Ethernet device of the daemon's namespace but the pods' kinds (veth and
//! netkit: a pod's side runs `from_pod`, and another runtime's containers sit behind a
//! bridge, which is guarded) and the devices the caller names (the uplinks and the
//! overlay, whose own programs drop the same). Attached as the uplink programs are:
//! through a TCX link pinned under `<bpf dir>/links/gateway_guard@<device>`, or as a
//! clsact filter at the uplinks' preference with a handle of its own
//! ([`GUARD_HANDLE`]), so that a device turning into an uplink can hold both for a
//! moment. A device that refuses it is logged and skipped; the others are guarded.

use std::{collections::BTreeMap, fs};

use aya::programs::TcAttachType;
use cni_api::Attachment;
use cni_ebpf_common::program_names::GATEWAY_GUARD;
use futures::TryStreamExt;
use rtnetlink::packet_route::link::{
    InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage,
};

use super::{
    Datapath, DatapathError, classifier, clsact, ensure_clsact,
    links::{attach_pinned, pin_error, remove_pin},
    netlink::with_netlink,
};

/// The clsact filter's handle at the uplinks' preference (theirs is 1).
pub const GUARD_HANDLE: u32 = 2;

/// The pin of the guard's TCX link on `device`.
fn pin_name(device: &str) -> String {
    format!("{GATEWAY_GUARD}@{device}")
}

/// The device of the guard pin `name`; `None` when `name` is no guard pin.
fn pin_device(name: &str) -> Option<&str> {
    name.strip_prefix(GATEWAY_GUARD)?.strip_prefix('@')
}

impl Datapath {
    /// Has the guard on every guardable device of the namespace but those of `skip`
    /// (with TCX, also off devices that are gone: their pins go). A device guarded by
    /// an earlier call is left as it is while it keeps its index.
    pub fn sync_guard(&mut self, skip: &[&str]) -> Result<(), DatapathError> {
        let candidates = guardable()?;
        let wanted: BTreeMap<String, u32> = candidates
            .iter()
            .filter(|(device, _)| !skip.contains(&device.as_str()))
            .map(|(device, ifindex)| (device.clone(), *ifindex))
            .collect();
        let links_dir = self.links_dir();
        if self.tcx {
            if let Ok(entries) = fs::read_dir(&links_dir) {
                for entry in entries.filter_map(Result::ok) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if pin_device(&name).is_some_and(|device| !wanted.contains_key(device)) {
                        remove_pin(&links_dir.join(&name))?;
                    }
                }
            }
        } else {
            for device in candidates
                .keys()
                .filter(|device| !wanted.contains_key(*device))
            {
                clsact::detach(device, TcAttachType::Ingress, GATEWAY_GUARD)?;
            }
        }
        self.guarded
            .retain(|device, ifindex| wanted.get(device) == Some(ifindex));
        for (device, ifindex) in wanted {
            if self.guarded.contains_key(&device) {
                continue;
            }
            match self.guard(&device) {
                Ok(()) => {
                    tracing::info!(
                        interface = %device,
                        ifindex,
                        program = GATEWAY_GUARD,
                        "attached: the pods' gateways are hidden there"
                    );
                    self.guarded.insert(device, ifindex);
                }
                // A device that went away meanwhile, or one that takes no TC program.
                Err(error) => tracing::warn!(
                    %error,
                    interface = %device,
                    "the pods' gateways cannot be hidden on this device"
                ),
            }
        }
        let mode = if self.tcx { "tcx" } else { "clsact" };
        self.attachments
            .retain(|attachment| attachment.program != GATEWAY_GUARD);
        self.attachments
            .extend(self.guarded.iter().map(|(device, ifindex)| Attachment {
                interface: device.clone(),
                ifindex: *ifindex,
                program: GATEWAY_GUARD.to_owned(),
                mode: mode.to_owned(),
            }));
        Ok(())
    }

    /// Attaches the guard to `device` (replaces the program in a link or filter an
    /// earlier daemon left there).
    fn guard(&mut self, device: &str) -> Result<(), DatapathError> {
        let links_dir = self.links_dir();
        fs::create_dir_all(&links_dir).map_err(|source| pin_error(&links_dir, source))?;
        let tcx = self.tcx;
        let program = classifier(&mut self.ebpf, GATEWAY_GUARD)?;
        if tcx {
            let pin = links_dir.join(pin_name(device));
            if let Err(error) = attach_pinned(
                program,
                GATEWAY_GUARD,
                device,
                TcAttachType::Ingress,
                pin.clone(),
            ) {
                if !pin.exists() {
                    return Err(error);
                }
                // A link whose device went away (a device of the same name made since).
                remove_pin(&pin)?;
                let program = classifier(&mut self.ebpf, GATEWAY_GUARD)?;
                attach_pinned(program, GATEWAY_GUARD, device, TcAttachType::Ingress, pin)?;
            }
        } else {
            ensure_clsact(device)?;
            clsact::attach(
                program,
                GATEWAY_GUARD,
                device,
                TcAttachType::Ingress,
                GUARD_HANDLE,
            )?;
        }
        Ok(())
    }
}

/// Removes the guard's clsact filters from every guardable device (uninstall; its TCX
/// links go with their pins).
pub fn remove_guard_filters() -> Result<(), DatapathError> {
    for device in guardable()?.keys() {
        clsact::detach(device, TcAttachType::Ingress, GATEWAY_GUARD)?;
    }
    Ok(())
}

/// The devices of the namespace that may take the guard (name and index): the Ethernet
/// devices but veth and netkit ones. (A layer-3 device, an IP-in-IP or WireGuard
/// tunnel, carries no ARP; what it delivers to a gateway is not checked.)
fn guardable() -> Result<BTreeMap<String, u32>, DatapathError> {
    let links: Vec<LinkMessage> = with_netlink(|handle| async move {
        handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|error| DatapathError::Gateways(format!("cannot list the links: {error}")))
    })?;
    Ok(links
        .iter()
        .filter_map(|message| Some((guardable_name(message)?, message.header.index)))
        .collect())
}

/// The name of the link `message` describes, when it may take the guard.
pub fn guardable_name(message: &LinkMessage) -> Option<String> {
    // The program reads an Ethernet header; the loopback carries none worth reading.
    if message.header.link_layer_type != LinkLayerType::Ether
        || message.header.flags.contains(LinkFlags::Loopback)
    {
        return None;
    }
    let mut name = None;
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(found) => name = Some(found.clone()),
            LinkAttribute::LinkInfo(infos)
                if infos.iter().any(|info| {
                    matches!(info, LinkInfo::Kind(InfoKind::Veth | InfoKind::Netkit))
                }) =>
            {
                return None;
            }
            _ => {}
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_pins_name_their_device_and_no_other_pin_is_a_guard_pin() {
        assert_eq!(pin_device(&pin_name("eth1")), Some("eth1"));
        assert_eq!(pin_device("gateway_guard@br-ext.100"), Some("br-ext.100"));
        for other in [
            "gateway_guard",
            "uplink_ingress@eth1",
            "gateway_guardx@eth1",
        ] {
            assert_eq!(pin_device(other), None, "{other}");
        }
    }
}
