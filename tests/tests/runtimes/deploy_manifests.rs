//! The manifests under `deploy/` against the Kubernetes API types and the built
//! `ebpf-cnid`: every setting one the daemon accepts, every host folder it uses mounted
//! at the host's path, the node name from the downward API, the probes on the port the
//! daemon serves them, the permissions it needs and no more. No cluster runs here.

use std::{collections::BTreeMap, net::SocketAddr, path::Path};

use ebpf_cni_tests::{
    deploy::{self, Manifests},
    kubelet,
};
use k8s_openapi::{api::core::v1::Probe, apimachinery::pkg::util::intstr::IntOrString};

fn settings(manifests: &Manifests) -> &BTreeMap<String, String> {
    manifests
        .config_map
        .data
        .as_ref()
        .expect("the ConfigMap has data")
}

#[test]
fn every_setting_is_an_env_var_of_ebpf_cnid_run() {
    let manifests = deploy::load();
    let help = deploy::run_help();
    let unknown: Vec<&String> = settings(&manifests)
        .keys()
        .filter(|key| !help.env.contains_key(*key))
        .collect();
    assert!(
        unknown.is_empty(),
        "the ConfigMap sets variables `ebpf-cnid run` does not read: {unknown:?}; it reads {:?}",
        help.env.keys().collect::<Vec<_>>()
    );
    let container = manifests.container();
    for var in container.env.iter().flatten() {
        assert!(
            help.env.contains_key(&var.name),
            "the DaemonSet sets {}, which `ebpf-cnid run` does not read",
            var.name
        );
    }
    let sources = container.env_from.as_deref().unwrap_or_default();
    assert!(
        sources.iter().any(
            |source| source.config_map_ref.as_ref().is_some_and(|map| map.name
                == manifests
                    .config_map
                    .metadata
                    .name
                    .clone()
                    .unwrap_or_default())
        ),
        "the container does not take its environment from the ConfigMap"
    );
    // The image's entrypoint is ebpf-cnid: its arguments are the subcommand and flags.
    let args = container.args.as_deref().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
    for arg in args.iter().filter(|arg| arg.starts_with('-')) {
        let flag = arg.split('=').next().unwrap_or(arg);
        assert!(help.flags.contains(flag), "`ebpf-cnid run` has no {flag}");
    }
    assert_eq!(container.image.as_deref(), Some(deploy::IMAGE));
}

#[test]
fn the_node_name_comes_from_the_pods_node() {
    let manifests = deploy::load();
    let var = manifests
        .container()
        .env
        .iter()
        .flatten()
        .find(|var| var.name == "NODE_NAME")
        .expect("NODE_NAME is set");
    let field = var
        .value_from
        .as_ref()
        .and_then(|from| from.field_ref.as_ref())
        .expect("NODE_NAME comes from a field of the pod");
    assert_eq!(field.field_path, "spec.nodeName");
    assert!(
        !settings(&manifests).contains_key("NODE_NAME"),
        "the ConfigMap is the same for every node: NODE_NAME must not be in it"
    );
}

/// The host folders the daemon writes or reads, through the variable naming each: its
/// value in the ConfigMap, else its flag's default. A socket's folder is what must be
/// shared with the host (the plugin runs there).
const HOST_PATHS: [(&str, bool); 6] = [
    ("EBPF_CNID_BPF_DIR", false),
    ("EBPF_CNID_SOCKET", true),
    ("EBPF_CNID_STATE_DIR", false),
    ("EBPF_CNID_CGROUP", false),
    ("EBPF_CNID_CNI_BIN_DIR", false),
    ("EBPF_CNID_CNI_CONF_DIR", false),
];

#[test]
fn every_host_folder_the_daemon_uses_is_mounted_at_the_hosts_path() {
    let manifests = deploy::load();
    let help = deploy::run_help();
    let spec = manifests.pod_spec();
    let mounts = manifests
        .container()
        .volume_mounts
        .as_deref()
        .unwrap_or_default();
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    for (var, is_socket) in HOST_PATHS {
        let value = settings(&manifests)
            .get(var)
            .cloned()
            .or_else(|| help.env.get(var).cloned().flatten())
            .unwrap_or_else(|| {
                panic!("{var} is neither in the ConfigMap nor defaulted by the daemon")
            });
        let path = Path::new(&value);
        let path = if is_socket {
            path.parent().expect("a socket path has a folder")
        } else {
            path
        };
        let mount = mounts
            .iter()
            .filter(|mount| path.starts_with(&mount.mount_path))
            .max_by_key(|mount| mount.mount_path.len())
            .unwrap_or_else(|| panic!("{} ({var}) is not mounted", path.display()));
        let volume = volumes
            .iter()
            .find(|volume| volume.name == mount.name)
            .unwrap_or_else(|| panic!("no volume {}", mount.name));
        let host = volume
            .host_path
            .as_ref()
            .unwrap_or_else(|| panic!("{} ({var}) is not a host path", path.display()));
        assert_eq!(
            host.path, mount.mount_path,
            "{var}: the host's folder must be at its own path in the container"
        );
    }
    let bpf = mounts
        .iter()
        .find(|mount| mount.mount_path == "/sys/fs/bpf")
        .expect("bpffs is mounted");
    assert_eq!(
        bpf.mount_propagation.as_deref(),
        Some("HostToContainer"),
        "the host's bpffs must reach the container also when mounted after it started \
         (Bidirectional would need a privileged container)"
    );
    for mount in mounts {
        if mount.mount_path != "/sys/fs/cgroup" {
            assert_ne!(
                mount.read_only,
                Some(true),
                "{} is written",
                mount.mount_path
            );
        }
    }
}

