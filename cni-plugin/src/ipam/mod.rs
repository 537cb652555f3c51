//! IPAM delegation, as the spec says: the plugin named in `ipam.type` is executed from
//! CNI_PATH with our environment and the same network configuration on stdin, except for
//! Calico's `usePodCidr` ranges, filled with the node's pod ranges first ([`pod_cidr`]).
//!
//! Version negotiation: the delegate gets the config's cniVersion. If it answers "1"
//! (incompatible version), we ask it for VERSION and retry once with the highest version
//! both sides support (Debian's host-local 1.1.1 stops at 1.0.0, so a 1.1.0 network still
//! gets addresses). Its result is read in whatever version it printed.
//!
//! Each exec of host-local costs ADD time, and the negotiation above costs three (ADD,
//! VERSION, ADD) on every ADD of a 1.1.0 network with such a plugin. So the VERSION
//! answer is cached beside the daemon socket ([`VersionCache`]): a call whose cniVersion
//! the plugin is known not to speak is downgraded before the first exec (one exec), and
//! STATUS and GC read the cache instead of asking. A cached answer is tied to the plugin
//! file's identity (size, mtime, inode), so an upgraded plugin is asked again; a cache
//! that cannot be read only means "ask", and a wrong one only costs the old retry (a code
//! 1 always asks the plugin afresh).

pub mod checks;
pub mod pod_cidr;
mod process;
#[cfg(test)]
pub(crate) mod tests;
mod versions;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;

use crate::spec::{self, CniError, CniResult, CniVersion, Command, ErrorCode};

pub use process::DEFAULT_TIMEOUT;
pub use versions::VersionCache;

/// An IPAM plugin found in CNI_PATH.
pub struct Ipam {
    plugin: PathBuf,
    name: String,
    versions: VersionCache,
    timeout: Duration,
}

/// Environment overrides for one call; everything else is inherited from our own
/// environment (which the runtime set for us).
pub struct CallEnv<'a> {
    pub command: Command,
    /// For calls on behalf of another attachment (GC's per-endpoint DEL).
    pub container_id: Option<&'a str>,
    pub ifname: Option<&'a str>,
    pub netns: Option<&'a str>,
    /// Leave CNI_ARGS out (see `Invocation::ipam_env`).
    pub drop_args: bool,
}

impl CallEnv<'_> {
    /// `command` with everything else inherited.
    pub const fn new(command: Command) -> Self {
        Self {
            command,
            container_id: None,
            ifname: None,
            netns: None,
            drop_args: false,
        }
    }
}

