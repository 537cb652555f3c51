//! Makes a fresh machine of the project's kind ready, idempotently (docs/architecture.md, Toolchain):
//! Debian packages for the build, tests and demo, nightly rust-src, and bpf-linker built
//! against rustc's own libLLVM. Nearly instant when everything is already there.

use std::{
    env, fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};

use crate::cmd;

/// Debian packages the tests, demo and benchmarks use, with what for.
const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip: namespaces, veths, addresses, routes"),
    ("iputils-ping", "ping: real ICMP traffic"),
    ("iperf3", "throughput measurements"),
    (
        "containernetworking-plugins",
        "host-local IPAM and the reference bridge chain",
    ),
    ("bpftool", "inspecting programs and maps by hand"),
    (
        "iptables",
        "kube-proxy's iptables rules and the nodes' firewall rules in the tests",
    ),
    (
        "nftables",
        "nft: kube-proxy's nftables rules in the Services tests",
    ),
    (
        "util-linux",
        "nsenter: start the daemon inside a node namespace",
    ),
    (
        "containerd",
        "the containerd tests' runtime, driven through the CRI; ctr imports their image",
    ),
    (
        "runc",
        "the OCI runtime containerd and podman start the tests' pods with",
    ),
    (
        "podman",
        "the podman test's runtime (CNI backend; brings conmon)",
    ),
    (
        "busybox-static",
        "the runtime tests' image, and the VM tests' initramfs: a static busybox",
    ),
    (
        "qemu-system-x86",
        "the libraries of the VM tests' emulator (bookworm-backports' qemu, vm/emulator.rs)",
    ),
    (
        "kmod",
        "depmod for the VM tests' kernels; modprobe in their guests",
    ),
];

/// Debian packages the workspace's build needs, with what for; `toolchain` installs
/// them too, since every build compiles the tests crate.
const BUILD_PACKAGES: &[(&str, &str)] = &[(
    "protobuf-compiler",
    "protoc: k8s-cri compiles the CRI protos for the containerd tests' client",
)];

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Where the tools this project builds are kept: outside the clone, so a fresh clone on
/// the same machine reuses them.
pub struct Toolchain {
    /// Folder holding `bpf-linker`; prepended to PATH for the eBPF build.
    pub bin_dir: PathBuf,
}

/// Everything: packages, rust-src, bpf-linker.
pub fn full() -> anyhow::Result<Toolchain> {
    let mut installed = Vec::new();
    // One apt-get run for both lists: `toolchain_into` then finds its packages there.
    let packages: Vec<(&str, &str)> = PACKAGES.iter().chain(BUILD_PACKAGES).copied().collect();
    apt_packages(&packages, &mut installed)?;
    let tools = toolchain_into(&mut installed)?;
    if installed.is_empty() {
        eprintln!("setup: everything was already in place");
    } else {
        eprintln!("setup: installed {}", installed.join(", "));
    }
    Ok(tools)
}

/// Only what building needs: the build packages, rust-src and bpf-linker.
pub fn toolchain() -> anyhow::Result<Toolchain> {
    toolchain_into(&mut Vec::new())
}

fn toolchain_into(installed: &mut Vec<String>) -> anyhow::Result<Toolchain> {
    apt_packages(BUILD_PACKAGES, installed)?;
    rust_src(installed)?;
    bpf_linker(installed)
}

fn apt_packages(packages: &[(&str, &str)], installed: &mut Vec<String>) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !dpkg_installed(name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages: {}; run `sudo cargo xtask setup` (or as root)",
            missing.join(" ")
        );
    }
    eprintln!("setup: installing Debian packages: {}", missing.join(" "));
    cmd::run(cmd::clean("apt-get").args(["update", "-q"]))?;
    cmd::run(
        cmd::clean("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing),
    )
    .context("apt-get install failed; check the network and `apt-get update`")?;
    installed.extend(missing.iter().map(|name| format!("apt:{name}")));
    Ok(())
}

