//! Project tasks: `cargo xtask setup | build | test | vm-test | demo | bench | image`.
//!
//! Every task that needs tools runs `setup` first, so a fresh machine needs nothing but
//! the command itself (see the README's Quick start).

mod bench;
mod build;
mod cmd;
mod demo;
mod image;
mod setup;
mod test;
mod vm;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ebpf-cni project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Make this machine ready: Debian packages, nightly rust-src, bpf-linker.
    Setup,
    /// Build the eBPF object once, then the user-space binaries that embed it.
    Build {
        /// Build the user-space binaries with the release profile.
        #[arg(long)]
        release: bool,
    },
    /// Setup, then fmt, clippy, the image check (podman), unit tests and the root
    /// integration tests.
    Test {
        /// Extra arguments for `cargo test` (for example a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// The integration tests inside qemu guests of Debian's kernels: 6.1 (no TCX), the
    /// 6.12 LTS, and the refusal on 5.10 below the floor.
    VmTest {
        /// 6.1, 6.12, 5.10 (only the refusal test), or all.
        #[arg(long, default_value = "6.1")]
        kernel: String,
        /// Only what `cargo xtask test` runs on that kernel (on 6.1: the kernel's
        /// binaries less `KERNEL_SKIPS`), as CI does.
        #[arg(long)]
        ci: bool,
        /// How the guest's CPUs run: auto (KVM when a guest boots with it, else TCG).
        #[arg(long, value_enum, default_value = "auto")]
        accel: vm::Accel,
        /// Arguments for every test binary, after `--` (a test name filter, --skip NAME).
        #[arg(last = true)]
        filter: Vec<String>,
    },
    /// The main job: a simulated node in network namespaces, traffic through eBPF.
    Demo,
    /// ebpf-cni against the reference plugins and a raw veth, in one run; writes
    /// BENCHMARKS.md (with --quick: target/bench/BENCHMARKS.md).
    Bench {
        /// Shorter runs (under three minutes), written under target/bench.
        #[arg(long)]
        quick: bool,
        /// Run one section only (add-del, pod-to-pod, pod-to-external, hostport,
        /// cross-node, services, policy, bandwidth, memory), its report written under
        /// target/bench.
        #[arg(long)]
        only: Option<String>,
    },
    /// Build the binaries and write an OCI image archive of them (no registry, no
    /// container engine); prints the archive's path last.
    Image {
        /// Cargo profile of the binaries.
        #[arg(long, value_enum, default_value = "release")]
        profile: build::Profile,
        /// Where to write the archive (default: target/image/ebpf-cni-VERSION-PROFILE.oci.tar).
        #[arg(long)]
        output: Option<PathBuf>,
        /// The image's reference (default: the one deploy/05-daemonset.yaml runs).
        #[arg(long)]
        name: Option<String>,
        /// Then load it with podman (a store of its own) and run both binaries in it.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> ExitCode {
    match execute(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` gives the context chain without anyhow's backtrace, which
            // RUST_BACKTRACE=1 would otherwise print and bury the message under.
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    let root = workspace_root();
    match cli.task {
        Task::Setup => {
            setup::full()?;
        }
        Task::Build { release } => {
            let tools = setup::toolchain()?;
            build::all(&root, &tools, build::Profile::from_release(release))?;
        }
        Task::Test { args } => test::run(&root, &args)?,
        Task::VmTest {
            kernel,
            ci,
            accel,
            filter,
        } => vm::run(
            &root,
            &vm::Request {
                kernel,
                ci,
                accel,
                filter,
            },
        )?,
        Task::Demo => demo::run(&root)?,
        Task::Bench { quick, only } => bench::run(&root, bench::Plan { quick }, only.as_deref())?,
        Task::Image {
            profile,
            output,
            name,
            check,
        } => {
            let tools = setup::toolchain()?;
            let request = image::Request {
                profile,
                output,
                name,
                check,
            };
            let archive = image::run(&root, &tools, &request)?;
            #[expect(
                clippy::print_stdout,
                reason = "the archive's path is the task's output"
            )]
            {
                println!("{}", archive.display());
            }
        }
    }
    Ok(())
}

/// The workspace root: the parent of this crate's folder.
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}
