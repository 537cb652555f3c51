//! Undoing an attachment, shared by ADD's rollback, DEL and GC: every step runs even when
//! an earlier one failed, and every failure is reported.

use std::path::Path;

use serde_json::Value;

use crate::{
    commands::block_on,
    daemon::{self, Daemon},
    ipam::{CallEnv, Ipam},
    link::Netlink,
    spec::{CniError, Command, ErrorCode},
};

/// The failures of a teardown; empty means success.
#[derive(Default)]
pub struct Failures(Vec<(String, CniError)>);

impl Failures {
    pub fn record<T>(&mut self, step: &str, outcome: Result<T, CniError>) -> Option<T> {
        match outcome {
            Ok(value) => Some(value),
            Err(error) => {
                self.0.push((step.to_owned(), error));
                None
            }
        }
    }

    /// One error naming every failed step, with the first failure's code.
    pub fn into_result(self, what: &str) -> Result<(), CniError> {
        let Some((_, first)) = self.0.first() else {
            return Ok(());
        };
        let code = first.code;
        let details = self
            .0
            .iter()
            .map(|(step, error)| format!("{step}: {} {}", error.msg, error.details))
            .collect::<Vec<_>>()
            .join("; ");
        Err(
            CniError::new(code, format!("{what} failed in {} step(s)", self.0.len()))
                .with_details(details),
        )
    }
}

/// Removes the daemon's record; an unreachable daemon is not a failure, since the
/// restarted daemon drops records whose veth is gone.
pub fn detach(daemon: &Daemon, id: cni_api::EndpointId) -> Result<(), CniError> {
    match daemon.detach(id) {
        Ok(_) => Ok(()),
        Err(error) if daemon::is_unreachable(&error) => {
            crate::log::warn(&format!("{}; its record goes when it restarts", error.msg));
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// Deletes the host-side veth (its peer goes with it); a missing link is success.
pub fn delete_host_veth(name: &str) -> Result<(), CniError> {
    block_on(async {
        let netlink = Netlink::connect().map_err(setup_error)?;
        netlink.delete(name).await.map(drop).map_err(setup_error)
    })?
}

/// IPAM DEL for one attachment.
pub fn ipam_del(
    ipam: &Ipam,
    config: &Value,
    container_id: &str,
    ifname: &str,
    netns: Option<&Path>,
) -> Result<(), CniError> {
    let netns = netns.map(|path| path.display().to_string());
    let env = CallEnv {
        container_id: Some(container_id),
        ifname: Some(ifname),
        netns: Some(netns.as_deref().unwrap_or("")),
        ..CallEnv::new(Command::Del)
    };
    ipam.run(&env, config)
}

pub fn setup_error(error: crate::link::LinkError) -> CniError {
    CniError::new(ErrorCode::InterfaceSetup, error.to_string())
}
