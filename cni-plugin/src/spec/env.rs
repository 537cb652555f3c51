//! The `CNI_*` environment: which command runs, and the attachment it names. Parsed from
//! an iterator of pairs so tests never touch the process environment.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::args::{ArgsError, CniArgs};
use super::error::CniError;

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub const ALL: [Command; 6] = [
        Self::Add,
        Self::Del,
        Self::Check,
        Self::Status,
        Self::Gc,
        Self::Version,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Status => "STATUS",
            Self::Gc => "GC",
            Self::Version => "VERSION",
        }
    }

    /// ADD, DEL and CHECK act on one attachment, `(CNI_CONTAINERID, CNI_IFNAME)`.
    pub const fn is_attachment(self) -> bool {
        matches!(self, Self::Add | Self::Del | Self::Check)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Command {
    type Err = EnvError;

    /// Exact, upper-case names, as runtimes send them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| EnvError::UnknownCommand(s.to_owned()))
    }
}

/// Why the environment was rejected; every variant is code 4 and names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("CNI_COMMAND {0:?} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION")]
    UnknownCommand(String),
    #[error("{var} is required for {command} but is missing or empty")]
    Missing { var: &'static str, command: Command },
    #[error(
        "CNI_CONTAINERID {0:?} must start with a letter or digit, followed by letters, digits, '_', '.' or '-'"
    )]
    InvalidContainerId(String),
    #[error("CNI_IFNAME {name:?} is not a valid Linux interface name: {reason}")]
    InvalidIfname { name: String, reason: &'static str },
    #[error("{var} entry {value:?} is not an absolute path")]
    RelativePath { var: &'static str, value: String },
    #[error(transparent)]
    Args(#[from] ArgsError),
}

/// Everything the runtime passed in the environment, validated for the command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    pub command: Command,
    /// Set for ADD, DEL and CHECK; `None` for the others.
    pub container_id: Option<String>,
    /// Set for ADD and CHECK; for DEL `None` when the runtime no longer has the netns.
    pub netns: Option<PathBuf>,
    /// Set for ADD, DEL and CHECK; `None` for the others.
    pub ifname: Option<String>,
    /// Parsed for ADD, DEL and CHECK; empty for the others, which the spec gives no args.
    /// DEL and CHECK do not use it: for them a malformed one reads as empty, and why is
    /// in `unreadable_args`.
    pub args: CniArgs,
    /// Why DEL or CHECK could not read CNI_ARGS (for the log, and to keep it from the
    /// IPAM plugin, which would refuse it too).
    pub unreadable_args: Option<ArgsError>,
    /// `CNI_PATH` split on ':'; empty only for VERSION.
    pub path: Vec<PathBuf>,
}

impl Environment {
    /// Parses and validates the environment for the command it names.
    ///
    /// | command | required | optional |
    /// |---|---|---|
    /// | ADD, CHECK | CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH | CNI_ARGS |
    /// | DEL | CNI_CONTAINERID, CNI_IFNAME, CNI_PATH | CNI_NETNS, CNI_ARGS |
    /// | STATUS, GC | CNI_PATH | |
    /// | VERSION | | |
    ///
    /// The spec lists CNI_PATH as optional for ADD/DEL/CHECK/STATUS; this plugin always
    /// delegates to its IPAM plugin, which it can only find through CNI_PATH, so it
    /// requires it rather than fail later. Variables a command does not use are ignored.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Self, CniError> {
        Ok(Self::parse(vars.into_iter().collect())?)
    }

    fn parse(vars: HashMap<String, String>) -> Result<Self, EnvError> {
        // An empty value is the same as an absent one: runtimes set unused variables to "".
        let get = |var: &str| vars.get(var).map(String::as_str).filter(|v| !v.is_empty());
        let command: Command = get("CNI_COMMAND").unwrap_or_default().parse()?;
        let require = |var: &'static str| get(var).ok_or(EnvError::Missing { var, command });

        let mut env = Self {
            command,
            container_id: None,
            netns: None,
            ifname: None,
            args: CniArgs::default(),
            unreadable_args: None,
            path: Vec::new(),
        };
        if command == Command::Version {
            return Ok(env);
        }
        env.path = parse_path(require("CNI_PATH")?)?;
        if env.path.is_empty() {
            return Err(EnvError::Missing {
                var: "CNI_PATH",
                command,
            });
        }
        if !command.is_attachment() {
            return Ok(env);
        }
        env.container_id = Some(validate_container_id(require("CNI_CONTAINERID")?)?);
        env.ifname = Some(validate_ifname(require("CNI_IFNAME")?)?);
        let netns = match command {
            Command::Del => get("CNI_NETNS"),
            _ => Some(require("CNI_NETNS")?),
        };
        env.netns = netns.map(|n| absolute("CNI_NETNS", n)).transpose()?;
        match CniArgs::parse_typed(get("CNI_ARGS").unwrap_or_default()) {
            Ok(args) => env.args = args,
            Err(error) if command == Command::Add => return Err(error.into()),
            Err(error) => env.unreadable_args = Some(error),
        }
        Ok(env)
    }
}

/// `CNI_PATH` split on ':'. Empty entries (e.g. a trailing ':') are skipped; relative ones
/// are refused because plugins would then be looked up relative to an unknown cwd.
fn parse_path(raw: &str) -> Result<Vec<PathBuf>, EnvError> {
    raw.split(':')
        .filter(|p| !p.is_empty())
        .map(|p| absolute("CNI_PATH", p))
        .collect()
}

fn absolute(var: &'static str, value: &str) -> Result<PathBuf, EnvError> {
    if Path::new(value).is_absolute() {
        Ok(PathBuf::from(value))
    } else {
        Err(EnvError::RelativePath {
            var,
            value: value.to_owned(),
        })
    }
}

pub(crate) use cni_api::naming::is_spec_identifier;

fn validate_container_id(id: &str) -> Result<String, EnvError> {
    if is_spec_identifier(id) {
        Ok(id.to_owned())
    } else {
        Err(EnvError::InvalidContainerId(id.to_owned()))
    }
}

/// The kernel's `dev_valid_name` rules, which the spec repeats.
fn validate_ifname(name: &str) -> Result<String, EnvError> {
    match cni_api::naming::ifname_problem(name) {
        Some(reason) => Err(EnvError::InvalidIfname {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(name.to_owned()),
    }
}
