//! The datapath, the daemon's lowest layer (synchronous): loading the eBPF object (after
//! making the pins it finds fit it, [`upgrade`]), attaching its programs, and
//! handing its maps to the modules that keep them. `from_pod` runs in the pods' shared
//! TC block ([`tc_block`]), to which each pod's veth is bound ([`pod`]), or on the hook
//! of a pod's netkit pair ([`netkit`]); the uplink
//! programs (source NAT) attach through pinned TCX links, or without them as filters of
//! [`clsact`] ([`uplink`]), and so does the gateway guard on the node's other devices
//! ([`guard`]); the socket programs (hostPorts for the node's processes) to
//! a cgroup ([`sock`]). [`services`] writes the Service ranges, [`nat_maps`] hands out
//! source NAT's maps; netlink requests go through one connection ([`netlink`]). Nothing
//! here uses the node's model above it (endpoints, NAT, hostPorts).

pub mod bpffs;
mod clsact;
#[cfg(test)]
mod frames;
pub mod gateways;
mod guard;
mod links;
pub mod nat_maps;
mod netkit;
mod netlink;
pub mod node_routes;
pub mod overlay;
mod pod;
pub mod policy_maps;
mod services;
pub mod sock;
pub mod tc_block;
mod upgrade;
mod uplink;

pub use guard::{guardable_name, remove_guard_filters};
pub use pod::detach_netkit_pods;
pub use uplink::remove_uplink_filters;

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuHashMap},
    programs::{
        LinkOrder, SchedClassifier, TcAttachType, tc,
        tc::{NlOptions, TcAttachOptions},
    },
    util::KernelVersion,
};
use aya_log::EbpfLogger;
use cni_ebpf_common::{
    EndpointCounters, EndpointInfo, EndpointKey, PortKey, PortTarget, map_names, program_names,
};
use tokio::io::{Interest, unix::AsyncFd};

use cni_api::Attachment;

