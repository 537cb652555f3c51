//! `cargo xtask vm-test`: the integration tests, the same built binaries, inside qemu
//! guests running Debian's own kernels (6.1 without TCX, the 6.12 LTS with it), and the
//! kernel-floor refusal on bullseye's 5.10.
//!
//! Kernels (kernel.rs) and the emulator (emulator.rs, bookworm-backports' qemu) are
//! Debian's packages, unpacked through a private apt (apt.rs) into the tools cache.
//! The guest boots the unpacked kernel with an initramfs of busybox (initramfs.rs),
//! mounts the host's root read-only over virtio-9p under a tmpfs overlay, and runs the
//! binaries as root with the mounts a test host has (guest.sh). The console is the only
//! channel back (qemu.rs).

mod apt;
mod emulator;
mod initramfs;
mod kernel;
mod qemu;

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::Context;

pub use self::qemu::Accel;
use self::{
    initramfs::Plan,
    kernel::{Kernel, Suite},
};
use crate::{
    build::{self, Built, Profile},
    cmd::TestTotals,
    image, setup,
};

/// What `cargo xtask vm-test` was asked.
pub struct Request {
    /// `6.1`, `6.12`, `5.10` or `all`.
    pub kernel: String,
    /// Only what CI runs on each kernel ([`ci_kernels`]).
    pub ci: bool,
    pub accel: Accel,
    /// Arguments for every test binary (a test name filter, `--skip NAME`, ...).
    pub filter: Vec<String>,
}

/// `cargo xtask vm-test`: setup, the debug build, then each kernel in turn.
pub fn run(root: &Path, request: &Request) -> anyhow::Result<()> {
    let mut specs = kernel::select(&request.kernel)?;
    if request.ci {
        let names: Vec<&str> = specs.iter().map(|spec| spec.name).collect();
        specs = ci_kernels()?
            .into_iter()
            .filter(|spec| names.contains(&spec.name))
            .collect();
    }
    let tools = setup::full()?;
    let built = build::all(root, &tools, Profile::Dev)?;
    // The image the end-to-end test starts as the DaemonSet (`cargo xtask test` checks
    // it with podman; here it is only written).
    let archive = ebpf_cni_tests::deploy::image_archive(root, "dev");
    image::write(&built, ebpf_cni_tests::deploy::IMAGE, &archive)?;
    let results = suite(
        root,
        &built,
        &archive,
        &specs,
        request.accel,
        &request.filter,
    )?;
    conclude(&results)
}

/// The kernels `cargo xtask test` runs after the host's suite, and what it runs on each:
/// the refusal below the floor (a minute or two), Debian 12's 6.1 (the kernel without
/// TCX) for the binaries whose outcome the kernel decides, and the 6.12 LTS for the
/// netkit pods, which the host's kernel may not make. The rest of 6.12 is for a person:
/// CI's time goes to what the host's kernel cannot show.
const CI_KERNELS: &[(&str, Suite)] = &[
    ("5.10", Suite::Refusal),
    ("6.1", Suite::Kernel),
    ("6.12", Suite::Netkit),
];

/// [`CI_KERNELS`] as specs. CI runs a part of the suite on each kernel: the whole suite
/// took 75 to 100 min under TCG on CI's machines, past CI's 90 min with the host's suite
/// before it.
pub fn ci_kernels() -> anyhow::Result<Vec<kernel::Spec>> {
    let mut specs = Vec::new();
    for (name, suite_kind) in CI_KERNELS {
        specs.extend(kernel::select(name)?.into_iter().map(|spec| kernel::Spec {
            suite_kind: *suite_kind,
            ..spec
        }));
    }
    Ok(specs)
}

/// One kernel's result.
pub struct KernelResult {
    pub name: &'static str,
    pub version: String,
    pub accel: Accel,
    pub elapsed: Duration,
    /// The error that ended the guest early (no boot, hang, panic), if one did.
    pub error: Option<String>,
    pub totals: TestTotals,
    pub failed_binaries: Vec<(String, i32)>,
    /// Whether a filter chose the tests (then none matching is no failure).
    pub filtered: bool,
}

