//! `ebpf-cni`: the CNI plugin binary. Reads CNI_* variables and the network config on
//! stdin, prints the result or an error JSON on stdout (and nothing else there), exits
//! non-zero on error. Diagnostics go to stderr.

use std::{io::Read, process::ExitCode};

use cni_plugin::{
    commands,
    output::{emit, error_version, install_panic_hook, remember_version},
    spec::{CniError, Environment, ErrorCode},
};

/// The most stdin may hold: a network configuration with its `prevResult`, or a GC
/// request listing every attachment of a node, is a few hundred KiB at most.
const MAX_STDIN: usize = 4 << 20;

fn main() -> ExitCode {
    install_panic_hook();
    let mut stdin = Vec::new();
    let outcome = std::io::stdin()
        .take(MAX_STDIN as u64 + 1)
        .read_to_end(&mut stdin)
        .map_err(|error| CniError::new(ErrorCode::IoFailure, error.to_string()))
        .and_then(|read| {
            if read > MAX_STDIN {
                return Err(CniError::new(
                    ErrorCode::IoFailure,
                    format!("stdin holds more than {MAX_STDIN} bytes, more than any network configuration"),
                ));
            }
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
