//! The commands' views as text tables (`--output table`; JSON is the views serialized).

use std::collections::BTreeMap;

use super::{
    join::{EndpointView, NodesTable, PolicyTable, PortRow, StatusView},
    nat::{FlowView, NatView},
    read::SourceCounters,
};

/// How the tables show a node address the uplink does not have.
pub const NO_ADDRESS: &str =
    "none (the uplink has no IPv4 address: traffic to translate is dropped)";

pub fn status_table(view: &StatusView) -> String {
    let status = &view.status;
    let mut out = format!(
        "daemon {}  bpf dir {}  datapath {}  endpoints {}\n",
        status.daemon_version,
        status.bpf_dir.display(),
        if status.datapath_loaded {
            "loaded"
        } else {
            "not loaded"
        },
        status.endpoints
    );
    out.push_str(&node_line(status));
    let drops: Vec<String> = view.drops.iter().map(|(r, n)| format!("{r}={n}")).collect();
    out.push_str(&format!("drops: {}\n", drops.join(" ")));
    if status.nat_enabled {
        out.push_str("nat: enabled\n");
        for uplink in &status.uplinks {
            let node = uplink
                .node_addr
                .map_or_else(|| NO_ADDRESS.to_owned(), |addr| addr.to_string());
            out.push_str(&format!("  uplink {}  node {node}\n", uplink.name));
        }
    } else {
        out.push_str("nat: disabled\n");
    }
    if !status.service_cidrs.is_empty() {
        out.push_str(&format!(
            "services: {} (through the node's stack: kube-proxy)\n",
            joined(&status.service_cidrs, ", ")
        ));
    }
    if !status.host_firewall_cidrs.is_empty() {
        out.push_str(&format!(
            "host firewall: {} (always through the node's stack and its netfilter)\n",
            joined(&status.host_firewall_cidrs, ", ")
        ));
    }
    match status.pod_gso_max_size {
        Some(size) => out.push_str(&format!(
            "new pods: IPv4 GSO/GRO size {size} (BIG TCP, following the uplinks)\n"
        )),
        None => out.push_str("new pods: IPv4 GSO/GRO size default (64 KiB)\n"),
    }
    out.push_str(&format!(
        "nat counters: {}\n",
        counters_line(&view.nat_counters)
    ));
    out.push_str(&format!(
        "hostPort addresses: {} (and 127.0.0.0/8 for the node's own processes)\n",
        joined(&status.host_port_addrs, " ")
    ));
    if !status.gateways.is_empty() {
        out.push_str(&format!(
            "pods' gateways: {} (node addresses for its pods only)\n",
            joined(&status.gateways, " ")
        ));
    }
    if !status.attachments.is_empty() {
        // Columns as wide as their longest entry: a cgroup path is long.
        let width = |column: &dyn Fn(&cni_api::Attachment) -> usize, title: &str| {
            status
                .attachments
                .iter()
                .map(column)
                .chain([title.len()])
                .max()
                .unwrap_or(0)
        };
        let interface = width(&|a| a.interface.len(), "INTERFACE");
        let program = width(&|a| a.program.len(), "PROGRAM");
        out.push_str(&format!(
            "{:<interface$} {:>8} {:<program$} {}\n",
            "INTERFACE", "IFINDEX", "PROGRAM", "MODE"
        ));
        for a in &status.attachments {
            out.push_str(&format!(
                "{:<interface$} {:>8} {:<program$} {}\n",
                a.interface, a.ifindex, a.program, a.mode
            ));
        }
    }
    out
}

/// One line of counters, `name=value ...`.
pub fn counters_line(counters: &BTreeMap<&'static str, u64>) -> String {
    let parts: Vec<String> = counters.iter().map(|(n, v)| format!("{n}={v}")).collect();
    parts.join(" ")
}

