//! Label selectors as Kubernetes evaluates them: `matchLabels` and `matchExpressions`
//! (`In`, `NotIn`, `Exists`, `DoesNotExist`), all of them at once; the empty selector
//! selects everything. Checked when made ([`Selector::new`]) as the API server checks
//! them, since a policy file never went through one.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// An object's labels.
pub type Labels = BTreeMap<String, String>;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Requirement {
    /// The label is set to one of the values.
    In(String, Vec<String>),
    /// The label is unset, or set to none of the values.
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Self::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Self::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Self::Exists(key) => labels.contains_key(key),
            Self::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

/// A checked label selector: every requirement must hold. `matchLabels` entries are
/// `In` requirements of one value. Requirements are kept sorted, so that two selectors
/// written differently but asking the same compare equal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// Why a selector was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("operator {operator:?} of key {key:?} is not In, NotIn, Exists or DoesNotExist")]
    UnknownOperator { key: String, operator: String },
    #[error("operator {operator} of key {key:?} needs at least one value")]
    NoValues { key: String, operator: String },
    #[error("operator {operator} of key {key:?} takes no values")]
    UnexpectedValues { key: String, operator: String },
    #[error("an empty label key")]
    EmptyKey,
}

impl Selector {
    /// The selector that selects everything.
    pub const fn everything() -> Self {
        Self {
            requirements: Vec::new(),
        }
    }

    /// Checks and translates `selector`.
    pub fn new(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            if key.is_empty() {
                return Err(SelectorError::EmptyKey);
            }
            requirements.push(Requirement::In(key.clone(), vec![value.clone()]));
        }
        for expression in selector.match_expressions.iter().flatten() {
            let key = expression.key.clone();
            if key.is_empty() {
                return Err(SelectorError::EmptyKey);
            }
            let mut values = expression.values.clone().unwrap_or_default();
            values.sort();
            values.dedup();
            let operator = expression.operator.clone();
            let requirement = match operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError::NoValues { key, operator });
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(SelectorError::UnexpectedValues { key, operator });
                }
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                _ => return Err(SelectorError::UnknownOperator { key, operator }),
            };
            requirements.push(requirement);
        }
        requirements.sort();
        requirements.dedup();
        Ok(Self { requirements })
    }

    /// Whether an object with `labels` is selected.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this selector selects everything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expression(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: values.map(|v| v.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    fn selector(
        match_labels: &[(&str, &str)],
        expressions: Vec<LabelSelectorRequirement>,
    ) -> Result<Selector, SelectorError> {
        Selector::new(&LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!expressions.is_empty()).then_some(expressions),
        })
    }

    #[test]
    fn the_empty_selector_selects_everything() {
        let all = Selector::new(&LabelSelector::default()).expect("valid");
        assert!(all.is_everything());
        assert!(all.matches(&Labels::new()));
        assert!(all.matches(&labels(&[("pod", "a")])));
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let s = selector(
            &[("pod", "a")],
            vec![
                expression("tier", "In", Some(&["web", "api"])),
                expression("env", "NotIn", Some(&["prod"])),
                expression("team", "Exists", None),
                expression("legacy", "DoesNotExist", None),
            ],
        )
        .expect("valid");
        let good = [("pod", "a"), ("tier", "api"), ("team", "x")];
        assert!(s.matches(&labels(&good)));
        // NotIn holds for an unset label and for another value, not for a listed one.
        assert!(s.matches(&labels(&[good[0], good[1], good[2], ("env", "dev")])));
        assert!(!s.matches(&labels(&[good[0], good[1], good[2], ("env", "prod")])));
        assert!(!s.matches(&labels(&[good[0], good[1], good[2], ("legacy", "")])));
        assert!(!s.matches(&labels(&[good[0], good[1]])), "team missing");
        assert!(!s.matches(&labels(&[("pod", "b"), good[1], good[2]])));
        assert!(!s.matches(&labels(&[good[0], ("tier", "db"), good[2]])));
    }

    #[test]
    fn the_same_ask_written_two_ways_is_one_selector() {
        let a = selector(&[("pod", "a")], vec![]).expect("valid");
        let b = selector(&[], vec![expression("pod", "In", Some(&["a", "a"]))]).expect("valid");
        assert_eq!(a, b);
    }

    #[test]
    fn malformed_requirements_are_refused_as_the_api_server_refuses_them() {
        assert_eq!(
            selector(&[], vec![expression("k", "In", Some(&[]))]),
            Err(SelectorError::NoValues {
                key: "k".into(),
                operator: "In".into()
            })
        );
        assert_eq!(
            selector(&[], vec![expression("k", "NotIn", None)]),
            Err(SelectorError::NoValues {
                key: "k".into(),
                operator: "NotIn".into()
            })
        );
        assert_eq!(
            selector(&[], vec![expression("k", "Exists", Some(&["v"]))]),
            Err(SelectorError::UnexpectedValues {
                key: "k".into(),
                operator: "Exists".into()
            })
        );
        assert_eq!(
            selector(&[], vec![expression("k", "in", Some(&["v"]))]),
            Err(SelectorError::UnknownOperator {
                key: "k".into(),
                operator: "in".into()
            })
        );
        assert_eq!(selector(&[("", "v")], vec![]), Err(SelectorError::EmptyKey));
    }
}
