//! Installing the node's CNI configuration once the daemon serves (`ebpf-cnid run
//! --cni-conf-dir`, `--cni-bin-dir`): the plugin binary copied into the runtime's bin
//! folder, then `05-ebpf-cni.conflist` written into its config folder, each through a
//! temporary file in the same folder, fsync and a rename, so that a runtime never
//! executes or reads half a file. Kubelet calls the node's network ready once a
//! conflist is there: only a daemon that serves writes it. A file already equal to what
//! would be written is left alone (a restart changes nothing a runtime could notice).
//!
//! `ebpf-cnid uninstall --cni-conf-dir` removes the conflist ([`remove_conflist`]) and
//! leaves the plugin binary: pods the plugin made still need it for their DEL (see
//! docs/decisions.md).

use std::{
    fs, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

/// The flags of `ebpf-cnid run` that install the CNI configuration (flattened into
/// `run`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "CNI installation")]
pub struct InstallArgs {
    /// The container runtime's CNI config folder (the host's /etc/cni/net.d) where
    /// `05-ebpf-cni.conflist` is written once the datapath is loaded and the plugin's
    /// socket serves. Default: none, nothing is written. Needs a node source (the
    /// conflist's IPAM range is `usePodCidr`).
    #[arg(long, env = "EBPF_CNID_CNI_CONF_DIR")]
    pub cni_conf_dir: Option<PathBuf>,
    /// The container runtime's CNI bin folder (the host's /opt/cni/bin) the plugin
    /// binary is copied into (mode 0755), before the conflist is written. Default:
    /// none, nothing is copied.
    #[arg(long, env = "EBPF_CNID_CNI_BIN_DIR")]
    pub cni_bin_dir: Option<PathBuf>,
    /// The plugin binary to copy. Default: `ebpf-cni` beside this executable.
    #[arg(long, env = "EBPF_CNID_CNI_PLUGIN")]
    pub cni_plugin: Option<PathBuf>,
    /// The conflist's `cniVersion`. 1.0.0 by default: runtimes whose libcni predates 1.2
    /// (podman 4.3, containerd 1.6 and 1.7) cannot read a 1.1.0 result.
    #[arg(
        long,
        env = "EBPF_CNID_CNI_VERSION",
        default_value = "1.0.0",
        value_parser = CNI_VERSIONS
    )]
    pub cni_version: String,
}

impl InstallArgs {
    /// Whether anything is to be installed.
    pub fn wanted(&self) -> bool {
        self.cni_conf_dir.is_some() || self.cni_bin_dir.is_some()
    }
}

/// The versions the plugin speaks.
pub const CNI_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The file written into the config folder. `05-` sorts it before the usual `10-`
/// files: runtimes use the first conflist of the folder.
pub const CONFLIST_FILE: &str = "05-ebpf-cni.conflist";
/// The network's name, and the plugin's `type` (its file name in the bin folder).
pub const NETWORK_NAME: &str = "ebpf-cni";
pub const PLUGIN_TYPE: &str = "ebpf-cni";

/// What the conflist says of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    /// The pods' MTU: the daemon's (`Status::pod_mtu`, the overlay's), else the
    /// uplink's; `None`: the kernel's default.
    pub mtu: Option<u32>,
    /// The daemon's socket, for the plugin's `daemonSocket`.
    pub socket: PathBuf,
}

/// The conflist for `version` and `node`: one `ebpf-cni` plugin with source NAT,
/// hostPorts (and the `ips` and `mac` capabilities, which the plugin honours), and
/// host-local IPAM in this node's pod ranges (`usePodCidr`).
pub fn conflist(version: &str, node: &NodeSettings) -> Value {
    let mut plugin = json!({
        "type": PLUGIN_TYPE,
        "ipMasq": true,
        "daemonSocket": node.socket,
        "capabilities": {"portMappings": true, "ips": true, "mac": true},
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "usePodCidr"}]],
        },
    });
    if let Some(mtu) = node.mtu {
        plugin["mtu"] = json!(mtu);
    }
    json!({
        "cniVersion": version,
        "name": NETWORK_NAME,
        "plugins": [plugin],
    })
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot find the plugin beside this executable: {0}")]
    NoPlugin(io::Error),
    #[error("cannot read the plugin {path}: {source}")]
    ReadPlugin { path: String, source: io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: io::Error },
}