/// The object built by `cargo xtask build`, embedded at compile time (see build.rs).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cni-ebpf.o"));

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("this ebpf-cnid was built without its eBPF object: build it with `cargo xtask build`")]
    NoObject,
    #[error("cannot load the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("the eBPF object has no program {0}")]
    MissingProgram(&'static str),
    /// The kernel refused a program (its verifier, or a helper it lacks). The message
    /// carries the verifier's closing reason; its whole output is logged at debug level
    /// (`EBPF_CNID_LOG=debug`), since it runs to thousands of lines.
    #[error(
        "the kernel ({kernel}) refuses program {program}: {reason}. ebpf-cni needs the BPF \
         features of Linux 5.17 (bpf_loop and the helpers before it), or a distribution \
         kernel that backports them (EBPF_CNID_LOG=debug prints the verifier's output)"
    )]
    ProgramLoad {
        program: &'static str,
        kernel: String,
        reason: String,
    },
    #[error("program {program}: {source}")]
    Program {
        program: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("the eBPF object has no map {0}")]
    MissingMap(&'static str),
    #[error("--service-cidr: {0}")]
    ServiceCidrs(String),
    #[error("map: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("link pin {path}: {source}")]
    Pin {
        path: String,
        source: std::io::Error,
    },
    #[error("pinned link {path}: {source} ({})", std::error::Error::source(source).map(ToString::to_string).unwrap_or_default())]
    Link {
        path: String,
        source: aya::programs::links::LinkError,
    },
    #[error("no interface {0} in the daemon's network namespace")]
    NoInterface(String),
    #[error("{name} is not a pod veth of this plugin ({reason}): refused")]
    NotPodVeth { name: String, reason: &'static str },
    #[error("pods' TC block: {0}")]
    TcBlock(#[from] tc_block::TcBlockError),
    #[error("the pod program on the netkit pair of {device}: {source}")]
    Netkit {
        device: String,
        source: std::io::Error,
    },
    #[error("cannot read this namespace's cookie: {0}")]
    NetnsCookie(std::io::Error),
    #[error("cannot record the pods' block namespace in {path}: {source}")]
    BlockNetns {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open the cgroup folder {path}: {source}")]
    Cgroup {
        path: String,
        source: std::io::Error,
    },
    #[error("routes to other nodes' pods: {0}")]
    NodeRoutes(String),
    #[error("overlay: {0}")]
    Overlay(String),
    #[error("pods' gateways: {0}")]
    Gateways(String),
    /// The netlink connection itself (its thread, its socket).
    #[error("netlink: {0}")]
    Netlink(#[from] std::io::Error),
    #[error("cannot add the clsact qdisc to {interface}: {source}")]
    Clsact {
        interface: String,
        source: tc::TcError,
    },
}

/// The loaded object and what is attached where. Dropping it detaches every program
/// (maps stay pinned).
pub struct Datapath {
    ebpf: Ebpf,
    bpf_dir: PathBuf,
    attachments: Vec<Attachment>,
    /// The Service ranges and the host firewall's (see `set_stack_cidrs`).
    service_cidrs: Vec<ipnet::Ipv4Net>,
    host_firewall_cidrs: Vec<ipnet::Ipv4Net>,
    /// Whether the uplink and counting programs attach through TCX links (else as
    /// clsact filters, see [`clsact`]); see [`tcx_in_use`].
    tcx: bool,
    /// The devices the gateway guard is on, with their indexes ([`guard`]).
    guarded: std::collections::BTreeMap<String, u32>,
}

impl Datapath {
    /// Loads the embedded object, reusing (or creating) the map pins under `bpf_dir`, with
    /// NAT tables (and `HOSTPORT_FLOWS`) of `nat_max_flows` entries each (pins of another
    /// layout or size are made fit first, see [`upgrade`]), to attach
    /// through TCX links when `tcx` (else clsact filters), and starts forwarding aya-log
    /// records into `tracing` (must run inside tokio).
    pub fn load(bpf_dir: &Path, nat_max_flows: u32, tcx: bool) -> Result<Self, DatapathError> {
        if OBJECT.is_empty() {
            return Err(DatapathError::NoObject);
        }
        let carried = upgrade::before_load(bpf_dir, nat_max_flows)?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(bpf_dir)
            .map_max_entries(map_names::NAT_OUT, nat_max_flows)
            .map_max_entries(map_names::NAT_IN, nat_max_flows)
            .map_max_entries(map_names::NAT_INBOUND, nat_max_flows)
            .map_max_entries(map_names::HOSTPORT_FLOWS, nat_max_flows)
            .map_max_entries(map_names::DEST_PORTS, nat_max_flows)
            .load(OBJECT)?;
        upgrade::after_load(&mut ebpf, &carried)?;
        spawn_log_forwarder(&mut ebpf);
        let started = std::time::Instant::now();
        for name in [
            program_names::COUNT_BY_SOURCE,
            program_names::FROM_POD,
            program_names::TO_POD,
            program_names::UPLINK_EGRESS,
            program_names::UPLINK_INGRESS,
            program_names::NAT_SWEEP,
            program_names::OVERLAY_EGRESS,
            program_names::OVERLAY_INGRESS,
            program_names::GATEWAY_GUARD,
        ] {
            let one = std::time::Instant::now();
            classifier(&mut ebpf, name)?
                .load()
                .map_err(|source| refused(name, source))?;
            tracing::debug!(
                program = name,
                took_ms = one.elapsed().as_millis(),
                "loaded"
            );
        }
        for name in program_names::SOCKET_PROGRAMS {
            let one = std::time::Instant::now();
            program::<aya::programs::CgroupSockAddr>(&mut ebpf, name)?
                .load()
                .map_err(|source| refused(name, source))?;
            tracing::debug!(
                program = name,
                took_ms = one.elapsed().as_millis(),
                "loaded"
            );
        }
        tracing::info!(
            took_ms = started.elapsed().as_millis(),
            "programs loaded (the kernel's verifier)"
        );
        Ok(Self {
            ebpf,
            bpf_dir: bpf_dir.to_owned(),
            attachments: Vec::new(),
            service_cidrs: Vec::new(),
            host_firewall_cidrs: Vec::new(),
            tcx,
            guarded: std::collections::BTreeMap::new(),
        })
    }

    /// Attaches the counting program to `interface`'s ingress: TCX where the kernel has it
    /// (>= 6.6), else a clsact qdisc with a netlink filter.
    pub fn attach_counter(&mut self, interface: &str) -> Result<&Attachment, DatapathError> {
        let name = program_names::COUNT_BY_SOURCE;
        let ifindex = nix::net::if_::if_nametoindex(interface)
            .map_err(|_| DatapathError::NoInterface(interface.to_owned()))?;
        let tcx = self.tcx;
        if !tcx {
            ensure_clsact(interface)?;
        }
        let program = classifier(&mut self.ebpf, name)?;
        // Not `attach`, which takes TCX wherever the kernel has it, whatever the flag.
        let options = if tcx {
            TcAttachOptions::TcxOrder(LinkOrder::default())
        } else {
            TcAttachOptions::Netlink(NlOptions::default())
        };
        program
            .attach_with_options(interface, TcAttachType::Ingress, options)
            .map_err(|source| DatapathError::Program {
                program: name,
                source,
            })?;
        tracing::info!(interface, ifindex, program = name, "attached");
        self.attachments.push(Attachment {
            interface: interface.to_owned(),
            ifindex,
            program: name.to_owned(),
            mode: if tcx { "tcx" } else { "clsact" }.to_owned(),
        });
        Ok(self.attachments.last().expect("just pushed"))
    }

    /// Hands the endpoints map to its owner ([`crate::model::endpoints::Endpoints`]).
    /// `RATE_LIMITS`, the pods' egress token buckets.
    pub fn take_rate_limits_map(
        &mut self,
    ) -> Result<HashMap<MapData, u32, cni_ebpf_common::RateBucket>, DatapathError> {
        let map = self
            .ebpf
            .take_map(map_names::RATE_LIMITS)
            .ok_or(DatapathError::MissingMap(map_names::RATE_LIMITS))?;
        Ok(HashMap::try_from(map)?)
    }

    pub fn take_endpoints_map(
        &mut self,
    ) -> Result<HashMap<MapData, EndpointKey, EndpointInfo>, DatapathError> {
        let map = self
            .ebpf
            .take_map(map_names::ENDPOINTS)
            .ok_or(DatapathError::MissingMap(map_names::ENDPOINTS))?;
        Ok(HashMap::try_from(map)?)
    }

    /// Hands the gateways map to its owner ([`gateways::Gateways`]).
    pub fn take_gateways_map(&mut self) -> Result<HashMap<MapData, [u8; 4], u8>, DatapathError> {
        let map = self
            .ebpf
            .take_map(map_names::GATEWAYS)
            .ok_or(DatapathError::MissingMap(map_names::GATEWAYS))?;
        Ok(HashMap::try_from(map)?)
    }

    /// Hands the hostPort map to its owner ([`crate::model::hostports::HostPorts`]).
    pub fn take_hostports_map(
        &mut self,
    ) -> Result<HashMap<MapData, PortKey, PortTarget>, DatapathError> {
        let map = self
            .ebpf
            .take_map(map_names::HOSTPORTS)
            .ok_or(DatapathError::MissingMap(map_names::HOSTPORTS))?;
        Ok(HashMap::try_from(map)?)
    }

    /// Drops the counters of a removed endpoint, so a reused ifindex starts from zero.
    pub fn forget_counters(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        let map = self
            .ebpf
            .map_mut(map_names::ENDPOINT_COUNTERS)
            .ok_or(DatapathError::MissingMap(map_names::ENDPOINT_COUNTERS))?;
        let mut counters: PerCpuHashMap<_, u32, EndpointCounters> = PerCpuHashMap::try_from(map)?;
        Ok(crate::maps::removed(counters.remove(&ifindex))?)
    }

    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    pub fn bpf_dir(&self) -> &Path {
        &self.bpf_dir
    }
}

/// The error of a program the kernel would not load, with the kernel's version (what
/// the operator needs to tell an old kernel from a bug).
fn refused(program: &'static str, source: aya::programs::ProgramError) -> DatapathError {
    let kernel = KernelVersion::current().map_or_else(
        |_| "version unknown".to_owned(),
        |version| version.to_string(),
    );
    let reason = match &source {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            tracing::debug!(program, "the verifier's output:\n{log}");
            match verifier_reason(&log) {
                Some(reason) => format!("{reason} ({io_error})"),
                None => io_error.to_string(),
            }
        }
        other => other.to_string(),
    };
    DatapathError::ProgramLoad {
        program,
        kernel,
        reason,
    }
}

/// The verifier's reason for a refusal: the last line of its output before the
/// statistics it closes with (`invalid func unknown#181`, `R1 invalid mem access`).
fn verifier_reason(log: &str) -> Option<&str> {
    const STATISTICS: &[&str] = &["verification time", "stack depth", "processed "];
    log.lines()
        .map(str::trim)
        .rev()
        .find(|line| !line.is_empty() && !STATISTICS.iter().any(|stat| line.starts_with(stat)))
}

fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier, DatapathError> {
    program(ebpf, name)
}

/// The program `name` of the object, as the program type `P` it must be.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, DatapathError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(DatapathError::MissingProgram(name))?
        .try_into()
        .map_err(|source| DatapathError::Program {
            program: name,
            source,
        })
}

/// Adds the clsact qdisc that netlink-attached programs need (kernels < 6.6); one that
/// is there already (a restart: the filters stayed in it) is fine. The kernel says so
/// with EEXIST, which aya passes on as a netlink error: taken for a failure, it stopped
/// every restart of a daemon without TCX.
fn ensure_clsact(interface: &str) -> Result<(), DatapathError> {
    match tc::qdisc_add_clsact(interface) {
        Ok(()) | Err(tc::TcError::AlreadyAttached) => Ok(()),
        Err(tc::TcError::NetlinkError(error)) if error.raw_os_error() == Some(libc::EEXIST) => {
            Ok(())
        }
        Err(source) => Err(DatapathError::Clsact {
            interface: interface.to_owned(),
            source,
        }),
    }
}

/// Whether the uplink and counting programs attach through TCX links: when the kernel
/// has them (Linux >= 6.6) and the operator did not turn them off (`--enable-tcx
/// false`, for a node whose other TC users expect filters). The pods' program is in a
/// shared TC block either way (see [`tc_block`]).
pub fn tcx_in_use(enabled: bool) -> bool {
    enabled && KernelVersion::current().is_ok_and(|version| version >= KernelVersion::new(6, 6, 0))
}

/// Forwards the programs' aya-log records into the daemon's `tracing` output (the
/// `log` records are bridged by tracing-subscriber's log compatibility layer).
fn spawn_log_forwarder(ebpf: &mut Ebpf) {
    let logger = match EbpfLogger::init(ebpf) {
        Ok(logger) => logger,
        Err(error) => {
            tracing::warn!(%error, "eBPF logs are not forwarded");
            return;
        }
    };
    // SAFETY: the logger owns the ring buffer's map fd and keeps it open, unchanged, for
    // as long as it lives, and the AsyncFd owns the logger.
    let registered = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) };
    let mut logger = match registered {
        Ok(logger) => logger,
        Err(error) => {
            tracing::warn!(error = %error, "eBPF logs are not forwarded");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            let Ok(mut guard) = logger.readable_mut().await else {
                tracing::warn!("eBPF log ring buffer closed");
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::verifier_reason;

    #[test]
    fn the_refusal_names_the_verifiers_last_word_not_its_statistics() {
        let log = "; fun()\n796: (7b) *(u64 *)(r10 -336) = r1\n797: (85) call unknown#160\n\
                   invalid func unknown#160\nverification time 15154 usec\n\
                   stack depth 352+0+0+0\nprocessed 438 insns (limit 1000000)\n\n";
        assert_eq!(verifier_reason(log), Some("invalid func unknown#160"));
        assert_eq!(verifier_reason("\n"), None);
    }
}
