//! A file of the objects policies need: Namespaces, Pods and NetworkPolicies, as
//! `kubectl get -o json|yaml` prints them (a `List`, or a `NamespaceList`, `PodList` or
//! `NetworkPolicyList`) or as written for `kubectl apply` (the objects themselves, one
//! per YAML document), in any mix.
//!
//! A file that does not read at all is an error (the caller keeps what it had); an
//! object that does not read or check is refused alone, with its reason, and the rest
//! are taken.

use std::collections::{BTreeMap, BTreeSet};

use cni_nodes::{ParseError, documents, json_text, json_type};
use k8s_openapi::api::{
    core::v1::{Namespace, Pod as K8sPod},
    networking::v1::NetworkPolicy,
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Value, value::RawValue};

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

/// The names of the objects a file holds, by kind, namespace and name: a name seen
/// twice is refused the second time.
type Seen = BTreeSet<(String, String, String)>;

/// Reads a file of objects.
pub fn parse_objects(bytes: &[u8]) -> Result<Objects, ParseError> {
    let mut objects = Objects::default();
    let mut seen = Seen::new();
    if let Some(text) = json_text(bytes)?
        && let Ok(list) = serde_json::from_slice::<RawList<'_>>(text)
        && let Some(implied) = list.kind.as_deref().and_then(implied_kind)
    {
        // `kubectl get -o json`'s list: each item read straight into its type, without
        // a tree of values in between (half the time of a 1,000-policy file).
        for (index, item) in list.items.into_iter().flatten().enumerate() {
            let at = format!("document 1, item {}", index + 1);
            objects.raw_item(&at, implied, item, &mut seen);
        }
        return Ok(objects);
    }
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
        let Some(implied) = implied_kind(&kind) else {
            objects.item(&at, None, Value::Object(object), &mut seen);
            continue;
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

/// For a list's kind, the kind its items have when they name none (`Some(None)` for a
/// `List`); `None` for a kind that is not a list.
fn implied_kind(kind: &str) -> Option<Option<&'static str>> {
    match kind {
        "List" => Some(None),
        "NamespaceList" => Some(Some("Namespace")),
        "PodList" => Some(Some("Pod")),
        "NetworkPolicyList" => Some(Some("NetworkPolicy")),
        _ => None,
    }
}

/// A JSON list as `kubectl get -o json` prints it, its items left as text.
#[derive(Deserialize)]
struct RawList<'a> {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default, borrow)]
    items: Option<Vec<&'a RawValue>>,
}

/// What an item says it is, read before the rest of it.
#[derive(Deserialize)]
struct RawHead {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<RawMetadata>,
}

#[derive(Deserialize)]
struct RawMetadata {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// An object read into its type.
enum Typed {
    Namespace(Box<Namespace>),
    Pod(Box<K8sPod>),
    Policy(Box<NetworkPolicy>),
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

    /// Takes one item of a JSON list read as text. An item this cannot read straight
    /// into its type goes through [`Objects::item`], which says why it is refused.
    fn raw_item(&mut self, at: &str, implied: Option<&str>, raw: &RawValue, seen: &mut Seen) {
        if let Ok(head) = serde_json::from_str::<RawHead>(raw.get())
            && let Some(kind) = head.kind.as_deref().or(implied)
        {
            let (name, namespace) = head
                .metadata
                .map(|meta| (meta.name, meta.namespace))
                .unwrap_or_default();
            let typed = match kind {
                "Namespace" => serde_json::from_str(raw.get()).map(Typed::Namespace),
                "Pod" => serde_json::from_str(raw.get()).map(Typed::Pod),
                "NetworkPolicy" => serde_json::from_str(raw.get()).map(Typed::Policy),
                _ => return self.slow_item(at, implied, raw, seen),
            };
            if let Ok(typed) = typed {
                let Some(label) = self.named(at, kind, namespace.as_deref(), name.as_deref(), seen)
                else {
                    return;
                };
                return self.take(&label, typed);
            }
        }
        self.slow_item(at, implied, raw, seen)
    }

    fn slow_item(&mut self, at: &str, implied: Option<&str>, raw: &RawValue, seen: &mut Seen) {
        #[cfg(test)]
        tests::SLOW_ITEMS.with(|count| count.set(count.get() + 1));
        match serde_json::from_str::<Value>(raw.get()) {
            Ok(item) => self.item(at, implied, item, seen),
            Err(error) => self.refuse(at, error.to_string()),
        }
    }

