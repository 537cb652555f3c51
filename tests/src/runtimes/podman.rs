//! podman (Debian's 4.3, CNI backend) in a node's network namespace: its config,
//! storage, run and lock folders, runc state and (unless given others) CNI folders in
//! one [`Workdir`], the locally built image loaded. Every container and image, with
//! what they left on the host, is removed on drop.

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::Mutex,
    time::Duration,
};

use super::{RuntimePod, Workdir, cleanup, cni_bin_dir, image, require_tool, write_conflist};
use crate::{netns::Netns, node::Node, unique_name};

/// The image's name (from the archive's annotations).
pub const IMAGE: &str = "ecni.local/pause:1";
/// Where rootful podman keeps c/image's blob info cache, whatever its config says
/// (`podman load` writes it).
pub const BLOB_CACHE: &str = "/var/lib/containers";
/// runc's default state folder, which the cleanup podman that conmon runs when a
/// container exits creates (its command line does not carry `--runtime-flag`).
pub const RUNC_DEFAULT_ROOT: &str = "/run/runc";
/// How long conmon's exit command (`podman container cleanup`) may take to finish
/// after a removal, before what is left is killed.
const CLEANUP_GRACE: Duration = Duration::from_secs(5);
/// Resource limits set on every container: podman's defaults (nofile and nproc at
/// 1048576) are above this machine's hard limits, which runc may not raise.
pub const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

pub struct Podman {
    dir: Workdir,
    node: PathBuf,
    network: String,
    /// The CNI config folder and the plugin folders podman is pointed at.
    cni_conf_dir: PathBuf,
    cni_plugin_dirs: Vec<PathBuf>,
    /// The containers' cgroup parent (cgroupfs), `ecni-<pid>-<n>-pods`.
    cgroup_parent: String,
    /// The containers' namespaces seen, removed on drop if podman left them.
    netns: Mutex<Vec<PathBuf>>,
    /// The containers started, whose libcni cache entries are removed on drop.
    ids: Mutex<Vec<String>>,
    /// Whether [`BLOB_CACHE`] and [`RUNC_DEFAULT_ROOT`] were absent before this
    /// instance (then removed on drop, the latter if empty).
    made_blob_cache: bool,
    made_runc_root: bool,
}

/// Where a podman instance finds its CNI networks and plugins.
pub struct CniFolders {
    /// The network its containers join (a conflist's name in `conf_dir`).
    pub network: String,
    pub conf_dir: PathBuf,
    /// libcni's plugin path, searched in order.
    pub plugin_dirs: Vec<PathBuf>,
}

impl Podman {
    /// Configures podman for `node`'s network (the conflist's name, written by the
    /// test with the project's plugin) and loads the image.
    pub fn new(node: &Node) -> Self {
        let dir = Workdir::new("pod");
        let bin = dir.folder("cni-bin");
        cni_bin_dir(&bin);
        let conf = dir.folder("cni-conf");
        write_conflist(node, &conf);
        let cni = CniFolders {
            network: node.network.name.clone(),
            conf_dir: conf,
            plugin_dirs: vec![bin],
        };
        Self::in_dir(dir, &node.netns, cni)
    }

    /// podman in the network namespace `node`, on the network and folders of `cni`
    /// (folders someone else fills: a daemon installing its conflist), with the image
    /// loaded.
    pub fn on_node(node: &Netns, cni: CniFolders) -> Self {
        Self::in_dir(Workdir::new("pod"), node, cni)
    }

    fn in_dir(dir: Workdir, node: &Netns, cni: CniFolders) -> Self {
        for (program, package) in [("podman", "podman"), ("conmon", "conmon"), ("runc", "runc")] {
            require_tool(program, package);
        }
        let podman = Self {
            node: node.path(),
            network: cni.network,
            cni_conf_dir: cni.conf_dir,
            cni_plugin_dirs: cni.plugin_dirs,
            cgroup_parent: unique_name("pods"),
            netns: Mutex::new(Vec::new()),
            ids: Mutex::new(Vec::new()),
            made_blob_cache: !Path::new(BLOB_CACHE).exists(),
            made_runc_root: !Path::new(RUNC_DEFAULT_ROOT).exists(),
            dir,
        };
        fs::write(podman.dir.join("containers.conf"), podman.containers_conf())
            .expect("cannot write containers.conf");
        fs::write(podman.dir.join("storage.conf"), podman.storage_conf())
            .expect("cannot write storage.conf");
        let archive = podman.dir.join("image.tar");
        image::write_oci_archive(&archive, IMAGE);
        podman.load(&archive);
        podman
    }

    /// `podman load` of the archive at `path`; returns the names it loaded.
    pub fn load(&self, path: &Path) -> Vec<String> {
        let archive = path.display().to_string();
        let out = self.ok(&["load", "--input", &archive]);
        // `Loaded image: a` or `Loaded image(s): a,b`.
        out.lines()
            .filter(|line| line.starts_with("Loaded image"))
            .filter_map(|line| line.split_once(": ").map(|(_, names)| names))
            .flat_map(|names| names.split(','))
            .map(|name| name.trim().to_owned())
            .collect()
    }

    fn containers_conf(&self) -> String {
        containers_conf(self.dir.path(), &self.cni_conf_dir, &self.cni_plugin_dirs)
    }

    fn storage_conf(&self) -> String {
        storage_conf(self.dir.path())
    }

