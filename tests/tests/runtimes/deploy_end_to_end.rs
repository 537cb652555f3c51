//! The DaemonSet on a simulated node, end to end: the image `cargo xtask image --profile
//! dev` writes is started with podman as kubelet would start the DaemonSet's pod
//! (`kubelet::podman_run_args`, read from deploy/: the node's network namespace as the
//! host network, the container's arguments, the ConfigMap's environment and the node's
//! name, its capabilities and security options, read-only root, its host folders);
//! once its conflist appears, podman as the node's runtime (CNI backend, pointed at the
//! config and bin folders the daemon installed into) starts containers that get an
//! address from the node's pod range, reach each other and serve a hostPort; the
//! daemon's container is then replaced by a new one from the same image (an upgrade)
//! while two TCP streams into a container keep flowing, and a new container starts
//! afterwards; last, the pods are removed and the DaemonSet's pod is run once with
//! `uninstall`, as docs/install.md's removal says.
//!
//! Differences from a cluster, all forced by the machine and said where they are made:
//! - the node's pod range comes from a nodes file (`EBPF_CNID_NODES_FILE`, in a
//!   per-test folder mounted into the container) instead of the Kubernetes API the
//!   manifests use in a cluster;
//! - the host folders the DaemonSet mounts are per-test folders (`/run/ecni-*`) for
//!   `/etc/cni/net.d`, `/opt/cni/bin`, `/run/ebpf-cni` and `/var/lib/ebpf-cni`, mounted
//!   at their own path in the container and named so in the environment (the manifests
//!   mount every folder at its host path); bpffs and the cgroup v2 mount are the
//!   machine's, with a per-test pin folder and cgroup (this machine's cgroup v2 is at
//!   `/sys/fs/cgroup/unified`: docs/install.md's setting for such hosts);
//! - host-local keeps its allocations in the machine's `/var/lib/cni/networks/ebpf-cni`
//!   (the installed conflist names no other): this test removes what it made there.

use std::{
    collections::BTreeMap,
    fs,
    net::Ipv4Addr,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    bins,
    cgroup::{self, Cgroup},
    cluster::NodesFile,
    cni::{REFERENCE_PLUGINS, veths},
    daemon::eventually,
    deploy::{self, Manifests},
    http,
    kubelet::{self, NodeHost},
    netns::Netns,
    node::{NODE_ADDR, external_host, socket},
    oci, require_root,
    runtimes::{
        RuntimePod, Workdir, in_subnet, ping,
        podman::{CniFolders, Podman},
    },
    traffic::{EchoServer, Stream, round_trip},
};
use serde_json::Value;

const NODE_NAME: &str = "node-1";
const POD_CIDR: &str = "10.244.191.0/24";
const CONTAINER_PORT: u16 = 8080;
const HOST_PORT: u16 = 30191;
/// What the daemon installs: the network's name and file (cni-daemon's `install`).
const NETWORK: &str = "ebpf-cni";
const CONFLIST: &str = "05-ebpf-cni.conflist";
/// How long a started daemon container may take to install its conflist, and to
/// answer its readiness probe.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// host-local's default data folder, where the installed conflist's IPAM keeps its
/// allocations (one file per address, named after it).
const HOST_LOCAL_DATA: &str = "/var/lib/cni/networks";