/// Copies the plugin (when `--cni-bin-dir` is given), then writes the conflist (when
/// `--cni-conf-dir` is), for `node`. Blocking file work.
pub fn install(args: &InstallArgs, node: &NodeSettings) -> Result<(), InstallError> {
    if let Some(bin_dir) = &args.cni_bin_dir {
        let plugin = match &args.cni_plugin {
            Some(plugin) => plugin.clone(),
            None => beside_this_executable().map_err(InstallError::NoPlugin)?,
        };
        let bytes = fs::read(&plugin).map_err(|source| InstallError::ReadPlugin {
            path: plugin.display().to_string(),
            source,
        })?;
        let changed = write_atomic(&bin_dir.join(PLUGIN_TYPE), &bytes, 0o755)?;
        tracing::info!(dir = %bin_dir.display(), changed, "CNI plugin installed");
    }
    if let Some(conf_dir) = &args.cni_conf_dir {
        let mut text =
            serde_json::to_vec_pretty(&conflist(&args.cni_version, node)).map_err(|error| {
                InstallError::Write {
                    path: conf_dir.join(CONFLIST_FILE).display().to_string(),
                    source: io::Error::other(error),
                }
            })?;
        text.push(b'\n');
        let changed = write_atomic(&conf_dir.join(CONFLIST_FILE), &text, 0o644)?;
        tracing::info!(dir = %conf_dir.display(), changed, "CNI configuration installed");
    }
    Ok(())
}

fn beside_this_executable() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| io::Error::other("the executable has no folder"))?;
    Ok(dir.join(PLUGIN_TYPE))
}

/// Writes `bytes` to `path` with `mode` whole or not at all (`cni_api::files`; the
/// temporary `<name>.tmp` is a name runtimes neither read as a config nor execute);
/// makes the folder if missing. Returns whether anything changed: a file already
/// holding `bytes` with `mode` is left as it is.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, InstallError> {
    let failed = |at: &Path| {
        let path = at.display().to_string();
        move |source| InstallError::Write { path, source }
    };
    if fs::read(path).is_ok_and(|current| current == bytes)
        && fs::metadata(path).is_ok_and(|meta| meta.permissions().mode() & 0o7777 == mode)
    {
        return Ok(false);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(failed(dir))?;
    cni_api::files::write_atomic(path, bytes, mode).map_err(failed(path))?;
    Ok(true)
}

/// Removes `05-ebpf-cni.conflist` from `conf_dir` if it is ours (names the `ebpf-cni`
/// network and plugin); other files are never touched. Returns whether it removed it.
pub fn remove_conflist(conf_dir: &Path) -> io::Result<bool> {
    let path = conf_dir.join(CONFLIST_FILE);
    let text = match fs::read(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    let ours = serde_json::from_slice::<Value>(&text).is_ok_and(|conf| {
        conf["name"] == NETWORK_NAME && conf["plugins"][0]["type"] == PLUGIN_TYPE
    });
    if !ours {
        tracing::warn!(
            path = %path.display(),
            "not the conflist ebpf-cnid writes (another network or plugin): left in place"
        );
        return Ok(false);
    }
    crate::files::remove_file(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeSettings {
        NodeSettings {
            mtu: Some(1450),
            socket: PathBuf::from("/run/ebpf-cni/ebpf-cnid.sock"),
        }
    }

    #[test]
    fn the_conflist_carries_the_version_mtu_socket_and_pod_cidr_ipam() {
        let conf = conflist("1.0.0", &node());
        assert_eq!(conf["cniVersion"], "1.0.0");
        assert_eq!(conf["name"], NETWORK_NAME);
        let plugin = &conf["plugins"][0];
        assert_eq!(plugin["type"], PLUGIN_TYPE);
        assert_eq!(plugin["mtu"], 1450);
        assert_eq!(plugin["daemonSocket"], "/run/ebpf-cni/ebpf-cnid.sock");
        assert_eq!(plugin["capabilities"]["portMappings"], true);
        assert_eq!(plugin["ipam"]["ranges"][0][0]["subnet"], "usePodCidr");
        let without_mtu = conflist(
            "0.4.0",
            &NodeSettings {
                mtu: None,
                ..node()
            },
        );
        assert!(without_mtu["plugins"][0].get("mtu").is_none());
    }

    #[test]
    fn an_equal_file_is_not_rewritten_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join("conf.d").join(CONFLIST_FILE);
        assert!(write_atomic(&path, b"one", 0o644).expect("written"));
        let inode = fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        assert!(!write_atomic(&path, b"one", 0o644).expect("left"));
        let same = fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        assert_eq!(inode.ok(), same.ok(), "not replaced");
        assert!(write_atomic(&path, b"two", 0o755).expect("replaced"));
        assert_eq!(fs::read(&path).expect("read"), b"two");
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        let names: Vec<_> = fs::read_dir(path.parent().expect("folder"))
            .expect("listed")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn uninstall_removes_only_our_conflist() {
        let dir = tempfile::tempdir().expect("a folder");
        assert!(!remove_conflist(dir.path()).expect("nothing there"));
        let path = dir.path().join(CONFLIST_FILE);
        fs::write(
            &path,
            br#"{"name": "other", "plugins": [{"type": "bridge"}]}"#,
        )
        .expect("written");
        assert!(!remove_conflist(dir.path()).expect("left"));
        assert!(path.exists());
        let ours = serde_json::to_vec(&conflist("1.0.0", &node())).expect("json");
        fs::write(&path, ours).expect("written");
        assert!(remove_conflist(dir.path()).expect("removed"));
        assert!(!path.exists());
    }
}
