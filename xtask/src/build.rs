//! Builds the eBPF object once and the user-space binaries that embed it.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;

use crate::{cmd, setup::Toolchain};

/// The variable through which cni-daemon's build.rs finds the prebuilt object, so the
/// object is built once instead of once per cargo profile.
pub const OBJECT_VAR: &str = "EBPF_CNI_OBJECT";

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    Dev,
    Release,
}

impl Profile {
    pub fn from_release(release: bool) -> Self {
        if release { Self::Release } else { Self::Dev }
    }

    /// The folder under `target/` where cargo puts this profile's binaries.
    pub fn dir(self) -> &'static str {
        match self {
            Self::Dev => "debug",
            Self::Release => "release",
        }
    }
}

/// Built artefacts.
pub struct Built {
    pub object: PathBuf,
    pub bin_dir: PathBuf,
}

pub fn all(root: &Path, tools: &Toolchain, profile: Profile) -> anyhow::Result<Built> {
    let object = ebpf_object(root, tools)?;
    let mut build = host_cargo(root, &object);
    build.arg("build");
    if profile == Profile::Release {
        // Release builds serve the benchmark, which runs the product's two binaries
        // only: the tests crate's helpers are not worth their compile time there.
        build.args([
            "--release",
            "-p",
            "cni-plugin",
            "-p",
            "cni-daemon",
            "--bins",
        ]);
    } else {
        build.args([
            "--workspace",
            "--exclude",
            "cni-ebpf",
            "--exclude",
            "xtask",
            "--bins",
        ]);
    }
    cmd::run(&mut build)?;
    Ok(Built {
        object,
        bin_dir: root.join("target").join(profile.dir()),
    })
}

/// `cargo` for the host, with the eBPF object handed to build.rs.
pub fn host_cargo(root: &Path, object: &Path) -> Command {
    let mut cargo = cmd::clean("cargo");
    cargo.current_dir(root).env(OBJECT_VAR, object);
    cargo
}

/// Builds `cni-ebpf` for bpfel-unknown-none with nightly's build-std (docs/architecture.md,
/// Toolchain).
pub fn ebpf_object(root: &Path, tools: &Toolchain) -> anyhow::Result<PathBuf> {
    let target_dir = root.join("target").join("ebpf");
    let path = env::var_os("PATH").unwrap_or_default();
    let path =
        env::join_paths(std::iter::once(tools.bin_dir.clone()).chain(env::split_paths(&path)))
            .context("PATH cannot hold the tools folder")?;
    cmd::run(
        cmd::clean("rustup")
            .current_dir(root)
            .args([
                "run",
                "nightly",
                "cargo",
                "build",
                "--package",
                "cni-ebpf",
                "--bins",
            ])
            .args([
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .env(
                "CARGO_ENCODED_RUSTFLAGS",
                // -D warnings: clippy does not look at this crate, so the compiler must.
                "--cfg=bpf_target_arch=\"x86_64\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf\x1f-Dwarnings",
            )
            .env("PATH", path),
    )?;
    let object = target_dir
        .join("bpfel-unknown-none")
        .join("release")
        .join("cni-ebpf");
    anyhow::ensure!(
        object.is_file(),
        "the eBPF build produced no {}",
        object.display()
    );
    Ok(object)
}
