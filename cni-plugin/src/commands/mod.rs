//! One module per CNI verb. Each validates everything it can before changing anything.

mod add;
mod check;
mod del;
mod gc;
mod status;
mod teardown;
#[cfg(test)]
mod tests;

use std::{borrow::Cow, path::PathBuf};

use cni_api::Status;
use serde_json::Value;

use crate::{
    daemon::{self, Daemon},
    ipam::{CallEnv, Ipam, VersionCache, pod_cidr},
    spec::{self, CniError, Command, Environment, ErrorCode, NetConf},
};

/// What every verb gets: the parsed environment and config (which keeps the config
/// exactly as the runtime gave it, what IPAM gets: [`Invocation::ipam_config`]).
pub struct Invocation {
    pub env: Environment,
    pub conf: NetConf,
}

impl Invocation {
    /// What IPAM gets on stdin: the config as received, or, when it has `usePodCidr`
    /// ranges, a copy with this node's pod ranges in their place (`ipam::pod_cidr`).
    /// `status` is the daemon's answer when the verb already has one (ADD, STATUS);
    /// otherwise the daemon is asked, only for a config with the placeholder, and when it
    /// does not answer, a verb other than ADD reads the ranges from the file the daemon
    /// keeps beside its socket.
    pub fn ipam_config(&self, status: Option<&Status>) -> Result<Cow<'_, Value>, CniError> {
        let raw = self.conf.raw();
        if !pod_cidr::needs_pod_cidrs(raw)? {
            return Ok(Cow::Borrowed(raw));
        }
        let cidrs = match status {
            Some(status) => pod_cidr::from_status(status)?,
            None => match self.daemon().status() {
                Ok(status) => pod_cidr::from_status(&status)?,
                Err(error)
                    if daemon::is_unreachable(&error) && self.env.command != Command::Add =>
                {
                    let file = daemon::beside_socket(
                        self.conf.daemon_socket.as_deref(),
                        cni_api::NODE_POD_CIDRS_FILE,
                    );
                    pod_cidr::from_file(file.as_deref(), &error)?
                }
                Err(error) => return Err(error),
            },
        };
        pod_cidr::fill(raw, &cidrs).map(Cow::Owned)
    }
}

impl Invocation {
    pub fn daemon(&self) -> Daemon {
        Daemon::new(self.conf.daemon_socket.clone())
    }

    /// The IPAM plugin `ipam.type` names, found in CNI_PATH, with its versions cached
    /// beside the daemon's socket and the configured timeout.
    pub fn ipam(&self) -> Result<Ipam, CniError> {
        let versions = VersionCache::beside_socket(self.conf.daemon_socket.as_deref());
        let ipam = Ipam::find(self.conf.ipam_type()?, &self.env.path, versions)?;
        Ok(match self.conf.ipam_timeout {
            Some(secs) => ipam.with_timeout(std::time::Duration::from_secs(secs)),
            None => ipam,
        })
    }

    /// The environment of an IPAM call for `command` on this attachment. CNI_ARGS that
    /// this verb could not read is not passed on: the IPAM plugin would refuse it too, and
    /// a DEL must still free the address.
    pub fn ipam_env(&self, command: Command) -> CallEnv<'_> {
        CallEnv {
            drop_args: self.env.unreadable_args.is_some(),
            ..CallEnv::new(command)
        }
    }

    pub fn container_id(&self) -> Result<&str, CniError> {
        self.env
            .container_id
            .as_deref()
            .ok_or_else(|| missing("CNI_CONTAINERID"))
    }

    pub fn ifname(&self) -> Result<&str, CniError> {
        self.env
            .ifname
            .as_deref()
            .ok_or_else(|| missing("CNI_IFNAME"))
    }

    pub fn netns(&self) -> Result<&PathBuf, CniError> {
        self.env.netns.as_ref().ok_or_else(|| missing("CNI_NETNS"))
    }

    /// The pod's namespace; one that cannot be opened is "container unknown" (code 3).
    pub fn open_netns(&self) -> Result<std::fs::File, CniError> {
        let path = self.netns()?;
        crate::netns::open(path).map_err(|error| {
            CniError::new(
                ErrorCode::UnknownContainer,
                format!(
                    "cannot open the network namespace {}: {error}",
                    path.display()
                ),
            )
        })
    }

    pub fn endpoint_id(&self) -> Result<cni_api::EndpointId, CniError> {
        Ok(cni_api::EndpointId {
            container_id: self.container_id()?.to_owned(),
            ifname: self.ifname()?.to_owned(),
        })
    }
}

fn missing(var: &str) -> CniError {
    CniError::new(ErrorCode::InvalidEnvironment, format!("{var} is required"))
}

/// Runs the verb named by the environment; `Ok(Some(json))` is printed on stdout.
pub fn dispatch(env: Environment, stdin: &[u8]) -> Result<Option<String>, CniError> {
    if env.command == Command::Version {
        let requested = spec::parse_version_request(stdin)?;
        return Ok(Some(spec::version_reply(&requested)));
    }
    let conf = NetConf::parse_for(stdin, env.command)?;
    conf.validate_for(env.command)?;
    let args = env.unreadable_args.as_ref().map(ToString::to_string);
    let fields = conf.set_aside().iter().map(ToString::to_string);
    for ignored in args.into_iter().chain(fields) {
        crate::log::warn(&format!("{}: ignored: {ignored}", env.command));
    }
    let invocation = Invocation { env, conf };
    match invocation.env.command {
        Command::Add => add::run(&invocation).map(Some),
        Command::Del => del::run(&invocation).map(|()| None),
        Command::Check => check::run(&invocation).map(|()| None),
        Command::Status => status::run(&invocation).map(|()| None),
        Command::Gc => gc::run(&invocation).map(|()| None),
        Command::Version => unreachable!("handled above"),
    }
}

/// Runs `future` on a small runtime of its own (the plugin is a short-lived process).
pub fn block_on<F: std::future::Future>(future: F) -> Result<F::Output, CniError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| CniError::internal(format!("cannot start a runtime: {error}")))?;
    Ok(runtime.block_on(future))
}