#[test]
fn the_image_run_as_the_daemon_set_networks_a_runtimes_containers_across_an_upgrade() {
    require_root();
    let manifests = deploy::load();
    let archive = image_of_this_build();

    let node = Netns::new("node");
    let external = external_host(&node);
    // What docs/install.md asks of a node (kubeadm's preflight too): /proc/sys is read-only
    // in the container, so the daemon cannot turn forwarding on itself.
    let forwarding = node.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    assert!(forwarding.status.success(), "sysctl: {forwarding:?}");
    let nodes = NodesFile::new(&[(NODE_NAME, NODE_ADDR, &[POD_CIDR])]);
    let host = HostFolders::new();
    let _host_local = HostLocalData::new(POD_CIDR);
    let podman = Podman::on_node(
        &node,
        CniFolders {
            network: NETWORK.into(),
            conf_dir: host.conf.clone(),
            plugin_dirs: vec![host.bin.clone()],
        },
    );
    let loaded = podman.load(&archive);
    let container = manifests.container();
    assert_eq!(
        loaded,
        [container.image.clone().expect("an image")],
        "the archive holds the image the DaemonSet runs"
    );
    let agent = Kubelet {
        manifests: &manifests,
        podman: &podman,
        node: &node,
        host: host.node_host(&node, &nodes),
    };

    // The DaemonSet's pod starts; the node's network becomes ready.
    let daemon = agent.start("cnid-1");
    agent.wait_for_conflist(&daemon, &host);
    agent.wait_ready(&daemon);
    assert_eq!(agent.probe(false), Some(200), "the liveness probe answers");
    let installed: Value =
        serde_json::from_slice(&fs::read(host.conf.join(CONFLIST)).expect("the conflist"))
            .expect("the conflist is JSON");
    assert_eq!(installed["name"], NETWORK, "{installed}");
    assert_eq!(
        installed["plugins"][0]["daemonSocket"],
        host.run.join("ebpf-cnid.sock").display().to_string(),
        "the plugin finds the socket at the host's path"
    );
    assert_eq!(
        fs::read(host.bin.join("ebpf-cni")).expect("the installed plugin"),
        fs::read(bins::path("ebpf-cni")).expect("the built plugin"),
        "the plugin installed into the host's bin folder is the image's"
    );
    // `kubectl exec <pod> -- ebpf-cnid status` (docs/install.md's check): the container's
    // environment names the instance.
    let status = podman.ok(&["exec", &daemon, "ebpf-cnid", "status", "--output", "json"]);
    let status: Value = serde_json::from_str(&status).expect("status prints JSON");
    assert_eq!(
        status["bpf_dir"],
        host.bpf_dir.display().to_string(),
        "{status}"
    );
    assert!(
        fs::read_dir(&host.bpf_dir).is_ok_and(|mut pins| pins.next().is_some()),
        "the daemon pinned into the test's folder"
    );

    // The runtime starts containers on the installed network.
    let a = run_pod(&podman, &[(HOST_PORT, CONTAINER_PORT)]);
    let b = run_pod(&podman, &[]);
    assert!(ping(&a.netns, &b.ip.to_string()), "a reaches b");
    assert!(ping(&b.netns, &a.ip.to_string()), "b reaches a");
    let _server = EchoServer::start(&a.netns, CONTAINER_PORT);
    let through_port = socket(NODE_ADDR, HOST_PORT);
    let back = round_trip(&external, through_port, b"hostPort")
        .unwrap_or_else(|error| panic!("hostPort {HOST_PORT} from outside: {error}"));
    assert_eq!(back, b"hostPort");

    // The upgrade: the pod is deleted (SIGTERM, the grace period), a new one starts
    // from the same image, while a pod-to-pod and a hostPort stream keep flowing.
    let pod_stream = Stream::start(&b.netns, socket(&a.ip.to_string(), CONTAINER_PORT));
    let port_stream = Stream::start(&external, through_port);
    let streams = [("pod to pod", &pod_stream), ("hostPort", &port_stream)];
    assert_flowing(&streams, "before the upgrade", || agent.logs(&daemon));
    agent.delete(&daemon);
    assert_eq!(agent.probe(true), None, "no daemon answers");
    assert_flowing(&streams, "while no daemon runs", String::new);
    let daemon = agent.start("cnid-2");
    agent.wait_ready(&daemon);
    assert_flowing(&streams, "after the upgrade", || {
        format!("{}\n{}", agent.logs(&daemon), node.ip(&["-s", "link"]))
    });
    let c = run_pod(&podman, &[]);
    assert!(
        ping(&c.netns, &a.ip.to_string()),
        "a container started after the upgrade reaches a"
    );
    pod_stream
        .finish()
        .expect("the pod-to-pod stream never broke");
    port_stream
        .finish()
        .expect("the hostPort stream never broke");

    // Removal, as docs/install.md says: the pods go (DEL, the daemon answering), then the
    // DaemonSet, then its pod runs once with `uninstall`.
    for pod in [&c, &b, &a] {
        podman.remove(&pod.id);
    }
    let endpoints = podman.ok(&[
        "exec",
        &daemon,
        "ebpf-cnid",
        "endpoints",
        "--output",
        "json",
    ]);
    let endpoints: Value = serde_json::from_str(&endpoints).expect("endpoints prints JSON");
    assert_eq!(endpoints, Value::Array(Vec::new()), "endpoints left");
    let pod_veths: Vec<String> = veths(&node)
        .into_iter()
        .filter(|name| name.starts_with("veb"))
        .collect();
    assert_eq!(pod_veths, Vec::<String>::new(), "host veths left");
    agent.delete(&daemon);
    agent.run_once("cnid-uninstall", &["uninstall"]);
    assert!(!host.bpf_dir.exists(), "uninstall left the pins");
    assert!(
        !host.conf.join(CONFLIST).exists(),
        "uninstall left the conflist"
    );
    assert!(
        host.bin.join("ebpf-cni").exists(),
        "the plugin stays for DELs of pods it made"
    );
    assert_eq!(names_in(&host.state), Vec::<String>::new(), "state left");
    assert_eq!(
        names_in(&host.run),
        Vec::<String>::new(),
        "socket folder left"
    );
}

