//! The overlay device (`--routing vxlan`): a collect-metadata VXLAN device the daemon
//! owns, [`DEVICE`], with `overlay_egress` (the tunnel key of what leaves by it) and
//! `overlay_ingress` (what comes out of the tunnel, checked and delivered into pods) on
//! it, pinned under `<bpf dir>/overlay` (TCX; clsact filters without), and
//! `OVERLAY_CONFIG` naming it. It has no ARP (its neighbours are resolved to its own
//! MAC: the tunnel key says where a packet goes) and one address, the network address of
//! this node's first pod range, which the node's own traffic to other nodes' pods leaves
//! from (as flannel's `flannel.1`): their answers then come back through the overlay.
//!
//! A restart finds the device and its links in place and keeps them: the tunnel carries
//! on while the daemon is away. Native routing, or `uninstall`, removes them.

use std::{fs, net::Ipv4Addr, path::Path};

use aya::maps::{Array, LpmTrie, MapData};
use aya::programs::TcAttachType;
use cni_api::Attachment;
use cni_ebpf_common::{OverlayConfig, RemoteNode, map_names, program_names};
use futures::TryStreamExt;
use rtnetlink::{
    Handle, LinkMessageBuilder, LinkUnspec, LinkVxlan,
    packet_route::{
        address::{AddressAttribute, AddressMessage},
        link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage},
    },
};

use super::{
    Datapath, DatapathError, classifier, clsact, ensure_clsact,
    links::{attach_pinned, pin_error, remove_pin},
    netlink::with_netlink,
};

/// The overlay device's name.
pub const DEVICE: &str = "ebpf-vxlan";

/// What the overlay adds to each packet: outer IPv4 (20), UDP (8), VXLAN (8) and inner
/// Ethernet (14) headers. Pods' MTU is the uplink's less this.
pub const OVERHEAD: u32 = 50;

/// The overlay programs: where they attach; their pins are named after them.
const PROGRAMS: [(&str, TcAttachType); 2] = [
    (program_names::OVERLAY_EGRESS, TcAttachType::Egress),
    (program_names::OVERLAY_INGRESS, TcAttachType::Ingress),
];

/// The overlay's settings (`--vxlan-port`, `--vxlan-vni`), and how far packets from
/// other nodes are trusted (`--underlay-trust`, a `cni_ebpf_common::underlay_trust`
/// value), which holds with either routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverlaySettings {
    pub port: u16,
    pub vni: u32,
    pub underlay_trust: u8,
}

/// `REMOTE_NODES`: other nodes' pod ranges -> their node.
pub type RemoteNodes = LpmTrie<MapData, [u8; 4], RemoteNode>;

/// `CLUSTER_NODES`: the cluster's nodes' addresses, each a /32.
pub type ClusterNodes = LpmTrie<MapData, [u8; 4], u8>;

impl Datapath {
    /// Makes the overlay device (when it is missing) with `mtu`, up and without ARP,
    /// attaches its programs and names it in `OVERLAY_CONFIG`. Returns its ifindex.
    pub fn start_overlay(
        &mut self,
        settings: OverlaySettings,
        mtu: u32,
    ) -> Result<u32, DatapathError> {
        let ifindex = ensure_device(settings.port, mtu)?;
        let pins = self.bpf_dir.join("overlay");
        fs::create_dir_all(&pins).map_err(|source| pin_error(&pins, source))?;
        if !self.tcx {
            ensure_clsact(DEVICE)?;
        }
        self.attachments
            .retain(|attachment| attachment.interface != DEVICE);
        for (name, attach_type) in PROGRAMS {
            let program = classifier(&mut self.ebpf, name)?;
            if self.tcx {
                attach_pinned(program, name, DEVICE, attach_type, pins.join(name))?;
            } else {
                clsact::attach(program, name, DEVICE, attach_type, clsact::HANDLE)?;
            }
            self.attachments.push(Attachment {
                interface: DEVICE.to_owned(),
                ifindex,
                program: name.to_owned(),
                mode: if self.tcx { "tcx" } else { "clsact" }.to_owned(),
            });
        }
        self.overlay_config()?.set(
            0,
            OverlayConfig {
                ifindex,
                vni: settings.vni,
                port: settings.port,
                underlay_trust: settings.underlay_trust,
                pad: [0; 5],
            },
            0,
        )?;
        tracing::info!(
            device = DEVICE,
            ifindex,
            mtu,
            port = settings.port,
            vni = settings.vni,
            "overlay up"
        );
        Ok(ifindex)
    }

