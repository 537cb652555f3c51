//! Network namespaces: work inside a pod's namespace without ever switching the
//! namespace of a thread that other code runs on.

use std::{fs::File, io, os::fd::AsFd, path::Path, thread};

use nix::sched::{CloneFlags, setns};

/// Opens a namespace file (`/var/run/netns/NAME`, `/proc/PID/ns/net`).
pub fn open(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// Runs `work` on a new thread that has entered `netns`. The thread ends with the work,
/// so no other code ever runs in the pod's namespace by mistake, and the caller's
/// namespace is never changed.
pub fn run_in<T, F>(netns: &File, work: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let netns = netns.try_clone()?;
    thread::Builder::new()
        .name("pod-netns".into())
        .spawn(move || {
            setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            Ok(work())
        })?
        .join()
        .map_err(|_| io::Error::other("the netns worker thread panicked"))?
}
