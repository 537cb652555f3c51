//! The plugin as runtimes call it: its input and output at every CNI version, its bounds
//! and error codes, ADD/DEL/CHECK/GC lifecycles, chaining, and the configuration the
//! daemon installs for it.
//!
//! One binary of many modules, so that one build serves them all: run one with
//! `cargo test -p ebpf-cni-tests --test plugin <module>::`.

mod chaining;
mod cni_install;
mod plugin_bounds;
mod plugin_errors;
mod plugin_lifecycle;
mod plugin_node_ops;
mod plugin_runtime_json;
