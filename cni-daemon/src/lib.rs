//! ebpf-cnid, the node daemon: loads the eBPF object once, pins its maps under a bpffs
//! folder, attaches programs, and serves the plugin over a root-only unix socket.
//!
//! A synchronous core (maps, attachments: [`datapath`], [`bpffs`], [`inspect`]) sits
//! behind an async front ([`server`], [`run`]).

pub mod api;
pub mod bpffs;
pub mod datapath;
pub mod inspect;
pub mod run;
pub mod server;
