//! The daemon's bpffs folder: where maps (and later programs and links) are pinned so
//! that they outlive a daemon restart.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use nix::{
    mount::{MsFlags, mount},
    sys::statfs::statfs,
};

#[derive(Debug, thiserror::Error)]
pub enum BpffsError {
    #[error("{0} has no parent folder to mount bpffs on")]
    NoParent(String),
    #[error("cannot mount bpffs on {path}: {source}")]
    Mount { path: String, source: nix::Error },
    #[error("cannot inspect {path}: {source}")]
    Stat { path: String, source: nix::Error },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

/// Makes sure `dir` exists on a bpffs, mounting bpffs on its parent when that is not one
/// yet (as systemd does at boot; some minimal machines skip it).
pub fn prepare(dir: &Path) -> Result<(), BpffsError> {
    let parent = dir
        .parent()
        .ok_or_else(|| BpffsError::NoParent(dir.display().to_string()))?;
    fs::create_dir_all(parent).map_err(|source| io_error(parent, source))?;
    if !is_bpffs(parent)? {
        tracing::info!(path = %parent.display(), "mounting bpffs");
        mount(
            Some("bpf"),
            parent,
            Some("bpf"),
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| BpffsError::Mount {
            path: parent.display().to_string(),
            source,
        })?;
    }
    fs::create_dir_all(dir).map_err(|source| io_error(dir, source))
}

fn is_bpffs(path: &Path) -> Result<bool, BpffsError> {
    let stat = statfs(path).map_err(|source| BpffsError::Stat {
        path: path.display().to_string(),
        source,
    })?;
    // The magic's type differs between libc targets; compare as u64.
    Ok(stat.filesystem_type().0 as u64 == libc::BPF_FS_MAGIC as u64)
}

/// Path of the pin of the map named `name`.
pub fn map_pin(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Removes every pin under `dir` and the folder itself. A missing folder is success, so
/// uninstall can run twice.
pub fn remove(dir: &Path) -> Result<(), BpffsError> {
    crate::files::remove_dir_all(dir).map_err(|source| io_error(dir, source))
}

fn io_error(path: &Path, source: io::Error) -> BpffsError {
    BpffsError::Io {
        path: path.display().to_string(),
        source,
    }
}
