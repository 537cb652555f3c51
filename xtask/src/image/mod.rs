//! `cargo xtask image`: an OCI image archive of the two binaries, built from this
//! machine's files with no registry and no container engine (`ebpf_cni_tests::oci`
//! writes the layout), for `ctr images import` or `podman load` on the nodes.

mod check;
mod rootfs;

use std::path::{Path, PathBuf};

use anyhow::Context;
use ebpf_cni_tests::oci::{self, Image};

use crate::build::{self, Built, Profile};
use crate::setup::Toolchain;

/// The workspace's version, which both binaries print.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What to build and where to put it.
pub struct Request {
    pub profile: Profile,
    pub output: Option<PathBuf>,
    /// The image's reference; default [`ebpf_cni_tests::deploy::IMAGE`], the one the
    /// DaemonSet runs.
    pub name: Option<String>,
    /// Load the archive with podman and run both binaries in it afterwards.
    pub check: bool,
}

/// Builds the binaries, writes the archive, and returns its path.
pub fn run(root: &Path, tools: &Toolchain, request: &Request) -> anyhow::Result<PathBuf> {
    let built = build::all(root, tools, request.profile)?;
    let name = request
        .name
        .clone()
        .unwrap_or_else(|| ebpf_cni_tests::deploy::IMAGE.to_owned());
    let output = request.output.clone().unwrap_or_else(|| {
        let profile = match request.profile {
            Profile::Dev => "dev",
            Profile::Release => "release",
        };
        ebpf_cni_tests::deploy::image_archive(root, profile)
    });
    write(&built, &name, &output)?;
    if request.check {
        check::run(&output, &name, VERSION)?;
    }
    Ok(output)
}

/// Writes the archive of `built`'s binaries, named `name`, to `output`.
pub fn write(built: &Built, name: &str, output: &Path) -> anyhow::Result<()> {
    let layer = rootfs::layer(&built.bin_dir)?;
    if let Some(folder) = output.parent() {
        std::fs::create_dir_all(folder)
            .with_context(|| format!("cannot create {}", folder.display()))?;
    }
    let daemon = format!("/{}/ebpf-cnid", rootfs::BIN_DIR);
    let image = Image {
        name,
        entrypoint: &[&daemon],
        cmd: &["run"],
        env: &["PATH=/usr/local/bin:/usr/bin:/bin"],
        labels: &[
            ("org.opencontainers.image.title", "ebpf-cni"),
            ("org.opencontainers.image.version", VERSION),
            (
                "org.opencontainers.image.description",
                "ebpf-cnid, the node daemon, and ebpf-cni, the CNI plugin it installs",
            ),
        ],
    };
    oci::write_archive(output, &image, &layer);
    Ok(())
}

/// The check `cargo xtask test` runs after its debug build: the archive `cargo xtask
/// image --profile dev` would write, of those binaries, loaded and run with podman in a
/// store of its own. The archive stays, for the end-to-end test (`deploy_end_to_end`),
/// which loads it again; returns its path.
pub fn test(root: &Path, built: &Built) -> anyhow::Result<PathBuf> {
    let name = ebpf_cni_tests::deploy::IMAGE;
    let output = ebpf_cni_tests::deploy::image_archive(root, "dev");
    write(built, name, &output)?;
    check::run(&output, name, VERSION)?;
    Ok(output)
}