    /// No overlay (native routing): `OVERLAY_CONFIG` cleared first (but for
    /// `underlay_trust`), so that pods' traffic stops going to the device, then its
    /// pins and the device go.
    pub fn stop_overlay(&mut self, underlay_trust: u8) -> Result<(), DatapathError> {
        let config = OverlayConfig {
            underlay_trust,
            ..OverlayConfig::default()
        };
        self.overlay_config()?.set(0, config, 0)?;
        remove_pins(&self.bpf_dir)?;
        self.attachments
            .retain(|attachment| attachment.interface != DEVICE);
        remove_device()
    }

    /// `REMOTE_NODES`, for the node to keep in step with the cluster.
    pub fn take_remote_nodes(&mut self) -> Result<RemoteNodes, DatapathError> {
        let map = self
            .ebpf
            .take_map(map_names::REMOTE_NODES)
            .ok_or(DatapathError::MissingMap(map_names::REMOTE_NODES))?;
        Ok(LpmTrie::try_from(map)?)
    }

    /// `CLUSTER_NODES`, for the node to keep in step with the cluster.
    pub fn take_cluster_nodes(&mut self) -> Result<ClusterNodes, DatapathError> {
        let map = self
            .ebpf
            .take_map(map_names::CLUSTER_NODES)
            .ok_or(DatapathError::MissingMap(map_names::CLUSTER_NODES))?;
        Ok(LpmTrie::try_from(map)?)
    }

    fn overlay_config(&mut self) -> Result<Array<&mut MapData, OverlayConfig>, DatapathError> {
        let map = self
            .ebpf
            .map_mut(map_names::OVERLAY_CONFIG)
            .ok_or(DatapathError::MissingMap(map_names::OVERLAY_CONFIG))?;
        Ok(Array::try_from(map)?)
    }
}

/// Removes the overlay programs' pins (their TCX links go with them).
fn remove_pins(bpf_dir: &Path) -> Result<(), DatapathError> {
    for (name, _) in PROGRAMS {
        remove_pin(&bpf_dir.join("overlay").join(name))?;
    }
    let _ = fs::remove_dir(bpf_dir.join("overlay"));
    Ok(())
}

/// The overlay device's ifindex, made when missing: `ip link add ebpf-vxlan type vxlan
/// external dstport PORT nolearning`, then MTU, no ARP, up. An existing device is kept
/// (a restart must not cut the tunnel) and given the MTU.
fn ensure_device(port: u16, mtu: u32) -> Result<u32, DatapathError> {
    let error = |what: &'static str| {
        move |error: rtnetlink::Error| DatapathError::Overlay(format!("{what}: {error}"))
    };
    with_netlink(move |handle| async move {
        let index = match find_link(&handle, DEVICE).await {
            Some(link) => {
                if !is_external_vxlan(&link.attributes) {
                    return Err(DatapathError::Overlay(format!(
                        "{DEVICE} exists and is not a collect-metadata VXLAN device: \
                         remove it, the daemon makes its own"
                    )));
                }
                link.header.index
            }
            _ => {
                let device = LinkMessageBuilder::<LinkVxlan>::new(DEVICE)
                    .port(port)
                    .collect_metadata(true)
                    .learning(false)
                    .build();
                handle
                    .link()
                    .add(device)
                    .execute()
                    .await
                    .map_err(error("cannot make the overlay device"))?;
                let link = find_link(&handle, DEVICE)
                    .await
                    .ok_or_else(|| DatapathError::Overlay("the overlay device vanished".into()))?;
                link.header.index
            }
        };
        let settings = LinkUnspec::new_with_index(index)
            .mtu(mtu)
            .arp(false)
            .up()
            .build();
        handle
            .link()
            .set(settings)
            .execute()
            .await
            .map_err(error("cannot set the overlay device up"))?;
        Ok(index)
    })
}