impl KernelResult {
    fn passed(&self) -> bool {
        self.error.is_none()
            && self.failed_binaries.is_empty()
            && self.totals.failed == 0
            && (self.filtered || self.totals.passed > 0)
    }

    /// `vm-test 6.1 (Debian 6.1.176-1, TCG (software emulation), 31 min): 512 passed, 0 failed`
    pub fn summary(&self) -> String {
        let mut line = format!(
            "vm-test {} (Debian {}, {}, {} min): {} passed, {} failed",
            self.name,
            self.version,
            self.accel.label(),
            self.elapsed.as_secs().div_ceil(60),
            self.totals.passed,
            self.totals.failed
        );
        if !self.failed_binaries.is_empty() {
            let binaries: Vec<String> = self
                .failed_binaries
                .iter()
                .map(|(name, status)| match status {
                    124 | 137 => format!("{name} (timed out)"),
                    _ => format!("{name} (exit {status})"),
                })
                .collect();
            line.push_str(&format!("; failing binaries: {}", binaries.join(", ")));
        }
        if let Some(error) = &self.error {
            line.push_str(&format!("; {}", error.lines().next().unwrap_or_default()));
        }
        line
    }
}

/// Runs the tests of `built` in a guest of each kernel of `specs`, one after another.
/// An error only for what stops every kernel (no package lists, no test binaries); a
/// guest's own failure is in its [`KernelResult`].
pub fn suite(
    root: &Path,
    built: &Built,
    archive: &Path,
    specs: &[kernel::Spec],
    accel: Accel,
    filter: &[String],
) -> anyhow::Result<Vec<KernelResult>> {
    let binaries = test_binaries(root, built)?;
    let cache = setup::tools_home()?.join("vm");
    let source = apt::Source::new(
        cache.join("apt"),
        kernel::KERNELS
            .iter()
            .map(|spec| spec.suite)
            .chain([emulator::SUITE]),
    );
    let emulator = emulator::get(&cache, &source)?;
    eprintln!("vm-test: {}", emulator.version);
    let work = root.join("target/vm");
    fs::create_dir_all(&work)?;
    let mut results = Vec::new();
    // KVM works or not whatever the kernel: probed once, with the first.
    let mut resolved = None;
    for spec in specs {
        let kernel = kernel::get(&cache, &source, *spec)?;
        let plan = plan(root, built, archive, &kernel, &binaries, accel, filter)?;
        let initramfs = work.join(format!("initramfs-{}.cpio", spec.name));
        initramfs::write(&kernel, &plan, &initramfs)?;
        let accel =
            *resolved.get_or_insert_with(|| qemu::resolve(&emulator, accel, &kernel, &initramfs));
        eprintln!(
            "vm-test: Linux {} (Debian {}, {}) under {}: {} test binaries",
            kernel.release,
            kernel.version,
            spec.suite,
            accel.label(),
            plan.binaries.len()
        );
        // Only a filter may leave no test to run.
        let filtered = !filter.is_empty() && spec.suite_kind != Suite::Refusal;
        let start = Instant::now();
        let outcome = qemu::run(&emulator, accel, &kernel, &initramfs, total_timeout(&plan));
        let (outcome, error) = match outcome {
            Ok(outcome) => {
                let error = outcome.ended_early.clone();
                (outcome, error)
            }
            Err(error) => {
                eprintln!("vm-test: {error:#}");
                (qemu::Outcome::default(), Some(format!("{error:#}")))
            }
        };
        let result = KernelResult {
            name: spec.name,
            version: kernel.version.clone(),
            accel,
            elapsed: start.elapsed(),
            error,
            totals: outcome.totals,
            failed_binaries: outcome.failed_binaries,
            filtered,
        };
        if specs.len() > 1 {
            // As each kernel ends; [`conclude`] prints them all again at the end.
            eprintln!("{}", result.summary());
        }
        results.push(result);
    }
    Ok(results)
}

