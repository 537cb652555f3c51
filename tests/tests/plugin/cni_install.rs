//! The CNI configuration a DaemonSet's daemon installs (`ebpf-cnid run --cni-conf-dir
//! --cni-bin-dir`): the plugin and `05-ebpf-cni.conflist` appear whole and only once
//! the daemon serves, carry the node's settings, work with the real plugin, stay as
//! they are across a restart, and `uninstall --cni-conf-dir` removes the conflist and
//! nothing else.

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    bins,
    cluster::NodesFile,
    cni::{Call, REFERENCE_PLUGINS, first_ip},
    daemon::{Daemon, Instance, eventually},
    http,
    netns::Netns,
    node::{NODE_ADDR, external_host},
    require_root,
    runtimes::in_subnet,
    scaled, unique_name,
};
use serde_json::{Value, json};

const POD_CIDR: &str = "10.244.71.0/24";
const CONFLIST: &str = "05-ebpf-cni.conflist";

/// The host's CNI folders, standing in for /etc/cni/net.d and /opt/cni/bin, with
/// another network's conflist already there; removed on drop.
struct HostDirs {
    root: PathBuf,
    conf: PathBuf,
    bin: PathBuf,
}

impl HostDirs {
    fn new() -> Self {
        let root = PathBuf::from("/run").join(unique_name("cni-host"));
        let (conf, bin) = (root.join("net.d"), root.join("bin"));
        fs::create_dir_all(&conf).expect("the config folder");
        fs::create_dir_all(&bin).expect("the bin folder");
        fs::write(conf.join("10-other.conflist"), OTHER).expect("another conflist");
        Self { root, conf, bin }
    }

    fn conflist(&self) -> PathBuf {
        self.conf.join(CONFLIST)
    }

