//! The endpoints map: pod IPv4 -> host veth and pod MAC, written by the daemon.
//!
//! Forwarding reads it (pod-to-pod redirect, next issue); it is declared here so the
//! object pins it and the daemon can fill it from the first pod on.

use aya_ebpf::{macros::map, maps::HashMap};
use cni_ebpf_common::{EndpointInfo, EndpointKey};

/// Pods per node; Kubernetes' default maximum is 110, this leaves room for churn.
const MAX_ENDPOINTS: u32 = 4096;

#[map(name = "ENDPOINTS")]
pub static ENDPOINTS: HashMap<EndpointKey, EndpointInfo> = HashMap::pinned(MAX_ENDPOINTS, 0);