    /// Takes one object (at `at`; its kind `implied` by its list when it names none).
    fn item(&mut self, at: &str, implied: Option<&str>, item: Value, seen: &mut Seen) {
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
            .map(str::to_owned);
        let name = item
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let Some(label) = self.named(at, &kind, namespace.as_deref(), name.as_deref(), seen) else {
            return;
        };
        let typed = match kind.as_str() {
            "Namespace" => read(item).map(Typed::Namespace),
            "Pod" => read(item).map(Typed::Pod),
            "NetworkPolicy" => read(item).map(Typed::Policy),
            other => Err(format!(
                "kind {other:?} is not a Namespace, Pod or NetworkPolicy"
            )),
        };
        match typed {
            Ok(typed) => self.take(&label, typed),
            Err(reason) => self.refuse(&label, reason),
        }
    }

    /// The label of an object in messages (`NetworkPolicy x/deny`, or `at` when it has
    /// no name); `None`, the object refused, when its name was seen before.
    fn named(
        &mut self,
        at: &str,
        kind: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        seen: &mut Seen,
    ) -> Option<String> {
        let namespace = namespace.filter(|n| !n.is_empty());
        let label = match (kind, name) {
            ("Namespace", Some(name)) => format!("Namespace {name}"),
            (_, Some(name)) => format!(
                "{kind} {}/{name}",
                namespace.unwrap_or(translate::DEFAULT_NAMESPACE)
            ),
            _ => at.to_owned(),
        };
        let key = (
            kind.to_owned(),
            namespace.unwrap_or(translate::DEFAULT_NAMESPACE).to_owned(),
            name.unwrap_or_default().to_owned(),
        );
        if name.is_some() && !seen.insert(key) {
            self.refuse(
                &label,
                "named twice in the file; the first is kept".to_owned(),
            );
            return None;
        }
        Some(label)
    }

    /// Takes an object read into its type, or refuses it.
    fn take(&mut self, label: &str, typed: Typed) {
        match typed {
            Typed::Namespace(namespace) => match objects::namespace(&namespace) {
                Some((name, labels)) => {
                    self.namespaces.insert(name, labels);
                }
                None => self.refuse(label, "no name".to_owned()),
            },
            Typed::Pod(pod) if pod.metadata.name.as_deref().is_none_or(str::is_empty) => {
                self.refuse(label, "no name".to_owned());
            }
            // Pods policies leave out (host network, ended) are no error.
            Typed::Pod(pod) => self.pods.extend(objects::pod(&pod)),
            Typed::Policy(policy) => match translate::policy(&policy) {
                Ok(policy) => self.policies.push(policy),
                Err(error) => self.refuse(label, error.to_string()),
            },
        }
    }
}

fn read<T: DeserializeOwned>(item: Value) -> Result<Box<T>, String> {
    serde_json::from_value(item).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use serde_json::json;

    use super::*;

    thread_local! {
        /// Items this thread read the old way, through a tree of values.
        pub(super) static SLOW_ITEMS: Cell<usize> = const { Cell::new(0) };
    }

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

    /// A JSON list read item by item as text gives what the same list read as a tree
    /// of values gives (YAML's reader takes JSON too), refusals and their reasons
    /// included.
    #[test]
    fn a_json_list_read_as_text_gives_what_its_values_give() {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"kind": "Namespace", "metadata": {"name": "x", "labels": {"team": "x"}}},
            {"kind": "Pod", "metadata": {"name": "a", "namespace": "x", "labels": {"pod": "a"}},
             "spec": {"containers": [{"name": "c", "ports": [{"name": "serve-80", "containerPort": 80}]}]},
             "status": {"podIPs": [{"ip": "10.0.0.1"}]}},
            {"kind": "NetworkPolicy", "metadata": {"name": "deny", "namespace": "x"},
             "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}]}},
            {"kind": "NetworkPolicy", "metadata": {"name": "deny", "namespace": "x"}, "spec": {}},
            {"kind": "NetworkPolicy", "metadata": {"name": "bad", "namespace": "x"},
             "spec": {"ingress": [{"ports": [{"protocol": "ICMP"}]}]}},
            {"kind": "Pod", "metadata": {"name": "broken"}, "spec": {"containers": 7}},
            {"kind": 7, "metadata": {"name": "odd"}},
            {"metadata": {"name": 5}},
            {"kind": "Service", "metadata": {"name": "s", "namespace": "x"}},
            {"kind": "Namespace", "metadata": {}},
            "text",
        ]});
        let text = list.to_string();
        SLOW_ITEMS.with(|count| count.set(0));
        let as_text = parse_objects(text.as_bytes()).expect("readable");
        // The five items that do not read as their kind's type go the old way; the
        // other six are read straight into their types.
        assert_eq!(SLOW_ITEMS.with(Cell::get), 5);
        let as_values = parse_objects(format!("# YAML\n{text}").as_bytes()).expect("readable");
        assert_eq!(as_text, as_values);
        assert_eq!(as_text.policies.len(), 1);
        assert_eq!(as_text.pods.len(), 1);
        assert_eq!(as_text.refused.len(), 8, "{:?}", as_text.refused);
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