/// The debug build's image archive, checked to hold the binaries this test was built
/// with (an older archive would test older code).
fn image_of_this_build() -> PathBuf {
    let archive = deploy::dev_image_archive();
    assert!(
        archive.is_file(),
        "{} is missing: run `cargo xtask image --profile dev` (`cargo xtask test` writes it)",
        archive.display()
    );
    let names = ["ebpf-cnid", "ebpf-cni"];
    let paths: Vec<String> = names
        .iter()
        .map(|name| format!("usr/local/bin/{name}"))
        .collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    for (name, in_image) in names.iter().zip(oci::files_in_archive(&archive, &paths)) {
        assert!(
            in_image == fs::read(bins::path(name)).ok(),
            "the image's {name} is not this build's: run `cargo xtask image --profile dev`"
        );
    }
    archive
}

/// The host's folders for the DaemonSet's volumes and settings, each per test: the CNI
/// config and bin folders (the latter holding the reference plugins a node's
/// `/opt/cni/bin` has), the socket and state folders, a pin folder on the machine's
/// bpffs and a cgroup. All removed on drop, the pins first.
struct HostFolders {
    conf: PathBuf,
    bin: PathBuf,
    run: PathBuf,
    state: PathBuf,
    bpf_dir: PathBuf,
    cgroup: Cgroup,
    _root: Workdir,
}

impl HostFolders {
    fn new() -> Self {
        let root = Workdir::new("e2e");
        let bin = root.folder("opt-cni-bin");
        for plugin in ["host-local", "loopback"] {
            let target = Path::new(REFERENCE_PLUGINS).join(plugin);
            assert!(
                target.is_file(),
                "{} is missing: install containernetworking-plugins",
                target.display()
            );
            symlink(&target, bin.join(plugin)).expect("a reference plugin linked");
        }
        Self {
            conf: root.folder("etc-cni-net.d"),
            run: root.folder("run-ebpf-cni"),
            state: root.folder("var-lib-ebpf-cni"),
            bpf_dir: PathBuf::from("/sys/fs/bpf").join(ebpf_cni_tests::unique_name("e2e")),
            cgroup: Cgroup::new(),
            bin,
            _root: root,
        }
    }

