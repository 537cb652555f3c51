//! The watcher of the node's IPv4 addresses, default route, root qdiscs and devices: an
//! async task of the front that listens to rtnetlink's announcements and has the node
//! follow them (`Node::sync_node_addrs`, `Node::follow_uplink`,
//! `Node::follow_root_qdisc`, `Node::sync_guard`) on a blocking thread, then publishes
//! the node's view for the readiness and the metrics
//! (its uplinks).

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use rtnetlink::{
    constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_LINK, RTMGRP_TC},
    packet_core::NetlinkPayload,
    packet_route::{RouteNetlinkMessage, tc::TcHandle},
    sys::{AsyncSocket, SocketAddr},
};

use crate::{
    datapath::{self, tc_block},
    front::metrics::{NodeView, Telemetry},
    model::node::LocalNode,
};

/// The IPv4 address and route announcements.
pub const ADDRESS_GROUPS: u32 = RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE;
/// The TC announcements (qdiscs, for the pods' root qdiscs) and the links' (devices
/// that come and go, for the gateway guard).
pub const QDISC_GROUPS: u32 = RTMGRP_TC | RTMGRP_LINK;

/// Refills `NODE_ADDRS`, and has source NAT follow the uplink's address and device (see
/// `Nat::follow_uplink`), on every IPv4 address change, and has NAT follow the default
/// route on every change of it, until the task is dropped. A watcher that cannot start
/// is logged: hostPorts then cover the addresses known at start, and NAT keeps the
/// uplink and address it started with.
///
/// `groups` is what this watcher's own socket joins: [`ADDRESS_GROUPS`] or
/// [`QDISC_GROUPS`], each on a socket of its own, so that a burst of TC announcements
/// (every pod's qdiscs and filters) can never overflow the socket that carries the
/// address changes source NAT follows.
pub async fn run(node: Arc<Mutex<LocalNode>>, telemetry: Arc<Telemetry>, groups: u32) {
    let (mut connection, _handle, mut messages) = match rtnetlink::new_connection() {
        Ok(parts) => parts,
        Err(error) => {
            tracing::warn!(%error, groups, "cannot watch rtnetlink's announcements");
            return;
        }
    };
    let address = SocketAddr::new(0, groups);
    if let Err(error) = connection.socket_mut().socket_mut().bind(&address) {
        tracing::warn!(%error, groups, "cannot watch rtnetlink's announcements");
        return;
    }
    let connection = tokio::spawn(connection);
    while let Some((message, _)) = messages.next().await {
        let Some(change) = Change::of(&message.payload) else {
            continue;
        };
        let node = Arc::clone(&node);
        let telemetry = Arc::clone(&telemetry);
        let synced = tokio::task::spawn_blocking(move || {
            let mut node = match node.lock() {
                Ok(node) => node,
                Err(poisoned) => poisoned.into_inner(),
            };
            let synced = match change {
                Change::Address => node.sync_node_addrs().map(Some),
                Change::DefaultRoute => node.follow_uplink().map(|()| None),
                Change::RootQdisc { ifindex, queued } => {
                    let changed = node.follow_root_qdisc(ifindex, queued);
                    if let Ok(true) = changed {
                        tracing::info!(
                            ifindex,
                            queued,
                            "a pod's host veth root qdisc changed: its frames go {}",
                            if queued {
                                "through it"
                            } else {
                                "straight into the pod"
                            }
                        );
                    }
                    changed.map(|_| None)
                }
                Change::Device => node.sync_guard().map(|()| None),
            };
            telemetry.publish(NodeView::of(&node));
            synced
        })
        .await;
        match synced {
            Ok(Ok(Some(addrs))) => tracing::info!(?addrs, "node addresses changed"),
            Ok(Ok(None)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "cannot refresh the node's addresses"),
            Err(error) => tracing::warn!(%error, "node address task failed"),
        }
    }
    connection.abort();
}

/// What a netlink announcement changed, among what the watcher follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// An IPv4 address came or went.
    Address,
    /// A default IPv4 route (0.0.0.0/0) came or went: source NAT may have to follow it.
    /// Other routes (a pod's /32 at every ADD) change nothing here.
    DefaultRoute,
    /// Link `ifindex`'s root qdisc came (`queued`, when it is not `noqueue`) or went: a
    /// pod on that host veth must get its frames through it (a rate limit's `tbf`,
    /// perhaps the reference bandwidth plugin's after ebpf-cni in a chain).
    RootQdisc { ifindex: u32, queued: bool },
    /// A device that may take the gateway guard (an Ethernet device, neither veth nor
    /// netkit: a pod's ADD announces none) came, changed or went.
    Device,
}

impl Change {
    fn of(payload: &NetlinkPayload<RouteNetlinkMessage>) -> Option<Self> {
        match payload {
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewAddress(_) | RouteNetlinkMessage::DelAddress(_),
            ) => Some(Self::Address),
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewRoute(route) | RouteNetlinkMessage::DelRoute(route),
            ) if route.header.destination_prefix_length == 0 => Some(Self::DefaultRoute),
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewLink(link) | RouteNetlinkMessage::DelLink(link),
            ) if datapath::guardable_name(link).is_some() => Some(Self::Device),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(qdisc))
                if qdisc.header.parent == TcHandle::ROOT =>
            {
                Some(Self::RootQdisc {
                    ifindex: u32::try_from(qdisc.header.index).ok()?,
                    queued: tc_block::is_queue(qdisc),
                })
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelQueueDiscipline(qdisc))
                if qdisc.header.parent == TcHandle::ROOT =>
            {
                Some(Self::RootQdisc {
                    ifindex: u32::try_from(qdisc.header.index).ok()?,
                    queued: false,
                })
            }
            _ => None,
        }
    }
}
