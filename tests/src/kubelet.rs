//! What kubelet asks a container runtime for when it starts the DaemonSet's pod on a
//! node, written as `podman run` arguments: read from the parsed manifests
//! ([`crate::deploy`]), never repeated here, so a test that starts the image this way
//! follows the manifests as they change. Also the probes' addresses, as kubelet reads
//! them.
//!
//! A simulated node keeps its folders elsewhere than a real node's (`/etc/cni/net.d`
//! is the machine's): [`NodeHost`] says where each volume's host path stands, and where
//! each folder the ConfigMap names stands. The manifests mount every folder at its host
//! path (04-configmap.yaml says so), and the daemon writes its socket's path into the
//! conflist for the plugin, which runs on the host: a moved folder is mounted at its new
//! path in the container too. A folder this module is not told about panics rather
//! than reach the machine's own.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::{
    api::core::v1::{Container, PodSpec, Probe},
    apimachinery::pkg::util::intstr::IntOrString,
};

use crate::deploy::Manifests;

/// Where the node's paths are for this run.
pub struct NodeHost {
    /// The node's network namespace (the pod's `hostNetwork`).
    pub netns: PathBuf,
    /// The node's name (the downward API's `spec.nodeName`).
    pub node_name: String,
    /// Each volume's host path, as the DaemonSet names it, and the path standing for it.
    pub volumes: BTreeMap<PathBuf, PathBuf>,
    /// Paths in the container's environment and the paths standing for them; a value
    /// at or under a key is moved (the longest key wins).
    pub settings: BTreeMap<PathBuf, PathBuf>,
    /// Variables set after the manifests' (what the node source needs here).
    pub extra_env: Vec<(String, String)>,
    /// Folders mounted read-only besides the manifests' (host path, container path).
    pub extra_volumes: Vec<(PathBuf, PathBuf)>,
}

/// The pod's `terminationGracePeriodSeconds` (Kubernetes' default: 30).
pub fn grace_seconds(manifests: &Manifests) -> u64 {
    let seconds = manifests
        .pod_spec()
        .termination_grace_period_seconds
        .unwrap_or(30);
    u64::try_from(seconds).expect("a grace period of zero or more")
}

/// The environment kubelet gives the container: the ConfigMap of `envFrom`, then `env`
/// (the downward API's node name), then `host.extra_env`, with paths moved.
pub fn environment(manifests: &Manifests, host: &NodeHost) -> Vec<(String, String)> {
    let container = manifests.container();
    let mounts: Vec<PathBuf> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| PathBuf::from(&mount.mount_path))
        .collect();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for source in container.env_from.iter().flatten() {
        let reference = source
            .config_map_ref
            .as_ref()
            .expect("envFrom names a ConfigMap");
        assert_eq!(
            Some(&reference.name),
            manifests.config_map.metadata.name.as_ref(),
            "envFrom names the ConfigMap under deploy/"
        );
        for (name, value) in manifests.config_map.data.iter().flatten() {
            env.insert(name.clone(), value.clone());
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => {
                let field = from
                    .field_ref
                    .as_ref()
                    .map(|field| field.field_path.as_str());
                assert_eq!(
                    field,
                    Some("spec.nodeName"),
                    "{}: only the node's name comes from the downward API here",
                    var.name
                );
                host.node_name.clone()
            }
            (None, None) => String::new(),
        };
        env.insert(var.name.clone(), value);
    }
    let mut moved: Vec<(String, String)> = env
        .into_iter()
        .map(|(name, value)| {
            let value = move_path(&name, &value, &mounts, &host.settings);
            (name, value)
        })
        .collect();
    moved.extend(host.extra_env.iter().cloned());
    moved
}

/// `value` moved by `settings` when it is a path; panics when it lies in a mounted
/// folder that `settings` does not move (it would be the machine's).
fn move_path(
    name: &str,
    value: &str,
    mounts: &[PathBuf],
    settings: &BTreeMap<PathBuf, PathBuf>,
) -> String {
    let path = Path::new(value);
    if !path.is_absolute() {
        return value.to_owned();
    }
    let moved = settings
        .iter()
        .filter(|(from, _)| path.starts_with(from))
        .max_by_key(|(from, _)| from.components().count());
    match moved {
        Some((from, to)) => {
            let rest = path.strip_prefix(from).expect("a prefix");
            // Joining an empty rest would add a trailing `/`.
            if rest.as_os_str().is_empty() {
                to.display().to_string()
            } else {
                to.join(rest).display().to_string()
            }
        }
        None => {
            assert!(
                !mounts.iter().any(|mount| path.starts_with(mount)),
                "{name}={value} is in a host folder the test does not place"
            );
            value.to_owned()
        }
    }
}

