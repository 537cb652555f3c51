//! The image as a runtime sees it: loaded by podman into a store of its own (in a
//! `/run/ecni-*` folder, so nothing lands in the machine's image store), both binaries
//! run in a container, then everything removed, also when a step fails.

use std::{
    fs,
    io::Write,
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use anyhow::{Context, bail, ensure};
use ebpf_cni_tests::{
    runtimes::{
        Workdir, cleanup,
        podman::{self, BLOB_CACHE, RUNC_DEFAULT_ROOT, ULIMITS},
        require_tool,
    },
    unique_name,
};

use super::rootfs::BIN_DIR;

/// Loads `archive` (named `name`), runs `ebpf-cnid --version` and the plugin's VERSION
/// in it, and checks what they print.
pub fn run(archive: &Path, name: &str, version: &str) -> anyhow::Result<()> {
    for (program, package) in [("podman", "podman"), ("conmon", "conmon"), ("runc", "runc")] {
        require_tool(program, package);
    }
    let podman = Podman::new()?;
    let loaded = podman.ok(&["load", "--input", &archive.display().to_string()])?;
    ensure!(
        loaded.contains(name),
        "podman loaded the archive under another name than {name}: {loaded}"
    );
    eprintln!("image: podman: {loaded}");

    let out = podman.ok(&["run", "--rm", "--network", "none", name, "--version"])?;
    let expected = format!("ebpf-cnid {version}");
    ensure!(
        out.trim() == expected,
        "`ebpf-cnid --version` in the image printed {out:?}, not {expected:?}"
    );
    eprintln!("image: `ebpf-cnid --version` in a container: {out}");

    // The plugin is the other binary: VERSION needs only its libraries.
    let plugin = format!("/{BIN_DIR}/ebpf-cni");
    let out = podman.ok_with_stdin(
        &[
            "run",
            "--rm",
            "--interactive",
            "--network",
            "none",
            "--env",
            "CNI_COMMAND=VERSION",
            "--entrypoint",
            &plugin,
            name,
        ],
        br#"{"cniVersion":"1.0.0"}"#,
    )?;
    let answer: serde_json::Value = serde_json::from_str(&out)
        .with_context(|| format!("the plugin's VERSION printed no JSON: {out}"))?;
    ensure!(
        answer["supportedVersions"]
            .as_array()
            .is_some_and(|versions| versions.iter().any(|v| v == "1.0.0")),
        "the plugin's VERSION does not list 1.0.0: {answer}"
    );
    eprintln!("image: `ebpf-cni` VERSION in a container: {answer}");

    podman.ok(&["rmi", name])?;
    let left = podman.ok(&["images", "--quiet"])?;
    ensure!(left.is_empty(), "images left in the store: {left}");
    Ok(())
}

/// podman with its config, storage, run folders and runc state in one workdir.
struct Podman {
    dir: Workdir,
    cgroup_parent: String,
    made_blob_cache: bool,
    made_runc_root: bool,
}

impl Podman {
    fn new() -> anyhow::Result<Self> {
        let podman = Self {
            dir: Workdir::new("img"),
            cgroup_parent: unique_name("img"),
            made_blob_cache: !Path::new(BLOB_CACHE).exists(),
            made_runc_root: !Path::new(RUNC_DEFAULT_ROOT).exists(),
        };
        let conf = podman::containers_conf(podman.dir.path(), &podman.dir.join("cni-conf"), &[]);
        fs::write(podman.dir.join("containers.conf"), conf)
            .context("cannot write containers.conf")?;
        fs::write(
            podman.dir.join("storage.conf"),
            podman::storage_conf(podman.dir.path()),
        )
        .context("cannot write storage.conf")?;
        Ok(podman)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("podman");
        command
            .arg("--runtime-flag")
            .arg(format!("root={}", self.dir.join("runc").display()))
            .args(args.iter().take(1));
        if args.first() == Some(&"run") {
            command
                .args(ULIMITS)
                .arg("--cgroup-parent")
                .arg(format!("/{}", self.cgroup_parent));
        }
        command
            .args(args.iter().skip(1))
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"));
        command
    }

    fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run podman")?;
        checked(args, out)
    }

    fn ok_with_stdin(&self, args: &[&str], input: &[u8]) -> anyhow::Result<String> {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run podman")?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input)
                .context("cannot write podman's stdin")?;
        }
        checked(args, child.wait_with_output().context("podman")?)
    }
}

fn checked(args: &[&str], out: Output) -> anyhow::Result<String> {
    if !out.status.success() {
        bail!(
            "podman {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self
            .command(&["rm", "--all", "--force", "--time", "0"])
            .output();
        let _ = self.command(&["rmi", "--all", "--force"]).output();
        cleanup::end_processes_mentioning(
            &self.dir.path().display().to_string(),
            Duration::from_secs(5),
        );
        cleanup::remove_cgroup(&self.cgroup_parent);
        if self.made_blob_cache {
            let _ = fs::remove_dir_all(BLOB_CACHE);
        }
        if self.made_runc_root {
            let _ = fs::remove_dir(RUNC_DEFAULT_ROOT);
        }
        // The workdir (the store) unmounts what is left under it and goes with its field.
    }
}
