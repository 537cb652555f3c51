//! `ebpf-cni`: the CNI plugin binary. Reads CNI_* variables and the network config on
//! stdin, prints the result or an error JSON on stdout (and nothing else there), exits
//! non-zero on error. Diagnostics go to stderr.

use std::{
    io::{Read, Write},
    process::ExitCode,
    sync::OnceLock,
};

use cni_plugin::{
    commands,
    spec::{CniError, CniVersion, Environment},
};

/// The cniVersion to put in an error: the config's when it was readable.
static ERROR_VERSION: OnceLock<String> = OnceLock::new();

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

/// Errors carry the config's cniVersion when it is one we know, else our newest.
fn remember_version(stdin: &[u8]) {
    let version = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|config| config["cniVersion"].as_str().map(str::to_owned))
        .filter(|version| version.parse::<CniVersion>().is_ok());
    if let Some(version) = version {
        let _ = ERROR_VERSION.set(version);
    }
}

fn error_version() -> &'static str {
    ERROR_VERSION.get().map_or("1.1.0", String::as_str)
}

/// A panic still answers the runtime with an error JSON (code 100) on stdout.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let error = CniError::internal("ebpf-cni panicked").with_details(info.to_string());
        emit(&error.to_json(error_version()));
        eprintln!("ebpf-cni: {info}");
        std::process::exit(1);
    }));
}

/// The protocol channel: exactly one JSON document.
fn emit(json: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{json}");
    let _ = stdout.flush();
}
