//! Running the real `ebpf-cni` binary the way a container runtime does: CNI_* variables,
//! the network config on stdin, inside the node's network namespace, with Debian's
//! reference `host-local` as the IPAM plugin.

use std::{collections::BTreeMap, fs, io::Write, path::PathBuf, process::Stdio};

use serde_json::{Value, json};

use crate::{bins, daemon::Instance, netns::Netns};

/// Where Debian's containernetworking-plugins puts host-local and friends.
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// Every version the plugin accepts.
pub const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// One CNI network on a simulated node: its name, subnet and host-local data folder.
pub struct Network {
    pub name: String,
    pub subnet: String,
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    /// The config's `mtu`: 1450 (not the kernel's default) so that tests see it applied;
    /// the benchmark sets `None`, the reference chain's default.
    pub mtu: Option<u32>,
}

impl Network {
    /// A network served by `instance`'s daemon, with host-local state kept in the
    /// instance's run folder (removed with it).
    pub fn new(instance: &Instance, subnet: &str) -> Self {
        let run_dir = instance.socket.parent().expect("socket has a folder");
        Self {
            name: crate::unique_name("net"),
            subnet: subnet.to_owned(),
            data_dir: run_dir.join("ipam"),
            socket: instance.socket.clone(),
            mtu: Some(1450),
        }
    }

    /// The config a runtime would pass for `version`.
    pub fn config(&self, version: &str) -> Value {
        let mut config = json!({
            "cniVersion": version,
            "name": self.name,
            "type": "ebpf-cni",
            "daemonSocket": self.socket,
            "ipMasq": true,
            "ipam": {
                "type": "host-local",
                "subnet": self.subnet,
                "dataDir": self.data_dir,
            },
        });
        if let Some(mtu) = self.mtu {
            config["mtu"] = json!(mtu);
        }
        config
    }

    /// Addresses host-local has handed out and not released (its files named by IP).
    pub fn allocated(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.data_dir.join(&self.name)) else {
            return Vec::new();
        };
        let mut ips: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect();
        ips.sort();
        ips
    }
}

/// What a plugin execution gave.
#[derive(Debug)]
pub struct Outcome {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// stdout as JSON; panics with both streams when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {self:?}"))
    }

    /// Panics unless the plugin succeeded; returns its stdout as JSON (Null if empty).
    pub fn ok(&self) -> Value {
        assert!(self.success, "the plugin failed: {self:?}");
        if self.stdout.trim().is_empty() {
            Value::Null
        } else {
            self.json()
        }
    }

    /// Panics unless the plugin failed with an error JSON of `code`; returns it.
    pub fn error(&self, code: u64) -> Value {
        assert!(
            !self.success,
            "the plugin should have failed with code {code}: {self:?}"
        );
        let error = self.json();
        assert_eq!(error["code"], code, "wrong error code: {error}");
        assert!(
            error["msg"].as_str().is_some_and(|msg| !msg.is_empty()),
            "no msg: {error}"
        );
        assert!(error["cniVersion"].is_string(), "no cniVersion: {error}");
        error
    }
}

/// A plugin invocation being built.
pub struct Call {
    vars: BTreeMap<String, String>,
    stdin: Vec<u8>,
}

impl Call {
    /// `command` for (`container_id`, `ifname`) in `pod`, with `config` on stdin.
    pub fn new(
        command: &str,
        container_id: &str,
        ifname: &str,
        pod: Option<&Netns>,
        config: &Value,
    ) -> Self {
        let mut vars = BTreeMap::new();
        vars.insert("CNI_COMMAND".into(), command.into());
        vars.insert("CNI_CONTAINERID".into(), container_id.into());
        vars.insert("CNI_IFNAME".into(), ifname.into());
        vars.insert("CNI_PATH".into(), REFERENCE_PLUGINS.into());
        if let Some(pod) = pod {
            vars.insert("CNI_NETNS".into(), pod.path().display().to_string());
        }
        Self {
            vars,
            stdin: serde_json::to_vec(config).expect("config encodes"),
        }
    }

    /// A call with no attachment (VERSION, STATUS, GC).
    pub fn bare(command: &str, config: &Value) -> Self {
        let mut call = Self::new(command, "", "", None, config);
        call.vars
            .retain(|var, _| var == "CNI_COMMAND" || var == "CNI_PATH");
        call
    }

    pub fn var(mut self, name: &str, value: &str) -> Self {
        self.vars.insert(name.into(), value.into());
        self
    }

    pub fn without(mut self, name: &str) -> Self {
        self.vars.remove(name);
        self
    }

    pub fn stdin(mut self, bytes: &[u8]) -> Self {
        self.stdin = bytes.to_vec();
        self
    }

    /// Runs the plugin inside `node`, as the runtime on that node would.
    pub fn run(&self, node: &Netns) -> Outcome {
        self.run_plugin(node, &bins::path("ebpf-cni"))
    }

    /// Runs another plugin (the reference ones) the same way.
    pub fn run_plugin(&self, node: &Netns, plugin: &std::path::Path) -> Outcome {
        let mut command = node.command(plugin);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(&self.vars)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("cannot start ebpf-cni");
        let written = child
            .stdin
            .take()
            .expect("stdin pipe")
            .write_all(&self.stdin);
        // A plugin may stop reading (stdin over its limit) and answer: its answer says so.
        if let Err(error) = &written {
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::BrokenPipe,
                "cannot write the config: {error}"
            );
        }
        let out = child.wait_with_output().expect("ebpf-cni did not finish");
        Outcome {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The address of a CNI result's first IP (`ips[0].address`, CIDR notation); panics
/// when there is none.
pub fn first_ip(result: &Value) -> std::net::Ipv4Addr {
    result["ips"][0]["address"]
        .as_str()
        .and_then(|address| address.split('/').next())
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("an IPv4 address in the result: {result}"))
}

/// Names of the veth links in `netns` (the node's host sides, or a pod's interface).
pub fn veths(netns: &Netns) -> Vec<String> {
    let out = netns.ip(&["-j", "link", "show", "type", "veth"]);
    let links: Value = serde_json::from_str(&out).unwrap_or(Value::Array(Vec::new()));
    links
        .as_array()
        .map(|links| {
            links
                .iter()
                .filter_map(|link| link["ifname"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