fn dpkg_installed(name: &str) -> bool {
    cmd::output(cmd::clean("dpkg-query").args(["-W", "-f=${Status}", name]))
        .is_some_and(|status| status.contains("install ok installed"))
}

fn is_root() -> bool {
    cmd::output(cmd::clean("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}

fn rust_src(installed: &mut Vec<String>) -> anyhow::Result<()> {
    let components = cmd::output(cmd::clean("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context("the `nightly` toolchain is missing: `rustup toolchain install nightly`")?;
    if components.lines().any(|line| line.starts_with("rust-src")) {
        return Ok(());
    }
    cmd::run(cmd::clean("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))?;
    installed.push("nightly rust-src".into());
    Ok(())
}

/// bpf-linker 0.13 built against the nightly toolchain's own libLLVM (Debian's LLVM is
/// too old, and the crate's default feature wants a newer LLVM), cached by LLVM major.
fn bpf_linker(installed: &mut Vec<String>) -> anyhow::Result<Toolchain> {
    let version = cmd::output(cmd::clean("rustc").args(["+nightly", "-vV"]))
        .context("cannot run `rustc +nightly -vV`")?;
    let major = version
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|llvm| llvm.split('.').next())
        .context("`rustc +nightly -vV` prints no LLVM version")?
        .to_owned();
    let home = tools_home()?.join(format!("bpf-linker-{BPF_LINKER_VERSION}-llvm{major}"));
    let bin_dir = home.join("bin");
    let linker = bin_dir.join("bpf-linker");
    if cmd::output(cmd::clean(linker.to_str().context("non-UTF-8 tools path")?).arg("--version"))
        .is_some()
    {
        return Ok(Toolchain { bin_dir });
    }

    let llvm_dir = home.join("llvm");
    link_rustc_llvm(&llvm_dir.join("lib"), &major)?;
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against rustc's LLVM {major} (about a minute)"
    );
    cmd::run(
        cmd::clean("rustup")
            .args(["run", "nightly", "cargo", "install"])
            .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
            .args(["--locked", "--force", "--no-default-features", "--features"])
            .arg(format!("llvm-{major}"))
            .arg("--root")
            .arg(&home)
            .env("LLVM_PREFIX", &llvm_dir),
    )?;
    cmd::output(cmd::clean(linker.to_str().context("non-UTF-8 tools path")?).arg("--version"))
        .with_context(|| format!("{} was built but does not run", linker.display()))?;
    installed.push(format!("bpf-linker {BPF_LINKER_VERSION} (LLVM {major})"));
    Ok(Toolchain { bin_dir })
}

/// Makes `lib_dir` hold `libLLVM.so` and the library's own name, both pointing at the
/// nightly sysroot's `libLLVM.so.<major>.<minor>-rust-<version>`.
fn link_rustc_llvm(lib_dir: &Path, major: &str) -> anyhow::Result<()> {
    let sysroot = cmd::output(cmd::clean("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("cannot find the nightly sysroot")?;
    let sysroot_lib = PathBuf::from(sysroot.trim()).join("lib");
    let prefix = format!("libLLVM.so.{major}.");
    let library = fs::read_dir(&sysroot_lib)
        .with_context(|| format!("cannot list {}", sysroot_lib.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with(&prefix) && name.contains("-rust-"))
        .with_context(|| format!("no {prefix}*-rust-* in {}", sysroot_lib.display()))?;
    fs::create_dir_all(lib_dir)?;
    for name in ["libLLVM.so", library.as_str()] {
        let link = lib_dir.join(name);
        let _ = fs::remove_file(&link);
        symlink(sysroot_lib.join(&library), &link)
            .with_context(|| format!("cannot create {}", link.display()))?;
    }
    Ok(())
}

pub fn tools_home() -> anyhow::Result<PathBuf> {
    if let Some(dir) = env::var_os("EBPF_CNI_TOOLS_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let cache = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .context("neither EBPF_CNI_TOOLS_DIR, XDG_CACHE_HOME nor HOME is set")?;
    Ok(cache.join("ebpf-cni"))
}
