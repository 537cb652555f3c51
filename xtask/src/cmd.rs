//! Running external commands with a readable trace and a clear error.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

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

/// The command line of `command`, for traces and errors.
pub fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Tests counted from cargo's `test result:` lines.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TestTotals {
    pub passed: u64,
    pub failed: u64,
}

/// Runs `cargo test ...`, passing its stdout through while adding up the per-binary
/// `test result:` lines; fails like [`run`] when cargo fails.
pub fn run_counting_tests(command: &mut Command) -> anyhow::Result<TestTotals> {
    let line = describe(command);
    eprintln!("+ {line}");
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{line}`"))?;
    let mut totals = TestTotals::default();
    let stdout = child.stdout.take().context("no stdout pipe")?;
    for text in BufReader::new(stdout).lines() {
        let text = text?;
        #[expect(clippy::print_stdout, reason = "cargo's own output, passed through")]
        {
            println!("{text}");
        }
        add_result_line(&mut totals, &text);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "`{line}` failed ({status}); {} passed, {} failed",
            totals.passed,
            totals.failed
        );
    }
    Ok(totals)
}

/// Adds `test result: ok. 3 passed; 0 failed; ...` to `totals`; other lines are ignored.
pub fn add_result_line(totals: &mut TestTotals, line: &str) {
    let Some(rest) = line.strip_prefix("test result: ") else {
        return;
    };
    for part in rest.split(['.', ';']) {
        let mut words = part.split_whitespace();
        let (Some(count), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        match what {
            "passed" => totals.passed += count,
            "failed" => totals.failed += count,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_of_several_binaries_add_up() {
        let mut totals = TestTotals::default();
        add_result_line(
            &mut totals,
            "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.03s",
        );
        add_result_line(&mut totals, "running 2 tests");
        add_result_line(
            &mut totals,
            "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        assert_eq!(
            totals,
            TestTotals {
                passed: 4,
                failed: 1
            }
        );
    }
}
