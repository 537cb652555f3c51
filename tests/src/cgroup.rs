//! A private cgroup v2 directory, removed on drop with whatever still runs in it.
//!
//! The daemon attaches its node-local hostPort programs (connect4, sendmsg4, recvmsg4,
//! getpeername4) to the cgroup given by `--cgroup`; without one it would take the
//! machine's root cgroup, so every instance gets its own, and the node-local clients
//! of a test are placed in it.

use std::{
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::unique_name;

/// How often a removal is tried while killed members are still exiting, and the pause.
const RMDIR_TRIES: u32 = 50;
const RMDIR_PAUSE: Duration = Duration::from_millis(20);

/// A cgroup `ecni-<pid>-<n>-cg` under the cgroup2 mount.
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Creates the directory; panics when no cgroup2 filesystem is mounted (a test that
    /// cannot run says so instead of skipping).
    pub fn new() -> Self {
        let mount = mount_point().unwrap_or_else(|| {
            panic!(
                "no cgroup2 filesystem in /proc/self/mountinfo: the daemon's node-local \
                 hostPort programs attach to a cgroup v2 directory (mount one, e.g. \
                 `mount -t cgroup2 none /sys/fs/cgroup/unified`)"
            )
        });
        let path = mount.join(unique_name("cg"));
        fs::create_dir(&path)
            .unwrap_or_else(|error| panic!("cannot create cgroup {}: {error}", path.display()));
        Self { path }
    }

    /// The directory, for `--cgroup` and for `cgroup.procs`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Default for Cgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        remove(&self.path);
    }
}

/// Where the cgroup2 filesystem is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on a hybrid setup), from /proc/self/mountinfo.
pub fn mount_point() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        // `<id> <parent> <dev> <root> <mount point> <options> [optional...] - <fs type> ...`
        let (mount, fs) = line.split_once(" - ")?;
        if fs.split(' ').next()? != "cgroup2" {
            return None;
        }
        mount
            .split(' ')
            .nth(4)
            .map(|point| PathBuf::from(unescape(point)))
    })
}

/// mountinfo writes space, tab, newline and backslash as three octal digits.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Kills every process in the cgroup at `path`, then removes it (retrying while they
/// exit); true when it is gone.
pub(crate) fn remove(path: &Path) -> bool {
    for _ in 0..RMDIR_TRIES {
        kill_members(path);
        match fs::remove_dir(path) {
            Ok(()) => return true,
            Err(error) if error.kind() == ErrorKind::NotFound => return true,
            Err(_) => thread::sleep(RMDIR_PAUSE),
        }
    }
    false
}

fn kill_members(path: &Path) {
    let procs = fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
    for pid in procs
        .lines()
        .filter_map(|line| line.trim().parse::<i32>().ok())
    {
        // Already gone is fine: the next rmdir tells.
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn mountinfo_octal_escapes_are_decoded() {
        assert_eq!(unescape("/sys/fs/cgroup"), "/sys/fs/cgroup");
        assert_eq!(unescape("/mnt/a\\040b\\134c"), "/mnt/a b\\c");
        assert_eq!(unescape("/odd\\x"), "/odd\\x");
    }
}
