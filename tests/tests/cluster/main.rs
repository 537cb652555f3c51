//! The cluster's nodes: from a file and from a Kubernetes API server speaking the real
//! wire format, vetted Node objects, thousands of nodes, and nodes coming and going;
//! NetworkPolicies from that API server.
//!
//! One binary of many modules, so that one build serves them all: run one with
//! `cargo test -p ebpf-cni-tests --test cluster <module>::`.

// The fake API server cni-nodes' tests use, shared by path.
use ebpf_cni_tests::fake_api;

mod cluster_kube_source;
mod cluster_nodes;
mod cluster_scale;
mod cross_node_changes;
mod network_policy_model;
mod node_objects;
mod policy_kube_source;
mod policy_services;
