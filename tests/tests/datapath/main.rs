//! The tests whose outcome the kernel decides: the programs through the verifier and
//! `BPF_PROG_TEST_RUN`, the uplink's attach modes, pins across restarts, and every datapath
//! path (redirects into pods, source NAT, hostPorts, the overlay, FIB lookups, BIG TCP,
//! `tbf`, the gateway, isolation, Services, NetworkPolicy). CI runs this binary on the host and in the
//! guest of Debian 12's 6.1 (`xtask/src/vm/kernel.rs`).
//!
//! One binary of many modules, so that one build serves them all: run one with
//! `cargo test -p ebpf-cni-tests --test datapath <module>::`.

mod bandwidth;
mod big_tcp;
mod cross_node_native;
mod cross_node_vxlan;
mod daemon_pod_veths;
mod forwarding;
mod gateway;
mod hostport;
mod nat_program;
mod nat_program_budgets;
mod nat_program_fragments;
mod nat_program_malformed;
mod nat_program_ports;
mod nat_program_protocols;
mod nat_program_replies;
mod nat_program_sweep;
mod nat_program_tcp_window;
mod network_policy;
mod pod_boundaries;
mod pod_isolation;
mod pod_program_arp;
mod pod_program_ipv4;
mod pod_program_malformed;
mod restart;
mod services;
mod services_cluster;
mod snat;
mod tcp_blind_rst;
mod underlay_boundaries;
mod uplink_attach;
mod uplink_lifecycle;
