//! The cluster's nodes as a daemon reads them from `--nodes-file`: a file in the form
//! `kubectl get nodes -o yaml` prints, written and replaced as a person or a sync job
//! would.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

/// One node of the file: name, InternalIP, pod ranges.
pub type NodeEntry<'a> = (&'a str, &'a str, &'a [&'a str]);

/// A nodes file in its own folder under /run, removed on drop.
pub struct NodesFile {
    dir: PathBuf,
    path: PathBuf,
}

impl NodesFile {
    pub fn new(nodes: &[NodeEntry<'_>]) -> Self {
        let dir = PathBuf::from("/run").join(crate::unique_name("nodes"));
        std::fs::create_dir_all(&dir).expect("a folder for the nodes file");
        let file = Self {
            path: dir.join("nodes.yaml"),
            dir,
        };
        file.replace(nodes);
        file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `--nodes-file PATH`, as daemon flags.
    pub fn flags(&self) -> [&str; 2] {
        ["--nodes-file", self.path.to_str().expect("a UTF-8 path")]
    }

    /// Writes `nodes` to a new file and renames it over the old one, as `kubectl ... >
    /// tmp && mv tmp nodes.yaml` does.
    pub fn replace(&self, nodes: &[NodeEntry<'_>]) {
        let temporary = self.dir.join("nodes.yaml.new");
        std::fs::write(&temporary, list_yaml(nodes)).expect("the nodes written");
        std::fs::rename(&temporary, &self.path).expect("the nodes file replaced");
    }

    /// Writes raw `text` in place.
    pub fn write_raw(&self, text: &str) {
        std::fs::write(&self.path, text).expect("the nodes file written");
    }
}

impl Drop for NodesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `nodes` as the `List` that `kubectl get nodes -o yaml` prints.
pub fn list_yaml(nodes: &[NodeEntry<'_>]) -> String {
    let mut yaml =
        String::from("apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n");
    for (name, address, cidrs) in nodes {
        let _ = write!(
            yaml,
            "- apiVersion: v1\n  kind: Node\n  metadata:\n    name: {name}\n    labels:\n      \
             kubernetes.io/hostname: {name}\n  spec:\n"
        );
        if let Some(first) = cidrs.first() {
            let _ = writeln!(yaml, "    podCIDR: {first}\n    podCIDRs:");
            for cidr in *cidrs {
                let _ = writeln!(yaml, "    - {cidr}");
            }
        }
        let _ = write!(
            yaml,
            "  status:\n    addresses:\n    - address: {address}\n      type: InternalIP\n    \
             - address: {name}\n      type: Hostname\n"
        );
    }
    yaml
}
