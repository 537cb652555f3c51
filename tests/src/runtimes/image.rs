//! The one image the runtime tests use, built here because nothing can be pulled: a
//! layer holding Debian's busybox-static as `/bin/busybox` (with `sh` and `sleep`
//! links) whose entrypoint is a pause, written as an OCI image layout archive for
//! `ctr images import` and `podman load`.

use std::{fs, path::Path};

use crate::oci::{self, Image, Rootfs};

/// Debian's busybox-static.
pub const BUSYBOX: &str = "/bin/busybox";

/// What the image runs, as the pause image does: sleep until TERM or INT, then exit at
/// once (a shell's trap runs during `wait`, not during a foreground `sleep`).
pub const PAUSE: [&str; 3] = [
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; sleep 2147483647 & wait",
];

/// Folders the runtimes mount over or write into (`/etc/hosts`, `/dev/shm`...).
const FOLDERS: [&str; 9] = [
    "bin", "dev", "etc", "proc", "sys", "tmp", "run", "var", "root",
];
/// Applets reached through links, by the pause command.
const APPLETS: [&str; 2] = ["sh", "sleep"];

/// The rootfs as an uncompressed tar (the image's one layer).
fn rootfs_tar() -> Vec<u8> {
    let busybox = fs::read(BUSYBOX).unwrap_or_else(|error| {
        panic!("cannot read {BUSYBOX} ({error}): install busybox-static (`cargo xtask setup`)")
    });
    let mut rootfs = Rootfs::new();
    for folder in FOLDERS {
        rootfs.folder(folder, 0o755);
    }
    rootfs.file("bin/busybox", 0o755, &busybox);
    for applet in APPLETS {
        rootfs.symlink(&format!("bin/{applet}"), "busybox");
    }
    rootfs.finish()
}

/// Writes an OCI image layout archive of the rootfs to `path`, named `name` (a full
/// reference such as `ecni.local/pause:1`), whose entrypoint is [`PAUSE`].
pub fn write_oci_archive(path: &Path, name: &str) {
    let image = Image {
        name,
        entrypoint: &PAUSE,
        cmd: &[],
        env: &["PATH=/bin"],
        labels: &[],
    };
    oci::write_archive(path, &image, &rootfs_tar());
}
