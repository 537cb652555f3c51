//! IPv4 BIG TCP for pods: new pods' veths take the uplink's IPv4 GSO/GRO size when the
//! node's admin raised it above the 64 KiB default (as on a NIC with BIG TCP enabled).
//!
//! A pod's TCP builds GSO packets of up to its interface's `gso_ipv4_max_size`: larger
//! packets mean fewer trips through the stacks and the datapath per byte (pod to pod
//! at 192 KiB: +8-18% throughput in full `cargo xtask bench` runs on the benchmark
//! machine). But a packet larger than the
//! size of the device it leaves by is segmented in software there, which costs more
//! than it saved (pod-to-external throughput halved with pods at 192 KiB behind a 64 KiB
//! uplink). So pods follow the uplink, never lead it.
//!
//! Decision: the daemon reads the uplink's sizes and never changes them. The uplink is
//! the node's device, configured by its admin or its NIC driver; raising it (as Cilium
//! does when BIG TCP is switched on) would change how the node's own traffic leaves,
//! and needs undoing on uninstall. A node whose uplink stays at 64 KiB runs its pods at
//! the kernel's default.

use rtnetlink::packet_route::link::LinkAttribute;

/// The kernel's default (and the most without BIG TCP): `GSO_LEGACY_MAX_SIZE`.
pub const LEGACY_MAX_SIZE: u32 = 65_536;

/// The most a veth takes (`GSO_MAX_SIZE`, its `tso_max_size`).
pub const VETH_MAX_SIZE: u32 = 524_280;

/// The size new pods' veths get, from the uplink's IPv4 GSO and GRO sizes: the smaller
/// of the two (a pod's packets must fit the uplink's GSO size on their way out, and
/// what the uplink's GRO builds must fit the pod's veth on the way in), capped at what
/// a veth takes; `None` when that is not above the default.
pub fn pod_size(uplink_gso: u32, uplink_gro: u32) -> Option<u32> {
    let size = uplink_gso.min(uplink_gro).min(VETH_MAX_SIZE);
    (size > LEGACY_MAX_SIZE).then_some(size)
}

/// [`pod_size`] for the interface named `uplink` of the daemon's namespace; `None` also
/// when the kernel does not report IPv4 sizes (before 6.3, without IPv4 BIG TCP).
pub async fn pod_size_for(uplink: &str) -> std::io::Result<Option<u32>> {
    let links = crate::front::link_stats::links(Some(uplink)).await?;
    let Some(link) = links.first() else {
        return Ok(None);
    };
    let (mut gso, mut gro) = (None, None);
    for attribute in &link.attributes {
        match attribute {
            LinkAttribute::GsoIpv4MaxSize(size) => gso = Some(*size),
            LinkAttribute::GroIpv4MaxSize(size) => gro = Some(*size),
            _ => {}
        }
    }
    Ok(gso.zip(gro).and_then(|(gso, gro)| pod_size(gso, gro)))
}

/// [`pod_size_for`] every one of `uplinks` takes: the smallest, `None` when one of
/// them takes no more than the default (or there is none). Decision: a pod's traffic may
/// leave by any uplink, and a GSO packet larger than its device takes would be split in
/// software there, so a pod gets what all of them take.
pub async fn pod_size_for_all(uplinks: &[String]) -> std::io::Result<Option<u32>> {
    let mut smallest: Option<u32> = None;
    for uplink in uplinks {
        let Some(size) = pod_size_for(uplink).await? else {
            return Ok(None);
        };
        smallest = Some(smallest.map_or(size, |s| s.min(size)));
    }
    Ok(smallest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uplink_at_the_default_size_leaves_pods_at_the_default() {
        assert_eq!(pod_size(LEGACY_MAX_SIZE, LEGACY_MAX_SIZE), None);
        assert_eq!(
            pod_size(16_384, 65_536),
            None,
            "never below the default either"
        );
    }

    #[test]
    fn pods_follow_an_uplink_with_big_tcp() {
        assert_eq!(pod_size(196_608, 196_608), Some(196_608));
    }

    #[test]
    fn the_smaller_of_gso_and_gro_is_followed() {
        assert_eq!(pod_size(196_608, 131_072), Some(131_072));
        assert_eq!(pod_size(196_608, LEGACY_MAX_SIZE), None);
        assert_eq!(pod_size(LEGACY_MAX_SIZE, 196_608), None);
    }

    #[test]
    fn a_size_above_what_a_veth_takes_is_capped() {
        assert_eq!(pod_size(1 << 20, 1 << 20), Some(VETH_MAX_SIZE));
    }
}
