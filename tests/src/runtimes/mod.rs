//! Real container runtimes on a simulated node ([`Node`]): containerd driven through
//! the CRI as kubelet drives it, and podman with its CNI backend, both executing the
//! real `ebpf-cni` from a conflist the test writes. Each runtime instance keeps its
//! config, storage, state and sockets in one folder of its own (`/run/ecni-...`), and
//! its guard removes everything it made, also what lands outside that folder (shim
//! sockets, libcni's cache, pod namespaces, cgroups), on success, failure and panic.
//!
//! `image` builds the image both use (nothing can be pulled here), `cleanup` finds
//! what a runtime leaves on the host, `cri` is the kubelet side of the CRI, and
//! `containerd` and `podman` own one runtime each.

pub mod cleanup;
#[cfg(feature = "cri")]
pub mod containerd;
#[cfg(feature = "cri")]
pub mod cri;
pub mod image;
pub mod podman;

use std::{
    fs,
    net::Ipv4Addr,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use crate::{bins, cni::REFERENCE_PLUGINS, netns::Netns, node::Node, unique_name};

/// A runtime's folder, `/run/ecni-<pid>-<n>-<tag>` (short, as unix socket paths must
/// be; a stale one is removed by [`crate::sweep_stale`]); removed on drop, after
/// whatever is mounted under it.
pub struct Workdir {
    path: PathBuf,
}

impl Workdir {
    pub fn new(tag: &str) -> Self {
        let path = PathBuf::from("/run").join(unique_name(tag));
        fs::create_dir_all(&path)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", path.display()));
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside the folder.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Creates the folder `name` inside and returns it.
    pub fn folder(&self, name: &str) -> PathBuf {
        let folder = self.join(name);
        fs::create_dir_all(&folder)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", folder.display()));
        folder
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        cleanup::unmount_under(&self.path);
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Panics, naming the Debian package, unless `program` is on PATH: a test that needs a
/// runtime fails loudly without it.
pub fn require_tool(program: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!("`{program}` is not installed: install {package} (`cargo xtask setup`)")
        })
}

/// Fills `dir` as a runtime's single CNI plugin folder: the project's `ebpf-cni`, and
/// the reference `host-local` and `loopback` (the runtimes set up every pod's `lo`
/// with it).
pub fn cni_bin_dir(dir: &Path) {
    let plugins = [
        ("ebpf-cni", bins::path("ebpf-cni")),
        (
            "host-local",
            Path::new(REFERENCE_PLUGINS).join("host-local"),
        ),
        ("loopback", Path::new(REFERENCE_PLUGINS).join("loopback")),
    ];
    for (name, target) in plugins {
        assert!(
            target.is_file(),
            "{} is missing: install containernetworking-plugins (`cargo xtask setup`)",
            target.display()
        );
        symlink(&target, dir.join(name))
            .unwrap_or_else(|error| panic!("cannot link {name} into {}: {error}", dir.display()));
    }
}

/// The node's network as a conflist (cniVersion 1.0.0, the newest podman's libcni
/// reads) that asks the runtime for `portMappings`.
pub fn conflist(node: &Node) -> Value {
    let version = "1.0.0";
    let mut plugin = node.network.config(version);
    if let Some(fields) = plugin.as_object_mut() {
        fields.remove("cniVersion");
        fields.remove("name");
    }
    plugin["capabilities"] = json!({ "portMappings": true });
    json!({
        "cniVersion": version,
        "name": node.network.name,
        "plugins": [plugin],
    })
}

/// Writes [`conflist`] into `dir`.
pub fn write_conflist(node: &Node, dir: &Path) {
    let path = dir.join("10-ebpf-cni.conflist");
    let text = serde_json::to_string_pretty(&conflist(node)).expect("the conflist encodes");
    fs::write(&path, text)
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
}

/// A pod (or podman container) as its runtime reported it.
pub struct RuntimePod {
    pub id: String,
    pub ip: Ipv4Addr,
    /// The runtime's namespace for it (the runtime removes it).
    pub netns: Netns,
    pub netns_path: PathBuf,
}

/// The external host reaches an echo server in `pod` (on `container_port`) through the
/// node's address and `host_port`.
pub fn assert_host_port_serves(node: &Node, pod: &Netns, host_port: u16, container_port: u16) {
    let _server = crate::traffic::EchoServer::start(pod, container_port);
    let message = format!("through hostPort {host_port}");
    let back = crate::traffic::round_trip(
        &node.external,
        crate::node::socket(crate::node::NODE_ADDR, host_port),
        message.as_bytes(),
    )
    .unwrap_or_else(|error| panic!("hostPort {host_port} does not answer from outside: {error}"));
    assert_eq!(back, message.as_bytes());
}

/// Whether one ping from `from` to `to` is answered within two seconds.
pub fn ping(from: &Netns, to: &str) -> bool {
    from.run("ping", &["-c", "1", "-W", "2", to])
        .status
        .success()
}

/// Whether `ip` is inside `subnet` (`a.b.c.d/len`).
pub fn in_subnet(ip: Ipv4Addr, subnet: &str) -> bool {
    let (network, len) = subnet.split_once('/').expect("a CIDR subnet");
    let network: Ipv4Addr = network.parse().expect("an IPv4 subnet");
    let len: u32 = len.parse().expect("a prefix length");
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(network) & mask
}

/// Panics unless the node holds nothing of any pod: no host veth, no host-local
/// allocation, no endpoint or hostPort in the daemon, no libcni cache entry, and none of
/// `netns` still mounted.
pub fn assert_nothing_left(node: &Node, netns: &[&Path]) {
    assert_eq!(node.host_veths(), Vec::<String>::new(), "host veths left");
    assert_eq!(
        node.network.allocated(),
        Vec::<String>::new(),
        "host-local allocations left"
    );
    assert_eq!(
        node.instance.cli_json(&["endpoints"]),
        json!([]),
        "endpoints left"
    );
    assert_eq!(
        node.instance.cli_json(&["ports"]),
        json!([]),
        "hostPorts left"
    );
    assert_eq!(
        cleanup::cni_cache_entries(&node.network.name),
        Vec::<PathBuf>::new(),
        "libcni cache entries left"
    );
    for path in netns {
        assert!(!path.exists(), "pod namespace {} left", path.display());
    }
}
