//! The protocol channel: stdout carries exactly one JSON document per run (the result or
//! an error), also when the plugin panics; diagnostics go to stderr.

use std::{io::Write, sync::OnceLock};

use crate::spec::{CniError, CniVersion};

/// The cniVersion to put in an error: the config's when it was readable.
static ERROR_VERSION: OnceLock<String> = OnceLock::new();

/// Keeps the config's cniVersion for errors, when it is one we know (else our newest).
pub fn remember_version(stdin: &[u8]) {
    let version = crate::spec::parse_version_request(stdin)
        .ok()
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

#[cfg(test)]
mod tests {
    use std::process::Command;

    /// Set in the child run of the test below, which then panics under the real hook.
    const CHILD: &str = "EBPF_CNI_PANIC_HOOK_CHILD";

    #[test]
    fn a_panic_prints_one_error_json_with_code_100_and_the_configs_version() {
        if std::env::var_os(CHILD).is_some() {
            super::remember_version(br#"{"cniVersion": "0.4.0"}"#);
            super::install_panic_hook();
            panic!("a deliberate panic, as a bug would");
        }
        // The hook exits the process: it runs in a child, this same test binary.
        let out = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "output::tests::a_panic_prints_one_error_json_with_code_100_and_the_configs_version",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .expect("the child runs");
        assert_eq!(out.status.code(), Some(1), "the hook's exit status");
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The test harness prints its own text, also before the document on its line.
        let documents: Vec<serde_json::Value> = stdout
            .lines()
            .filter_map(|line| serde_json::from_str(&line[line.find('{')?..]).ok())
            .collect();
        assert_eq!(documents.len(), 1, "one document: {stdout}");
        let error = &documents[0];
        assert_eq!(error["code"], 100, "{error}");
        assert_eq!(error["cniVersion"], "0.4.0", "{error}");
        assert!(
            error["msg"]
                .as_str()
                .is_some_and(|m| m.contains("panicked")),
            "{error}"
        );
        assert!(
            error["details"]
                .as_str()
                .is_some_and(|d| d.contains("deliberate")),
            "{error}"
        );
    }
}
