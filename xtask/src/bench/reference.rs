//! The reference chain users would otherwise run, from Debian's containernetworking-
//! plugins: `bridge` (isGateway, ipMasq, hairpinMode) with `host-local`, then `portmap`
//! (or `bandwidth`, for the limits' figures), executed the way a runtime executes a
//! conflist (each plugin gets the previous result).

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{
    cni::{Call, REFERENCE_PLUGINS},
    netns::Netns,
    node::{big_tcp_uplink, external_host},
    unique_name,
};
use serde_json::{Value, json};

/// A simulated node using the reference chain, with an uplink to an external host
/// (`EXTERNAL_ADDR`) as `ebpf_cni_tests::node::Node` has.
pub struct RefNode {
    pub netns: Netns,
    pub external: Netns,
    name: String,
    subnet: String,
    data_dir: PathBuf,
}

impl RefNode {
    pub fn new(subnet: &str) -> Self {
        let name = unique_name("ref");
        let netns = Netns::new("refnode");
        let external = external_host(&netns);
        // The same node as ebpf-cni's (`super::traffic`): its uplink has BIG TCP.
        big_tcp_uplink(&netns, &external);
        Self {
            netns,
            external,
            data_dir: PathBuf::from("/run").join(&name),
            name,
            subnet: subnet.to_owned(),
        }
    }

    fn bridge_config(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "isDefaultGateway": true,
            "ipMasq": true,
            "hairpinMode": true,
            "ipam": { "type": "host-local", "subnet": self.subnet, "dataDir": self.data_dir },
        })
    }

    fn portmap_config(&self, prev: Option<&Value>, mappings: &Value) -> Value {
        let mut config = json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "type": "portmap",
            "capabilities": { "portMappings": true },
            "runtimeConfig": { "portMappings": mappings },
        });
        if let Some(prev) = prev {
            config["prevResult"] = prev.clone();
        }
        config
    }

    /// ADD through the chain; returns the pod's address.
    pub fn add(&self, container_id: &str, pod: &Netns) -> anyhow::Result<Ipv4Addr> {
        self.add_with_ports(container_id, pod, &json!([]))
    }

    /// ADD with `runtimeConfig.portMappings` (a JSON list) for portmap.
    pub fn add_with_ports(
        &self,
        container_id: &str,
        pod: &Netns,
        mappings: &Value,
    ) -> anyhow::Result<Ipv4Addr> {
        let result = self.bridge_add(container_id, pod)?;
        let portmap = Call::new(
            "ADD",
            container_id,
            "eth0",
            Some(pod),
            &self.portmap_config(Some(&result), mappings),
        )
        .run_plugin(&self.netns, &plugin("portmap"));
        ensure!(portmap.success, "portmap ADD failed: {}", portmap.stdout);
        first_address(&result)
    }

    /// ADD through `bridge`; its result.
    fn bridge_add(&self, container_id: &str, pod: &Netns) -> anyhow::Result<Value> {
        let bridge = Call::new(
            "ADD",
            container_id,
            "eth0",
            Some(pod),
            &self.bridge_config(),
        )
        .run_plugin(&self.netns, &plugin("bridge"));
        ensure!(bridge.success, "bridge ADD failed: {}", bridge.stdout);
        Ok(bridge.json())
    }

    /// ADD through `bridge` and then Debian's `bandwidth` plugin with
    /// `runtimeConfig.bandwidth` = `limits` (no portmap); returns the pod's address.
    pub fn add_shaped(
        &self,
        container_id: &str,
        pod: &Netns,
        limits: &Value,
    ) -> anyhow::Result<Ipv4Addr> {
        let result = self.bridge_add(container_id, pod)?;
        let config = json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "type": "bandwidth",
            "capabilities": { "bandwidth": true },
            "runtimeConfig": { "bandwidth": limits },
            "prevResult": result,
        });
        let bandwidth = Call::new("ADD", container_id, "eth0", Some(pod), &config)
            .run_plugin(&self.netns, &plugin("bandwidth"));
        ensure!(
            bandwidth.success,
            "bandwidth ADD failed: {}",
            bandwidth.stdout
        );
        first_address(&result)
    }

    /// DEL through the chain, in reverse order as runtimes do.
    pub fn del(&self, container_id: &str, pod: &Netns) -> anyhow::Result<()> {
        let portmap = Call::new(
            "DEL",
            container_id,
            "eth0",
            Some(pod),
            &self.portmap_config(None, &json!([])),
        )
        .run_plugin(&self.netns, &plugin("portmap"));
        ensure!(portmap.success, "portmap DEL failed: {}", portmap.stdout);
        let bridge = Call::new(
            "DEL",
            container_id,
            "eth0",
            Some(pod),
            &self.bridge_config(),
        )
        .run_plugin(&self.netns, &plugin("bridge"));
        ensure!(bridge.success, "bridge DEL failed: {}", bridge.stdout);
        Ok(())
    }
}

impl RefNode {
    /// Peak RSS (KiB) of the bridge plugin during one ADD, run under `wrapper`.
    pub fn peak_bridge_add(
        &self,
        wrapper: &super::PeakWrapper,
        pod: &Netns,
    ) -> anyhow::Result<f64> {
        let script = wrapper.script("bridge", &plugin("bridge"))?;
        let out = Call::new("ADD", "peak", "eth0", Some(pod), &self.bridge_config())
            .run_plugin(&self.netns, &script);
        ensure!(out.success, "bridge ADD failed: {}", out.stdout);
        let peak = wrapper.peak_kib("bridge")?;
        let del = Call::new("DEL", "peak", "eth0", Some(pod), &self.bridge_config())
            .run_plugin(&self.netns, &plugin("bridge"));
        ensure!(del.success, "bridge DEL failed: {}", del.stdout);
        Ok(peak)
    }
}

impl Drop for RefNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// The first address of a bridge result.
fn first_address(result: &Value) -> anyhow::Result<Ipv4Addr> {
    result["ips"][0]["address"]
        .as_str()
        .and_then(|address| address.split('/').next()?.parse().ok())
        .context("bridge returned no IPv4 address")
}

fn plugin(name: &str) -> PathBuf {
    Path::new(REFERENCE_PLUGINS).join(name)
}
