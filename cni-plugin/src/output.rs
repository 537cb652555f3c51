//! The protocol channel: stdout carries exactly one JSON document per run (the result or
//! an error), also when the plugin panics; diagnostics go to stderr.

use std::{io::Write, sync::OnceLock};

use crate::spec::{CniError, CniVersion};

/// The cniVersion to put in an error: the config's when it was readable.
static ERROR_VERSION: OnceLock<String> = OnceLock::new();

/// Keeps the config's cniVersion for errors, when it is one we know (else our newest).
pub fn remember_version(stdin: &[u8]) {
    let version = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|config| config["cniVersion"].as_str().map(str::to_owned))
        .filter(|version| version.parse::<CniVersion>().is_ok());
    if let Some(version) = version {
        let _ = ERROR_VERSION.set(version);
    }
}

pub fn error_version() -> &'static str {
    ERROR_VERSION.get().map_or("1.1.0", String::as_str)
}

/// A panic still answers the runtime with an error JSON (code 100) on stdout, and exits
/// with status 1.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let error = CniError::internal("ebpf-cni panicked").with_details(info.to_string());
        emit(&error.to_json(error_version()));
        eprintln!("ebpf-cni: {info}");
        std::process::exit(1);
    }));
}

/// Writes `json` as the run's one document.
pub fn emit(json: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{json}");
    let _ = stdout.flush();
}