/// A readable summary and table of `view`.
pub fn nat_table(view: &NatView) -> String {
    let mut out = if view.enabled {
        let mut head = format!(
            "nat enabled  ports {}  flows {}/{}\n",
            view.port_range,
            view.entries.len(),
            view.max_flows
        );
        for uplink in &view.uplinks {
            let node = uplink
                .node_addr
                .map_or_else(|| NO_ADDRESS.to_owned(), |addr| addr.to_string());
            let name = uplink.name.as_deref().unwrap_or("(gone)");
            head.push_str(&format!(
                "  uplink {name} (ifindex {})  node {node}\n",
                uplink.ifindex
            ));
        }
        head
    } else {
        "nat disabled\n".to_owned()
    };
    out.push_str(&format!("counters: {}\n", counters_line(&view.counters)));
    out.push_str(&format!(
        "budget per pod: {} entries a table, {} ports a destination (0: none)\n",
        view.budgets.pod_flows, view.budgets.ports_per_destination
    ));
    if !view.endpoints.is_empty() {
        out.push_str(&format!(
            "{:<16} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
            "POD", "FLOWS", "INBOUND", "HOSTPORT", "REFUSED", "NO_PORT", "FLOWS>", "PORTS>", "FULL"
        ));
        for endpoint in &view.endpoints {
            let (counted, by) = (&endpoint.counted, &endpoint.refused_by);
            out.push_str(&format!(
                "{:<16} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
                endpoint.pod.to_string(),
                endpoint.flows,
                counted.from_outside,
                counted.hostport,
                endpoint.refused,
                by.no_port,
                by.flow_budget,
                by.port_budget,
                by.table_full
            ));
        }
    }
    push_flows(&mut out, &view.entries);
    if !view.from_outside.is_empty() {
        out.push_str(&format!(
            "opened from outside to a pod's own address, answered untranslated: {}\n",
            view.from_outside.len()
        ));
        push_flows(&mut out, &view.from_outside);
    }
    out
}

/// A header line and a line per flow of `flows`.
fn push_flows(out: &mut String, flows: &[FlowView]) {
    out.push_str(&format!(
        "{:<5} {:<21} {:<21} {:<21} {:<11} {:>8} {:>8}\n",
        "PROTO", "POD", "NODE", "REMOTE", "STATE", "IDLE", "EXPIRES"
    ));
    for flow in flows {
        out.push_str(&format!(
            "{:<5} {:<21} {:<21} {:<21} {:<11} {:>7}s {:>7}s\n",
            flow.proto,
            flow.pod.to_string(),
            flow.node.to_string(),
            flow.remote.to_string(),
            flow.state,
            flow.idle_secs,
            flow.expires_in_secs,
        ));
    }
}

/// A readable table of `rows`.
pub fn counters_table(rows: &[SourceCounters]) -> String {
    let mut out = format!("{:<16} {:>12} {:>14}\n", "SOURCE", "PACKETS", "BYTES");
    for row in rows {
        out.push_str(&format!(
            "{:<16} {:>12} {:>14}\n",
            row.source.to_string(),
            row.packets,
            row.bytes
        ));
    }
    out
}

pub fn ports_table(rows: &[PortRow]) -> String {
    let mut out = format!(
        "{:<5} {:<22} {:<22} {:>5} {}\n",
        "PROTO", "HOST", "POD", "CONNS", "CONTAINER"
    );
    for row in rows {
        let host = format!(
            "{}:{}",
            row.host_ip
                .map_or_else(|| "*".to_owned(), |ip| ip.to_string()),
            row.host_port
        );
        let pod = format!(
            "{}:{}",
            row.pod_ip
                .map_or_else(|| "?".to_owned(), |ip| ip.to_string()),
            row.container_port
        );
        out.push_str(&format!(
            "{:<5} {:<22} {:<22} {:>5} {}/{}\n",
            row.protocol, host, pod, row.connections, row.container_id, row.ifname
        ));
    }
    out
}

/// A readable table of endpoints and their counters.
pub fn endpoints_table(views: &[EndpointView]) -> String {
    let mut out = format!(
        "{:<20} {:<8} {:<18} {:<17} {:<15} {:>7} {:>10} {:>10}  {}\n",
        "CONTAINER",
        "IFNAME",
        "IP",
        "MAC",
        "HOST VETH",
        "IFINDEX",
        "PKTS OUT",
        "PKTS IN",
        "LIMITS (rate/burst, bits)"
    );
    for view in views {
        let endpoint = &view.endpoint;
        let ips: Vec<String> = endpoint.ips.iter().map(ToString::to_string).collect();
        let container: String = endpoint.id.container_id.chars().take(20).collect();
        out.push_str(&format!(
            "{:<20} {:<8} {:<18} {:<17} {:<15} {:>7} {:>10} {:>10}  {}\n",
            container,
            endpoint.id.ifname,
            ips.join(","),
            endpoint.mac,
            endpoint.host_veth,
            endpoint.host_ifindex,
            view.counters.from_pod_packets,
            view.counters.to_pod_packets,
            limits(endpoint.bandwidth.as_ref()),
        ));
    }
    out
}

