//! The policy file (`--policy-file`): a file of Namespaces, Pods and NetworkPolicies
//! ([`crate::parse`]) read at start, then polled and published again when it changes, as
//! the nodes file is ([`cni_nodes::Poller`]: one `stat` every 50 ms, which sees a file
//! replaced by rename, rewritten in place or swapped in by a ConfigMap volume alike).
//!
//! A file that is missing or does not read at start is an error. Later, a file that does
//! not read at all keeps the objects last read, with a warning logged once while it
//! lasts. An object refused ([`Refused`]) is logged once, as a warning naming the file, and
//! again only after it was taken or left the file, or when why it is refused changes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use cni_nodes::{FileError, FileKind, Poller, Reporter};
use tokio::sync::watch;

use crate::parse::{Objects, Refused, parse_objects};

/// The policy file, in messages: `policy file PATH: ...`.
pub const POLICY_FILE: FileKind = FileKind {
    name: "policy file",
    contents: "the policy objects",
};

/// Reads the policy file and returns a receiver that holds its objects, updated by a
/// task that polls the file until every receiver is dropped.
pub async fn watch_file(
    path: impl Into<PathBuf>,
) -> Result<watch::Receiver<Arc<Objects>>, FileError> {
    let path = path.into();
    let shown = path.display().to_string();
    let mut reporter = Reporter::default();
    let parse = move |bytes: &[u8]| {
        let objects = parse_objects(bytes)?;
        report(&mut reporter, &shown, &objects.refused);
        Ok(Arc::new(objects))
    };
    Poller::new(POLICY_FILE, path, parse, |objects| objects.summary())
        .watch()
        .await
}

/// Logs the refusals `reporter` has not logged yet, and forgets the objects no longer
/// refused.
fn report(reporter: &mut Reporter<String>, file: &str, refused: &[Refused]) {
    let mut reasons: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for refusal in refused {
        reasons
            .entry(refusal.object.as_str())
            .or_default()
            .push(refusal.reason.clone());
    }
    for (object, reasons) in &reasons {
        for reason in reporter.news(object, reasons) {
            tracing::warn!("policy file {file}: {object} left out: {reason}");
        }
    }
    reporter.keep_only(|object| reasons.contains_key(object));
}