    /// `podman <args>` inside the node's namespace, with this instance's config; runc
    /// keeps its state in the workdir too (it has no config key: a runtime flag).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.node.display()))
            .arg("--")
            .arg("podman")
            .arg("--runtime-flag")
            .arg(format!("root={}", self.dir.join("runc").display()))
            .args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"));
        command
    }

    /// Runs `podman <args>`, whatever its outcome.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("cannot run podman")
    }

    /// Runs `podman <args>`; panics with its stderr when it fails; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `podman run --detach <args>` with what every container needs on this machine
    /// (the instance's cgroup parent, resource limits podman may set); returns the
    /// container's id, or podman's error.
    pub fn run_detached(&self, args: &[String]) -> Result<String, String> {
        let parent = format!("/{}", self.cgroup_parent);
        let mut all: Vec<&str> = vec!["run", "--detach", "--cgroup-parent", &parent];
        all.extend(ULIMITS);
        all.extend(args.iter().map(String::as_str));
        let out = self.run(&all);
        if !out.status.success() {
            return Err(format!(
                "podman run failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if let Ok(mut ids) = self.ids.lock() {
            ids.push(id.clone());
        }
        Ok(id)
    }

    /// `podman run -d` of the image on the node's network, with a TCP hostPort for each
    /// (host, container) port of `host_ports`; returns the container as podman inspects
    /// it, or podman's error.
    pub fn try_run(&self, host_ports: &[(u16, u16)]) -> Result<RuntimePod, String> {
        let mut args: Vec<String> = vec!["--network".into(), self.network.clone()];
        for (host, container) in host_ports {
            args.extend(["--publish".to_owned(), format!("{host}:{container}/tcp")]);
        }
        args.push(IMAGE.to_owned());
        let id = self.run_detached(&args)?;
        let inspect: serde_json::Value = serde_json::from_str(&self.ok(&["inspect", &id]))
            .map_err(|error| format!("podman inspect printed no JSON: {error}"))?;
        let settings = &inspect[0]["NetworkSettings"];
        let netns_path = settings["SandboxKey"]
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| format!("no SandboxKey: {settings}"))?;
        if let Ok(mut seen) = self.netns.lock() {
            seen.push(netns_path.clone());
        }
        let ip: Ipv4Addr = settings["Networks"][&self.network]["IPAddress"]
            .as_str()
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| format!("no IPv4 address on {}: {settings}", self.network))?;
        Ok(RuntimePod {
            id,
            ip,
            netns: Netns::existing(&netns_path),
            netns_path,
        })
    }

    /// Notes the namespaces of every container podman has (for [`Drop`]).
    fn record_namespaces(&self) {
        let out = self.run(&["ps", "--all", "--quiet", "--no-trunc"]);
        let ids = String::from_utf8_lossy(&out.stdout).into_owned();
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if ids.is_empty() {
            return;
        }
        let mut args = vec!["inspect", "--format", "{{.NetworkSettings.SandboxKey}}"];
        args.extend(ids);
        let out = self.run(&args);
        if let Ok(mut seen) = self.netns.lock() {
            seen.extend(
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(PathBuf::from),
            );
        }
    }

    /// `podman rm --force --time 0`: stops at once (the pause exits on TERM anyway).
    pub fn remove(&self, id: &str) {
        self.ok(&["rm", "--force", "--time", "0", id]);
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // podman's own cleanup first (CNI DEL, unmounts), then whatever it left:
        // conmon and the containers' processes, cgroups, namespaces, cache entries.
        self.record_namespaces();
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        cleanup::end_processes_mentioning(&self.dir.path().display().to_string(), CLEANUP_GRACE);
        cleanup::remove_cgroup(&self.cgroup_parent);
        if let Ok(seen) = self.netns.lock() {
            for path in seen.iter() {
                cleanup::remove_netns(path);
            }
        }
        if let Ok(ids) = self.ids.lock() {
            cleanup::remove_cni_cache_of(&self.network, &ids);
        }
        if self.made_blob_cache {
            let _ = fs::remove_dir_all(BLOB_CACHE);
        }
        if self.made_runc_root {
            let _ = fs::remove_dir(RUNC_DEFAULT_ROOT);
        }
        // The workdir unmounts what is left under it and goes when its field drops.
    }
}

/// The engine's config of a podman whose folders are under `dir`: the CNI backend with
/// `cni_conf_dir` and `plugin_dirs` (podman's default plugin path when empty), runc with cgroupfs (this machine has no systemd),
/// file events and locks, and the run folder in `dir`.
pub fn containers_conf(dir: &Path, cni_conf_dir: &Path, plugin_dirs: &[PathBuf]) -> String {
    let path = |name: &str| dir.join(name).display().to_string();
    format!(
        r#"[containers]
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{events}"
lock_type = "file"
runtime = "runc"
tmp_dir = "{tmp}"
volume_path = "{volumes}"

[network]
network_backend = "cni"
{bin}network_config_dir = "{conf}"
"#,
        events = path("events.log"),
        tmp = path("tmp"),
        volumes = path("volumes"),
        // podman refuses an empty list: none at all means its defaults.
        bin = if plugin_dirs.is_empty() {
            String::new()
        } else {
            let dirs: Vec<String> = plugin_dirs
                .iter()
                .map(|dir| format!("\"{}\"", dir.display()))
                .collect();
            format!("cni_plugin_dirs = [{}]\n", dirs.join(", "))
        },
        conf = cni_conf_dir.display(),
    )
}

/// The storage config of a podman whose image store and run root are under `dir`.
pub fn storage_conf(dir: &Path) -> String {
    format!(
        "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
        dir.join("root").display(),
        dir.join("runroot").display()
    )
}
