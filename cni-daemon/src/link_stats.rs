//! What the node's own stack sent into each pod: the host veths' kernel TX counters.
//! The datapath counts what it delivers itself (pod to pod, replies of translated flows,
//! hostPorts), which reaches the pod with `bpf_redirect_peer`, past the host veth's
//! transmit path; everything the stack sends (the node's processes talking to a pod)
//! goes through that path, and only through it. Reading the kernel's counters costs
//! nothing per packet and spares a second TC program per pod.

use futures::TryStreamExt;
use rtnetlink::packet_route::link::LinkAttribute;

use crate::api::LinkCounters;

/// TX packets and bytes of every link of the daemon's namespace.
pub async fn tx_counters() -> std::io::Result<Vec<LinkCounters>> {
    let (connection, handle, _) = rtnetlink::new_connection()?;
    let connection = tokio::spawn(connection);
    let links: Result<Vec<_>, _> = handle.link().get().execute().try_collect().await;
    connection.abort();
    let links = links.map_err(std::io::Error::other)?;
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
