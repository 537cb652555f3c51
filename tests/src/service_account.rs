//! A pod's in-cluster configuration for a daemon run outside a pod: the service account's
//! files (`token`, `ca.crt`, `namespace`) in a folder of their own, bind-mounted at
//! [`MOUNT_POINT`] in a private mount namespace that only the daemon sees, and the
//! `kubernetes` Service's address in its environment (`KUBERNETES_SERVICE_HOST`,
//! `KUBERNETES_SERVICE_PORT`), as kubelet gives every pod.
//!
//! The machine's mount table is never changed. Where [`MOUNT_POINT`] does not exist, the
//! folders missing on the way are created for the daemon's namespace to mount on, and
//! exactly those are removed on drop; a machine that has them (a runner in a pod) keeps
//! its own, covered only inside the daemon's namespace.

use std::{
    fs, io,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, PoisonError},
};

/// Where kube's `Config::incluster` reads the service account's files.
pub const MOUNT_POINT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// One service account at a time in a test process, so that the folders one created are
/// not removed while another's daemon mounts on them.
static MOUNT_POINT_IN_USE: Mutex<()> = Mutex::new(());

pub struct ServiceAccount {
    dir: PathBuf,
    /// The folders on the way to [`MOUNT_POINT`] created here, outermost first.
    created: Vec<PathBuf>,
    /// The mounts at [`MOUNT_POINT`] in this process's namespace when it was made.
    mounts_before: Vec<String>,
    _in_use: MutexGuard<'static, ()>,
}

impl ServiceAccount {
    /// A service account of namespace `kube-system` with `token`, trusting the CA
    /// certificates in `ca_pem`.
    pub fn new(token: &str, ca_pem: &str) -> Self {
        let in_use = MOUNT_POINT_IN_USE
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut account = Self {
            dir: PathBuf::from("/run").join(crate::unique_name("sa")),
            created: Vec::new(),
            mounts_before: Vec::new(),
            _in_use: in_use,
        };
        fs::create_dir_all(&account.dir).expect("a folder for the service account");
        for (name, content) in [
            ("token", token),
            ("ca.crt", ca_pem),
            ("namespace", "kube-system"),
        ] {
            fs::write(account.dir.join(name), content).unwrap_or_else(|error| {
                panic!("cannot write the service account's {name}: {error}")
            });
        }
        account.create_mount_point();
        account.mounts_before = mounts_at_mount_point();
        account
    }

    /// The mounts at [`MOUNT_POINT`] in this process's mount namespace (the machine's)
    /// that were not there when the account was made: none, when the daemon's mount
    /// stayed in its own namespace.
    pub fn mounts_outside(&self) -> Vec<String> {
        mounts_at_mount_point()
            .into_iter()
            .filter(|mount| !self.mounts_before.contains(mount))
            .collect()
    }

    fn create_mount_point(&mut self) {
        let missing: Vec<&Path> = Path::new(MOUNT_POINT)
            .ancestors()
            .take_while(|folder| !folder.exists())
            .collect();
        for folder in missing.into_iter().rev() {
            match fs::create_dir(folder) {
                Ok(()) => self.created.push(folder.to_owned()),
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => panic!("cannot create {}: {error}", folder.display()),
            }
        }
    }

    /// A wrapper for [`crate::daemon::Daemon::start_under`]: the daemon in a private mount
    /// namespace with this account's files at [`MOUNT_POINT`], told that the API server
    /// is at `host`:`port`.
    pub fn wrapper(&self, host: &str, port: u16) -> Vec<String> {
        let mount = format!("mount --bind \"$0\" {MOUNT_POINT} && exec \"$@\"");
        [
            "env",
            &format!("KUBERNETES_SERVICE_HOST={host}"),
            &format!("KUBERNETES_SERVICE_PORT={port}"),
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            &mount,
            self.dir.to_str().expect("a UTF-8 path"),
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

/// The lines of this process's mountinfo whose mount point is [`MOUNT_POINT`] (after
/// its symbolic links: /var/run is one, to /run, on most machines).
fn mounts_at_mount_point() -> Vec<String> {
    let target = fs::canonicalize(MOUNT_POINT)
        .unwrap_or_else(|error| panic!("cannot resolve {MOUNT_POINT}: {error}"));
    let target = target.to_str().expect("a UTF-8 path");
    fs::read_to_string("/proc/self/mountinfo")
        .expect("this process's mountinfo")
        .lines()
        // The fifth field is the mount point.
        .filter(|line| line.split(' ').nth(4) == Some(target))
        .map(str::to_owned)
        .collect()
}

impl Drop for ServiceAccount {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        for folder in self.created.iter().rev() {
            if let Err(error) = fs::remove_dir(folder) {
                eprintln!(
                    "cannot remove {}, made by the test: {error}",
                    folder.display()
                );
            }
        }
    }
}
