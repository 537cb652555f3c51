//! Files written whole or not at all, for everything the plugin and the daemon keep on
//! disk (endpoint records, the installed plugin and conflist, the node's pod ranges,
//! the IPAM version cache): a reader, or a crash even of the machine, sees the old
//! content or the new one, never half of one.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Writes `bytes` to `path` with `mode`: into `<path>.tmp` (created with `mode`,
/// whatever the umask), fsync, a rename over `path`, and an fsync of the folder, which
/// must exist. On failure the temporary file is removed and `path` is as it was. One
/// writer at a time: a second would share the temporary file (see [`write_shared`]).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_through(path, &beside(path, ".tmp"), bytes, mode)
}

/// [`write_atomic`] for a file several processes may write at once (the plugin's
/// caches): each writes through a temporary file of its own, `<path>.<pid>.tmp`, and
/// the last rename wins.
pub fn write_shared(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let suffix = format!(".{}.tmp", std::process::id());
    write_through(path, &beside(path, &suffix), bytes, mode)
}

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(suffix);
    path.with_file_name(name)
}

fn write_through(path: &Path, tmp: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let written = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(tmp)
        .and_then(|mut file| {
            // The mode given at creation is masked by the umask; a leftover keeps its own.
            file.set_permissions(fs::Permissions::from_mode(mode))?;
            file.write_all(bytes)?;
            file.sync_all()
        })
        .and_then(|()| fs::rename(tmp, path));
    if let Err(error) = written {
        let _ = fs::remove_file(tmp);
        return Err(error);
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    fs::File::open(dir).and_then(|dir| dir.sync_all())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_with_its_mode_and_nothing_left_beside_it() {
        let dir = std::env::temp_dir().join(format!("cni-api-files-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("a folder");
        let path = dir.join("record.json");
        write_atomic(&path, b"one", 0o600).expect("written");
        assert_eq!(fs::read(&path).expect("read"), b"one");
        write_shared(&path, b"two", 0o644).expect("replaced");
        assert_eq!(fs::read(&path).expect("read"), b"two");
        let mode = fs::metadata(&path).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o7777, 0o644);
        let names: Vec<_> = fs::read_dir(&dir)
            .expect("listed")
            .map(|entry| entry.expect("an entry").file_name())
            .collect();
        assert_eq!(names, ["record.json"], "no temporary file left");
        assert!(
            write_atomic(&dir.join("missing/record.json"), b"x", 0o600).is_err(),
            "the folder must exist"
        );
        assert!(!dir.join("missing").exists());
        fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