    /// The daemon flags that install into these folders.
    fn flags(&self) -> Vec<String> {
        vec![
            "--cni-conf-dir".into(),
            self.conf.display().to_string(),
            "--cni-bin-dir".into(),
            self.bin.display().to_string(),
        ]
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

const OTHER: &str = r#"{"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "bridge"}]}"#;

/// A node namespace with an uplink and a nodes file naming it `node-1` with
/// [`POD_CIDR`].
struct Host {
    netns: Netns,
    _external: Netns,
    nodes: NodesFile,
}

impl Host {
    fn new() -> Self {
        let netns = Netns::new("node");
        let external = external_host(&netns);
        let nodes = NodesFile::new(&[("node-1", NODE_ADDR, &[POD_CIDR])]);
        Self {
            netns,
            _external: external,
            nodes,
        }
    }

    fn start(&self, instance: &Instance, dirs: &HostDirs) -> Daemon {
        let mut flags: Vec<String> = vec!["--node-name".into(), "node-1".into()];
        flags.extend(self.nodes.flags().map(str::to_owned));
        flags.extend(dirs.flags());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Daemon::start_with(&self.netns, instance, &[], &flags)
    }

    fn wait_ready(&self) {
        assert!(
            eventually(Duration::from_secs(10), || {
                http::get(&self.netns, "/readyz").status == 200
            }),
            "never ready: {:?}",
            http::get(&self.netns, "/readyz")
        );
    }
}

/// What a watcher saw whenever it found the conflist: whether the daemon's socket
/// answered then, and whether the plugin was in place, whole.
struct Sighting {
    socket_answered: bool,
    plugin_whole: bool,
    conflist_whole: bool,
}

/// Polls the config folder until the conflist appears (or `stop`, after one last
/// look), then checks at once what must already hold.
fn watch(
    dirs: &HostDirs,
    socket: &Path,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Option<Sighting>> {
    let (conflist, plugin, socket) = (
        dirs.conflist(),
        dirs.bin.join("ebpf-cni"),
        socket.to_owned(),
    );
    thread::spawn(move || {
        // The daemon's start, stretched like every wait of a slow (emulated) run.
        // `stop` comes once the daemon is ready, which it is only after the install:
        // the look taken after `stop` is seen is the last, and must find the file.
        let deadline = Instant::now() + scaled(Duration::from_secs(30));
        loop {
            let last = stop.load(Ordering::Relaxed) || Instant::now() >= deadline;
            if let Ok(text) = fs::read(&conflist) {
                let socket_answered =
                    cni_api::call(&socket, &cni_api::Request::Status, Duration::from_secs(2))
                        .is_ok();
                let plugin_whole = fs::read(&plugin).is_ok_and(|bytes| {
                    bytes == fs::read(bins::path("ebpf-cni")).unwrap_or_default()
                });
                let conflist_whole = serde_json::from_slice::<Value>(&text).is_ok();
                return Some(Sighting {
                    socket_answered,
                    plugin_whole,
                    conflist_whole,
                });
            }
            if last {
                return None;
            }
            thread::sleep(Duration::from_millis(2));
        }
    })
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("listed")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn the_conflist_appears_whole_once_the_daemon_serves_and_the_real_plugin_takes_it() {
    require_root();
    let host = Host::new();
    let dirs = HostDirs::new();
    let instance = Instance::new();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(&dirs, &instance.socket, Arc::clone(&stop));
    let _daemon = host.start(&instance, &dirs);
    host.wait_ready();
    stop.store(true, Ordering::Relaxed);
    let seen = watcher
        .join()
        .expect("the watcher")
        .expect("the conflist appeared");
    assert!(seen.conflist_whole, "the conflist was seen half written");
    assert!(
        seen.socket_answered,
        "the conflist came before the socket served"
    );
    assert!(
        seen.plugin_whole,
        "the conflist came before the plugin was in place"
    );

    assert_eq!(names_in(&dirs.conf), [CONFLIST, "10-other.conflist"]);
    assert_eq!(
        fs::read_to_string(dirs.conf.join("10-other.conflist")).expect("read"),
        OTHER
    );
    assert_eq!(names_in(&dirs.bin), ["ebpf-cni"], "no temporary left");
    let mode = fs::metadata(dirs.bin.join("ebpf-cni"))
        .expect("the plugin")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);

    let conflist: Value =
        serde_json::from_slice(&fs::read(dirs.conflist()).expect("read")).expect("JSON");
    assert_eq!(conflist["cniVersion"], "1.0.0");
    assert_eq!(conflist["name"], "ebpf-cni");
    let plugin = &conflist["plugins"][0];
    assert_eq!(plugin["type"], "ebpf-cni");
    // The overlay's 50 bytes off the uplink's 1500 (`--routing vxlan`, the default).
    assert_eq!(plugin["mtu"], 1450, "{conflist}");
    assert_eq!(plugin["capabilities"]["portMappings"], true);
    assert_eq!(plugin["ipam"]["ranges"][0][0]["subnet"], "usePodCidr");
    assert_eq!(plugin["daemonSocket"], json!(instance.socket));

    // The runtime's view: libcni gives each plugin the list's name and version. Only
    // host-local's data folder is moved out of the machine's /var/lib/cni.
    let mut network = plugin.clone();
    network["cniVersion"] = conflist["cniVersion"].clone();
    network["name"] = conflist["name"].clone();
    network["ipam"]["dataDir"] = json!(dirs.root.join("ipam"));
    let cni_path = format!("{}:{REFERENCE_PLUGINS}", dirs.bin.display());
    let pod = Netns::new("pod");
    let added = Call::new("ADD", "installed", "eth0", Some(&pod), &network)
        .var("CNI_PATH", &cni_path)
        .run_plugin(&host.netns, &dirs.bin.join("ebpf-cni"))
        .ok();
    let ip = first_ip(&added);
    assert!(in_subnet(ip, POD_CIDR), "{ip} is in the node's pod range");
    let link: Value = serde_json::from_str(&pod.ip(&["-j", "link", "show", "dev", "eth0"]))
        .expect("ip -j prints JSON");
    assert_eq!(link[0]["mtu"], 1450, "the pod's MTU is the conflist's");
    Call::new("DEL", "installed", "eth0", Some(&pod), &network)
        .var("CNI_PATH", &cni_path)
        .run_plugin(&host.netns, &dirs.bin.join("ebpf-cni"))
        .ok();
}

#[test]
fn a_restart_leaves_the_files_alone_and_uninstall_removes_only_the_conflist() {
    require_root();
    let host = Host::new();
    let dirs = HostDirs::new();
    let instance = Instance::new();
    let mut daemon = host.start(&instance, &dirs);
    host.wait_ready();
    let identity = |path: &Path| {
        let meta = fs::metadata(path).expect("installed");
        (meta.ino(), meta.mtime_nsec(), fs::read(path).expect("read"))
    };
    let conflist = identity(&dirs.conflist());
    let plugin = identity(&dirs.bin.join("ebpf-cni"));

    assert!(daemon.stop(), "the daemon stops cleanly");
    assert!(
        dirs.conflist().exists(),
        "a stopped daemon leaves the conflist for its pods"
    );
    let _restarted = host.start(&instance, &dirs);
    host.wait_ready();
    assert!(
        instance
            .log()
            .matches("CNI configuration installed")
            .count()
            >= 2,
        "both starts installed: {}",
        instance.log()
    );
    assert!(
        identity(&dirs.conflist()) == conflist,
        "the restart replaced an equal conflist"
    );
    assert!(
        identity(&dirs.bin.join("ebpf-cni")) == plugin,
        "the restart replaced an equal plugin"
    );
    drop(_restarted);

    let conf = dirs.conf.display().to_string();
    let out = instance.cli(&["uninstall", "--cni-conf-dir", &conf]);
    assert!(out.status.success(), "uninstall: {out:?}");
    assert_eq!(names_in(&dirs.conf), ["10-other.conflist"]);
    assert_eq!(
        fs::read_to_string(dirs.conf.join("10-other.conflist")).expect("read"),
        OTHER
    );
    assert!(
        dirs.bin.join("ebpf-cni").exists(),
        "the plugin stays for the DEL of pods it made"
    );
}

#[test]
fn an_install_that_fails_keeps_the_daemon_serving_unready_until_it_succeeds() {
    require_root();
    let host = Host::new();
    let dirs = HostDirs::new();
    // The config folder is a file: nothing can be written into it.
    fs::remove_dir_all(&dirs.conf).expect("removed");
    fs::write(&dirs.conf, "not a folder").expect("a file in its place");
    let instance = Instance::new();
    let _daemon = host.start(&instance, &dirs);
    assert!(
        eventually(Duration::from_secs(10), || {
            http::get(&host.netns, "/readyz")
                .body
                .contains("installing the CNI configuration failed")
        }),
        "the failure is not the reason: {:?}",
        http::get(&host.netns, "/readyz")
    );
    assert_eq!(http::get(&host.netns, "/readyz").status, 503);
    assert!(
        instance.cli(&["status"]).status.success(),
        "the daemon still serves"
    );

    fs::remove_file(&dirs.conf).expect("removed");
    fs::create_dir_all(&dirs.conf).expect("the folder");
    // The next attempt, within its 10 s retry.
    assert!(
        eventually(Duration::from_secs(20), || http::get(
            &host.netns,
            "/readyz"
        )
        .status
            == 200),
        "never ready after the folder came: {:?}",
        http::get(&host.netns, "/readyz")
    );
    assert!(dirs.conflist().exists());
}

#[test]
fn installing_without_a_node_source_is_refused_before_anything_is_loaded() {
    require_root();
    let netns = Netns::new("node");
    let instance = Instance::new();
    let dirs = HostDirs::new();
    let out = netns
        .command(bins::path("ebpf-cnid"))
        .args(instance.flags())
        .arg("run")
        .args(dirs.flags())
        .output()
        .expect("ebpf-cnid runs");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--cni-conf-dir needs a node source"),
        "{stderr}"
    );
    assert!(!instance.bpf_dir.exists(), "nothing was loaded");
    assert_eq!(names_in(&dirs.conf), ["10-other.conflist"]);
}