/// The arguments of `podman run` that start the DaemonSet's container as kubelet
/// would, named `name`, running `args` instead of the manifest's when given (a one-off
/// `uninstall`). What the machine needs of every container (cgroup parent, limits) is
/// the caller's to add.
pub fn podman_run_args(
    manifests: &Manifests,
    host: &NodeHost,
    name: &str,
    args: Option<&[&str]>,
) -> Vec<String> {
    let spec = manifests.pod_spec();
    let container = manifests.container();
    assert_eq!(
        spec.host_network,
        Some(true),
        "the pod is on the host network"
    );
    let mut out: Vec<String> = vec![
        "--name".into(),
        name.into(),
        "--network".into(),
        format!("ns:{}", host.netns.display()),
        // `IfNotPresent` with the image loaded: nothing is pulled (nothing could be).
        "--pull".into(),
        "never".into(),
    ];
    out.extend(security_args(container));
    out.extend(volume_args(spec, container, host));
    for (source, target) in &host.extra_volumes {
        out.extend([
            "--volume".into(),
            format!("{}:{}:ro", source.display(), target.display()),
        ]);
    }
    for (key, value) in environment(manifests, host) {
        out.extend(["--env".into(), format!("{key}={value}")]);
    }
    if let Some(command) = &container.command {
        out.extend(["--entrypoint".into(), command.join(" ")]);
    }
    out.push(
        container
            .image
            .clone()
            .expect("the container names its image"),
    );
    match args {
        Some(args) => out.extend(args.iter().map(|arg| (*arg).to_owned())),
        None => out.extend(container.args.iter().flatten().cloned()),
    }
    out
}

/// Capabilities, privilege escalation, seccomp, AppArmor, SELinux, read-only root.
fn security_args(container: &Container) -> Vec<String> {
    let mut out = Vec::new();
    let Some(context) = &container.security_context else {
        return out;
    };
    assert_ne!(
        context.privileged,
        Some(true),
        "the container is not privileged"
    );
    if let Some(capabilities) = &context.capabilities {
        for dropped in capabilities.drop.iter().flatten() {
            out.extend(["--cap-drop".into(), capability(dropped)]);
        }
        for added in capabilities.add.iter().flatten() {
            out.extend(["--cap-add".into(), capability(added)]);
        }
    }
    if context.allow_privilege_escalation == Some(false) {
        out.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    if let Some(seccomp) = &context.seccomp_profile {
        assert_eq!(seccomp.type_, "Unconfined", "only Unconfined is translated");
        out.extend(["--security-opt".into(), "seccomp=unconfined".into()]);
    }
    if let Some(apparmor) = &context.app_armor_profile {
        assert_eq!(
            apparmor.type_, "Unconfined",
            "only Unconfined is translated"
        );
        out.extend(["--security-opt".into(), "apparmor=unconfined".into()]);
    }
    if let Some(selinux) = &context.se_linux_options {
        for (key, value) in [
            ("user", &selinux.user),
            ("role", &selinux.role),
            ("type", &selinux.type_),
            ("level", &selinux.level),
        ] {
            if let Some(value) = value {
                out.extend(["--security-opt".into(), format!("label={key}:{value}")]);
            }
        }
    }
    if context.read_only_root_filesystem == Some(true) {
        // Kubelet mounts no tmpfs anywhere; podman's --read-only would.
        out.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
    }
    out
}

/// `ALL` stays; `BPF` becomes `CAP_BPF`.
fn capability(name: &str) -> String {
    if name == "ALL" {
        name.to_owned()
    } else {
        format!("CAP_{name}")
    }
}

/// One `--volume` per mount: the volume's host path as `host` places it, at the mount
/// path (moved alike when it is the host path), read-only and propagation as asked.
fn volume_args(spec: &PodSpec, container: &Container, host: &NodeHost) -> Vec<String> {
    let mut out = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == mount.name)
            .unwrap_or_else(|| panic!("no volume {}", mount.name));
        let host_path = &volume
            .host_path
            .as_ref()
            .unwrap_or_else(|| panic!("volume {} is not a hostPath", volume.name))
            .path;
        let source = host
            .volumes
            .get(Path::new(host_path))
            .unwrap_or_else(|| panic!("the test does not place the host's {host_path}"));
        let target = if mount.mount_path == *host_path {
            source.clone()
        } else {
            PathBuf::from(&mount.mount_path)
        };
        let mut options = vec![if mount.read_only == Some(true) {
            "ro"
        } else {
            "rw"
        }];
        match mount.mount_propagation.as_deref() {
            None | Some("None") => {}
            Some("HostToContainer") => options.push("rslave"),
            Some("Bidirectional") => options.push("rshared"),
            Some(other) => panic!("mountPropagation {other}"),
        }
        out.extend([
            "--volume".into(),
            format!(
                "{}:{}:{}",
                source.display(),
                target.display(),
                options.join(",")
            ),
        ]);
    }
    out
}