    /// Where the node's paths stand for kubelet's translation.
    fn node_host(&self, node: &Netns, nodes: &NodesFile) -> NodeHost {
        let cgroup2 = cgroup::mount_point().expect("a cgroup v2 mount");
        let folders = [
            ("/etc/cni/net.d", &self.conf),
            ("/opt/cni/bin", &self.bin),
            ("/run/ebpf-cni", &self.run),
            ("/var/lib/ebpf-cni", &self.state),
        ];
        let mut volumes: BTreeMap<PathBuf, PathBuf> = folders
            .iter()
            .map(|(host, here)| (PathBuf::from(host), (*here).clone()))
            .collect();
        let mut settings = volumes.clone();
        volumes.insert("/sys/fs/bpf".into(), "/sys/fs/bpf".into());
        volumes.insert("/sys/fs/cgroup".into(), cgroup2.clone());
        settings.insert("/sys/fs/bpf/ebpf-cni".into(), self.bpf_dir.clone());
        settings.insert("/sys/fs/cgroup".into(), self.cgroup.path().to_owned());
        let nodes_dir = nodes.path().parent().expect("the nodes file's folder");
        NodeHost {
            netns: node.path(),
            node_name: NODE_NAME.into(),
            volumes,
            settings,
            extra_env: vec![(
                "EBPF_CNID_NODES_FILE".into(),
                nodes.path().display().to_string(),
            )],
            extra_volumes: vec![(nodes_dir.to_owned(), nodes_dir.to_owned())],
        }
    }
}

impl Drop for HostFolders {
    fn drop(&mut self) {
        // Removing the pins detaches what they hold (the uplink's and the cgroup's
        // links); the node's namespace takes the rest.
        let _ = fs::remove_dir_all(&self.bpf_dir);
        // The cgroup and the folders go with their fields.
    }
}

/// host-local's allocations of this test's range in its default data folder: files
/// named after an address of the range (and the folders, if this test made them) are
/// removed on drop.
struct HostLocalData {
    network_dir: PathBuf,
    made: Vec<PathBuf>,
    range: String,
}

impl HostLocalData {
    fn new(range: &str) -> Self {
        let network_dir = Path::new(HOST_LOCAL_DATA).join(NETWORK);
        let made = [Path::new(HOST_LOCAL_DATA), &network_dir]
            .into_iter()
            .filter(|dir| !dir.exists())
            .map(Path::to_owned)
            .collect();
        Self {
            network_dir,
            made,
            range: range.to_owned(),
        }
    }
}

impl Drop for HostLocalData {
    fn drop(&mut self) {
        for name in names_in(&self.network_dir) {
            if name
                .parse::<Ipv4Addr>()
                .is_ok_and(|ip| in_subnet(ip, &self.range))
            {
                let _ = fs::remove_file(self.network_dir.join(name));
            }
        }
        // A folder this test made goes whole (host-local's lock and last address).
        if self.made.contains(&self.network_dir) {
            let _ = fs::remove_dir_all(&self.network_dir);
        }
        for dir in self.made.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// Kubelet's side: the DaemonSet's pod started, probed and deleted with podman.
struct Kubelet<'a> {
    manifests: &'a Manifests,
    podman: &'a Podman,
    node: &'a Netns,
    host: NodeHost,
}

impl Kubelet<'_> {
    /// Starts the DaemonSet's container as `name`; returns its id.
    fn start(&self, name: &str) -> String {
        let args = kubelet::podman_run_args(self.manifests, &self.host, name, None);
        self.podman
            .run_detached(&args)
            .unwrap_or_else(|error| panic!("the DaemonSet's container: {error}"))
    }

    /// Runs the DaemonSet's container once with `args` instead of its own; panics with
    /// its logs unless it exits 0.
    fn run_once(&self, name: &str, args: &[&str]) {
        let run_args = kubelet::podman_run_args(self.manifests, &self.host, name, Some(args));
        let id = self
            .podman
            .run_detached(&run_args)
            .unwrap_or_else(|error| panic!("{args:?}: {error}"));
        let code = self.podman.ok(&["wait", &id]);
        assert_eq!(code, "0", "{args:?} failed: {}", self.logs(&id));
        self.podman.ok(&["rm", &id]);
    }

