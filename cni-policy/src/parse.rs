//! A file of the objects policies need: Namespaces, Pods and NetworkPolicies, as
//! `kubectl get -o json|yaml` prints them (a `List`, or a `NamespaceList`, `PodList` or
//! `NetworkPolicyList`) or as written for `kubectl apply` (the objects themselves, one
//! per YAML document), in any mix.
//!
//! A file that does not read at all is an error (the caller keeps what it had); an
//! object that does not read or check is refused alone, with its reason, and the rest
//! are taken.

use std::collections::{BTreeMap, BTreeSet};

use cni_nodes::{ParseError, documents, json_type};
use k8s_openapi::api::{
    core::v1::{Namespace, Pod as K8sPod},
    networking::v1::NetworkPolicy,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{compile::Pod, objects, policy::Policy, selector::Labels, translate};

/// What a file, or the cluster, holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    pub namespaces: BTreeMap<String, Labels>,
    pub pods: Vec<Pod>,
    pub policies: Vec<Policy>,
    pub refused: Vec<Refused>,
}

/// An object left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// `NetworkPolicy x/deny-all`, or where it stands when it has no name
    /// (`document 2, item 5`).
    pub object: String,
    pub reason: String,
}

/// Reads a file of objects.
pub fn parse_objects(bytes: &[u8]) -> Result<Objects, ParseError> {
    let mut objects = Objects::default();
    let mut seen = BTreeSet::new();
    for (number, document) in documents(bytes)?.into_iter().enumerate() {
        let at = format!("document {}", number + 1);
        let Value::Object(mut object) = document else {
            objects.refuse(&at, format!("{} is not an object", json_type(&document)));
            continue;
        };
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let implied = match kind.as_str() {
            "List" => None,
            "NamespaceList" => Some("Namespace"),
            "PodList" => Some("Pod"),
            "NetworkPolicyList" => Some("NetworkPolicy"),
            _ => {
                objects.item(&at, None, Value::Object(object), &mut seen);
                continue;
            }
        };
        match object.remove("items") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for (index, item) in items.into_iter().enumerate() {
                    let where_ = format!("{at}, item {}", index + 1);
                    objects.item(&where_, implied, item, &mut seen);
                }
            }
            Some(other) => {
                objects.refuse(&at, format!("items is {}, not a list", json_type(&other)))
            }
        }
    }
    Ok(objects)
}

impl Objects {
    /// How many of each it holds, for log lines.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} namespaces, {} pods, {} network policies, {} objects refused",
            self.namespaces.len(),
            self.pods.len(),
            self.policies.len(),
            self.refused.len()
        )
    }

    fn refuse(&mut self, object: &str, reason: String) {
        self.refused.push(Refused {
            object: object.to_owned(),
            reason,
        });
    }

    /// Takes one object (at `at`; its kind `implied` by its list when it names none).
    fn item(
        &mut self,
        at: &str,
        implied: Option<&str>,
        item: Value,
        seen: &mut BTreeSet<(String, String, String)>,
    ) {
        let kind = match item.get("kind") {
            Some(Value::String(kind)) => kind.clone(),
            None | Some(Value::Null) => match implied {
                Some(kind) => kind.to_owned(),
                None => return self.refuse(at, "no kind".to_owned()),
            },
            Some(other) => return self.refuse(at, format!("kind is {}", json_type(other))),
        };
        let namespace = item
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let name = item.pointer("/metadata/name").and_then(Value::as_str);
        let label = match (kind.as_str(), namespace, name) {
            ("Namespace", _, Some(name)) => format!("Namespace {name}"),
            (_, _, Some(name)) => format!(
                "{kind} {}/{name}",
                namespace.unwrap_or(translate::DEFAULT_NAMESPACE)
            ),
            _ => at.to_owned(),
        };
        let key = (
            kind.clone(),
            namespace.unwrap_or(translate::DEFAULT_NAMESPACE).to_owned(),
            name.unwrap_or_default().to_owned(),
        );
        if name.is_some() && !seen.insert(key) {
            return self.refuse(
                &label,
                "named twice in the file; the first is kept".to_owned(),
            );
        }
        match kind.as_str() {
            "Namespace" => match read::<Namespace>(item).map(|ns| objects::namespace(&ns)) {
                Ok(Some((name, labels))) => {
                    self.namespaces.insert(name, labels);
                }
                Ok(None) => self.refuse(&label, "no name".to_owned()),
                Err(reason) => self.refuse(&label, reason),
            },
            "Pod" => match read::<K8sPod>(item) {
                Ok(pod) if pod.metadata.name.as_deref().is_none_or(str::is_empty) => {
                    self.refuse(&label, "no name".to_owned());
                }
                // Pods policies leave out (host network, ended) are no error.
                Ok(pod) => self.pods.extend(objects::pod(&pod)),
                Err(reason) => self.refuse(&label, reason),
            },
            "NetworkPolicy" => match read::<NetworkPolicy>(item) {
                Ok(policy) => match translate::policy(&policy) {
                    Ok(policy) => self.policies.push(policy),
                    Err(error) => self.refuse(&label, error.to_string()),
                },
                Err(reason) => self.refuse(&label, reason),
            },
            other => self.refuse(
                &label,
                format!("kind {other:?} is not a Namespace, Pod or NetworkPolicy"),
            ),
        }
    }
}