/// Where kubelet sends an HTTP probe: the address (the probe's `host`; `None`: the
/// pod's IP, a hostNetwork pod's being the node's address), the path, and the port (a
/// named port resolved through the container's ports).
pub fn probe_target(container: &Container, probe: &Probe) -> (Option<String>, String, u16) {
    let action = probe.http_get.as_ref().expect("an HTTP probe");
    let port = match &action.port {
        IntOrString::Int(port) => *port,
        IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|port| port.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    };
    (
        action.host.clone(),
        action.path.clone().unwrap_or_else(|| "/".into()),
        u16::try_from(port).expect("a TCP port"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> NodeHost {
        let moved = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(from, to)| (PathBuf::from(from), PathBuf::from(to)))
                .collect()
        };
        NodeHost {
            netns: PathBuf::from("/run/netns/n"),
            node_name: "node-1".into(),
            volumes: moved(&[
                ("/sys/fs/bpf", "/sys/fs/bpf"),
                ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"),
                ("/run/ebpf-cni", "/t/run"),
                ("/var/lib/ebpf-cni", "/t/state"),
                ("/opt/cni/bin", "/t/bin"),
                ("/etc/cni/net.d", "/t/net.d"),
            ]),
            settings: moved(&[
                ("/sys/fs/bpf/ebpf-cni", "/sys/fs/bpf/t"),
                ("/sys/fs/cgroup", "/sys/fs/cgroup/unified/t"),
                ("/run/ebpf-cni", "/t/run"),
                ("/var/lib/ebpf-cni", "/t/state"),
                ("/opt/cni/bin", "/t/bin"),
                ("/etc/cni/net.d", "/t/net.d"),
            ]),
            extra_env: vec![("EBPF_CNID_NODES_FILE".into(), "/t/nodes.yaml".into())],
            extra_volumes: vec![("/n".into(), "/n".into())],
        }
    }

    #[test]
    fn the_daemon_sets_container_becomes_podman_arguments_with_folders_moved() {
        let manifests = crate::deploy::load();
        let args = podman_run_args(&manifests, &host(), "cnid", None);
        let text = args.join(" ");
        for expected in [
            "--network ns:/run/netns/n",
            "--cap-drop ALL",
            "--cap-add CAP_BPF",
            "--security-opt no-new-privileges",
            "--read-only --read-only-tmpfs=false",
            "--volume /sys/fs/bpf:/sys/fs/bpf:rw,rslave",
            "--volume /sys/fs/cgroup/unified:/sys/fs/cgroup/unified:ro",
            "--volume /t/run:/t/run:rw",
            "--env EBPF_CNID_SOCKET=/t/run/ebpf-cnid.sock",
            "--env EBPF_CNID_BPF_DIR=/sys/fs/bpf/t",
            "--env EBPF_CNID_CGROUP=/sys/fs/cgroup/unified/t",
            "--env EBPF_CNID_CNI_PLUGIN=/usr/local/bin/ebpf-cni",
            "--env NODE_NAME=node-1",
            "--env EBPF_CNID_NODES_FILE=/t/nodes.yaml",
            "--volume /n:/n:ro",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        assert_eq!(args[args.len() - 2], crate::deploy::IMAGE);
        assert_eq!(args[args.len() - 1], "run");
        let once = podman_run_args(&manifests, &host(), "x", Some(&["uninstall"]));
        assert_eq!(once.last().map(String::as_str), Some("uninstall"));
    }

    #[test]
    #[should_panic(expected = "in a host folder the test does not place")]
    fn a_setting_in_a_folder_the_test_does_not_place_panics() {
        let manifests = crate::deploy::load();
        let mut host = host();
        host.settings.remove(Path::new("/sys/fs/bpf/ebpf-cni"));
        environment(&manifests, &host);
    }

    #[test]
    fn the_readiness_probe_asks_loopback() {
        let manifests = crate::deploy::load();
        let container = manifests.container();
        let probe = container
            .readiness_probe
            .as_ref()
            .expect("a readiness probe");
        assert_eq!(
            probe_target(container, probe),
            (Some("127.0.0.1".to_owned()), "/readyz".to_owned(), 9877)
        );
    }
}
