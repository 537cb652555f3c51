//! Embeds the eBPF object built by `cargo xtask build` (release, bpfel-unknown-none).
//!
//! The object is built once and copied here, instead of aya-build rebuilding it for
//! every cargo profile (check, clippy, dev, release). `EBPF_CNI_OBJECT` names it; without
//! the variable the default output path of `cargo xtask build` is used. Without the
//! object the daemon still builds, with a warning, and refuses to load a datapath.

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo::rerun-if-env-changed=EBPF_CNI_OBJECT");
    let object = env::var_os("EBPF_CNI_OBJECT").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target/ebpf/bpfel-unknown-none/release/cni-ebpf")
        },
        PathBuf::from,
    );
    println!("cargo::rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("cni-ebpf.o");
    if let Err(error) = fs::copy(&object, &out) {
        // `cargo check`, clippy and rust-analyzer on a fresh clone: the daemon builds
        // with an empty object and refuses to start (`DatapathError::NoObject`).
        println!(
            "cargo::warning=no eBPF object at {} ({error}): this ebpf-cnid cannot load a \
             datapath; run `cargo xtask build`, or set EBPF_CNI_OBJECT to a built object",
            object.display()
        );
        fs::write(&out, []).expect("cargo's OUT_DIR is writable");
    }
}
