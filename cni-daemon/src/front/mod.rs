//! The front: what waits on I/O (async where it does) and talks to the outside.
//! [`run`] (signals, lifecycle, the NAT sweeper), [`server`] (the plugin's unix socket;
//! requests answered on blocking threads), [`address_watch`], [`cluster_watch`] and
//! [`policy_watch`] (the node's addresses and devices, the cluster's nodes, the network
//! policies, followed), [`link_stats`] and
//! [`big_tcp`] (netlink reads for the answers), [`inspect`] (the CLI's views of the
//! pinned maps), [`metrics`] (health and Prometheus metrics over HTTP, never taking the
//! node's lock), [`install`] (the CNI configuration written for the runtime once the
//! daemon serves) and [`uninstall`] (everything the daemon left, removed).

pub mod address_watch;
pub mod big_tcp;
pub mod cluster_watch;
pub mod inspect;
pub mod install;
pub mod link_stats;
pub mod metrics;
pub mod policy_watch;
pub mod run;
pub mod server;
pub mod uninstall;
