//! The endpoints map: pod IPv4 -> host veth, pod MAC and host MAC, written by the daemon.

use aya_ebpf::{macros::map, maps::HashMap};
use cni_ebpf_common::{EndpointInfo, EndpointKey};

/// Pods per node; Kubernetes' default maximum is 110, this leaves room for churn.
const MAX_ENDPOINTS: u32 = 4096;

#[map(name = "ENDPOINTS")]
static ENDPOINTS: HashMap<EndpointKey, EndpointInfo> = HashMap::pinned(MAX_ENDPOINTS, 0);

/// The endpoint that owns `addr`, if it is a pod of this node.
#[inline(always)]
pub fn lookup(addr: [u8; 4]) -> Option<EndpointInfo> {
    // SAFETY: the value is copied out at once, while the program's RCU read lock holds.
    unsafe { ENDPOINTS.get(&EndpointKey { addr }) }.copied()
}