impl Ipam {
    /// Finds `plugin_type` in CNI_PATH. A name with a path separator is refused: the spec
    /// names plugins, it does not take paths. `versions` remembers what it speaks.
    pub fn find(
        plugin_type: &str,
        cni_path: &[PathBuf],
        versions: VersionCache,
    ) -> Result<Self, CniError> {
        if plugin_type.is_empty() || plugin_type.contains('/') || plugin_type == ".." {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                format!("ipam.type {plugin_type:?} is not a plugin name"),
            ));
        }
        cni_path
            .iter()
            .map(|dir| dir.join(plugin_type))
            .find(|candidate| candidate.is_file())
            .map(|plugin| Self {
                plugin,
                name: plugin_type.to_owned(),
                versions,
                timeout: process::DEFAULT_TIMEOUT,
            })
            .ok_or_else(|| {
                CniError::new(
                    ErrorCode::IpamFailed,
                    format!("IPAM plugin {plugin_type:?} not found in CNI_PATH"),
                )
                .with_details(format!("searched {cni_path:?}"))
            })
    }

    /// ADD: the addresses (and routes, DNS) for the pod.
    pub fn add(&self, config: &Value) -> Result<CniResult, CniError> {
        let output = self
            .call(&CallEnv::new(Command::Add), config)?
            .ok_or_else(|| self.failed("printed no result for ADD"))?;
        CniResult::parse(&output).map_err(|error| {
            self.failed("printed a result we cannot read")
                .with_details(error.msg)
        })
    }

    /// Gives every run `timeout` (kept within 1 s..=10 min) instead of the default.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.clamp(Duration::from_secs(1), Duration::from_secs(600));
        self
    }

    /// Any verb without a result (DEL, CHECK, GC, STATUS).
    pub fn run(&self, env: &CallEnv<'_>, config: &Value) -> Result<(), CniError> {
        self.call(env, config).map(drop)
    }

    /// Whether the plugin speaks `version` (from the cache, else asked with VERSION).
    pub fn supports(&self, version: CniVersion) -> Result<bool, CniError> {
        let known = match self.versions.get(&self.plugin) {
            Some(known) => known,
            None => self.ask_versions()?,
        };
        Ok(known.contains(&version))
    }

    fn call(&self, env: &CallEnv<'_>, config: &Value) -> Result<Option<Value>, CniError> {
        // A version the plugin is known not to speak is not tried: one exec, not three.
        let cached = self
            .versions
            .get(&self.plugin)
            .filter(|known| requested(config).is_some_and(|version| !known.contains(&version)))
            .and_then(|known| downgraded(config, &known));
        let first = cached.as_ref().unwrap_or(config);
        match self.exec(env, first) {
            Err(error) if error.code == ErrorCode::IncompatibleVersion => {
                // Asked afresh, not from the cache: if the cache chose `first`, it was wrong.
                let retry = downgraded(config, &self.ask_versions()?)
                    .filter(|retry| retry != first)
                    .ok_or(error)?;
                self.exec(env, &retry)
            }
            other => other,
        }
    }

    /// Asks the plugin with VERSION, and caches its answer.
    fn ask_versions(&self) -> Result<Vec<CniVersion>, CniError> {
        let request = serde_json::json!({ "cniVersion": CniVersion::V1_1_0.to_string() });
        let env = CallEnv::new(Command::Version);
        let reply = self
            .exec(&env, &request)?
            .ok_or_else(|| self.failed("printed nothing for VERSION"))?;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Reply {
            #[serde(default)]
            supported_versions: Vec<Value>,
        }
        let answered: Vec<String> = spec::go_json::from_value::<Reply>(reply)
            .map(|reply| reply.supported_versions)
            .unwrap_or_default()
            .iter()
            .filter_map(|version| Some(version.as_str()?.to_owned()))
            .collect();
        self.versions.put(&self.plugin, &answered);
        Ok(versions::known(&answered))
    }

    /// One execution: stdin is `config`, stdout is parsed as JSON (empty is `None`), a
    /// non-zero exit is the plugin's error result with its code kept.
    fn exec(&self, env: &CallEnv<'_>, config: &Value) -> Result<Option<Value>, CniError> {
        let stdin = serde_json::to_vec(config)
            .map_err(|error| CniError::internal(format!("cannot encode the config: {error}")))?;
        let mut command = process::command(&self.plugin);
        command.env("CNI_COMMAND", env.command.as_str());
        if env.drop_args {
            command.env_remove("CNI_ARGS");
        }
        for (var, value) in [
            ("CNI_CONTAINERID", env.container_id),
            ("CNI_IFNAME", env.ifname),
            ("CNI_NETNS", env.netns),
        ] {
            if let Some(value) = value {
                command.env(var, value);
            }
        }
        let child = command
            .spawn()
            .map_err(|error| self.failed(format!("cannot be started: {error}")))?;
        let (status, stdout) =
            process::run(child, stdin, self.timeout).map_err(|error| self.failed(error))?;
        let parsed: Option<Value> = if stdout.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(serde_json::from_slice(&stdout).map_err(|error| {
                self.failed("printed something that is not JSON")
                    .with_details(format!("{error}: {}", String::from_utf8_lossy(&stdout)))
            })?)
        };
        if status.success() {
            return Ok(parsed);
        }
        Err(
            match parsed.as_ref().and_then(CniError::from_plugin_output) {
                // The spec's own codes (below 100) mean the same from any plugin: kept.
                Some(error) if error.code.code() < 100 => {
                    let msg = format!("IPAM plugin {}: {}", self.name, error.msg);
                    CniError { msg, ..error }
                }
                // 100 and above are each plugin's own (host-local says 999 for a bad
                // subnet); under our name they would read as our table's codes, so they
                // become 101 with the delegate's code in the details.
                Some(error) => self
                    .failed(format!("failed: {}", error.msg))
                    .with_details(format!(
                        "code {} from {}{}{}",
                        error.code.code(),
                        self.name,
                        if error.details.is_empty() { "" } else { ": " },
                        error.details
                    )),
                None => self.failed(format!("failed ({status}) without an error result")),
            },
        )
    }

    fn failed(&self, what: impl std::fmt::Display) -> CniError {
        CniError::new(
            ErrorCode::IpamFailed,
            format!("IPAM plugin {} {what}", self.name),
        )
    }

    pub fn path(&self) -> &Path {
        &self.plugin
    }
}

/// The config's cniVersion, when it is one we know.
fn requested(config: &Value) -> Option<CniVersion> {
    config["cniVersion"].as_str()?.parse().ok()
}

/// `config` with the highest version of `supported` below the requested one, or `None`
/// when there is nothing lower to try.
fn downgraded(config: &Value, supported: &[CniVersion]) -> Option<Value> {
    let requested = requested(config)?;
    let best = supported
        .iter()
        .filter(|version| **version < requested)
        .max()?;
    let mut config = config.clone();
    config["cniVersion"] = Value::String(best.to_string());
    Some(config)
}
