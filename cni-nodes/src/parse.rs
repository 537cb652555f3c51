//! Node list documents: the `NodeList` the API serves (`kubectl get --raw /api/v1/nodes`)
//! or the `List` that `kubectl get nodes -o json` and `-o yaml` print, as JSON or YAML.
//!
//! A document that is not such a list is an error; an item in it that is not a usable node
//! is skipped with a warning, like the nodes `node::translate` refuses.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node as K8sNode;
use serde_json::Value;

use crate::node::NodeSet;
use crate::report::Reporter;
use crate::translate::{Problem, translate};

/// The largest nodes file read: 5,000 nodes (Kubernetes' tested maximum) of `kubectl get
/// nodes -o yaml` take about 80 MiB, most of it the 50 images each node reports.
pub const MAX_DOCUMENT_BYTES: usize = 128 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("not valid YAML: {0}")]
    Yaml(Box<serde_saphyr::Error>),
    #[error("the document is {0}, not a NodeList or List object")]
    NotAnObject(&'static str),
    #[error("kind {0:?}: the document must be a NodeList or a List")]
    Kind(String),
    #[error("items is {0}, not a list")]
    Items(&'static str),
    #[error(
        "the document is {len} bytes, more than the {MAX_DOCUMENT_BYTES} a file of objects may take"
    )]
    TooLarge { len: usize },
}

/// Reads a node list document, JSON when its first character is `{`, else YAML, and
/// logs a warning for each item left out.
pub fn parse_nodes(bytes: &[u8]) -> Result<NodeSet, ParseError> {
    parse_reporting(bytes, &mut Reporter::default())
}

/// [`parse_nodes`] that logs only the problems `reporter` has not logged yet.
pub(crate) fn parse_reporting(
    bytes: &[u8],
    reporter: &mut Reporter<Problem>,
) -> Result<NodeSet, ParseError> {
    let items = list_items(document(bytes)?)?;
    let mut set = NodeSet::new();
    let mut keys = BTreeSet::new();
    for (index, item) in items.into_iter().enumerate() {
        let name = item
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .map(str::to_owned);
        let key = match &name {
            Some(name) if !keys.contains(name) => name.clone(),
            _ => format!("#{index}"),
        };
        let (node, mut problems) = match read_item(index, name.as_deref(), item) {
            Ok(k8s) => {
                let translation = translate(&k8s);
                (translation.node, translation.problems)
            }
            Err(problem) => (None, vec![problem]),
        };
        if let Some(node) = node {
            if set.contains(&node.name) {
                problems.push(Problem::Duplicate {
                    node: node.name.clone(),
                });
            }
            set.insert(node);
        }
        reporter.report(&key, &problems);
        keys.insert(key);
    }
    reporter.keep_only(|key| keys.contains(key));
    Ok(set)
}

fn document(bytes: &[u8]) -> Result<Value, ParseError> {
    let text = bounded(bytes)?;
    if is_json(text) {
        return serde_json::from_slice(text).map_err(ParseError::Json);
    }
    serde_saphyr::from_slice_with_options(text, yaml_options())
        .map_err(|err| ParseError::Yaml(Box::new(err)))
}

/// Every document of a Kubernetes objects file: one JSON document when its first
/// character is `{`, else each document of a YAML stream (`---` between them), with the
/// bounds node lists have. Empty YAML documents are left out.
pub fn documents(bytes: &[u8]) -> Result<Vec<Value>, ParseError> {
    let text = bounded(bytes)?;
    if is_json(text) {
        return serde_json::from_slice(text)
            .map(|document| vec![document])
            .map_err(ParseError::Json);
    }
    let all: Vec<Value> = serde_saphyr::from_slice_multiple_with_options(text, yaml_options())
        .map_err(|err| ParseError::Yaml(Box::new(err)))?;
    Ok(all.into_iter().filter(|d| !d.is_null()).collect())
}

/// The text of a file of objects when it is one JSON document (its first character is
/// `{`), for readers that take it apart themselves; `None` for YAML. The bounds are
/// [`documents`]'s.
pub fn json_text(bytes: &[u8]) -> Result<Option<&[u8]>, ParseError> {
    let text = bounded(bytes)?;
    Ok(is_json(text).then_some(text))
}

/// `bytes` without a byte order mark, unless they are too many.
fn bounded(bytes: &[u8]) -> Result<&[u8], ParseError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(ParseError::TooLarge { len: bytes.len() });
    }
    Ok(bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes))
}

fn is_json(text: &[u8]) -> bool {
    text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// The YAML reader's default budget fits configuration files: a few hundred nodes of
/// `kubectl -o yaml` exceed its 250,000 nodes. Events and scalars are bounded by the
/// document's size instead. Aliases stay bounded and tighter than the default (100,000
/// events replayed from anchors rather than a million): kubectl writes none, and a
/// hand-written file needs few.
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 2 * MAX_DOCUMENT_BYTES;
    budget.max_nodes = MAX_DOCUMENT_BYTES;
    budget.max_total_scalar_bytes = MAX_DOCUMENT_BYTES;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.alias_limits.max_total_replayed_events = 100_000;
    // Errors on one line, for the logs, without a snippet of the file.
    options.with_snippet = false;
    options
}

fn list_items(document: Value) -> Result<Vec<Value>, ParseError> {
    let Value::Object(mut object) = document else {
        return Err(ParseError::NotAnObject(json_type(&document)));
    };
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "NodeList" && kind != "List" {
        return Err(ParseError::Kind(kind.to_owned()));
    }
    match object.remove("items") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(ParseError::Items(json_type(&other))),
    }
}

/// One item as a Kubernetes node. A `List` may hold any kind; a `NodeList`'s items carry
/// no kind at all.
fn read_item(index: usize, name: Option<&str>, item: Value) -> Result<K8sNode, Problem> {
    let what = match name {
        Some(name) => format!("item {index} ({name})"),
        None => format!("item {index}"),
    };
    match item.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(kind)) if kind == "Node" => {}
        Some(kind) => {
            return Err(Problem::NotANode {
                item: what,
                kind: kind.to_string(),
            });
        }
    }
    serde_json::from_value(item).map_err(|err| Problem::Malformed {
        item: what,
        reason: err.to_string(),
    })
}

/// What kind of JSON value `value` is, for messages.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