    /// What the container logged.
    fn logs(&self, id: &str) -> String {
        let out = self.podman.run(&["logs", id]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Whether the container runs (`podman inspect`'s state).
    fn running(&self, id: &str) -> bool {
        self.podman
            .ok(&["inspect", "--format", "{{.State.Running}}", id])
            == "true"
    }

    /// Waits until the conflist is in the host's config folder; panics with the
    /// container's logs when it stops or the time is up.
    fn wait_for_conflist(&self, id: &str, host: &HostFolders) {
        let conflist = host.conf.join(CONFLIST);
        let deadline = Instant::now() + START_TIMEOUT;
        while !conflist.exists() {
            assert!(
                self.running(id),
                "the daemon's container stopped before installing:\n{}",
                self.logs(id)
            );
            assert!(
                Instant::now() < deadline,
                "no {CONFLIST} within {START_TIMEOUT:?}:\n{}",
                self.logs(id)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The readiness (or liveness) probe's answer, as kubelet sends it to a
    /// hostNetwork pod: to the probe's host (else the node's address), at its port and
    /// path, from the node's namespace; `None` when nothing answers.
    fn probe(&self, readiness: bool) -> Option<u16> {
        let container = self.manifests.container();
        let probe = if readiness {
            container.readiness_probe.as_ref()
        } else {
            container.liveness_probe.as_ref()
        };
        let (host, path, port) = kubelet::probe_target(container, probe.expect("a probe"));
        let host = host.unwrap_or_else(|| NODE_ADDR.to_owned());
        http::get_at(
            self.node,
            &format!("{host}:{port}"),
            &path,
            Duration::from_secs(2),
        )
        .ok()
        .map(|answer| answer.status)
    }

    /// Waits until the readiness probe gets a 200.
    fn wait_ready(&self, id: &str) {
        assert!(
            eventually(START_TIMEOUT, || self.probe(true) == Some(200)),
            "the daemon never became ready ({:?}):\n{}",
            self.probe(true),
            self.logs(id)
        );
    }

    /// Deletes the pod as kubelet does: SIGTERM, at most the grace period, then the
    /// container goes; the daemon must have exited by itself, cleanly.
    fn delete(&self, id: &str) {
        let grace = kubelet::grace_seconds(self.manifests).to_string();
        self.podman.ok(&["stop", "--time", &grace, id]);
        let code = self
            .podman
            .ok(&["inspect", "--format", "{{.State.ExitCode}}", id]);
        assert_eq!(
            code,
            "0",
            "the daemon did not stop cleanly on SIGTERM:\n{}",
            self.logs(id)
        );
        self.podman.ok(&["rm", id]);
    }
}

/// A container of the runtime on the installed network, with its address checked to
/// be in the node's pod range.
fn run_pod(podman: &Podman, host_ports: &[(u16, u16)]) -> RuntimePod {
    let pod = podman
        .try_run(host_ports)
        .unwrap_or_else(|error| panic!("a container on {NETWORK}: {error}"));
    assert!(
        in_subnet(pod.ip, POD_CIDR),
        "{} is outside {POD_CIDR}",
        pod.ip
    );
    pod
}

/// Panics unless every stream echoes more within five seconds, with `context` (the
/// daemon's logs).
fn assert_flowing(streams: &[(&str, &Stream)], when: &str, context: impl Fn() -> String) {
    for (name, stream) in streams {
        let before = stream.echoed();
        assert!(
            eventually(Duration::from_secs(5), || stream.echoed() > before),
            "the {name} stream stopped {when}:\n{}",
            context()
        );
    }
}

/// The names in a folder (none when it is gone).
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
