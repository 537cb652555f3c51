//! Where the project's binaries are: a folder chosen with [`use_dir`] (the benchmark's
//! release build), else `EBPF_CNI_BIN_DIR` (set by `cargo xtask test`), else the
//! workspace's `target/debug`.

use std::{path::PathBuf, sync::OnceLock};

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Makes [`path`] look in `dir`; only the first call counts.
pub fn use_dir(dir: PathBuf) {
    let _ = DIR.set(dir);
}

/// Path of the binary `name`; panics with what to run when it was not built.
pub fn path(name: &str) -> PathBuf {
    let dir = DIR.get().cloned().unwrap_or_else(|| {
        std::env::var_os("EBPF_CNI_BIN_DIR").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug"),
            PathBuf::from,
        )
    });
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask build` (or `cargo xtask test`)",
        path.display()
    );
    path
}
