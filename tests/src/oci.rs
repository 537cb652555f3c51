//! OCI image archives written without a container engine or a registry: a root
//! filesystem as one tar layer (gzip-compressed), its config, manifest and index, in an
//! OCI image layout packed as one tar (`oci-archive`, which `podman load` and
//! `ctr images import` read). Every entry has owner root and time 0, in the order given,
//! so the same files make the same archive.

use std::{collections::BTreeSet, fs, io::Write, path::Path};

use flate2::{Compression, write::GzEncoder};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A root filesystem being written as a tar layer.
pub struct Rootfs {
    tar: tar::Builder<Vec<u8>>,
    folders: BTreeSet<String>,
}

impl Default for Rootfs {
    fn default() -> Self {
        Self::new()
    }
}

impl Rootfs {
    pub fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
            folders: BTreeSet::new(),
        }
    }

    /// The folder `path` (relative, `a/b`) and those above it, once each.
    pub fn folder(&mut self, path: &str, mode: u32) {
        let mut prefix = String::new();
        for part in path.split('/').filter(|part| !part.is_empty()) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.folders.insert(prefix.clone()) {
                let mut header = header(tar::EntryType::Directory, mode, 0);
                self.tar
                    .append_data(&mut header, &prefix, std::io::empty())
                    .expect("a folder entry");
            }
        }
    }

    /// A regular file at `path` (relative), its folders first.
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.parent(path);
        let mut header = header(tar::EntryType::Regular, mode, data.len());
        self.tar
            .append_data(&mut header, path, data)
            .expect("a file entry");
    }

    /// A symbolic link at `path` (relative) to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parent(path);
        let mut header = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut header, path, target)
            .expect("a link entry");
    }

    fn parent(&mut self, path: &str) {
        if let Some((folder, _)) = path.rsplit_once('/') {
            self.folder(folder, 0o755);
        }
    }

    /// The layer: the uncompressed tar.
    pub fn finish(self) -> Vec<u8> {
        self.tar.into_inner().expect("the rootfs tar")
    }
}

fn header(kind: tar::EntryType, mode: u32, size: usize) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size as u64);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// What the image runs, and how it is named.
pub struct Image<'a> {
    /// A full reference, `host/path:tag`: containerd names the image after it
    /// (`io.containerd.image.name`), podman too (`org.opencontainers.image.ref.name`).
    pub name: &'a str,
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
    pub env: &'a [&'a str],
    /// Annotations of the config (`org.opencontainers.image.*`).
    pub labels: &'a [(&'a str, &'a str)],
}

/// Writes the OCI image archive of `image` whose one layer is `layer` (an uncompressed
/// tar, see [`Rootfs`]) to `path`.
pub fn write_archive(path: &Path, image: &Image<'_>, layer: &[u8]) {
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(layer).expect("gzip into memory");
    let compressed = gzip.finish().expect("gzip into memory");
    let labels: serde_json::Map<String, Value> = image
        .labels
        .iter()
        .map(|(key, value)| ((*key).to_owned(), Value::from(*value)))
        .collect();
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": image.env,
            "Entrypoint": image.entrypoint,
            "Cmd": image.cmd,
            "Labels": labels,
        },
        // The uncompressed layer's digest.
        "rootfs": { "type": "layers", "diff_ids": [digest(layer)] },
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
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest(&compressed),
            "size": compressed.len(),
        }],
    });
    let manifest = serde_json::to_vec(&manifest).expect("the manifest encodes");
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": image.name,
            },
        }],
    });
    let index = serde_json::to_vec(&index).expect("the index encodes");

    let mut archive = Rootfs::new();
    archive.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#);
    archive.file("index.json", 0o644, &index);
    for blob in [&compressed, &config, &manifest] {
        archive.file(&blob_path(blob), 0o644, blob);
    }
    fs::write(path, archive.finish())
        .unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn blob_path(bytes: &[u8]) -> String {
    format!("blobs/sha256/{:x}", Sha256::digest(bytes))
}

/// The files at `paths` (relative, `usr/local/bin/x`) in the first image of the
/// archive at `archive`, as [`write_archive`] writes them (one gzip layer), in order;
/// `None` for a path the layer does not hold. Panics when the archive cannot be read.
pub fn files_in_archive(archive: &Path, paths: &[&str]) -> Vec<Option<Vec<u8>>> {
    let bytes = fs::read(archive)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", archive.display()));
    let entry = |name: &str| -> Vec<u8> {
        entry_of(&bytes, name).unwrap_or_else(|| panic!("{} holds no {name}", archive.display()))
    };
    let json = |name: &str| -> Value {
        serde_json::from_slice(&entry(name))
            .unwrap_or_else(|error| panic!("{name} in {}: {error}", archive.display()))
    };
    let blob = |digest: &Value| {
        let digest = digest.as_str().expect("a digest");
        format!(
            "blobs/sha256/{}",
            digest.strip_prefix("sha256:").expect("a sha256 digest")
        )
    };
    let index = json("index.json");
    let manifest = json(&blob(&index["manifests"][0]["digest"]));
    let layer = entry(&blob(&manifest["layers"][0]["digest"]));
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(layer.as_slice()),
        &mut unzipped,
    )
    .expect("a gzip layer");
    paths.iter().map(|path| entry_of(&unzipped, path)).collect()
}

/// The content of the entry `name` of the tar `bytes`.
fn entry_of(bytes: &[u8], name: &str) -> Option<Vec<u8>> {
    let mut archive = tar::Archive::new(bytes);
    let entries = archive.entries().ok()?;
    for entry in entries {
        let mut entry = entry.ok()?;
        if entry.path().ok()?.as_ref() == Path::new(name) {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).ok()?;
            return Some(data);
        }
    }
    None
}
