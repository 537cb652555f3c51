//! A conflist run as libcni runs one (containernetworking/cni `libcni/api.go`): ADD
//! through the plugins in order, each given the previous one's result as `prevResult`
//! and, in `runtimeConfig`, only the capabilities it declares; CHECK through them in
//! order and DEL in reverse, each given the chain's final result (from 0.4.0; DEL of
//! 0.3.x gets none). `ebpf-cni` is the built binary, every other type Debian's.

use serde_json::{Map, Value, json};

use crate::{
    cni::{Call, Outcome, REFERENCE_PLUGINS},
    netns::Netns,
};

/// A network configuration list: a name, a version, and the plugins' own sections
/// (`type` and their keys, without `name`, `cniVersion` and `prevResult`).
pub struct Conflist {
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Value>,
}

/// A failed step of a chain: which plugin, and what it printed.
#[derive(Debug)]
pub struct Failed {
    pub plugin: String,
    pub outcome: Outcome,
}

impl Conflist {
    /// The config plugin `index` is run with: its section plus the list's name and
    /// version, `prevResult` when given, and the declared capabilities' runtime values.
    fn config(&self, index: usize, prev: Option<&Value>, runtime: &Value) -> Value {
        let mut config = self.plugins[index].clone();
        config["name"] = json!(self.name);
        config["cniVersion"] = json!(self.cni_version);
        if let Some(prev) = prev {
            config["prevResult"] = prev.clone();
        }
        let declared: Map<String, Value> = config["capabilities"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, on)| on.as_bool() == Some(true))
            .filter_map(|(capability, _)| {
                Some((capability.clone(), runtime.get(capability)?.clone()))
            })
            .collect();
        if !declared.is_empty() {
            config["runtimeConfig"] = Value::Object(declared);
        }
        config
    }

    fn run(
        &self,
        index: usize,
        command: &str,
        attachment: (&str, &str, &Netns),
        config: &Value,
        node: &Netns,
    ) -> Outcome {
        let plugin = self.plugins[index]["type"].as_str().unwrap_or_default();
        let (container_id, ifname, pod) = attachment;
        let call = Call::new(command, container_id, ifname, Some(pod), config);
        if plugin == "ebpf-cni" {
            call.run(node)
        } else {
            call.run_plugin(node, &std::path::Path::new(REFERENCE_PLUGINS).join(plugin))
        }
    }

    fn failed(&self, index: usize, outcome: Outcome) -> Failed {
        Failed {
            plugin: self.plugins[index]["type"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            outcome,
        }
    }

    /// ADD through every plugin; the chain's result (the last plugin's).
    pub fn add(
        &self,
        attachment: (&str, &str, &Netns),
        runtime: &Value,
        node: &Netns,
    ) -> Result<Value, Failed> {
        let mut prev: Option<Value> = None;
        for index in 0..self.plugins.len() {
            let config = self.config(index, prev.as_ref(), runtime);
            let outcome = self.run(index, "ADD", attachment, &config, node);
            if !outcome.success {
                return Err(self.failed(index, outcome));
            }
            prev = Some(outcome.json());
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// CHECK through every plugin, each given `result` (the chain's ADD result).
    pub fn check(
        &self,
        attachment: (&str, &str, &Netns),
        runtime: &Value,
        result: &Value,
        node: &Netns,
    ) -> Result<(), Failed> {
        let order: Vec<usize> = (0..self.plugins.len()).collect();
        self.each("CHECK", &order, attachment, runtime, Some(result), node)
    }

    /// DEL through every plugin in reverse order, each given `result` from 0.4.0.
    pub fn del(
        &self,
        attachment: (&str, &str, &Netns),
        runtime: &Value,
        result: &Value,
        node: &Netns,
    ) -> Result<(), Failed> {
        let order: Vec<usize> = (0..self.plugins.len()).rev().collect();
        let with_result = !self.cni_version.starts_with("0.3.");
        let prev = with_result.then_some(result);
        self.each("DEL", &order, attachment, runtime, prev, node)
    }

    /// `command` through the plugins at `order`, each given the same `prev`.
    fn each(
        &self,
        command: &str,
        order: &[usize],
        attachment: (&str, &str, &Netns),
        runtime: &Value,
        prev: Option<&Value>,
        node: &Netns,
    ) -> Result<(), Failed> {
        for &index in order {
            let config = self.config(index, prev, runtime);
            let outcome = self.run(index, command, attachment, &config, node);
            if !outcome.success {
                return Err(self.failed(index, outcome));
            }
        }
        Ok(())
    }
}
