//! The emulator: bookworm-backports' qemu (10.0), unpacked through the private apt
//! (apt.rs) into the tools folder like the kernels, never installed.
//!
//! Not the machine's own bookworm qemu (7.2): under its multi-threaded TCG, 6.12 guests
//! died of `Oops: int3` at static-branch sites (the kernel patches a branch with a
//! breakpoint, then restores it; a vCPU went on running the breakpoint's stale
//! translation) after 12 to 17 binaries, in every full run. Under 10.0 the whole suite
//! passes. The backports build links against bookworm's own libraries, which the
//! machine's `qemu-system-x86` (setup.rs) brings.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;

use super::apt;

/// Where the emulator comes from.
pub const SUITE: &str = "bookworm-backports";

/// The system emulator, its ROMs and its BIOS.
const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "qemu-system-common",
    "qemu-system-data",
    "seabios",
];

/// An unpacked qemu.
pub struct Emulator {
    /// `qemu-system-x86_64`.
    pub binary: PathBuf,
    /// The folders its firmware is in (for `-L`): the unpacked binary would look in the
    /// machine's `/usr/share`, which holds the installed 7.2's.
    pub firmware: Vec<PathBuf>,
    /// What `--version` printed first (`QEMU emulator version 10.0.2 (Debian ...)`).
    pub version: String,
}

/// The emulator: from the cache when it is there, else downloaded. Like the kernels',
/// the cache is not refreshed once complete (`rm -r` of the folder takes a newer one).
pub fn get(cache: &Path, source: &apt::Source) -> anyhow::Result<Emulator> {
    let home = cache.join("qemu");
    let ready = home.join("ready");
    if fs::read_to_string(&ready).is_ok() {
        return unpacked(&home);
    }
    let apt = source.open()?;
    let _ = fs::remove_dir_all(&home);
    let root = home.join("root");
    for package in PACKAGES {
        let version = apt.version_in(package, SUITE)?;
        eprintln!("vm-test: downloading {package} {version} from {SUITE}");
        apt.unpack(package, &version, &root)?;
    }
    let emulator = unpacked(&home)?;
    fs::write(&ready, format!("{}\n", emulator.version))?;
    Ok(emulator)
}

/// The emulator under `home`, checked by running it.
fn unpacked(home: &Path) -> anyhow::Result<Emulator> {
    let root = home.join("root");
    let binary = root.join("usr/bin/qemu-system-x86_64");
    let out = Command::new(&binary)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} --version failed ({}): {} (a library missing? `cargo xtask setup` installs \
         bookworm's qemu-system-x86 for them; or `rm -r {}` and download it again)",
        binary.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        home.display()
    );
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    Ok(Emulator {
        binary,
        firmware: vec![root.join("usr/share/qemu"), root.join("usr/share/seabios")],
        version,
    })
}
