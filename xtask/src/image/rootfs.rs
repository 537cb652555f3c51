//! The image's root filesystem, taken from this machine: the two binaries, the shared
//! libraries and dynamic loader `ldd` says they load, and the folders a runtime mounts
//! over. The daemon runs no other program (its eBPF object is embedded); the IPAM
//! plugins the CNI plugin calls are the runtime's, on the host.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use ebpf_cni_tests::oci::Rootfs;

/// Where the binaries are in the image (on PATH).
pub const BIN_DIR: &str = "usr/local/bin";
/// The binaries, by name under the build's output folder.
pub const BINARIES: [&str; 2] = ["ebpf-cnid", "ebpf-cni"];
/// Folders a runtime mounts over or writes into; `tmp` is sticky and open to all.
const FOLDERS: [(&str, u32); 8] = [
    ("dev", 0o755),
    ("etc", 0o755),
    ("proc", 0o555),
    ("run", 0o755),
    ("sys", 0o555),
    ("tmp", 0o1777),
    ("var/lib", 0o755),
    ("root", 0o700),
];

/// The layer: `bin_dir`'s binaries and everything they load, as an uncompressed tar.
pub fn layer(bin_dir: &Path) -> anyhow::Result<Vec<u8>> {
    let mut rootfs = Rootfs::new();
    for (folder, mode) in FOLDERS {
        rootfs.folder(folder, mode);
    }
    let mut libraries = Vec::new();
    for name in BINARIES {
        let binary = bin_dir.join(name);
        let data =
            fs::read(&binary).with_context(|| format!("cannot read {}", binary.display()))?;
        rootfs.file(&format!("{BIN_DIR}/{name}"), 0o755, &data);
        for library in shared_libraries(&binary)? {
            if !libraries.contains(&library) {
                libraries.push(library);
            }
        }
    }
    libraries.sort();
    for library in libraries {
        // The file's content at the path the loader looks for (a link's target is read:
        // Debian's /lib64 is itself a link into /usr).
        let data =
            fs::read(&library).with_context(|| format!("cannot read {}", library.display()))?;
        let path = library
            .strip_prefix("/")
            .with_context(|| format!("{} is not absolute", library.display()))?;
        rootfs.file(&path.to_string_lossy(), 0o755, &data);
    }
    Ok(rootfs.finish())
}

/// The shared libraries (and the loader) `binary` loads, as `ldd` resolves them here.
fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run ldd (Debian's libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "ldd {} failed ({}): {}{}",
            binary.display(),
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_ldd(&text)
}

/// The paths in `ldd`'s output: `name => /path (0x...)` and `/path (0x...)` (the loader);
/// the vDSO has no file. A library ldd did not find is an error.
pub fn parse_ldd(text: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let resolved = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    bail!("ldd found no {}", name.trim());
                }
                target
            }
            None => line,
        };
        let path = resolved.split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_gives_the_libraries_and_the_loader_not_the_vdso() {
        let text = "\
\tlinux-vdso.so.1 (0x00007ffc8a7f2000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0a1c2a0000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0a1c0bf000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0a1c9c3000)
";
        assert_eq!(
            parse_ldd(text).expect("parses"),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn a_library_ldd_cannot_find_is_an_error() {
        let text = "\tlibmissing.so.1 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n";
        let error = parse_ldd(text).expect_err("a missing library");
        assert!(error.to_string().contains("libmissing.so.1"), "{error}");
    }

    #[test]
    fn the_layer_holds_the_binaries_their_libraries_and_the_loader() {
        // /bin/true stands for a dynamically linked binary of ours.
        let dir = std::env::temp_dir().join(format!("xtask-rootfs-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("a temporary folder");
        for name in BINARIES {
            fs::copy("/bin/true", dir.join(name)).expect("a copy of /bin/true");
        }
        let layer = layer(&dir);
        let _ = fs::remove_dir_all(&dir);
        let layer = layer.expect("the layer");
        let mut archive = tar::Archive::new(layer.as_slice());
        let paths: Vec<String> = archive
            .entries()
            .expect("entries")
            .map(|entry| {
                let entry = entry.expect("an entry");
                entry.path().expect("a path").display().to_string()
            })
            .collect();
        for expected in [
            "usr/local/bin/ebpf-cnid",
            "usr/local/bin/ebpf-cni",
            "lib64/ld-linux-x86-64.so.2",
            "tmp",
        ] {
            assert!(
                paths.iter().any(|path| path == expected),
                "{expected} in {paths:?}"
            );
        }
        assert!(
            paths.iter().any(|path| path.contains("libc.so.6")),
            "libc in {paths:?}"
        );
    }
}
