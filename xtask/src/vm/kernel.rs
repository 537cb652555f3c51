//! The guests' kernels: Debian's own `linux-image-*-amd64` packages, unpacked through
//! the private apt (apt.rs), never installed, given a `modules.dep` by `depmod`, and
//! cached under the tools folder like bpf-linker.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use super::apt;
use crate::cmd;

/// A kernel `vm-test` can boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// What `--kernel` calls it.
    pub name: &'static str,
    /// The Debian suite whose `linux-image-amd64` names the kernel.
    pub suite: &'static str,
    /// What the guest runs on it.
    pub suite_kind: Suite,
}

/// What runs on a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// The integration suite.
    Integration,
    /// The integration suite's binaries whose outcome the kernel decides
    /// ([`KERNEL_BINARIES`]): what CI runs on 6.1 (see `vm::ci_kernels`).
    Kernel,
    /// The binaries that need netkit pairs ([`NETKIT_BINARIES`]), which the host's
    /// kernel may not make: what CI runs on 6.12.
    Netkit,
    /// Only the kernel-floor test: the kernel is older than the floor in docs/kernels.md, so the
    /// daemon must refuse it (`tests/tests/kernel_floor.rs`).
    Refusal,
}

/// Debian 12's kernel (no TCX), the 6.12 LTS from bookworm-backports (Debian 13's
/// series), and bullseye's 5.10, below the floor of 5.17.
pub const KERNELS: &[Spec] = &[
    Spec {
        name: "6.1",
        suite: "bookworm",
        suite_kind: Suite::Integration,
    },
    Spec {
        name: "6.12",
        suite: "bookworm-backports",
        suite_kind: Suite::Integration,
    },
    Spec {
        name: "5.10",
        suite: "bullseye",
        suite_kind: Suite::Refusal,
    },
];

/// The test binaries whose outcome depends on the kernel: `datapath` (the programs
/// through the verifier and `BPF_PROG_TEST_RUN`, the uplink's attach modes, pins across
/// restarts, and every datapath path: redirects into pods, source NAT, hostPorts, the
/// overlay's tunnel keys, FIB lookups, BIG TCP, `tbf`, the gateway, isolation,
/// services). What is left out is user space over netlink and files (plugin input and
/// output, runtimes' JSON, node sources, install, records, metrics, the image): the same
/// code on every kernel, run by the host's suite. `cargo xtask vm-test` runs every
/// binary.
pub const KERNEL_BINARIES: &[&str] = &["datapath"];

/// The test binaries whose tests take another path on a kernel without netkit pairs.
pub const NETKIT_BINARIES: &[&str] = &["netkit_pods"];

/// An unpacked kernel.
pub struct Kernel {
    pub spec: Spec,
    /// The package's version (`6.1.176-1`).
    pub version: String,
    /// `uname -r` of the kernel (`6.1.0-50-amd64`).
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/RELEASE` of the unpacked package, with `modules.dep`.
    pub modules: PathBuf,
}

/// The kernel of `spec`: from the cache when it is there, else downloaded.
///
/// The cache is kept per name and is not refreshed once complete: a later point release
/// of the suite is taken only after `rm -r` of the folder (`vm-test` prints it).
pub fn get(cache: &Path, source: &apt::Source, spec: Spec) -> anyhow::Result<Kernel> {
    let home = cache.join(format!("kernel-{}", spec.name));
    let ready = home.join("ready");
    if let Ok(text) = fs::read_to_string(&ready)
        && let Some((version, release)) = text.trim().split_once(' ')
    {
        return Ok(unpacked(&home, spec, version, release));
    }
    let apt = source.open()?;
    let (package, version) = image_package(&apt, spec.suite)?;
    eprintln!(
        "vm-test: downloading {package} {version} from {}",
        spec.suite
    );
    let _ = fs::remove_dir_all(&home);
    let root = home.join("root");
    apt.unpack(&package, &version, &root)?;
    let release = package
        .strip_prefix("linux-image-")
        .context("the image package is not named linux-image-*")?
        .to_owned();
    cmd::run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
    let kernel = unpacked(&home, spec, &version, &release);
    for path in [&kernel.vmlinuz, &kernel.modules.join("modules.dep")] {
        anyhow::ensure!(
            path.exists(),
            "{} is missing after unpacking",
            path.display()
        );
    }
    fs::write(&ready, format!("{version} {release}\n"))?;
    Ok(kernel)
}

impl Kernel {
    /// Whether the kernel's configuration (the package's `boot/config-RELEASE`) has
    /// `option` built in or as a module.
    pub fn configured(&self, option: &str) -> anyhow::Result<bool> {
        let path = self
            .vmlinuz
            .with_file_name(format!("config-{}", self.release));
        let config = fs::read_to_string(&path)
            .with_context(|| format!("reading the kernel's configuration {}", path.display()))?;
        Ok(config
            .lines()
            .any(|line| line == format!("{option}=y") || line == format!("{option}=m")))
    }
}

fn unpacked(home: &Path, spec: Spec, version: &str, release: &str) -> Kernel {
    let root = home.join("root");
    Kernel {
        spec,
        version: version.to_owned(),
        release: release.to_owned(),
        vmlinuz: root.join(format!("boot/vmlinuz-{release}")),
        modules: root.join(format!("lib/modules/{release}")),
    }
}

/// The versioned image package that `suite`'s `linux-image-amd64` depends on, and that
/// package's version in the suite.
fn image_package(apt: &apt::Apt, suite: &str) -> anyhow::Result<(String, String)> {
    let meta_version = apt.version_in("linux-image-amd64", suite)?;
    let depends = cmd::output(
        apt.command("apt-cache")
            .args(["depends", &format!("linux-image-amd64={meta_version}")]),
    )
    .context("apt-cache depends failed")?;
    let package = depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|name| name.starts_with("linux-image-"))
        .with_context(|| format!("linux-image-amd64 {meta_version} names no image"))?
        .to_owned();
    // The image package carries the same source version as its meta package.
    Ok((package, meta_version))
}

/// `--kernel`'s values: a name of [`KERNELS`], or `all`.
pub fn select(name: &str) -> anyhow::Result<Vec<Spec>> {
    if name == "all" {
        return Ok(KERNELS.to_vec());
    }
    match KERNELS.iter().find(|spec| spec.name == name) {
        Some(spec) => Ok(vec![*spec]),
        None => bail!(
            "--kernel {name}: one of {}, or all",
            KERNELS
                .iter()
                .map(|spec| spec.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
