//! The plugin's side of the daemon hand-off, with the daemon's failures mapped to CNI
//! codes: unreachable is 11 (try again later), a refusal is 104.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use cni_api::{self as api, ClientError, Endpoint, EndpointId, Request, Response, Status};

use crate::spec::{CniError, ErrorCode};

/// Requests are small map and file operations; a daemon that takes longer is stuck.
const TIMEOUT: Duration = Duration::from_secs(10);

pub struct Daemon {
    socket: PathBuf,
}

impl Daemon {
    pub fn new(socket: Option<PathBuf>) -> Self {
        Self {
            socket: socket.unwrap_or_else(|| PathBuf::from(api::DEFAULT_SOCKET)),
        }
    }

    pub fn status(&self) -> Result<Status, CniError> {
        match self.call(&Request::Status)? {
            Response::Status(status) => Ok(status),
            other => Err(unexpected(&other)),
        }
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
        let request = Request::Prepare {
            host_veth: host_veth.to_owned(),
        };
        match self.call(&request)? {
            Response::Prepared => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Undoes [`Self::prepare`] (a failed ADD's rollback).
    pub fn unprepare(&self, host_veth: &str) -> Result<(), CniError> {
        let request = Request::Unprepare {
            host_veth: host_veth.to_owned(),
        };
        match self.call(&request)? {
            Response::Unprepared { .. } => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub fn attach(&self, endpoint: Endpoint) -> Result<(), CniError> {
        match self.call(&Request::Attach(Box::new(endpoint)))? {
            Response::Attached => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Returns whether the daemon knew the endpoint.
    pub fn detach(&self, id: EndpointId) -> Result<bool, CniError> {
        match self.call(&Request::Detach(id))? {
            Response::Detached { existed } => Ok(existed),
            other => Err(unexpected(&other)),
        }
    }

    pub fn get(&self, id: EndpointId) -> Result<Option<Endpoint>, CniError> {
        match self.call(&Request::Get(id))? {
            Response::Endpoint { endpoint } => Ok(endpoint),
            other => Err(unexpected(&other)),
        }
    }

    /// Forgets this network's endpoints not in `keep`; returns them.
    pub fn gc(&self, network: &str, keep: Vec<EndpointId>) -> Result<Vec<Endpoint>, CniError> {
        let request = Request::Gc {
            network: network.to_owned(),
            keep,
        };
        match self.call(&request)? {
            Response::Collected { removed } => Ok(removed),
            other => Err(unexpected(&other)),
        }
    }

    fn call(&self, request: &Request) -> Result<Response, CniError> {
        match api::call(&self.socket, request, TIMEOUT) {
            Ok(Response::Error { message }) => Err(CniError::new(
                ErrorCode::DaemonRefused,
                format!("ebpf-cnid refused: {message}"),
            )),
            Ok(Response::PortConflict { message }) => {
                Err(CniError::new(ErrorCode::PortConflict, message))
            }
            Ok(response) => Ok(response),
            Err(error @ ClientError::Unreachable { .. }) => Err(CniError::try_again_later(
                "ebpf-cnid is not running on this node",
            )
            .with_details(error.to_string())),
            Err(error) => Err(
                CniError::try_again_later("ebpf-cnid did not answer properly")
                    .with_details(error.to_string()),
            ),
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

fn unexpected(response: &Response) -> CniError {
    CniError::internal(format!("ebpf-cnid answered with {response:?}"))
}
