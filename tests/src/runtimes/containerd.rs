//! containerd (Debian's 1.6) in a node's network namespace, with its own config, root,
//! state, sockets and CNI folders in one [`Workdir`], the locally built pause image
//! imported, and the CRI plugin driven by the test as kubelet. Stopped, with every pod,
//! shim, mount, namespace, cgroup and cache entry it made, on drop.

use std::{
    fs,
    net::Ipv4Addr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::{
    RuntimePod, Workdir, cleanup, cni_bin_dir,
    cri::{Cri, SandboxStatus, sandbox_config},
    image, require_tool, write_conflist,
};
use crate::{netns::Netns, node::Node, unique_name};

/// The sandbox image's name (`sandbox_image`), imported from the local archive.
pub const PAUSE_IMAGE: &str = "ecni.local/pause:1";
/// The CRI namespace of containerd.
const NAMESPACE: &str = "k8s.io";
/// How long containerd may take to answer, and to exit on SIGTERM.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Containerd {
    dir: Workdir,
    node: PathBuf,
    network: String,
    /// The pods' cgroup parent (cgroupfs driver), `ecni-<pid>-<n>-pods` in every
    /// hierarchy.
    cgroup_parent: String,
    process: Option<Child>,
    cri: Option<Cri>,
}

impl Containerd {
    /// Starts containerd inside `node` (its daemon serving the conflist's network) and
    /// imports the pause image; panics when it cannot.
    pub fn start(node: &Node) -> Self {
        for (program, package) in [
            ("containerd", "containerd"),
            ("ctr", "containerd"),
            ("containerd-shim-runc-v2", "containerd"),
            ("runc", "runc"),
        ] {
            require_tool(program, package);
        }
        let dir = Workdir::new("ctd");
        cni_bin_dir(&dir.folder("cni-bin"));
        write_conflist(node, &dir.folder("cni-conf"));
        dir.folder("logs");
        let mut containerd = Self {
            node: node.netns.path(),
            network: node.network.name.clone(),
            cgroup_parent: unique_name("pods"),
            process: None,
            cri: None,
            dir,
        };
        fs::write(containerd.config_path(), containerd.config())
            .expect("cannot write containerd's config");
        containerd.launch();

        let archive = containerd.dir.join("pause.tar");
        image::write_oci_archive(&archive, PAUSE_IMAGE);
        let import = Command::new("ctr")
            .arg("--address")
            .arg(containerd.socket())
            .args(["-n", NAMESPACE, "images", "import"])
            .arg(&archive)
            .output()
            .expect("cannot run ctr");
        assert!(
            import.status.success(),
            "ctr images import failed: {}",
            String::from_utf8_lossy(&import.stderr)
        );
        // The CRI plugin learns of the image from containerd's events: wait until it
        // does, or RunPodSandbox would try to pull it.
        let deadline = Instant::now() + START_TIMEOUT;
        while !containerd.cri().has_image(PAUSE_IMAGE).unwrap_or(false) {
            assert!(
                Instant::now() < deadline,
                "the CRI does not list {PAUSE_IMAGE} after its import:\n{}",
                containerd.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
        containerd
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    /// The config: everything under the workdir, the pods' namespaces too (so that a
    /// failed test's are unmounted with it); cgroupfs; `restrict_oom_score_adj` (runc
    /// cannot set the pause process's `oom_score_adj` without CAP_SYS_RESOURCE, which
    /// this machine lacks); overlayfs; one CNI folder of binaries and one of conflists;
    /// snapshotters that cannot work here disabled (they only log errors).
    fn config(&self) -> String {
        let dir = |name: &str| self.dir.join(name).display().to_string();
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.opt",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
            root = dir("root"),
            state = dir("state"),
            socket = self.socket().display(),
            runc = dir("runc"),
            bin = dir("cni-bin"),
            conf = dir("cni-conf"),
        )
    }

    /// Spawns containerd in the node's namespace (nsenter, which keeps the host's
    /// mounts: bpffs, cgroups) and waits until the CRI answers.
    fn launch(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("cannot open containerd's log");
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.node.display()))
            .arg("--")
            .arg("containerd")
            .arg("--config")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("cannot start containerd");
        self.process = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .process
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten())
            {
                panic!("containerd exited ({status}):\n{}", self.log());
            }
            let error = match Cri::connect(&self.socket()) {
                Ok(cri) => match cri.version() {
                    Ok(_) => {
                        self.cri = Some(cri);
                        return;
                    }
                    Err(status) => status.to_string(),
                },
                Err(error) => error,
            };
            assert!(
                Instant::now() < deadline,
                "containerd's CRI did not answer within {START_TIMEOUT:?} ({error}):\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, and waits for the exit (SIGKILL after [`STOP_TIMEOUT`]); the pods'
    /// shims and processes keep running, as on a node whose containerd restarts.
    pub fn stop(&mut self) {
        self.cri = None;
        let Some(mut child) = self.process.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// [`Self::stop`], then starts again with the same config and folders.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// containerd's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Child::id)
    }

    /// The CRI client of the running containerd.
    pub fn cri(&self) -> &Cri {
        self.cri.as_ref().expect("containerd is not running")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// Everything containerd logged (all its runs).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// RunPodSandbox for a pod `name` with TCP hostPorts (host, container), then its
    /// status; returns the pod, or the runtime's error (with the log's tail).
    pub fn try_run_pod(&self, name: &str, host_ports: &[(u16, u16)]) -> Result<RuntimePod, String> {
        let log_dir = self.dir.folder(&format!("logs/{name}"));
        let config = sandbox_config(
            name,
            &log_dir,
            &format!("/{}", self.cgroup_parent),
            host_ports,
        );
        let id = self
            .cri()
            .run_pod(config)
            .map_err(|status| format!("RunPodSandbox {name}: {}", status.message()))?;
        let status = self
            .pod_status(&id)
            .map_err(|status| format!("PodSandboxStatus {name}: {}", status.message()))?;
        let netns_path = status
            .netns
            .ok_or_else(|| format!("no network namespace in {name}'s verbose status"))?;
        if !status.ready {
            return Err(format!("{name} is not ready"));
        }
        let ip: Ipv4Addr = status
            .ip
            .parse()
            .map_err(|_| format!("{name} has no IPv4 address: {:?}", status.ip))?;
        Ok(RuntimePod {
            id,
            ip,
            netns: Netns::existing(&netns_path),
            netns_path,
        })
    }

    /// Like [`Self::try_run_pod`]; panics when the runtime refuses.
    pub fn run_pod(&self, name: &str, host_ports: &[(u16, u16)]) -> RuntimePod {
        self.try_run_pod(name, host_ports).unwrap_or_else(|error| {
            panic!("{error}\ncontainerd's log ends with:\n{}", self.log_tail())
        })
    }

    pub fn pod_status(&self, id: &str) -> Result<SandboxStatus, tonic::Status> {
        self.cri().pod_status(id)
    }

    /// StopPodSandbox; panics when it fails.
    pub fn stop_pod(&self, id: &str) {
        if let Err(status) = self.cri().stop_pod(id) {
            panic!(
                "StopPodSandbox {id}: {}\n{}",
                status.message(),
                self.log_tail()
            );
        }
    }

    /// RemovePodSandbox; panics when it fails.
    pub fn remove_pod(&self, id: &str) {
        if let Err(status) = self.cri().remove_pod(id) {
            panic!(
                "RemovePodSandbox {id}: {}\n{}",
                status.message(),
                self.log_tail()
            );
        }
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// What the workdir's shims listen on: each bundle's `address` file names a socket
    /// in /run/containerd/s, outside the workdir.
    fn shim_sockets(&self) -> Vec<PathBuf> {
        let tasks = self
            .dir
            .join("state")
            .join("io.containerd.runtime.v2.task")
            .join(NAMESPACE);
        fs::read_dir(tasks)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|bundle| fs::read_to_string(bundle.path().join("address")).ok())
            .filter_map(|address| address.trim().strip_prefix("unix://").map(PathBuf::from))
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // The runtime's own cleanup first: it runs CNI DEL and removes what it made.
        if let Some(cri) = &self.cri {
            for id in cri.list_pods().unwrap_or_default() {
                let _ = cri.stop_pod(&id);
                let _ = cri.remove_pod(&id);
            }
        }
        self.stop();
        // Then whatever a failure left: shims (their command line names the socket),
        // the pods' processes (in the cgroup parent), shim sockets, cache entries.
        let sockets = self.shim_sockets();
        cleanup::end_processes_mentioning(&self.dir.path().display().to_string(), Duration::ZERO);
        cleanup::remove_cgroup(&self.cgroup_parent);
        for socket in sockets {
            let _ = fs::remove_file(socket);
        }
        cleanup::remove_cni_cache(&self.network);
        // The workdir unmounts what is left under it (rootfs, shm, the pods'
        // namespaces) and goes when its field drops.
    }
}
