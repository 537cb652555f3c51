//! The guests' kernels: Debian's own `linux-image-*-amd64` packages, found through a
//! private apt configuration (the machine's sources and package state are left alone),
//! unpacked with `dpkg-deb -x` (never installed) and given a `modules.dep` by `depmod`,
//! cached under the tools folder like bpf-linker.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

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
    /// Only the kernel-floor test: the kernel is older than the README's floor, so the
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

const MIRROR: &str = "http://deb.debian.org/debian";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

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
pub fn get(cache: &Path, spec: Spec) -> anyhow::Result<Kernel> {
    let home = cache.join(format!("kernel-{}", spec.name));
    let ready = home.join("ready");
    if let Ok(text) = fs::read_to_string(&ready)
        && let Some((version, release)) = text.trim().split_once(' ')
    {
        return Ok(unpacked(&home, spec, version, release));
    }
    let apt = Apt::new(&cache.join("apt"))?;
    let (package, version) = apt.image_package(spec.suite)?;
    eprintln!(
        "vm-test: downloading {package} {version} from {}",
        spec.suite
    );
    let _ = fs::remove_dir_all(&home);
    let debs = home.join("deb");
    fs::create_dir_all(&debs)?;
    cmd::run(apt.command("apt-get").current_dir(&debs).args([
        "download",
        "-q",
        &format!("{package}={version}"),
    ]))?;
    let deb = fs::read_dir(&debs)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", debs.display()))?;
    let root = home.join("root");
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    fs::remove_dir_all(&debs)?;
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

/// apt with a configuration of its own: the suites' sources, lists and archives in a
/// cache folder, no package state (so nothing of the machine's own packages counts).
struct Apt {
    options: Vec<String>,
}

impl Apt {
    fn new(home: &Path) -> anyhow::Result<Self> {
        let lists = home.join("lists");
        let cache = home.join("cache");
        fs::create_dir_all(lists.join("partial"))?;
        fs::create_dir_all(cache.join("archives/partial"))?;
        let sources = home.join("sources.list");
        let text: String = KERNELS
            .iter()
            .map(|spec| format!("deb [signed-by={KEYRING}] {MIRROR} {} main\n", spec.suite))
            .collect();
        fs::write(&sources, text)?;
        let path = |path: &Path| path.to_string_lossy().into_owned();
        let options = [
            format!("Dir::Etc::SourceList={}", path(&sources)),
            "Dir::Etc::SourceParts=/nonexistent".to_owned(),
            format!("Dir::State::Lists={}", path(&lists)),
            // Its own package cache too: the machine's would be rebuilt from these lists.
            format!("Dir::Cache={}", path(&cache)),
            "Dir::State::status=/dev/null".to_owned(),
            "APT::Architecture=amd64".to_owned(),
            "APT::Architectures::=amd64".to_owned(),
            // The download lands in a root-owned folder that the `_apt` user cannot
            // write; apt would warn and download as root anyway.
            "APT::Sandbox::User=root".to_owned(),
        ];
        let apt = Self {
            options: options
                .into_iter()
                .flat_map(|option| ["-o".to_owned(), option])
                .collect(),
        };
        cmd::run(apt.command("apt-get").args(["update", "-q"]))
            .context("cannot read Debian's package lists for the VM kernels")?;
        Ok(apt)
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.args(&self.options);
        command
    }

    /// The versioned image package that `suite`'s `linux-image-amd64` depends on, and
    /// that package's version in the suite.
    fn image_package(&self, suite: &str) -> anyhow::Result<(String, String)> {
        let madison = cmd::output(
            self.command("apt-cache")
                .args(["madison", "linux-image-amd64"]),
        )
        .context("apt-cache madison linux-image-amd64 failed")?;
        // `linux-image-amd64 | 6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages`
        let meta_version = madison
            .lines()
            .map(|line| line.split('|').map(str::trim).collect::<Vec<_>>())
            .find(|fields| {
                fields.get(2).is_some_and(|source| {
                    source
                        .split_whitespace()
                        .nth(1)
                        .is_some_and(|part| part.split('/').next() == Some(suite))
                })
            })
            .and_then(|fields| fields.get(1).map(|version| (*version).to_owned()))
            .with_context(|| format!("{suite} has no linux-image-amd64:\n{madison}"))?;
        let depends = cmd::output(
            self.command("apt-cache")
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
