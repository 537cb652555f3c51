//! Debian's packages for the guests (their kernels) and for the host (the emulator),
//! found through a private apt configuration and unpacked with `dpkg-deb -x`, never
//! installed: the machine's sources and package state are left alone.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;

use crate::cmd;

const MIRROR: &str = "http://deb.debian.org/debian";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// Where the private configuration lives and which suites it reads. Opening it (which
/// downloads the package lists) waits until something is not in the cache yet.
pub struct Source {
    home: PathBuf,
    suites: Vec<&'static str>,
}

impl Source {
    /// `suites` in the order given, each once.
    pub fn new(home: PathBuf, suites: impl IntoIterator<Item = &'static str>) -> Self {
        let mut unique = Vec::new();
        for suite in suites {
            if !unique.contains(&suite) {
                unique.push(suite);
            }
        }
        Self {
            home,
            suites: unique,
        }
    }

    /// apt with its sources, lists and archives under the home folder and no package
    /// state (so nothing of the machine's own packages counts), the lists fresh.
    pub fn open(&self) -> anyhow::Result<Apt> {
        let lists = self.home.join("lists");
        let cache = self.home.join("cache");
        fs::create_dir_all(lists.join("partial"))?;
        fs::create_dir_all(cache.join("archives/partial"))?;
        let sources = self.home.join("sources.list");
        let text: String = self
            .suites
            .iter()
            .map(|suite| format!("deb [signed-by={KEYRING}] {MIRROR} {suite} main\n"))
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
        let apt = Apt {
            options: options
                .into_iter()
                .flat_map(|option| ["-o".to_owned(), option])
                .collect(),
        };
        cmd::run(apt.command("apt-get").args(["update", "-q"]))
            .with_context(|| format!("cannot read Debian's package lists ({MIRROR})"))?;
        Ok(apt)
    }
}

/// An opened [`Source`].
pub struct Apt {
    options: Vec<String>,
}

impl Apt {
    /// `program` (`apt-get`, `apt-cache`) with the private configuration.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.args(&self.options);
        command
    }

    /// The version of `package` that `suite` carries.
    pub fn version_in(&self, package: &str, suite: &str) -> anyhow::Result<String> {
        let madison = cmd::output(self.command("apt-cache").args(["madison", package]))
            .with_context(|| format!("apt-cache madison {package} failed"))?;
        // `linux-image-amd64 | 6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages`
        madison
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
            .with_context(|| format!("{suite} has no {package}:\n{madison}"))
    }

    /// Downloads `package` at `version` and unpacks it into `root` (created if need be).
    pub fn unpack(&self, package: &str, version: &str, root: &Path) -> anyhow::Result<()> {
        let debs = root.with_extension("debs");
        let _ = fs::remove_dir_all(&debs);
        fs::create_dir_all(&debs)?;
        cmd::run(self.command("apt-get").current_dir(&debs).args([
            "download",
            "-q",
            &format!("{package}={version}"),
        ]))?;
        let deb = fs::read_dir(&debs)?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", debs.display()))?;
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(root))?;
        fs::remove_dir_all(&debs)?;
        Ok(())
    }
}
