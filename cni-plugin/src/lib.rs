//! ebpf-cni, the CNI plugin: what container runtimes execute for every pod.
//!
//! - [`spec`]: the CNI protocol (environment, config, results, errors, versions);
//! - [`commands`]: one module per verb;
//! - [`ipam`]: delegation to the IPAM plugin; [`link`], [`netns`]: the veth pair,
//!   addresses and routes (named by `cni_api::naming`), [`tbf`] the qdisc of their rate
//!   limits; [`daemon`]: the hand-off to `ebpf-cnid`.

pub mod commands;
pub mod daemon;
pub mod ipam;
pub mod link;
pub mod log;
pub mod netns;
pub mod output;
pub mod spec;
pub mod tbf;
