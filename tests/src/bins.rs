//! Where the project's binaries are: `EBPF_CNI_BIN_DIR` (set by `cargo xtask test`), or
//! the workspace's `target/debug`.

use std::path::PathBuf;

/// Path of the binary `name`; panics with what to run when it was not built.
pub fn path(name: &str) -> PathBuf {
    let dir = std::env::var_os("EBPF_CNI_BIN_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug"),
        PathBuf::from,
    );
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask build` (or `cargo xtask test`)",
        path.display()
    );
    path
}
