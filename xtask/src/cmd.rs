//! Running external commands with a readable trace and a clear error.

use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Variables that rustup or an outer cargo set and that would pin an inner cargo to the
/// wrong toolchain or wrapper.
const TOOLCHAIN_VARS: &[&str] = &[
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTUP_TOOLCHAIN",
    "CARGO",
    "CARGO_TARGET_DIR",
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTFLAGS",
];

/// A command with the toolchain variables of the outer cargo removed.
pub fn clean(program: &str) -> Command {
    let mut command = Command::new(program);
    for var in TOOLCHAIN_VARS {
        command.env_remove(var);
    }
    command
}

/// Runs `command`, echoing it first; fails with the command line when it fails.
pub fn run(command: &mut Command) -> anyhow::Result<()> {
    let line = describe(command);
    eprintln!("+ {line}");
    let status = command
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `command` quietly and returns its stdout, or `None` when it fails or is missing.
pub fn output(command: &mut Command) -> Option<String> {
    let out = command.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
