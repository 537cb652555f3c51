//! STATUS: ready when the daemon answers with its datapath loaded and, for a config with
//! `usePodCidr` ranges, gives this node a pod range (else ADD could not get an address);
//! forwarded to IPAM when the IPAM plugin speaks 1.1.0 (older plugins have no STATUS and
//! are skipped).

use crate::{
    commands::Invocation,
    ipam::CallEnv,
    spec::{CniError, CniVersion, Command, ErrorCode},
};

pub fn run(inv: &Invocation) -> Result<(), CniError> {
    let status = inv.daemon().status().map_err(|error| {
        CniError::new(
            ErrorCode::PluginNotAvailable,
            format!("the node daemon is not available: {}", error.msg),
        )
        .with_details(error.details)
    })?;
    if !status.datapath_loaded {
        return Err(CniError::new(
            ErrorCode::PluginNotAvailable,
            "the node daemon runs but its datapath is not loaded",
        ));
    }
    // The config is validated to have ipam.type: ADD cannot work without it.
    let ipam = inv.ipam()?;
    // No pod range (11) or a daemon's bad one (100): ADD cannot work, which STATUS says
    // with 50.
    let config = inv
        .ipam_config(Some(&status))
        .map_err(|error| match error.code {
            ErrorCode::TryAgainLater | ErrorCode::Internal => CniError {
                code: ErrorCode::PluginNotAvailable,
                ..error
            },
            _ => error,
        })?;
    if ipam.supports(CniVersion::V1_1_0)? {
        let env = CallEnv::new(Command::Status);
        ipam.run(&env, &config)?;
    }
    Ok(())
}
