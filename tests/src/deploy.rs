//! The Kubernetes manifests under `deploy/`, read as the API server reads them: each file
//! one object, parsed into its k8s-openapi type with unknown fields refused (the API
//! server drops or refuses them; either way a misspelt field would do nothing); and what
//! `ebpf-cnid run --help` says the daemon accepts, to hold the manifests to it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, Container, PodSpec, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde::de::DeserializeOwned;

use crate::bins;

/// The image the DaemonSet runs, as `cargo xtask image` names it by default.
pub const IMAGE: &str = concat!("ebpf-cni.local/ebpf-cni:", env!("CARGO_PKG_VERSION"));

/// The archive `cargo xtask image --profile <profile>` writes by default, under the
/// workspace `root`.
pub fn image_archive(root: &Path, profile: &str) -> PathBuf {
    root.join("target").join("image").join(format!(
        "ebpf-cni-{}-{profile}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// The debug build's image archive: `EBPF_CNI_IMAGE` (`cargo xtask test` writes it and
/// sets it), else where `cargo xtask image --profile dev` writes it.
pub fn dev_image_archive() -> PathBuf {
    std::env::var_os("EBPF_CNI_IMAGE").map_or_else(
        || image_archive(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."), "dev"),
        PathBuf::from,
    )
}

/// The folder of the manifests.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every object `kubectl apply -f deploy/` creates, one of each kind.
pub struct Manifests {
    pub service_account: ServiceAccount,
    pub cluster_role: ClusterRole,
    pub cluster_role_binding: ClusterRoleBinding,
    pub config_map: ConfigMap,
    pub daemon_set: DaemonSet,
}

impl Manifests {
    /// The DaemonSet's pod template.
    pub fn pod_spec(&self) -> &PodSpec {
        self.daemon_set
            .spec
            .as_ref()
            .and_then(|spec| spec.template.spec.as_ref())
            .expect("the DaemonSet has a pod template")
    }

    /// The pod's one container, ebpf-cnid.
    pub fn container(&self) -> &Container {
        let containers = &self.pod_spec().containers;
        assert_eq!(containers.len(), 1, "the DaemonSet runs one container");
        &containers[0]
    }
}

/// Reads every `*.yaml` of [`dir`]; panics naming the file on a parse error, an unknown
/// field, an unexpected kind, or a kind present twice or missing.
pub fn load() -> Manifests {
    let mut texts: BTreeMap<String, (PathBuf, String)> = BTreeMap::new();
    let entries =
        fs::read_dir(dir()).unwrap_or_else(|error| panic!("cannot list deploy/: {error}"));
    for entry in entries {
        let path = entry.expect("a deploy/ entry").path();
        if path.extension().and_then(|ext| ext.to_str()) != Some("yaml") {
            continue;
        }
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
        let kind = kind_of(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        if let Some((earlier, _)) = texts.insert(kind.clone(), (path.clone(), text)) {
            panic!("{kind} twice: {} and {}", earlier.display(), path.display());
        }
    }
    let mut take = |kind: &str| {
        texts
            .remove(kind)
            .unwrap_or_else(|| panic!("no {kind} under deploy/"))
    };
    let manifests = Manifests {
        service_account: typed(take("ServiceAccount")),
        cluster_role: typed(take("ClusterRole")),
        cluster_role_binding: typed(take("ClusterRoleBinding")),
        config_map: typed(take("ConfigMap")),
        daemon_set: typed(take("DaemonSet")),
    };
    let unexpected: Vec<&String> = texts.keys().collect();
    assert!(
        unexpected.is_empty(),
        "unexpected kinds under deploy/: {unexpected:?}"
    );
    manifests
}

fn typed<T: DeserializeOwned>((path, text): (PathBuf, String)) -> T {
    parse(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The `kind` of one YAML document.
fn kind_of(text: &str) -> Result<String, String> {
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|error| error.to_string())?;
    value["kind"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| "no kind".to_owned())
}

/// One YAML document as `T`; a field `T` does not have is an error naming its path.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|error| error.to_string())?;
    let mut unknown = Vec::new();
    // serde_ignored writes `?` for each Option on the way; the YAML has no such level.
    let typed = serde_ignored::deserialize(value, |path| {
        unknown.push(path.to_string().replace(".?", ""));
    })
    .map_err(|error: serde_json::Error| error.to_string())?;
    if unknown.is_empty() {
        Ok(typed)
    } else {
        Err(format!("unknown fields: {}", unknown.join(", ")))
    }
}

/// The capabilities the DaemonSet's container adds (`BPF`, ...), in its order.
pub fn added_capabilities(manifests: &Manifests) -> Vec<String> {
    manifests
        .container()
        .security_context
        .as_ref()
        .and_then(|context| context.capabilities.as_ref())
        .and_then(|capabilities| capabilities.add.clone())
        .unwrap_or_default()
}

/// What `ebpf-cnid run --help` lists: the flags, and per environment variable the
/// default of its flag (if it has one).
#[derive(Debug, Default)]
pub struct Help {
    pub flags: BTreeSet<String>,
    pub env: BTreeMap<String, Option<String>>,
}

/// `ebpf-cnid run --help` of the built binary, with no `EBPF_CNID_*` set (clap would show
/// their values in place of nothing).
pub fn run_help() -> Help {
    let out = Command::new(bins::path("ebpf-cnid"))
        .args(["run", "--help"])
        .env_clear()
        .output()
        .expect("cannot run ebpf-cnid");
    assert!(
        out.status.success(),
        "ebpf-cnid run --help failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

/// Reads clap's help: a flag's line starts with `-x, --name` or `--name`; its
/// `[env: NAME=]` and `[default: VALUE]` end its description, on that line (clap's two
/// columns) or a later one.
pub fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut flag: Option<String> = None;
    let mut envs_of_flag: Vec<String> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let first = line.split_whitespace().next().unwrap_or("");
        let long = if first.starts_with("--") {
            Some(first)
        } else if first.starts_with('-') && first.ends_with(',') {
            line.split_whitespace().nth(1)
        } else {
            None
        };
        if let Some(long) = long {
            let name = long.split(['=', ' ']).next().unwrap_or(long).to_owned();
            help.flags.insert(name.clone());
            flag = Some(name);
            envs_of_flag.clear();
        }
        if flag.is_none() {
            continue;
        }
        if let Some(rest) = line.split_once("[env: ").map(|(_, rest)| rest)
            && let Some((name, _)) = rest.split_once('=')
        {
            help.env.insert(name.to_owned(), None);
            envs_of_flag.push(name.to_owned());
        }
        if let Some(rest) = line.split_once("[default: ").map(|(_, rest)| rest)
            && let Some((value, _)) = rest.split_once(']')
        {
            for name in &envs_of_flag {
                help.env.insert(name.clone(), Some(value.to_owned()));
            }
        }
    }
    help
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELP: &str = "\
Load and pin the datapath

Usage: ebpf-cnid run [OPTIONS]

Options:
      --bpf-dir <BPF_DIR>
          bpffs folder holding this instance's pinned maps.

          [env: EBPF_CNID_BPF_DIR=]
          [default: /sys/fs/bpf/ebpf-cni]

      --cgroup <CGROUP>
          cgroup v2 folder [env: EBPF_CNID_CGROUP=]

Cluster:
      --node-name <NODE_NAME>  This node's name: `NODE_NAME` [env: NODE_NAME=]
      --vxlan-vni <VXLAN_VNI>  VNI [env: EBPF_CNID_VXLAN_VNI=] [default: 1]

  -h, --help
          Print help (see a summary with '-h')
";

    #[test]
    fn help_gives_flags_env_vars_and_defaults() {
        let help = parse_help(HELP);
        assert_eq!(
            help.flags,
            BTreeSet::from([
                "--bpf-dir".into(),
                "--cgroup".into(),
                "--help".into(),
                "--node-name".into(),
                "--vxlan-vni".into(),
            ])
        );
        assert_eq!(
            help.env,
            BTreeMap::from([
                (
                    "EBPF_CNID_BPF_DIR".into(),
                    Some("/sys/fs/bpf/ebpf-cni".into())
                ),
                ("EBPF_CNID_CGROUP".into(), None),
                ("EBPF_CNID_VXLAN_VNI".into(), Some("1".into())),
                ("NODE_NAME".into(), None),
            ])
        );
    }

    #[test]
    fn an_unknown_field_is_refused_with_its_path() {
        let text = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  namespce: b\n";
        let error = parse::<ServiceAccount>(text).expect_err("namespce is no field");
        assert!(error.contains("metadata.namespce"), "{error}");
        let fine = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  namespace: b\n";
        let account: ServiceAccount = parse(fine).expect("a valid ServiceAccount");
        assert_eq!(account.metadata.namespace.as_deref(), Some("b"));
    }

    #[test]
    fn a_document_of_another_kind_is_refused() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n";
        assert!(parse::<ServiceAccount>(text).is_err());
    }
}
