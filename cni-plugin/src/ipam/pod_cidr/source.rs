//! Where the node's pod ranges for a `usePodCidr` range come from (the daemon's status,
//! or the file it keeps beside its socket), and the checks they pass before any IPAM
//! range is made of them. Which source a verb uses, and the codes, are the parent's doc.

use std::{fs::File, io::Read, net::Ipv4Addr, path::Path};

use cni_api::Status;
use ipnet::Ipv4Net;

use super::PLACEHOLDER;
use crate::{ipam::checks::MIN_PREFIX, spec::CniError};

/// More pod ranges than a node has (Kubernetes gives one per address family).
pub const MAX_POD_CIDRS: usize = 16;

/// The file holds a JSON list of at most [`MAX_POD_CIDRS`] short strings.
pub(super) const MAX_FILE_BYTES: u64 = 4096;

/// Blocks no pod address may come from (see `checks::refusal`): "this network", loopback,
/// link-local (it holds the node's hairpin source) and multicast with the reserved block.
const RESERVED: [Ipv4Net; 4] = [
    Ipv4Net::new_assert(Ipv4Addr::new(0, 0, 0, 0), 8),
    Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8),
    Ipv4Net::new_assert(Ipv4Addr::new(169, 254, 0, 0), 16),
    Ipv4Net::new_assert(Ipv4Addr::new(224, 0, 0, 0), 3),
];

/// This node's pod ranges, checked as the parent module's doc says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCidrs(Vec<Ipv4Net>);

/// Why a list of pod ranges cannot fill a `usePodCidr` range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodCidrsError {
    #[error("the list is empty")]
    Empty,
    #[error("{0} ranges are more than {MAX_POD_CIDRS}")]
    TooMany(usize),
    #[error("{0} is not a network address (host bits set)")]
    HostBits(Ipv4Net),
    #[error("{0} is shorter than /{MIN_PREFIX}")]
    TooWide(Ipv4Net),
    #[error("{0} overlaps {1}, where no pod address may come from")]
    Reserved(Ipv4Net, Ipv4Net),
    #[error("{0:?} is not an IPv4 CIDR")]
    NotIpv4(String),
    #[error("it is not a JSON list of strings: {0}")]
    Syntax(String),
    #[error("it is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    #[error("it cannot be read: {0}")]
    Unreadable(String),
}

impl PodCidrs {
    /// `cidrs` when they pass the checks of the parent module's doc.
    pub fn new(cidrs: Vec<Ipv4Net>) -> Result<Self, PodCidrsError> {
        if cidrs.is_empty() {
            return Err(PodCidrsError::Empty);
        }
        if cidrs.len() > MAX_POD_CIDRS {
            return Err(PodCidrsError::TooMany(cidrs.len()));
        }
        for &cidr in &cidrs {
            if cidr.trunc() != cidr {
                return Err(PodCidrsError::HostBits(cidr));
            }
            if cidr.prefix_len() < MIN_PREFIX {
                return Err(PodCidrsError::TooWide(cidr));
            }
            if let Some(&reserved) = RESERVED.iter().find(|reserved| overlap(cidr, **reserved)) {
                return Err(PodCidrsError::Reserved(cidr, reserved));
            }
        }
        Ok(Self(cidrs))
    }

    /// The daemon's file: a JSON list of CIDR strings, e.g. `["10.244.1.0/24"]`.
    pub fn parse_file(bytes: &[u8]) -> Result<Self, PodCidrsError> {
        let strings: Vec<String> = serde_json::from_slice(bytes)
            .map_err(|error| PodCidrsError::Syntax(error.to_string()))?;
        if strings.len() > MAX_POD_CIDRS {
            return Err(PodCidrsError::TooMany(strings.len()));
        }
        let cidrs = strings
            .into_iter()
            .map(|cidr| cidr.parse().map_err(|_| PodCidrsError::NotIpv4(cidr)))
            .collect::<Result<_, _>>()?;
        Self::new(cidrs)
    }

    /// Reads and parses the file at `path`, at most [`MAX_FILE_BYTES`] of it.
    pub fn read_file(path: &Path) -> Result<Self, PodCidrsError> {
        let unreadable = |error: std::io::Error| PodCidrsError::Unreadable(error.to_string());
        let mut bytes = Vec::new();
        File::open(path)
            .map_err(unreadable)?
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(PodCidrsError::TooLarge);
        }
        Self::parse_file(&bytes)
    }

    pub fn as_slice(&self) -> &[Ipv4Net] {
        &self.0
    }
}

fn overlap(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The node's pod ranges from the daemon's status: code 11 while it has none, 100 when
/// they fail the checks.
pub fn from_status(status: &Status) -> Result<PodCidrs, CniError> {
    PodCidrs::new(status.pod_cidrs.clone()).map_err(|error| match error {
        PodCidrsError::Empty => {
            let why = match (&status.node_source, &status.node_name) {
                (None, _) => {
                    "ebpf-cnid has no node source (--nodes-file, --kubeconfig or in-cluster)"
                        .to_owned()
                }
                (Some(source), Some(name)) => format!(
                    "ebpf-cnid's node source ({source}) gives node {name} none (its spec.podCIDRs is empty)"
                ),
                (Some(source), None) => format!(
                    "ebpf-cnid's node source ({source}) gives this node none (its spec.podCIDRs is empty)"
                ),
            };
            no_pod_range(why)
        }
        invalid => CniError::internal(format!(
            "ebpf-cnid gave this node pod ranges that cannot fill a {PLACEHOLDER} range: {invalid}"
        )),
    })
}

/// The node's pod ranges from the file the daemon keeps beside its socket (`file`; `None`
/// when the socket has no folder), read because the daemon did not answer (`unreachable`).
/// Any failure is code 11 naming both, with the daemon's details.
pub fn from_file(file: Option<&Path>, unreachable: &CniError) -> Result<PodCidrs, CniError> {
    let Some(file) = file else {
        return Err(no_pod_range(format!(
            "{}, and its socket has no folder to keep the node's pod ranges in",
            unreachable.msg
        ))
        .with_details(unreachable.details.clone()));
    };
    PodCidrs::read_file(file).map_err(|error| {
        no_pod_range(format!(
            "{}, and its last pod ranges in {} cannot be used: {error}",
            unreachable.msg,
            file.display()
        ))
        .with_details(unreachable.details.clone())
    })
}

fn no_pod_range(why: impl std::fmt::Display) -> CniError {
    CniError::try_again_later(format!(
        "this node has no pod range yet for the IPAM subnet {PLACEHOLDER}: {why}"
    ))
}