/// Prints one line per kernel; an error when any kernel failed.
pub fn conclude(results: &[KernelResult]) -> anyhow::Result<()> {
    #[expect(clippy::print_stdout, reason = "the closing summary belongs on stdout")]
    for result in results {
        println!("{}", result.summary());
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|result| !result.passed())
        .map(|result| result.name)
        .collect();
    anyhow::ensure!(failed.is_empty(), "vm-test failed on {}", failed.join(", "));
    Ok(())
}

/// The whole guest's limit: each binary's own limit ([`Accel::binary_timeout`] for its
/// number of tests), summed, and at least an hour.
fn total_timeout(plan: &Plan) -> Duration {
    plan.limits
        .iter()
        .sum::<Duration>()
        .max(Duration::from_secs(3600))
}

/// How many tests of the binary at `path` run (`--list`), less those CI's 6.1 guest
/// skips ([`kernel::KERNEL_SKIPS`]) when `skipping`; 0 when it cannot say.
fn test_count(path: &Path, skipping: bool) -> usize {
    test_names(path)
        .iter()
        .filter(|name| {
            !skipping
                || !kernel::KERNEL_SKIPS
                    .iter()
                    .any(|(skip, _)| name.contains(skip))
        })
        .count()
}

/// The names of the tests of the binary at `path` (`--list`); none when it cannot say.
fn test_names(path: &Path) -> Vec<String> {
    std::process::Command::new(path)
        .args(["--list", "--format", "terse"])
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|line| line.strip_suffix(": test"))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `--skip NAME` for each of [`kernel::KERNEL_SKIPS`] (libtest skips every test whose
/// name holds it); an error when one is in the name of none of the tests of `binaries`.
fn kernel_skips(binaries: &[(String, PathBuf)]) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = binaries
        .iter()
        .flat_map(|(_, path)| test_names(path))
        .collect();
    let mut args = Vec::new();
    for (skip, _) in kernel::KERNEL_SKIPS {
        anyhow::ensure!(
            names.iter().any(|name| name.contains(skip)),
            "KERNEL_SKIPS names {skip}, which is in the name of no test of {:?}",
            kernel::KERNEL_BINARIES
        );
        args.extend(["--skip".to_owned(), (*skip).to_owned()]);
    }
    Ok(args)
}

