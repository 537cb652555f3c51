//! What went into each pod through its host veth's transmit: the host veths' kernel TX
//! counters. The datapath counts what it hands straight into a pod itself (pod to pod,
//! replies of translated flows, hostPorts), which reaches the pod with
//! `bpf_redirect_peer`, past that transmit path; everything else goes through it, and
//! only through it: what the stack sends (the node's processes talking to a pod), and
//! what the datapath redirects to the host veth (a shaped pod's frames, which the
//! daemon then takes from here alone; ARP replies; deliveries from a netkit pair's hook,
//! which the datapath does not count). Reading the kernel's counters costs nothing per
//! packet and spares a second TC program per pod.
//!
//! [`links`] is the one netlink link dump of the async front; `big_tcp` reads the
//! uplink's sizes through it too.

use futures::TryStreamExt;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};

use cni_api::LinkCounters;

/// The links of the daemon's namespace as the kernel reports them (attributes and
/// statistics): every one, or only the one named `name`.
pub async fn links(name: Option<&str>) -> std::io::Result<Vec<LinkMessage>> {
    let (connection, handle, _) = rtnetlink::new_connection()?;
    let connection = tokio::spawn(connection);
    let mut request = handle.link().get();
    if let Some(name) = name {
        request = request.match_name(name.to_owned());
    }
    let links: Result<Vec<_>, _> = request.execute().try_collect().await;
    connection.abort();
    links.map_err(std::io::Error::other)
}

/// TX packets and bytes of every link of the daemon's namespace.
pub async fn tx_counters() -> std::io::Result<Vec<LinkCounters>> {
    let links = links(None).await?;
    Ok(links
        .iter()
        .filter_map(|link| {
            link.attributes
                .iter()
                .find_map(|attribute| match attribute {
                    LinkAttribute::Stats64(stats) => Some(LinkCounters {
                        ifindex: link.header.index,
                        packets: stats.tx_packets,
                        bytes: stats.tx_bytes,
                    }),
                    _ => None,
                })
        })
        .collect())
}
