//! A simulated Kubernetes node: a network namespace running `ebpf-cnid`, with one CNI
//! network whose IPAM is Debian's host-local, and an uplink to an "external" host.

use std::net::Ipv4Addr;

use aya::maps::{Map, MapData};
use cni_ebpf_common::NatEntry;
use serde_json::Value;

use crate::{
    cni::{Call, Network},
    daemon::{Daemon, Instance},
    netns::Netns,
};

/// Fields drop in order: the daemon stops before its instance is uninstalled, and the
/// namespace goes last.
pub struct Node {
    pub daemon: Daemon,
    pub network: Network,
    pub instance: Instance,
    pub netns: Netns,
    /// A host outside the node, at [`EXTERNAL_ADDR`], joined by the node's `uplink0`.
    pub external: Netns,
}

/// The node's address on its uplink.
pub const NODE_ADDR: &str = "198.18.0.1";
/// The external host's address.
pub const EXTERNAL_ADDR: &str = "198.18.0.2";

impl Node {
    /// Starts a node whose pods get addresses from `subnet`.
    pub fn start(subnet: &str) -> Self {
        Self::start_with_counters(subnet, &[])
    }

    /// Like [`Self::start`], with the per-source counter program also attached to the
    /// node links named in `counted` (for example `uplink0`).
    pub fn start_with_counters(subnet: &str, counted: &[&str]) -> Self {
        Self::start_with(subnet, counted, &[])
    }

    /// Like [`Self::start_with_counters`], with extra `ebpf-cnid run` flags.
    pub fn start_with(subnet: &str, counted: &[&str], daemon_flags: &[&str]) -> Self {
        Self::start_under(subnet, &[], counted, daemon_flags)
    }

    /// Like [`Self::start_with`], the daemon run through `wrapper` (see
    /// [`Daemon::start_under`]).
    pub fn start_under(
        subnet: &str,
        wrapper: &[&str],
        counted: &[&str],
        daemon_flags: &[&str],
    ) -> Self {
        let netns = Netns::new("node");
        let external = external_host(&netns);
        let instance = Instance::new();
        let daemon = Daemon::start_under(&netns, &instance, wrapper, counted, daemon_flags);
        let network = Network::new(&instance, subnet);
        Self {
            daemon,
            network,
            instance,
            netns,
            external,
        }
    }

    /// The pinned flow table `name` (a hash of [`NatEntry`] values keyed by `K`) of the
    /// node's daemon.
    pub fn flow_table<K: aya::Pod>(&self, name: &str) -> aya::maps::HashMap<MapData, K, NatEntry> {
        let data = MapData::from_pin(self.instance.bpf_dir.join(name))
            .unwrap_or_else(|error| panic!("cannot open the pinned {name}: {error}"));
        aya::maps::HashMap::try_from(Map::HashMap(data))
            .unwrap_or_else(|error| panic!("{name} is not a hash: {error}"))
    }

    /// Replaces the map pinned at `pin` (the daemon stopped) with an empty one of
    /// another layout, made by bpftool: `kind`, (key size, value size, entries), named
    /// after the pin.
    pub fn pin_map_of_another_layout(
        &self,
        pin: &std::path::Path,
        kind: &str,
        (key, value, entries): (u32, u32, u32),
    ) {
        std::fs::remove_file(pin).expect("unpin");
        let path = pin.to_str().expect("a UTF-8 path");
        let name = pin
            .file_name()
            .and_then(|name| name.to_str())
            .expect("a map name");
        let (key, value, entries) = (key.to_string(), value.to_string(), entries.to_string());
        let created = self.netns.run(
            "bpftool",
            &[
                "map", "create", path, "type", kind, "key", &key, "value", &value, "entries",
                &entries, "name", name,
            ],
        );
        assert!(created.status.success(), "bpftool: {created:?}");
    }

    /// Whether the source counter (`ebpf-cnid counters`) counted packets from `source`.
    pub fn counted(&self, source: &str) -> bool {
        self.instance
            .cli_json(&["counters"])
            .as_array()
            .expect("rows")
            .iter()
            .any(|row| row["source"] == source)
    }

