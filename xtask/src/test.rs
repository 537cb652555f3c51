//! `cargo xtask test`: setup, then everything CI checks, in one command.

use std::path::Path;

use crate::{
    build::{self, Profile},
    cmd, image, setup,
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
    Ok(())
}