fn read<T: DeserializeOwned>(item: Value) -> Result<T, String> {
    serde_json::from_value(item).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXED: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: x
  labels: {team: x}
---
apiVersion: v1
kind: PodList
items:
- metadata: {name: a, namespace: x, labels: {pod: a}}
  spec: {containers: [{name: c, ports: [{name: serve-80, containerPort: 80}]}]}
  status: {podIPs: [{ip: 10.0.0.1}]}
- metadata: {name: h, namespace: x}
  spec: {hostNetwork: true, containers: []}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}
---
apiVersion: v1
kind: List
items:
- kind: NetworkPolicy
  metadata: {name: bad, namespace: x}
  spec: {ingress: [{ports: [{protocol: ICMP}]}]}
- kind: Service
  metadata: {name: s, namespace: x}
- kind: NetworkPolicy
  metadata: {name: deny, namespace: x}
  spec: {}
- kind: Pod
  metadata: {name: broken}
  spec: {containers: 7}
"#;

    #[test]
    fn a_mixed_file_gives_what_reads_and_refuses_the_rest_alone() {
        let objects = parse_objects(MIXED.as_bytes()).expect("a readable file");
        assert_eq!(
            objects
                .namespaces
                .get("x")
                .and_then(|l| l.get("team"))
                .map(String::as_str),
            Some("x")
        );
        assert_eq!(objects.pods.len(), 1, "the host-network pod is left out");
        assert_eq!(objects.pods[0].name, "a");
        assert_eq!(objects.policies.len(), 1);
        assert_eq!(objects.policies[0].name, "deny");
        let refused: Vec<&str> = objects.refused.iter().map(|r| r.object.as_str()).collect();
        assert_eq!(
            refused,
            vec![
                "NetworkPolicy x/bad",
                "Service x/s",
                "NetworkPolicy x/deny",
                "Pod default/broken"
            ]
        );
        assert!(
            objects.refused[0]
                .reason
                .contains("spec.ingress[0].ports[0].protocol")
        );
        assert!(objects.refused[2].reason.contains("twice"));
    }

    #[test]
    fn a_json_list_reads_and_an_unreadable_file_is_an_error() {
        let json =
            br#"{"kind": "NetworkPolicyList", "items": [{"metadata": {"name": "p"}, "spec": {}}]}"#;
        let objects = parse_objects(json).expect("readable");
        assert_eq!(objects.policies.len(), 1);
        assert_eq!(objects.policies[0].namespace, "default");
        assert!(parse_objects(b"{not json").is_err());
        assert!(parse_objects(b"a: [unclosed").is_err());
        let scalar = parse_objects(b"just text").expect("a YAML scalar reads");
        assert_eq!(scalar.refused.len(), 1);
    }
}
