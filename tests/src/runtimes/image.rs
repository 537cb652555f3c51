//! The one image the runtime tests use, built here because nothing can be pulled: a
//! layer holding Debian's busybox-static as `/bin/busybox` (with `sh` and `sleep`
//! links) whose entrypoint is a pause, written as an OCI image layout archive for
//! `ctr images import` and `podman load`.

use std::{fs, path::Path};

use serde_json::json;
use sha2::{Digest, Sha256};

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
    let mut tar = tar::Builder::new(Vec::new());
    for folder in FOLDERS {
        let mut header = entry_header(tar::EntryType::Directory, 0o755, 0);
        tar.append_data(&mut header, folder, std::io::empty())
            .expect("a folder entry");
    }
    let mut header = entry_header(tar::EntryType::Regular, 0o755, busybox.len());
    tar.append_data(&mut header, "bin/busybox", busybox.as_slice())
        .expect("the busybox entry");
    for applet in APPLETS {
        let mut header = entry_header(tar::EntryType::Symlink, 0o777, 0);
        tar.append_link(&mut header, format!("bin/{applet}"), "busybox")
            .expect("an applet link");
    }
    tar.into_inner().expect("the rootfs tar")
}

fn entry_header(kind: tar::EntryType, mode: u32, size: usize) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size as u64);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// Writes an OCI image layout archive of the rootfs to `path`, named `name` (a full
/// reference such as `ecni.local/pause:1`), whose entrypoint is [`PAUSE`].
pub fn write_oci_archive(path: &Path, name: &str) {
    let layer = rootfs_tar();
    let layer_digest = digest(&layer);
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Env": ["PATH=/bin"], "Entrypoint": PAUSE },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    });
    let config = serde_json::to_vec(&config).expect("the config encodes");
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
    });
    let manifest = serde_json::to_vec(&manifest).expect("the manifest encodes");
    // containerd names the image after `io.containerd.image.name`; the OCI tag is
    // what other tools read.
    let tag = name.rsplit(':').next().unwrap_or("latest");
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    let index = serde_json::to_vec(&index).expect("the index encodes");

    let mut tar = tar::Builder::new(Vec::new());
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    let mut files: Vec<(String, &[u8])> =
        vec![("oci-layout".into(), layout), ("index.json".into(), &index)];
    for blob in [&layer, &config, &manifest] {
        files.push((blob_path(blob), blob));
    }
    for folder in ["blobs", "blobs/sha256"] {
        let mut header = entry_header(tar::EntryType::Directory, 0o755, 0);
        tar.append_data(&mut header, folder, std::io::empty())
            .expect("a folder entry");
    }
    for (name, data) in files {
        let mut header = entry_header(tar::EntryType::Regular, 0o644, data.len());
        tar.append_data(&mut header, name, data)
            .expect("an archive entry");
    }
    let archive = tar.into_inner().expect("the archive");
    fs::write(path, archive)
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
}

/// `sha256:<hex>` of `bytes`.
fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn blob_path(bytes: &[u8]) -> String {
    format!("blobs/sha256/{:x}", Sha256::digest(bytes))
}