    /// The value size and the number of entries of the map pinned as `name`.
    pub fn pinned_layout(&self, name: &str) -> (usize, u32) {
        let info = aya::maps::MapInfo::from_pin(self.instance.bpf_dir.join(name))
            .unwrap_or_else(|error| panic!("no pinned {name}: {error}"));
        (info.value_size() as usize, info.max_entries())
    }

    /// The pods' host-side devices in the node, veths and netkit primaries alike (the
    /// plugin names them `veb...`; the uplink is not one of them).
    pub fn host_veths(&self) -> Vec<String> {
        let out = self.netns.ip(&["-j", "link", "show"]);
        let links: serde_json::Value = serde_json::from_str(&out).expect("ip -j prints JSON");
        links
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|link| link["ifname"].as_str())
            .filter(|name| name.starts_with("veb"))
            .map(str::to_owned)
            .collect()
    }

    /// `pod`'s host-side device, as the daemon lists it.
    pub fn host_veth(&self, pod: &Pod) -> String {
        self.endpoint(pod)["host_veth"]
            .as_str()
            .expect("a host veth")
            .to_owned()
    }

    /// A new, empty pod network namespace.
    pub fn pod(&self, tag: &str) -> Netns {
        Netns::new(tag)
    }

    /// A pod added through the real plugin (cniVersion 1.1.0, ifname eth0); panics when
    /// ADD fails.
    pub fn add_pod(&self, container_id: &str) -> Pod {
        self.add_pod_with(container_id, &serde_json::Value::Null)
    }

    /// Like [`Self::add_pod`], with `runtime_config` (e.g. portMappings) in the config.
    pub fn add_pod_with(&self, container_id: &str, runtime_config: &serde_json::Value) -> Pod {
        let (netns, outcome) = self.try_add(container_id, runtime_config);
        Pod::added(container_id, netns, &outcome)
    }

    /// Like [`Self::add_pod`], the runtime naming the Kubernetes pod as kubelet does
    /// (`K8S_POD_NAMESPACE`, `K8S_POD_NAME` in `CNI_ARGS`).
    pub fn add_kubernetes_pod(&self, container_id: &str, namespace: &str, name: &str) -> Pod {
        self.add_kubernetes_pod_on(container_id, namespace, name, false)
    }

    /// Like [`Self::add_kubernetes_pod`], on a netkit pair when `netkit`.
    pub fn add_kubernetes_pod_on(
        &self,
        container_id: &str,
        namespace: &str,
        name: &str,
        netkit: bool,
    ) -> Pod {
        self.add_kubernetes_pod_with(container_id, namespace, name, netkit, &Value::Null)
    }

    /// Like [`Self::add_kubernetes_pod_on`], with `runtime_config` (e.g. portMappings).
    pub fn add_kubernetes_pod_with(
        &self,
        container_id: &str,
        namespace: &str,
        name: &str,
        netkit: bool,
        runtime_config: &Value,
    ) -> Pod {
        let netns = Netns::new("pod");
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}");
        let mut config = self.network.config("1.1.0");
        if netkit {
            config["podDevice"] = serde_json::json!("netkit");
        }
        if !runtime_config.is_null() {
            config["runtimeConfig"] = runtime_config.clone();
        }
        let outcome = Call::new("ADD", container_id, "eth0", Some(&netns), &config)
            .var("CNI_ARGS", &args)
            .run(&self.netns);
        Pod::added(container_id, netns, &outcome)
    }

    /// Like [`Self::add_pod`], the pod on a netkit pair (`"podDevice": "netkit"`).
    pub fn add_netkit_pod(&self, container_id: &str) -> Pod {
        let (netns, outcome) = self.try_add_netkit(container_id, &serde_json::Value::Null);
        Pod::added(container_id, netns, &outcome)
    }

    /// ADD in a new pod namespace, whatever its outcome.
    pub fn try_add(
        &self,
        container_id: &str,
        runtime_config: &serde_json::Value,
    ) -> (Netns, crate::cni::Outcome) {
        self.try_add_configured(container_id, runtime_config, |_| {})
    }

    /// Like [`Self::try_add`], the pod on a netkit pair.
    pub fn try_add_netkit(
        &self,
        container_id: &str,
        runtime_config: &serde_json::Value,
    ) -> (Netns, crate::cni::Outcome) {
        self.try_add_configured(container_id, runtime_config, |config| {
            config["podDevice"] = serde_json::json!("netkit");
        })
    }

    fn try_add_configured(
        &self,
        container_id: &str,
        runtime_config: &serde_json::Value,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> (Netns, crate::cni::Outcome) {
        let netns = Netns::new("pod");
        let mut config = self.network.config("1.1.0");
        if !runtime_config.is_null() {
            config["runtimeConfig"] = runtime_config.clone();
        }
        edit(&mut config);
        let outcome =
            Call::new("ADD", container_id, "eth0", Some(&netns), &config).run(&self.netns);
        (netns, outcome)
    }

    /// `pod`'s record as `ebpf-cnid endpoints --output json` lists it (counters
    /// included); panics when the daemon does not list it.
    pub fn endpoint(&self, pod: &Pod) -> serde_json::Value {
        let endpoints = self.instance.cli_json(&["endpoints"]);
        endpoints
            .as_array()
            .expect("a list")
            .iter()
            .find(|endpoint| endpoint["id"]["container_id"] == pod.container_id.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no endpoint for {}: {endpoints}", pod.container_id))
    }

    /// Removes `pod` through the real plugin; panics when DEL fails.
    pub fn del_pod(&self, pod: &Pod) {
        Call::new(
            "DEL",
            &pod.container_id,
            "eth0",
            Some(&pod.netns),
            &self.network.config("1.1.0"),
        )
        .run(&self.netns)
        .ok();
    }
}

/// Gives `node` an uplink `uplink0` ([`NODE_ADDR`]/24) to a new external host
/// ([`EXTERNAL_ADDR`]/24) and a default route through it (the uplink is the default
/// route's device: where the daemon finds it); returns the external host. The external
/// host has no route to any pod: only translated traffic reaches it.
pub fn external_host(node: &Netns) -> Netns {
    let external = Netns::new("ext");
    node.link_veth(
        "uplink0",
        &format!("{NODE_ADDR}/24"),
        &external,
        "eth0",
        &format!("{EXTERNAL_ADDR}/24"),
    );
    node.ip(&["route", "add", "default", "via", EXTERNAL_ADDR]);
    external
}

/// Gives the node's uplink and the external host's end of it IPv4 BIG TCP (GSO and GRO
/// sizes of 192 KiB), as on a node whose NIC has it switched on; new ebpf-cni pods
/// follow it (`cni_daemon::front::big_tcp`).
pub fn big_tcp_uplink(node: &Netns, external: &Netns) {
    crate::big_tcp::set(node, "uplink0", crate::big_tcp::SIZE);
    crate::big_tcp::set(external, "eth0", crate::big_tcp::SIZE);
}

/// `runtimeConfig` with `portMappings` to `container_port`: one entry per (host port,
/// protocol, hostIP) of `list`.
pub fn port_mappings(container_port: u16, list: &[(u16, &str, Option<&str>)]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = list
        .iter()
        .map(|(host_port, protocol, host_ip)| {
            let mut entry = serde_json::json!({
                "hostPort": host_port,
                "containerPort": container_port,
                "protocol": protocol,
            });
            if let Some(ip) = host_ip {
                entry["hostIP"] = serde_json::json!(ip);
            }
            entry
        })
        .collect();
    serde_json::json!({ "portMappings": entries })
}

/// `ip:port`.
pub fn socket(ip: &str, port: u16) -> std::net::SocketAddr {
    format!("{ip}:{port}").parse().expect("an address and port")
}

/// A pod made by [`Node::add_pod`].
pub struct Pod {
    pub container_id: String,
    pub ip: Ipv4Addr,
    pub netns: Netns,
}

impl Pod {
    /// The pod of a successful ADD (`outcome`) in `netns`; panics when ADD failed.
    pub fn added(container_id: &str, netns: Netns, outcome: &crate::cni::Outcome) -> Self {
        Self {
            container_id: container_id.to_owned(),
            ip: crate::cni::first_ip(&outcome.ok()),
            netns,
        }
    }
}
