//! Warnings about left-out nodes, logged once rather than at every sight of the node.

use std::collections::{BTreeMap, BTreeSet};

use crate::translate::Problem;

/// Logs each node's problems once: again only when they change. The Kubernetes source sees
/// a node again at every status update, and the file source at every reload.
#[derive(Debug, Default)]
pub(crate) struct Reporter {
    last: BTreeMap<String, Vec<Problem>>,
}

impl Reporter {
    /// Records the problems of the object known as `key` and returns those not logged
    /// for it last time.
    pub fn news<'a>(&mut self, key: &str, problems: &'a [Problem]) -> Vec<&'a Problem> {
        let before = self.last.get(key);
        let new: Vec<&Problem> = problems
            .iter()
            .filter(|problem| !before.is_some_and(|before| before.contains(problem)))
            .collect();
        if problems.is_empty() {
            self.last.remove(key);
        } else {
            self.last.insert(key.to_owned(), problems.to_vec());
        }
        new
    }

    /// Logs the problems that are news for `key`.
    pub fn report(&mut self, key: &str, problems: &[Problem]) {
        for problem in self.news(key, problems) {
            tracing::warn!("{problem}");
        }
    }

    pub fn forget(&mut self, key: &str) {
        self.last.remove(key);
    }

    /// Forgets every key but those listed: after a full list, the objects not in it.
    pub fn keep_only(&mut self, keys: &BTreeSet<String>) {
        self.last.retain(|key, _| keys.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reporter_repeats_a_problem_only_after_it_went_away() {
        let p = Problem::NoInternalIpv4 { node: "a".into() };
        let q = Problem::BadPodCidr {
            node: "a".into(),
            value: "x".into(),
        };
        let only_p = std::slice::from_ref(&p);
        let mut reporter = Reporter::default();
        assert_eq!(reporter.news("a", only_p), [&p]);
        assert!(reporter.news("a", only_p).is_empty());
        assert_eq!(reporter.news("a", &[p.clone(), q.clone()]), [&q]);
        assert!(reporter.news("a", &[]).is_empty());
        assert_eq!(reporter.news("a", only_p), [&p]);
        reporter.forget("a");
        assert_eq!(reporter.news("a", only_p), [&p]);
    }
}
