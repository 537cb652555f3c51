//! Source NAT following the node as it changes: the uplinks' addresses and devices, and
//! the default route when the uplink is its device ([`Nat::follow_uplink`]).

use super::{Nat, NatError, Uplink, uplink};
use crate::datapath::Datapath;

impl Nat {
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
