//! Warnings about left-out objects, logged once rather than at every sight of the object.

use std::collections::BTreeMap;
use std::fmt::Display;

/// Remembers each object's problems so that they are logged once: again only when they
/// change. A watch sees an object again at every update of it, and a polled file at every
/// reread. `P` is a problem (cni-nodes' node problems, a refusal's reason).
#[derive(Debug)]
pub struct Reporter<P> {
    last: BTreeMap<String, Vec<P>>,
}

impl<P> Default for Reporter<P> {
    fn default() -> Self {
        Self {
            last: BTreeMap::new(),
        }
    }
}

impl<P: Clone + PartialEq> Reporter<P> {
    /// Records the problems of the object known as `key` and returns those not logged
    /// for it last time.
    pub fn news<'a>(&mut self, key: &str, problems: &'a [P]) -> Vec<&'a P> {
        let before = self.last.get(key);
        let new: Vec<&P> = problems
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

    /// Logs, as warnings, the problems that are news for `key`.
    pub fn report(&mut self, key: &str, problems: &[P])
    where
        P: Display,
    {
        for problem in self.news(key, problems) {
            tracing::warn!("{problem}");
        }
    }

    /// Forgets the object known as `key`: gone, its problems are news again if it returns.
    pub fn forget(&mut self, key: &str) {
        self.last.remove(key);
    }

    /// Forgets every key but those `keep` keeps: after a full list or read, the objects
    /// not in it.
    pub fn keep_only(&mut self, keep: impl Fn(&str) -> bool) {
        self.last.retain(|key, _| keep(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::Problem;

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

    #[test]
    fn keep_only_forgets_the_objects_a_list_left_out() {
        let mut reporter = Reporter::default();
        let problem = ["refused".to_owned()];
        assert_eq!(reporter.news("a", &problem).len(), 1);
        assert_eq!(reporter.news("b", &problem).len(), 1);
        reporter.keep_only(|key| key == "a");
        assert!(reporter.news("a", &problem).is_empty());
        assert_eq!(reporter.news("b", &problem).len(), 1);
    }
}
