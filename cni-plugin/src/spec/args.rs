//! `CNI_ARGS`: the runtime's `K=V;K=V` extra arguments (Kubernetes puts the pod's name,
//! namespace and UID here).

use super::error::CniError;

/// Why `CNI_ARGS` was rejected; every variant maps to code 4, naming the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("CNI_ARGS: pair {0:?} has no '='")]
    MalformedPair(String),
    #[error("CNI_ARGS: pair {0:?} has an empty key")]
    EmptyKey(String),
    #[error("CNI_ARGS: IgnoreUnknown={0:?} is not one of 1, 0, true, false")]
    BadIgnoreUnknown(String),
    #[error("CNI_ARGS: unknown arguments {0:?} (set IgnoreUnknown=1 to allow them)")]
    UnknownKeys(Vec<String>),
}

/// The key by which a runtime says "ignore arguments you do not know" (libcni's name).
const IGNORE_UNKNOWN: &str = "IgnoreUnknown";
/// The keys by which kubelet names the pod.
const K8S_POD_NAMESPACE: &str = "K8S_POD_NAMESPACE";
const K8S_POD_NAME: &str = "K8S_POD_NAME";
const K8S_POD_UID: &str = "K8S_POD_UID";

/// Parsed `CNI_ARGS`, pairs in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
    ignore_unknown: bool,
}

impl CniArgs {
    /// Parses `K=V;K=V`. An empty string means no arguments. Empty segments (a trailing
    /// `;`) are skipped. The value is everything after the first `=`, so values may
    /// contain `=`. `IgnoreUnknown` takes 1/0/true/false, case-insensitively, as libcni does.
    pub fn parse(raw: &str) -> Result<Self, CniError> {
        Ok(Self::parse_typed(raw)?)
    }

    /// [`CniArgs::parse`] with the layer's own error, for callers that wrap it further.
    pub(crate) fn parse_typed(raw: &str) -> Result<Self, ArgsError> {
        let mut args = Self::default();
        for pair in raw.split(';').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| ArgsError::MalformedPair(pair.to_owned()))?;
            if key.is_empty() {
                return Err(ArgsError::EmptyKey(pair.to_owned()));
            }
            if key == IGNORE_UNKNOWN {
                args.ignore_unknown = match value.to_ascii_lowercase().as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => return Err(ArgsError::BadIgnoreUnknown(value.to_owned())),
                };
            }
            args.pairs.push((key.to_owned(), value.to_owned()));
        }
        Ok(args)
    }

    /// The value of `key`; if it was given twice, the last one wins, as in libcni.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// The Kubernetes pod kubelet names (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
    /// `K8S_POD_UID`; empty values read as absent); `None` when none of them is given.
    /// Other keys are not looked at: unknown arguments are ignored, as the reference
    /// plugins do when the runtime sets `IgnoreUnknown`, which kubelet always does.
    pub fn pod(&self) -> Option<cni_api::PodRef> {
        let get = |key| {
            self.get(key)
                .filter(|value| !value.is_empty())
                .map(str::to_owned)
        };
        let pod = cni_api::PodRef {
            namespace: get(K8S_POD_NAMESPACE),
            name: get(K8S_POD_NAME),
            uid: get(K8S_POD_UID),
        };
        (pod != cni_api::PodRef::default()).then_some(pod)
    }

    pub fn ignore_unknown(&self) -> bool {
        self.ignore_unknown
    }

    /// Rejects keys outside `known` (code 4) unless `IgnoreUnknown` is set.
    /// `IgnoreUnknown` itself is always known.
    pub fn check_known(&self, known: &[&str]) -> Result<(), CniError> {
        if self.ignore_unknown {
            return Ok(());
        }
        let unknown: Vec<String> = self
            .pairs
            .iter()
            .filter(|(k, _)| k != IGNORE_UNKNOWN && !known.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(ArgsError::UnknownKeys(unknown).into())
        }
    }
}
