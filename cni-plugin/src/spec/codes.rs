//! The one mapping from each module's error enum to a spec code. Messages come from the
//! module's own `Display`, which names the offending variable or field as the spec
//! requires.

use super::args::ArgsError;
use super::config::ConfigError;
use super::env::EnvError;
use super::error::{CniError, ErrorCode};
use super::result::ResultError;
use super::version::VersionError;

impl From<VersionError> for CniError {
    fn from(err: VersionError) -> Self {
        Self::new(ErrorCode::IncompatibleVersion, err.to_string())
    }
}

impl From<ArgsError> for CniError {
    fn from(err: ArgsError) -> Self {
        // CNI_ARGS is an environment variable: code 4 names it. Code 2 is reserved by the
        // spec for fields of the network configuration, which CNI_ARGS is not.
        Self::new(ErrorCode::InvalidEnvironment, err.to_string())
    }
}

impl From<EnvError> for CniError {
    fn from(err: EnvError) -> Self {
        match err {
            EnvError::Args(args) => args.into(),
            other => Self::new(ErrorCode::InvalidEnvironment, other.to_string()),
        }
    }
}

impl From<ConfigError> for CniError {
    fn from(err: ConfigError) -> Self {
        let code = match &err {
            ConfigError::Syntax(_) | ConfigError::NotAnObject => ErrorCode::DecodeFailure,
            ConfigError::Version(_) | ConfigError::CommandTooNew { .. } => {
                ErrorCode::IncompatibleVersion
            }
            ConfigError::MissingField(_)
            | ConfigError::InvalidField { .. }
            | ConfigError::CommandNeeds { .. } => ErrorCode::InvalidConfig,
        };
        Self::new(code, err.to_string())
    }
}

impl From<ResultError> for CniError {
    fn from(err: ResultError) -> Self {
        let code = match &err {
            ResultError::Version(_) => ErrorCode::IncompatibleVersion,
            ResultError::Syntax(_) | ResultError::Invalid(_) => ErrorCode::DecodeFailure,
        };
        Self::new(code, err.to_string())
    }
}
