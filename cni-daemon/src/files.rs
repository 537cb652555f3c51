//! Removing files and folders where "already gone" is success: a daemon restarted after
//! a crash, a repeated uninstall, a record whose pod went away.

use std::{fs, io, path::Path};

/// Removes the file at `path`. Returns whether there was one.
pub fn remove_file(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Removes the folder `path` and everything in it; a missing folder is success.
pub fn remove_dir_all(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Removes everything in the folder `path`, then the folder, unless it is a mount point
/// (a host folder mounted into the daemon's container, which `uninstall` run there
/// cannot remove: rmdir gives EBUSY, or EROFS when the container's root is read-only;
/// it stays, empty). A missing folder is success.
pub fn empty_and_remove_dir(path: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_dir_all(&entry.path())?;
        } else {
            remove_file(&entry.path())?;
        }
    }
    match fs::remove_dir(path) {
        Err(error)
            if !matches!(
                error.kind(),
                io::ErrorKind::NotFound
                    | io::ErrorKind::ResourceBusy
                    | io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            Err(error)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_what_is_not_there_succeeds_and_says_so() {
        let dir = std::env::temp_dir().join(format!("ecni-files-{}", std::process::id()));
        fs::create_dir_all(dir.join("inner")).expect("temp folder");
        let file = dir.join("inner/f");
        fs::write(&file, b"x").expect("file");
        assert!(remove_file(&file).expect("removed"));
        assert!(!remove_file(&file).expect("already gone"));
        remove_dir_all(&dir).expect("removed");
        assert!(!dir.exists());
        remove_dir_all(&dir).expect("already gone");
        // Anything else is still an error: a folder is not a file.
        fs::create_dir_all(&dir).expect("temp folder");
        assert!(remove_file(&dir).is_err());
        remove_dir_all(&dir).expect("removed");
    }

    #[test]
    fn a_folder_is_emptied_then_removed_and_a_missing_one_is_fine() {
        let dir = std::env::temp_dir().join(format!("ecni-empty-{}", std::process::id()));
        fs::create_dir_all(dir.join("inner/deeper")).expect("temp folder");
        fs::write(dir.join("f"), b"x").expect("file");
        fs::write(dir.join("inner/deeper/g"), b"y").expect("file");
        empty_and_remove_dir(&dir).expect("removed");
        assert!(!dir.exists());
        empty_and_remove_dir(&dir).expect("already gone");
    }
}
