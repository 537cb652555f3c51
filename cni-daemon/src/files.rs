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
}
