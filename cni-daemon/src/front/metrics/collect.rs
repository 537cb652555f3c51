//! `/metrics`: a registry built at each scrape from the pinned maps (read as the
//! inspection commands read them, [`crate::front::inspect::read`]), the published
//! [`NodeView`](super::NodeView) and the histograms of [`Telemetry`], encoded in the
//! Prometheus text format. Map reads are system calls: call this on a blocking thread.
//!
//! A map that cannot be read (before the datapath is loaded) leaves its metrics out;
//! the others are still served.

use std::{collections::BTreeMap, fmt::Debug};

use prometheus_client::{
    encoding::{EncodeLabelSet, prometheus_text},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{Telemetry, view::EndpointView};
use crate::front::inspect::{InspectError, read};

/// Every metric's name starts with it.
pub const PREFIX: &str = "ebpf_cni";

/// The labels of a pod interface's traffic counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrafficLabels {
    namespace: String,
    pod: String,
    ip: String,
    interface: String,
    /// `from_pod` (what the pod sent) or `to_pod` (what the datapath delivered to it).
    direction: &'static str,
}

impl TrafficLabels {
    fn of(endpoint: &EndpointView, direction: &'static str) -> Self {
        Self {
            namespace: endpoint.namespace.clone(),
            pod: endpoint.pod.clone(),
            ip: endpoint.ip.clone(),
            interface: endpoint.interface.clone(),
            direction,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabel {
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: &'static str,
}

/// A NetworkPolicy: an operator's object, so a bounded label set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    namespace: String,
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

/// A counter family with one value per label set.
fn counters<L>(values: impl IntoIterator<Item = (L, u64)>) -> Family<L, Counter>
where
    L: Clone + Debug + std::hash::Hash + Eq + EncodeLabelSet + Send + Sync + 'static,
{
    let family = Family::<L, Counter>::default();
    for (labels, value) in values {
        family.get_or_create(&labels).inc_by(value);
    }
    family
}

fn gauge(value: u64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
    gauge
}

/// Registers what `read` gave, or logs why it gave nothing.
fn register_read<T>(
    registry: &mut Registry,
    what: &str,
    read: Result<T, InspectError>,
    register: impl FnOnce(&mut Registry, T),
) {
    match read {
        Ok(value) => register(registry, value),
        Err(error) => tracing::debug!(%error, what, "left out of the metrics"),
    }
}

/// The metrics as the Prometheus text format (version 0.0.4) gives them.
pub fn encode(telemetry: &Telemetry) -> Result<String, std::fmt::Error> {
    let registry = registry(telemetry);
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

fn registry(telemetry: &Telemetry) -> Registry {
    let mut registry = Registry::with_prefix(PREFIX);
    let view = telemetry.view();
    let bpf_dir = telemetry.bpf_dir();
    registry.register(
        "endpoints",
        "Pod interfaces the daemon serves",
        gauge(view.endpoints.len() as u64),
    );
    registry.register(
        "hostport_mappings",
        "hostPort mappings of the node's pods",
        gauge(view.port_mappings() as u64),
    );
    let refusals = Family::<ReasonLabel, Gauge>::default();
    for (reason, count) in &view.node_refusals {
        refusals
            .get_or_create(&ReasonLabel { reason })
            .set(i64::try_from(*count).unwrap_or(i64::MAX));
    }
    registry.register(
        "node_refusals",
        "Other nodes' addresses and pod ranges the daemon does not take, by reason \
         (`ebpf-cnid nodes` lists them)",
        refusals,
    );
    let left_out = Family::<TableLabel, Gauge>::default();
    for (table, count) in &view.maps_left_out {
        left_out
            .get_or_create(&TableLabel { table })
            .set(i64::try_from(*count).unwrap_or(i64::MAX));
    }
    registry.register(
        "map_left_out",
        "Entries that did not fit in a full map of the cluster's ranges and nodes \
         (CLUSTER_CIDRS, REMOTE_NODES, CLUSTER_NODES) at its last sync",
        left_out,
    );
    registry.register(
        "policy_refused_objects",
        "Objects the policy source left out (`ebpf-cnid policy` lists them with why)",
        gauge(view.policies.refused),
    );
    let isolated = Family::<DirectionLabel, Gauge>::default();
    for (direction, count) in [
        ("ingress", view.policies.isolated_ingress),
        ("egress", view.policies.isolated_egress),
    ] {
        isolated
            .get_or_create(&DirectionLabel { direction })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
    registry.register(
        "policy_isolated_pods",
        "This node's pods a NetworkPolicy isolates, by direction",
        isolated,
    );
    registry.register(
        "request_duration_seconds",
        "Time from the arrival of a plugin's request to its answer, the wait for the \
         node's lock included, by command (add: ADD's attach step, del: DEL)",
        telemetry.requests.clone(),
    );
    registry.register(
        "nat_sweep_duration_seconds",
        "Time a sweep of the NAT flow tables took",
        telemetry.sweeps.clone(),
    );
    if !telemetry.datapath_loaded() {
        return registry;
    }
    let limits = Family::<TrafficLabels, Gauge>::default();
    for endpoint in &view.endpoints {
        for (direction, rate) in &endpoint.limits {
            limits
                .get_or_create(&TrafficLabels::of(endpoint, direction))
                .set(i64::try_from(*rate).unwrap_or(i64::MAX));
        }
    }
    registry.register(
        "endpoint_rate_limit_bits_per_second",
        "A pod interface's bandwidth limit: what it may receive (to_pod) and send \
         (from_pod); compare with rate(endpoint_bytes) * 8",
        limits,
    );
    register_read(
        &mut registry,
        "endpoint counters",
        read::endpoint_counters(bpf_dir),
        |registry, by_ifindex| {
            let mut packets = Vec::new();
            let mut bytes = Vec::new();
            for endpoint in &view.endpoints {
                // A pod that sent and received nothing yet has no entry: zeros.
                let counted = by_ifindex
                    .get(&endpoint.host_ifindex)
                    .copied()
                    .unwrap_or_default();
                let from = TrafficLabels::of(endpoint, "from_pod");
                let to = TrafficLabels::of(endpoint, "to_pod");
                packets.push((from.clone(), counted.from_pod_packets));
                packets.push((to.clone(), counted.to_pod_packets));
                bytes.push((from, counted.from_pod_bytes));
                bytes.push((to, counted.to_pod_bytes));
            }
            registry.register(
                "endpoint_packets",
                "Packets a pod interface sent (from_pod) and the datapath delivered to it \
                 (to_pod; what the node's stack routes to it is not counted)",
                counters(packets),
            );
            registry.register(
                "endpoint_bytes",
                "Bytes a pod interface sent (from_pod) and the datapath delivered to it \
                 (to_pod)",
                counters(bytes),
            );
        },
    );
    register_read(
        &mut registry,
        "drops",
        read::drops(bpf_dir),
        |registry, drops| {
            let values = drops
                .into_iter()
                .map(|(reason, count)| (ReasonLabel { reason }, count));
            registry.register(
                "drops",
                "Packets the datapath dropped, by reason",
                counters(values),
            );
        },
    );
    register_read(
        &mut registry,
        "policy counters",
        read::policy_counters(bpf_dir),
        |registry, by_slot| {
            let (mut denied, mut allowed, mut audited) = (Vec::new(), Vec::new(), Vec::new());
            for (slot, namespace, policy) in &view.policies.slots {
                // A policy that counted nothing yet has no entry: zeros.
                let counted = by_slot.get(slot).copied().unwrap_or_default();
                let labels = PolicyLabels {
                    namespace: namespace.clone(),
                    policy: policy.clone(),
                };
                denied.push((labels.clone(), counted.denied));
                allowed.push((labels.clone(), counted.allowed));
                audited.push((labels, counted.audited));
            }
            registry.register(
                "policy_drops",
                "Packets dropped at a pod a NetworkPolicy isolates, nothing letting them \
                 through, counted against the first policy isolating it that way",
                counters(denied),
            );
            registry.register(
                "policy_allowed_flows",
                "Flows a way of a NetworkPolicy let through at a pod it isolates",
                counters(allowed),
            );
            registry.register(
                "policy_audited",
                "Flows nothing lets through, let through in audit mode (--policy-mode \
                 audit), once per flow and policy change",
                counters(audited),
            );
        },
    );
    register_read(
        &mut registry,
        "NAT counters",
        read::nat_counters(bpf_dir),
        |registry, events| {
            let values = events
                .into_iter()
                .map(|(event, count)| (EventLabel { event }, count));
            registry.register(
                "nat_events",
                "Source NAT's counters (allocation_failures: new flows that found no node \
                 port; table_full, over_budget: new flows refused)",
                counters(values),
            );
        },
    );
    register_read(
        &mut registry,
        "NAT refusals",
        read::refused_flows(bpf_dir),
        |registry, by_pod| {
            let mut sums: BTreeMap<&'static str, u64> = BTreeMap::new();
            for refused in by_pod.values() {
                for (reason, count) in [
                    ("no_port", refused.no_port),
                    ("flow_budget", refused.flow_budget),
                    ("port_budget", refused.port_budget),
                    ("table_full", refused.table_full),
                ] {
                    *sums.entry(reason).or_default() += count;
                }
            }
            let values = sums
                .into_iter()
                .map(|(reason, count)| (ReasonLabel { reason }, count));
            registry.register(
                "nat_refused_flows",
                "New flows refused, by reason, summed over the pods the datapath still \
                 keeps refusals of",
                counters(values),
            );
        },
    );
    register_read(
        &mut registry,
        "NAT flows",
        read::flow_counts(bpf_dir),
        |registry, by_pod| {
            let (mut out, mut from_outside, mut hostport) = (0u64, 0u64, 0u64);
            for counts in by_pod.values() {
                out += u64::from(counts.out);
                from_outside += u64::from(counts.from_outside);
                hostport += u64::from(counts.hostport);
            }
            let family = Family::<TableLabel, Gauge>::default();
            for (table, count) in [
                ("translated", out),
                ("from_outside", from_outside),
                ("hostport", hostport),
            ] {
                family
                    .get_or_create(&TableLabel { table })
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
            registry.register(
                "nat_flows",
                "Entries in use in each flow table, as the pods' budgets count them",
                family,
            );
        },
    );
    register_read(
        &mut registry,
        "NAT capacity",
        read::nat_capacity(bpf_dir),
        |registry, capacity| {
            registry.register(
                "nat_flows_capacity",
                "Entries each flow table holds at most (--nat-max-flows)",
                gauge(u64::from(capacity)),
            );
        },
    );
    registry
}
