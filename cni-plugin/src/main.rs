//! `ebpf-cni`: the CNI plugin binary. Reads CNI_* variables and the network config on
//! stdin, prints the result or an error JSON on stdout (and nothing else there), exits
//! non-zero on error. Diagnostics go to stderr.

use std::{io::Read, process::ExitCode};

use cni_plugin::{
    commands,
    output::{emit, error_version, install_panic_hook, remember_version},
    spec::{CniError, Environment},
};

fn main() -> ExitCode {
    install_panic_hook();
    let mut stdin = Vec::new();
    let outcome = std::io::stdin()
        .read_to_end(&mut stdin)
        .map_err(|error| CniError::new(cni_plugin::spec::ErrorCode::IoFailure, error.to_string()))
        .and_then(|_| {
            remember_version(&stdin);
            let env = Environment::from_vars(std::env::vars())?;
            commands::dispatch(env, &stdin)
        });
    match outcome {
        Ok(output) => {
            if let Some(output) = output {
                emit(&output);
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            emit(&error.to_json(error_version()));
            ExitCode::FAILURE
        }
    }
}