fn plan(
    root: &Path,
    built: &Built,
    archive: &Path,
    kernel: &Kernel,
    binaries: &[(String, PathBuf)],
    accel: Accel,
    filter: &[String],
) -> anyhow::Result<Plan> {
    let path = |path: &Path| path.to_str().map(str::to_owned).context("non-UTF-8 path");
    let binaries = match kernel.spec.suite_kind {
        Suite::Integration => binaries.to_vec(),
        Suite::Kernel => listed(binaries, kernel::KERNEL_BINARIES)?,
        Suite::Netkit => listed(binaries, kernel::NETKIT_BINARIES)?,
        Suite::Refusal => binaries
            .iter()
            .filter(|(name, _)| name == KERNEL_FLOOR_TEST)
            .cloned()
            .collect(),
    };
    anyhow::ensure!(
        !binaries.is_empty(),
        "no test binary to run on {}",
        kernel.spec.name
    );
    let skipping = kernel.spec.suite_kind == Suite::Kernel;
    let limits: Vec<Duration> = binaries
        .iter()
        .map(|(_, path)| accel.binary_timeout(test_count(path, skipping)))
        .collect();
    let env = vec![
        ("TESTS_DIR".to_owned(), path(&root.join("tests"))?),
        (
            "BIN_TIMEOUT".to_owned(),
            // One limit for every binary of the guest: the largest's.
            limits
                .iter()
                .max()
                .copied()
                .unwrap_or_else(|| accel.quiet_limit())
                .as_secs()
                .to_string(),
        ),
        (
            "PATH".to_owned(),
            env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        ),
        (
            "HOME".to_owned(),
            env::var("HOME").unwrap_or_else(|_| "/root".into()),
        ),
        (build::OBJECT_VAR.to_owned(), path(&built.object)?),
        ("EBPF_CNI_BIN_DIR".to_owned(), path(&built.bin_dir)?),
        ("EBPF_CNI_IMAGE".to_owned(), path(archive)?),
        // The host's open-file limits: a kernel starts init with 1024 of 4096, and a test
        // of 2,000 connections needs more.
        ("NOFILE".to_owned(), nofile()),
        // The tests' waits stretched by how much slower the guest runs.
        (
            ebpf_cni_tests::TIME_SCALE_VAR.to_owned(),
            accel.time_scale().to_string(),
        ),
        // What the test binaries' panics print.
        ("RUST_BACKTRACE".to_owned(), "0".to_owned()),
        // Whether the kernel makes netkit pairs, so that its tests cannot take the path
        // of a kernel without them by mistake.
        (
            ebpf_cni_tests::netkit::KERNEL_VAR.to_owned(),
            if kernel.configured("CONFIG_NETKIT")? {
                "y"
            } else {
                "n"
            }
            .to_owned(),
        ),
        // Whether the kernel has SCTP, so that its NetworkPolicy tests make real
        // associations there, never only raw SCTP packets.
        (
            ebpf_cni_tests::traffic::sctp::KERNEL_VAR.to_owned(),
            if kernel.configured("CONFIG_IP_SCTP")? {
                "y"
            } else {
                "n"
            }
            .to_owned(),
        ),
    ];
    // The refusal's one test runs whatever the filter: it is the only one there.
    let args = match kernel.spec.suite_kind {
        Suite::Integration | Suite::Netkit => filter.to_vec(),
        Suite::Kernel => [filter.to_vec(), kernel_skips(&binaries)?].concat(),
        Suite::Refusal => Vec::new(),
    };
    Ok(Plan {
        env,
        binaries,
        args,
        limits,
    })
}

/// The binaries of `binaries` that `names` lists; an error when one it lists is none of
/// them (renamed), which must not drop out of CI silently.
fn listed(
    binaries: &[(String, PathBuf)],
    names: &[&str],
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    for name in names {
        anyhow::ensure!(
            binaries.iter().any(|(binary, _)| binary == name),
            "a kernel's suite names {name}, which is no test binary"
        );
    }
    Ok(binaries
        .iter()
        .filter(|(name, _)| names.contains(&name.as_str()))
        .cloned()
        .collect())
}

/// `SOFT:HARD` of this process's open-file limit, for the guest's shell to take over.
fn nofile() -> String {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or_else(
        |_| "1024:4096".to_owned(),
        |(soft, hard)| format!("{soft}:{hard}"),
    )
}

/// The test that checks the daemon's refusal below Linux 5.17 (and that it starts
/// above).
const KERNEL_FLOOR_TEST: &str = "kernel_floor";

/// The integration test binaries of the tests crate, built (cargo's `--no-run`) with the
/// environment `cargo xtask test` builds them with, so nothing is built twice.
fn test_binaries(root: &Path, built: &Built) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut command = build::host_cargo(root, &built.object);
    command
        .args([
            "test",
            "-p",
            "ebpf-cni-tests",
            "--tests",
            "--no-run",
            "--message-format=json",
        ])
        .env("CARGO_INCREMENTAL", "0")
        .stderr(Stdio::inherit());
    let out = command
        .output()
        .context("cannot run cargo to list the test binaries")?;
    anyhow::ensure!(
        out.status.success(),
        "cannot build the integration test binaries ({})",
        out.status
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    let mut binaries = Vec::new();
    for line in listing.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_integration_test = message["reason"] == "compiler-artifact"
            && message["profile"]["test"] == true
            && message["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|kind| kind == "test"));
        if let (true, Some(name), Some(executable)) = (
            is_integration_test,
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            binaries.push((name.to_owned(), PathBuf::from(executable)));
        }
    }
    binaries.sort();
    anyhow::ensure!(
        !binaries.is_empty(),
        "cargo listed no integration test binary"
    );
    Ok(binaries)
}
