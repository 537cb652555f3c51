//! One node's daemon over netlink, files and its maps: the socket, the endpoint records,
//! metrics and health, the flow tables' budgets and sweeps, hostPorts from the node
//! itself, the host firewall, the Service tables, the pinned layout.
//!
//! One binary of many modules, so that one build serves them all: run one with
//! `cargo test -p ebpf-cni-tests --test daemon <module>::`.

mod counter;
mod daemon_socket;
mod endpoint_reattach;
mod endpoint_records;
mod flow_table_budgets;
mod health_metrics;
mod host_firewall;
mod hostport_flows;
mod hostport_local;
mod nat_sweeps;
mod node_addrs;
mod pin_layout;
mod service_tables;
mod snat_flows;