#[test]
fn the_probes_ask_the_daemons_health_address_on_loopback() {
    let manifests = deploy::load();
    let settings = settings(&manifests);
    let address = |name: &str| -> SocketAddr {
        settings
            .get(name)
            .unwrap_or_else(|| panic!("the ConfigMap sets {name}"))
            .parse()
            .unwrap_or_else(|_| panic!("{name} is ADDR:PORT"))
    };
    let metrics = address("EBPF_CNID_METRICS_ADDRESS");
    assert!(
        metrics.ip().is_unspecified(),
        "Prometheus scrapes a hostNetwork pod at the node's address: {metrics} does not \
         listen on it"
    );
    let health = address("EBPF_CNID_HEALTH_ADDRESS");
    assert!(
        health.ip().is_loopback(),
        "the probes' listener must be out of the pods' reach: {health}"
    );
    let container = manifests.container();
    let target_of = |probe: Option<&Probe>, path: &str| {
        let get = probe
            .and_then(|probe| probe.http_get.as_ref())
            .unwrap_or_else(|| panic!("no HTTP probe for {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        let (host, _, port) = kubelet::probe_target(container, probe.expect("a probe"));
        (host, port)
    };
    let expected = (Some(health.ip().to_string()), health.port());
    assert_eq!(
        target_of(container.readiness_probe.as_ref(), "/readyz"),
        expected
    );
    assert_eq!(
        target_of(container.liveness_probe.as_ref(), "/healthz"),
        expected
    );
    // Scrapers that follow the prometheus.io annotations find the metrics port.
    let annotations = manifests
        .daemon_set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.metadata.as_ref())
        .and_then(|metadata| metadata.annotations.as_ref());
    if let Some(scraped) = annotations.and_then(|annotations| annotations.get("prometheus.io/port"))
    {
        assert_eq!(scraped, &metrics.port().to_string(), "prometheus.io/port");
    }
}

#[test]
fn the_cluster_role_reads_nodes_and_what_policies_need_and_nothing_else() {
    let manifests = deploy::load();
    let rules = manifests.cluster_role.rules.as_deref().unwrap_or_default();
    let mut read: Vec<(String, String)> = Vec::new();
    for rule in rules {
        assert_eq!(rule.verbs, ["get", "list", "watch"], "{rule:?}");
        assert_eq!(rule.resource_names, None, "{rule:?}");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                read.push((group.clone(), resource.clone()));
            }
        }
    }
    read.sort();
    let expected: Vec<(String, String)> = [
        ("", "namespaces"),
        ("", "nodes"),
        ("", "pods"),
        ("networking.k8s.io", "networkpolicies"),
    ]
    .into_iter()
    .map(|(group, resource)| (group.to_owned(), resource.to_owned()))
    .collect();
    assert_eq!(read, expected);

    let binding = &manifests.cluster_role_binding;
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        Some(&binding.role_ref.name),
        manifests.cluster_role.metadata.name.as_ref()
    );
    let account = &manifests.service_account.metadata;
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    assert!(
        subjects
            .iter()
            .any(|subject| subject.kind == "ServiceAccount"
                && Some(&subject.name) == account.name.as_ref()
                && subject.namespace == account.namespace),
        "the binding does not name the service account: {subjects:?}"
    );
    assert_eq!(manifests.pod_spec().service_account_name, account.name);
}

#[test]
fn the_daemon_set_runs_on_every_node_in_its_network_with_capabilities_not_privileged() {
    let manifests = deploy::load();
    let daemon_set = &manifests.daemon_set;
    assert_eq!(
        daemon_set.metadata.namespace.as_deref(),
        Some("kube-system")
    );
    assert_eq!(
        manifests.config_map.metadata.namespace.as_deref(),
        Some("kube-system")
    );
    let spec = manifests.pod_spec();
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(
        spec.tolerations
            .iter()
            .flatten()
            .any(
                |toleration| toleration.operator.as_deref() == Some("Exists")
                    && toleration.key.is_none()
                    && toleration.effect.is_none()
            ),
        "no toleration of every taint"
    );
    assert!(spec.termination_grace_period_seconds.is_some());

    let strategy = daemon_set
        .spec
        .as_ref()
        .and_then(|spec| spec.update_strategy.as_ref())
        .expect("an update strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy
            .rolling_update
            .as_ref()
            .and_then(|update| update.max_unavailable.clone()),
        Some(IntOrString::Int(1))
    );

    let container = manifests.container();
    let requests = container
        .resources
        .as_ref()
        .and_then(|resources| resources.requests.as_ref())
        .expect("resource requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
    let security = container
        .security_context
        .as_ref()
        .expect("a security context");
    assert_ne!(security.privileged, Some(true));
    let capabilities = security.capabilities.as_ref().expect("capabilities");
    assert_eq!(capabilities.drop.as_deref(), Some(&["ALL".to_owned()][..]));
    assert_eq!(
        capabilities.add.as_deref(),
        Some(
            &[
                "BPF".to_owned(),
                "PERFMON".to_owned(),
                "NET_ADMIN".to_owned()
            ][..]
        )
    );
}
