//! Kubernetes' Pods and Namespaces as the policies see them: a pod's namespace, name,
//! labels, addresses (`status.podIPs`) and named container ports; a namespace's labels.
//!
//! Left out: pods on the host's network (their addresses are their node's, which no
//! pod selector stands for) and pods that have ended (`Succeeded`, `Failed`: their
//! addresses may already be another pod's). A pod without addresses yet is kept: the
//! node learns a local pod's address from its ADD.

use std::net::IpAddr;

use cni_api::values::Protocol;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod as K8sPod};

use crate::{
    compile::{NamedPort, Pod},
    selector::Labels,
    translate::DEFAULT_NAMESPACE,
};

/// The pod as policies see it, or `None` when they leave it out.
pub fn pod(object: &K8sPod) -> Option<Pod> {
    let spec = object.spec.as_ref();
    if spec.and_then(|s| s.host_network) == Some(true) {
        return None;
    }
    let status = object.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return None;
    }
    let name = object.metadata.name.clone().filter(|n| !n.is_empty())?;
    let mut addrs: Vec<IpAddr> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if addrs.is_empty()
        && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref())
        && let Ok(ip) = ip.parse()
    {
        addrs.push(ip);
    }
    addrs.sort();
    addrs.dedup();
    // Sidecars (init containers that keep running) serve ports as containers do.
    let containers = spec.into_iter().flat_map(|spec| {
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        spec.containers.iter().chain(sidecars)
    });
    let mut ports: Vec<NamedPort> = containers.flat_map(named_ports).collect();
    ports.sort();
    ports.dedup();
    Some(Pod {
        namespace: object
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
        name,
        labels: object.metadata.labels.clone().unwrap_or_default(),
        addrs,
        ports,
    })
}

/// The named ports of `container`; a port of an unknown protocol or out of range is
/// none (the API server refuses such pods).
fn named_ports(container: &Container) -> impl Iterator<Item = NamedPort> + '_ {
    container.ports.iter().flatten().filter_map(|port| {
        let name = port.name.clone().filter(|n| !n.is_empty())?;
        let protocol = Protocol::from_kubernetes(port.protocol.as_deref())?;
        let number = u16::try_from(port.container_port)
            .ok()
            .filter(|p| *p != 0)?;
        Some(NamedPort {
            name,
            protocol,
            port: number,
        })
    })
}

/// The namespace's name and labels.
pub fn namespace(object: &Namespace) -> Option<(String, Labels)> {
    let name = object.metadata.name.clone().filter(|n| !n.is_empty())?;
    Some((name, object.metadata.labels.clone().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: serde_json::Value) -> K8sPod {
        serde_json::from_value(value).expect("a Pod")
    }

    #[test]
    fn a_pod_brings_its_labels_addresses_and_named_ports() {
        let seen = pod(&parse(json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"pod": "a"}},
            "spec": {
                "containers": [
                    {"name": "c80", "ports": [{"name": "serve-80-tcp", "containerPort": 80}, {"containerPort": 9}]},
                    {"name": "c81", "ports": [{"name": "serve-81-udp", "containerPort": 81, "protocol": "UDP"}]},
                ],
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always", "ports": [{"name": "metrics", "containerPort": 9100}]},
                    {"name": "once", "ports": [{"name": "setup", "containerPort": 7000}]},
                ],
            },
            "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]},
        })))
        .expect("kept");
        assert_eq!((seen.namespace.as_str(), seen.name.as_str()), ("x", "a"));
        assert_eq!(seen.labels.get("pod").map(String::as_str), Some("a"));
        assert_eq!(
            seen.addrs,
            vec![
                "10.0.0.1".parse::<IpAddr>().expect("ip"),
                "fd00::1".parse().expect("ip")
            ]
        );
        let names: Vec<(&str, Protocol, u16)> = seen
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.protocol, p.port))
            .collect();
        assert_eq!(
            names,
            vec![
                ("metrics", Protocol::Tcp, 9100),
                ("serve-80-tcp", Protocol::Tcp, 80),
                ("serve-81-udp", Protocol::Udp, 81),
            ],
            "unnamed ports and ports of init containers that end are no named ports"
        );
    }

    #[test]
    fn host_network_and_ended_pods_are_left_out_and_a_new_one_kept_without_addresses() {
        let host =
            json!({"metadata": {"name": "h"}, "spec": {"containers": [], "hostNetwork": true}});
        assert_eq!(pod(&parse(host)), None);
        for phase in ["Succeeded", "Failed"] {
            let ended =
                json!({"metadata": {"name": "e"}, "status": {"phase": phase, "podIP": "10.0.0.9"}});
            assert_eq!(pod(&parse(ended)), None, "{phase}");
        }
        let new = pod(&parse(
            json!({"metadata": {"name": "n"}, "status": {"phase": "Pending"}}),
        ))
        .expect("kept");
        assert!(new.addrs.is_empty());
        assert_eq!(new.namespace, "default");
    }
}