/// A pod's rate limits as `in 50M/5M out -` (tbf on both veth ends), `-` for none.
fn limits(bandwidth: Option<&cni_api::Bandwidth>) -> String {
    let Some(bandwidth) = bandwidth else {
        return "-".to_owned();
    };
    let direction = |rate: Option<u64>, burst: Option<u64>| match rate {
        Some(rate) => format!("{}/{}", si(rate), si(burst.unwrap_or(0))),
        None => "-".to_owned(),
    };
    format!(
        "in {} out {}",
        direction(bandwidth.ingress_rate, bandwidth.ingress_burst),
        direction(bandwidth.egress_rate, bandwidth.egress_burst)
    )
}

/// `value` with an SI prefix when it is a whole multiple of one (`50M`, `1500k`, `12345`).
fn si(value: u64) -> String {
    [(1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")]
        .into_iter()
        .find(|(unit, _)| value >= *unit && value.is_multiple_of(*unit))
        .map_or_else(
            || value.to_string(),
            |(unit, prefix)| format!("{}{prefix}", value / unit),
        )
}

/// `items` as text, separated by `separator`.
/// The status line of this node in its cluster.
fn node_line(status: &cni_api::Status) -> String {
    let name = status.node_name.as_deref().unwrap_or("?");
    match &status.node_source {
        None => format!("node {name}  nodes: no source (a node on its own)\n"),
        Some(source) if status.pod_cidrs.is_empty() => {
            format!("node {name}  nodes: {source}  pod ranges: none yet\n")
        }
        Some(source) => format!(
            "node {name}  nodes: {source}  pod ranges: {}\n",
            joined(&status.pod_cidrs, ", ")
        ),
    }
}

/// `ebpf-cnid nodes`: one row per node, this one marked, with what this node's pods
/// sent to each; then what is refused of the other nodes, with why.
pub fn nodes_table(view: &NodesTable) -> String {
    let mut out = format!(
        "source: {}  routing: {}\n",
        view.node_source
            .as_deref()
            .unwrap_or("none (a node on its own)"),
        view.routing.as_deref().unwrap_or("?")
    );
    let name_width = view
        .nodes
        .iter()
        .map(|node| node.name.len())
        .chain(["NAME".len()])
        .max()
        .unwrap_or(0);
    out.push_str(&format!(
        "  {:<name_width$} {:<15} {:>10} {:>12} {}\n",
        "NAME", "ADDRESS", "PKTS SENT", "BYTES SENT", "POD RANGES"
    ));
    for node in &view.nodes {
        out.push_str(&format!(
            "{} {:<name_width$} {:<15} {:>10} {:>12} {}\n",
            if node.this { "*" } else { " " },
            node.name,
            node.address.to_string(),
            node.sent_packets,
            node.sent_bytes,
            if node.pod_cidrs.is_empty() {
                "none".to_owned()
            } else {
                joined(&node.pod_cidrs, ", ")
            }
        ));
    }
    if !view.refused.is_empty() {
        out.push_str("refused:\n");
        for refused in &view.refused {
            out.push_str(&format!(
                "  {} {}: {}\n",
                refused.node, refused.item, refused.reason
            ));
        }
    }
    out
}

/// `ebpf-cnid policy`: the source and mode; one row per policy with the directions it
/// isolates, its counters and the pods of this node it selects; one row per pod of this
/// node with the directions it is isolated in; then the objects refused, with why.
pub fn policy_table(view: &PolicyTable) -> String {
    let source = match &view.source {
        None => "none (no pod is isolated)".to_owned(),
        Some(source) if !view.answered => {
            format!("{source} (not answered yet: the datapath keeps what it held)")
        }
        Some(source) => source.clone(),
    };
    let mut out = format!(
        "source: {source}  mode: {}  generation: {}\n",
        view.mode, view.generation
    );
    let directions = |ingress: bool, egress: bool| match (ingress, egress) {
        (true, true) => "ingress,egress",
        (true, false) => "ingress",
        (false, true) => "egress",
        (false, false) => "-",
    };
    let names: Vec<String> = view
        .policies
        .iter()
        .map(|row| format!("{}/{}", row.policy.namespace, row.policy.name))
        .collect();
    let width = names
        .iter()
        .map(String::len)
        .chain(["POLICY".len()])
        .max()
        .unwrap_or(0);
    out.push_str(&format!(
        "{:<width$} {:>5} {:<14} {:>13} {:>11} {:>13} {}\n",
        "POLICY", "SLOT", "ISOLATES", "FLOWS ALLOWED", "PKTS DENIED", "FLOWS AUDITED", "SELECTS"
    ));
    for (row, name) in view.policies.iter().zip(&names) {
        out.push_str(&format!(
            "{:<width$} {:>5} {:<14} {:>13} {:>11} {:>13} {}\n",
            name,
            row.policy.slot,
            directions(row.policy.ingress, row.policy.egress),
            row.allowed,
            row.denied,
            row.audited,
            if row.policy.selects.is_empty() {
                "-".to_owned()
            } else {
                row.policy.selects.join(" ")
            }
        ));
    }
    if !view.pods.is_empty() {
        let names: Vec<String> = view
            .pods
            .iter()
            .map(|pod| format!("{}/{}", pod.namespace, pod.name))
            .collect();
        let width = names
            .iter()
            .map(String::len)
            .chain(["POD".len()])
            .max()
            .unwrap_or(0);
        out.push_str(&format!("{:<width$} {}\n", "POD", "ISOLATED"));
        for (pod, name) in view.pods.iter().zip(&names) {
            out.push_str(&format!(
                "{name:<width$} {}\n",
                directions(pod.ingress, pod.egress)
            ));
        }
    }
    if !view.refused.is_empty() {
        out.push_str("refused:\n");
        for refused in &view.refused {
            out.push_str(&format!("  {}: {}\n", refused.object, refused.reason));
        }
    }
    out
}

fn joined<T: std::fmt::Display>(items: &[T], separator: &str) -> String {
    let texts: Vec<String> = items.iter().map(ToString::to_string).collect();
    texts.join(separator)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use cni_api::Status;

    use super::*;

    /// The view of a daemon with nothing attached and NAT off, for a test to change.
    fn view(status: Status) -> StatusView {
        StatusView {
            status,
            drops: BTreeMap::new(),
            nat_counters: BTreeMap::new(),
        }
    }

    fn idle() -> Status {
        Status {
            daemon_version: "0".into(),
            bpf_dir: "/sys/fs/bpf/x".into(),
            datapath_loaded: true,
            endpoints: 0,
            attachments: Vec::new(),
            nat_enabled: false,
            uplink: None,
            node_addr: None,
            uplinks: Vec::new(),
            service_cidrs: Vec::new(),
            host_firewall_cidrs: Vec::new(),
            host_port_addrs: Vec::new(),
            gateways: Vec::new(),
            pod_gso_max_size: None,
            node_name: Some("node-a".into()),
            node_source: None,
            pod_cidrs: Vec::new(),
            pod_mtu: None,
        }
    }

    #[test]
    fn nodes_are_listed_with_this_one_marked_and_what_was_sent_to_each() {
        let node = |name: &str, address: &str, cidrs: &[&str]| cni_api::NodeInfo {
            name: name.into(),
            address: address.parse().expect("an address"),
            pod_cidrs: cidrs.iter().map(|c| c.parse().expect("a range")).collect(),
        };
        let view = cni_api::NodesView {
            node_name: Some("node-a".into()),
            node_source: Some("file /etc/nodes.yaml".into()),
            routing: Some("vxlan".into()),
            nodes: vec![
                node("node-a", "192.0.2.1", &["10.244.1.0/24"]),
                node("a-longer-name", "192.0.2.2", &[]),
                node("greedy", "192.0.2.3", &["169.254.0.0/16"]),
            ],
            refused: vec![cni_api::RefusedInfo {
                node: "greedy".into(),
                item: "169.254.0.0/16".into(),
                reason: "it overlaps the link-local range 169.254.0.0/16".into(),
            }],
        };
        let sent = [(
            "192.0.2.2".parse().expect("an address"),
            cni_ebpf_common::TrafficCounters {
                packets: 3,
                bytes: 4500,
            },
        )]
        .into_iter()
        .collect();
        let table = nodes_table(&super::super::join::nodes_table(view, &sent));
        assert_eq!(
            table,
            "source: file /etc/nodes.yaml  routing: vxlan\n  NAME          ADDRESS          PKTS SENT   BYTES SENT POD RANGES\n\
             * node-a        192.0.2.1                0            0 10.244.1.0/24\n  \
             a-longer-name 192.0.2.2                3         4500 none\n  \
             greedy        192.0.2.3                0            0 169.254.0.0/16\n\
             refused:\n  greedy 169.254.0.0/16: it overlaps the link-local range 169.254.0.0/16\n"
        );
    }

    #[test]
    fn policies_are_listed_with_their_counters_the_pods_they_select_and_the_refused() {
        let policy = |name: &str, slot, egress: bool, selects: &[&str]| cni_api::PolicyInfo {
            namespace: "x".into(),
            name: name.into(),
            slot,
            ingress: !egress,
            egress,
            selects: selects.iter().map(|pod| (*pod).to_owned()).collect(),
        };
        let pod = |name: &str, ingress| cni_api::PolicyPodInfo {
            namespace: "x".into(),
            name: name.into(),
            ingress,
            egress: false,
        };
        let view = cni_api::PoliciesView {
            source: Some("file /etc/policies.yaml".into()),
            answered: true,
            mode: "enforce".into(),
            generation: 4,
            policies: vec![
                policy("deny-ingress", 0, false, &["x/a", "x/b"]),
                policy("quiet", 1, true, &[]),
            ],
            pods: vec![pod("a", true), pod("b", true), pod("unselected", false)],
            refused: vec![cni_api::RefusedObject {
                object: "NetworkPolicy x/sideways".into(),
                reason: r#"spec.policyTypes[0]: "Sideways" is not Ingress or Egress"#.into(),
            }],
        };
        let counted = [(
            0,
            cni_ebpf_common::PolicyCounters {
                allowed: 2,
                denied: 12,
                audited: 0,
            },
        )]
        .into_iter()
        .collect();
        let table = policy_table(&super::super::join::policy_table(view, &counted));
        assert_eq!(
            table,
            "source: file /etc/policies.yaml  mode: enforce  generation: 4\n\
             POLICY          SLOT ISOLATES       FLOWS ALLOWED PKTS DENIED FLOWS AUDITED SELECTS\n\
             x/deny-ingress     0 ingress                    2          12             0 x/a x/b\n\
             x/quiet            1 egress                     0           0             0 -\n\
             POD          ISOLATED\n\
             x/a          ingress\n\
             x/b          ingress\n\
             x/unselected -\n\
             refused:\n  NetworkPolicy x/sideways: spec.policyTypes[0]: \"Sideways\" is not \
             Ingress or Egress\n"
        );
    }

    #[test]
    fn status_columns_are_as_wide_as_the_longest_attachment() {
        let attachment = |interface: &str, program: &str| cni_api::Attachment {
            interface: interface.into(),
            ifindex: 2,
            program: program.into(),
            mode: "m".into(),
        };
        let view = view(Status {
            attachments: vec![
                attachment("uplink0", "uplink_egress"),
                attachment(
                    "/sys/fs/cgroup/unified/a-long-cgroup",
                    "hostport_getpeername4",
                ),
            ],
            ..idle()
        });
        let table = status_table(&view);
        let rows: Vec<&str> = table
            .lines()
            .skip_while(|line| !line.starts_with("INTERFACE"))
            .collect();
        assert_eq!(rows.len(), 3, "{table}");
        let mode_at: Vec<Option<usize>> = rows.iter().map(|row| row.rfind(' ')).collect();
        assert!(
            mode_at.iter().all(|at| *at == mode_at[0]),
            "the last column starts at one place: {table}"
        );
    }

    #[test]
    fn status_names_every_uplink_the_service_and_the_host_firewall_ranges() {
        let uplink = |name: &str, ifindex, node_addr| cni_api::UplinkStatus {
            name: name.into(),
            ifindex,
            node_addr,
        };
        let view = view(Status {
            nat_enabled: true,
            uplink: Some("eth0".into()),
            node_addr: Some([198, 18, 0, 1].into()),
            uplinks: vec![
                uplink("eth0", 2, Some([198, 18, 0, 1].into())),
                uplink("eth1", 3, None),
            ],
            service_cidrs: vec!["10.96.0.0/12".parse().expect("a range")],
            host_firewall_cidrs: vec!["169.254.169.254/32".parse().expect("a range")],
            ..idle()
        });
        let table = status_table(&view);
        let nat: Vec<&str> = table
            .lines()
            .skip_while(|line| *line != "nat: enabled")
            .take(5)
            .collect();
        assert_eq!(
            nat,
            [
                "nat: enabled",
                "  uplink eth0  node 198.18.0.1",
                &format!("  uplink eth1  node {}", NO_ADDRESS),
                "services: 10.96.0.0/12 (through the node's stack: kube-proxy)",
                "host firewall: 169.254.169.254/32 (always through the node's stack and its \
                 netfilter)",
            ],
            "{table}"
        );
    }

    #[test]
    fn table_lists_each_source_with_its_counters() {
        let rows = [SourceCounters {
            source: Ipv4Addr::new(198, 18, 0, 2),
            packets: 5,
            bytes: 490,
        }];
        let table = counters_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["198.18.0.2", "5", "490"]
        );
    }
}