/// The link `name`; `None` when there is none (or it cannot be read: what follows then
/// fails with its own error).
async fn find_link(handle: &Handle, name: &str) -> Option<LinkMessage> {
    handle
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await
        .ok()
        .flatten()
}

/// Whether a link's attributes are those of a VXLAN device in collect-metadata mode.
fn is_external_vxlan(attributes: &[LinkAttribute]) -> bool {
    attributes.iter().any(|attribute| match attribute {
        LinkAttribute::LinkInfo(infos) => {
            infos
                .iter()
                .any(|info| matches!(info, LinkInfo::Kind(InfoKind::Vxlan)))
                && infos.iter().any(|info| match info {
                    LinkInfo::Data(InfoData::Vxlan(data)) => data
                        .iter()
                        .any(|item| matches!(item, InfoVxlan::CollectMetadata(true))),
                    _ => false,
                })
        }
        _ => false,
    })
}

/// The MTU of links where the node's uplink cannot be read (no uplink yet).
const DEFAULT_MTU: u32 = 1500;

/// The overlay device's MTU, and that of pods whose conflist sets none: the uplink's
/// (`uplink`, else [`DEFAULT_MTU`]) less [`OVERHEAD`].
pub fn pod_mtu(uplink: Option<&str>) -> Result<u32, DatapathError> {
    let uplink_mtu = match uplink {
        Some(uplink) => link_mtu(uplink)?.unwrap_or(DEFAULT_MTU),
        None => DEFAULT_MTU,
    };
    Ok(uplink_mtu.saturating_sub(OVERHEAD))
}

/// The MTU of the link `name`; `None` when there is no such link.
pub fn link_mtu(name: &str) -> Result<Option<u32>, DatapathError> {
    let name = name.to_owned();
    with_netlink(move |handle| async move {
        let Some(link) = find_link(&handle, &name).await else {
            return Ok(None);
        };
        Ok(link
            .attributes
            .iter()
            .find_map(|attribute| match attribute {
                LinkAttribute::Mtu(mtu) => Some(*mtu),
                _ => None,
            }))
    })
}

/// Removes the overlay device; one that is not there is not an error.
pub fn remove_device() -> Result<(), DatapathError> {
    with_netlink(|handle| async move {
        if let Some(link) = find_link(&handle, DEVICE).await {
            handle
                .link()
                .del(link.header.index)
                .execute()
                .await
                .map_err(|error| {
                    DatapathError::Overlay(format!("cannot remove the overlay device: {error}"))
                })?;
        }
        Ok(())
    })
}

/// Gives the overlay device (`ifindex`) exactly `address` (/32), or none.
pub fn set_address(ifindex: u32, address: Option<Ipv4Addr>) -> Result<(), DatapathError> {
    with_netlink(move |handle| async move {
        let error = |what: String| {
            move |error: rtnetlink::Error| DatapathError::Overlay(format!("{what}: {error}"))
        };
        let present: Vec<AddressMessage> = handle
            .address()
            .get()
            .set_link_index_filter(ifindex)
            .execute()
            .try_collect()
            .await
            .map_err(error("cannot list the overlay device's addresses".into()))?;
        let mut has = false;
        for message in present {
            let addr = message
                .attributes
                .iter()
                .find_map(|attribute| match attribute {
                    AddressAttribute::Address(std::net::IpAddr::V4(addr)) => Some(*addr),
                    _ => None,
                });
            if addr.is_some() && addr == address && message.header.prefix_len == 32 {
                has = true;
                continue;
            }
            handle
                .address()
                .del(message)
                .execute()
                .await
                .map_err(error("cannot remove an overlay address".into()))?;
        }
        if let (Some(address), false) = (address, has) {
            handle
                .address()
                .add(ifindex, address.into(), 32)
                .execute()
                .await
                .map_err(error(format!("cannot give the overlay device {address}")))?;
        }
        Ok(())
    })
}
