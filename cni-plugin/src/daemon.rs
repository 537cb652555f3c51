//! The plugin's side of the daemon hand-off, with the daemon's failures mapped to CNI
//! codes: unreachable is 11 (try again later), a refusal is 104.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use cni_api::{self as api, CallError, ClientError, Endpoint, EndpointId, ErrorKind, Status};

use crate::spec::{CniError, ErrorCode};

/// Requests are small map and file operations; a daemon that takes longer is stuck.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon as the plugin's commands call it: [`api::Client`] with every failure a
/// CNI error ([`cni_error`]).
pub struct Daemon {
    client: api::Client,
}

impl Daemon {
    pub fn new(socket: Option<PathBuf>) -> Self {
        let socket = socket.unwrap_or_else(|| PathBuf::from(api::DEFAULT_SOCKET));
        Self {
            client: api::Client::new(socket, TIMEOUT),
        }
    }

    pub fn status(&self) -> Result<Status, CniError> {
        self.client.status().map_err(cni_error)
    }

    /// Fails with 11 unless the daemon answers and its datapath is loaded: checked
    /// before ADD changes anything. Returns the daemon's status.
    pub fn require_ready(&self) -> Result<Status, CniError> {
        let status = self.status()?;
        if status.datapath_loaded {
            Ok(status)
        } else {
            Err(CniError::try_again_later(
                "ebpf-cnid runs but its datapath is not loaded yet",
            ))
        }
    }

    /// Has the pod program attached to `host_veth` ahead of [`Self::attach`].
    pub fn prepare(&self, host_veth: &str) -> Result<(), CniError> {
        self.client.prepare(host_veth).map_err(cni_error)
    }

    /// Undoes [`Self::prepare`] (a failed ADD's rollback).
    pub fn unprepare(&self, host_veth: &str) -> Result<(), CniError> {
        self.client
            .unprepare(host_veth)
            .map(drop)
            .map_err(cni_error)
    }

    pub fn attach(&self, endpoint: Endpoint) -> Result<(), CniError> {
        self.client.attach(endpoint).map_err(cni_error)
    }

    /// Returns whether the daemon knew the endpoint.
    pub fn detach(&self, id: EndpointId) -> Result<bool, CniError> {
        self.client.detach(id).map_err(cni_error)
    }

    pub fn get(&self, id: EndpointId) -> Result<Option<Endpoint>, CniError> {
        self.client.get(id).map_err(cni_error)
    }

    /// Forgets this network's endpoints not in `keep`; returns them.
    pub fn gc(&self, network: &str, keep: Vec<EndpointId>) -> Result<Vec<Endpoint>, CniError> {
        self.client.gc(network, keep).map_err(cni_error)
    }
}

/// The CNI error of a failed call: not reached or no whole answer is 11 (try again
/// later), a hostPort conflict 105, any other refusal 104, an answer of the wrong kind
/// 100 (internal).
fn cni_error(error: CallError) -> CniError {
    match error {
        CallError::Transport(error @ ClientError::Unreachable { .. }) => {
            CniError::try_again_later("ebpf-cnid is not running on this node")
                .with_details(error.to_string())
        }
        CallError::Transport(error) => {
            CniError::try_again_later("ebpf-cnid did not answer properly")
                .with_details(error.to_string())
        }
        CallError::Refused(refusal) if refusal.kind == ErrorKind::PortConflict => {
            CniError::new(ErrorCode::PortConflict, refusal.message)
        }
        CallError::Refused(refusal) => CniError::new(
            ErrorCode::DaemonRefused,
            format!("ebpf-cnid refused: {}", refusal.message),
        ),
        CallError::Unexpected(response) => {
            CniError::internal(format!("ebpf-cnid answered with {response:?}"))
        }
    }
}

/// The file `name` in the folder of the daemon's socket (the config's `daemonSocket`,
/// else [`api::DEFAULT_SOCKET`]), where the daemon and the plugin keep what they share on
/// disk; `None` when the socket path has no folder.
pub fn beside_socket(socket: Option<&Path>, name: &str) -> Option<PathBuf> {
    socket
        .unwrap_or(Path::new(api::DEFAULT_SOCKET))
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
}

/// Whether `error` means the daemon could not be reached (as opposed to a refusal).
pub fn is_unreachable(error: &CniError) -> bool {
    error.code == ErrorCode::TryAgainLater
}
