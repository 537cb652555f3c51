//! `cargo xtask test`: setup, then everything CI checks, in one command.

use std::path::Path;

use crate::{
    build::{self, Profile},
    cmd, image, setup, vm,
};

pub fn run(root: &Path, extra: &[String]) -> anyhow::Result<()> {
    let tools = setup::full()?;
    cmd::run(
        cmd::clean("cargo")
            .current_dir(root)
            .args(["fmt", "--all", "--check"]),
    )?;
    let built = build::all(root, &tools, Profile::Dev)?;
    cmd::run(build::host_cargo(root, &built.object).args([
        "clippy",
        "--workspace",
        "--exclude",
        "cni-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    for leftover in ebpf_cni_tests::sweep_stale() {
        eprintln!("test: removed {leftover}, left by a killed run");
    }
    // The image of the debug build just made: loaded and run with podman.
    let archive = image::test(root, &built)?;
    eprintln!("test: the OCI image archive loads in podman and both binaries run in it");
    let totals = cmd::run_counting_tests(
        build::host_cargo(root, &built.object)
            .args(["test", "--workspace", "--exclude", "cni-ebpf"])
            .args(extra)
            // A whole-suite run is a fresh build more often than an edit loop; the
            // incremental caches of forty test binaries would take gigabytes of disk.
            .env("CARGO_INCREMENTAL", "0")
            .env("EBPF_CNI_BIN_DIR", &built.bin_dir)
            // The image of that build, which the end-to-end test starts as the DaemonSet.
            .env("EBPF_CNI_IMAGE", &archive),
    )?;
    // One closing line over every test binary (cargo prints one per binary, the last
    // of which is often an empty doc-test run).
    #[expect(clippy::print_stdout, reason = "the closing summary belongs on stdout")]
    {
        println!("tests: {} passed, {} failed", totals.passed, totals.failed);
    }
    anyhow::ensure!(totals.passed > 0, "no test ran");
    // The refusal below the floor in a qemu guest of bullseye's 5.10, then parts of the
    // suite again in guests of Debian 12's 6.1 and of the 6.12 LTS (`cargo xtask
    // vm-test`; `vm::CI_KERNELS`).
    let specs = vm::ci_kernels()?;
    let results = vm::suite(
        root,
        &built,
        &archive,
        &specs,
        vm::Accel::Auto,
        &binary_args(extra),
    )?;
    vm::conclude(&results)
}

/// What of `cargo test`'s arguments each test binary takes: its positional filter and
/// everything after `--` (cargo's own options, such as `-p NAME`, are not passed on).
fn binary_args(extra: &[String]) -> Vec<String> {
    let (cargo_args, binary_args) = match extra.iter().position(|arg| arg == "--") {
        Some(split) => (&extra[..split], &extra[split + 1..]),
        None => (extra, &[][..]),
    };
    let filter = cargo_args
        .iter()
        .enumerate()
        .filter(|(index, arg)| {
            !arg.starts_with('-') && (*index == 0 || !cargo_args[index - 1].starts_with('-'))
        })
        .map(|(_, arg)| arg.clone());
    filter.chain(binary_args.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| (*word).to_owned()).collect()
    }

    #[test]
    fn test_binaries_get_the_filter_and_what_follows_the_separator() {
        assert_eq!(binary_args(&args(&["snat"])), args(&["snat"]));
        assert_eq!(
            binary_args(&args(&["-p", "ebpf-cni-tests", "snat", "--", "--exact"])),
            args(&["snat", "--exact"])
        );
        assert!(binary_args(&[]).is_empty());
    }
}
