//! The guest's initramfs (a newc cpio, as the kernel unpacks it): Debian's static
//! busybox, the modules that mounting the host's root needs, the two stages of the
//! guest's init (init.sh, guest.sh) and the run's plan.

use std::{
    collections::HashMap,
    fs,
    io::{BufWriter, Cursor},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};

use super::kernel::Kernel;

const STAGE_ONE: &str = include_str!("init.sh");
const STAGE_TWO: &str = include_str!("guest.sh");

/// Debian's busybox-static: a static binary, so the initramfs needs no libraries.
const BUSYBOX: &str = "/bin/busybox";

/// What stage one loads to reach the host's root: the PCI transport, 9p over virtio,
/// and overlayfs. A kernel that builds one in (6.12's virtio_pci) has it in
/// `modules.builtin` instead.
const ROOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// What the guest runs after boot.
pub struct Plan {
    /// Exported before the binaries run.
    pub env: Vec<(String, String)>,
    /// Test binaries, by name, in order.
    pub binaries: Vec<(String, PathBuf)>,
    /// Given to every binary.
    pub args: Vec<String>,
    /// Each binary's limit, for the number of its tests that run.
    pub limits: Vec<std::time::Duration>,
}

/// Writes the initramfs for `kernel` and `plan` to `output`.
pub fn write(kernel: &Kernel, plan: &Plan, output: &Path) -> anyhow::Result<()> {
    let mut files: Vec<(String, u32, Vec<u8>)> = vec![
        ("init".into(), 0o755, STAGE_ONE.into()),
        ("guest.sh".into(), 0o755, STAGE_TWO.into()),
        (
            "bin/busybox".into(),
            0o755,
            fs::read(BUSYBOX).with_context(|| format!("cannot read {BUSYBOX}"))?,
        ),
        ("env".into(), 0o644, env_file(kernel, plan)?.into_bytes()),
        (
            "binaries".into(),
            0o644,
            binaries_file(&plan.binaries)?.into_bytes(),
        ),
        ("args".into(), 0o644, lines(&plan.args)?.into_bytes()),
    ];
    let mut order = String::new();
    for module in root_modules(&kernel.modules)? {
        let name = module_name(&module);
        files.push((
            format!("modules/{name}"),
            0o644,
            module_bytes(&kernel.modules.join(&module))?,
        ));
        order.push_str(&name);
        order.push('\n');
    }
    files.push(("modules/order".into(), 0o644, order.into_bytes()));

    let dirs = ["bin", "modules"].into_iter().map(|dir| {
        (
            cpio::NewcBuilder::new(dir).mode(0o040_755),
            Cursor::new(Vec::new()),
        )
    });
    let regular = files.into_iter().map(|(name, mode, bytes)| {
        (
            cpio::NewcBuilder::new(&name).mode(0o100_000 | mode),
            Cursor::new(bytes),
        )
    });
    let file =
        fs::File::create(output).with_context(|| format!("cannot create {}", output.display()))?;
    cpio::write_cpio(dirs.chain(regular), BufWriter::new(file))
        .with_context(|| format!("cannot write {}", output.display()))?
        .into_inner()
        .map_err(|error| error.into_error())
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(())
}

/// `export NAME='value'` lines: the tests' environment and the stage's own settings.
fn env_file(kernel: &Kernel, plan: &Plan) -> anyhow::Result<String> {
    let modules = kernel.modules.to_str().context("non-UTF-8 modules path")?;
    let mut text = format!("export MODULES={}\n", quote(modules)?);
    for (name, value) in &plan.env {
        anyhow::ensure!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "not a variable name: {name}"
        );
        text.push_str(&format!("export {name}={}\n", quote(value)?));
    }
    Ok(text)
}

fn binaries_file(binaries: &[(String, PathBuf)]) -> anyhow::Result<String> {
    let mut text = String::new();
    for (name, path) in binaries {
        let path = path.to_str().context("non-UTF-8 test binary path")?;
        anyhow::ensure!(
            !name.contains(char::is_whitespace) && !path.contains(['\n', ' ', '\t']),
            "test binary {name} at {path}: the plan is whitespace-separated"
        );
        text.push_str(&format!("{name} {path}\n"));
    }
    Ok(text)
}

fn lines(items: &[String]) -> anyhow::Result<String> {
    let mut text = String::new();
    for item in items {
        anyhow::ensure!(
            !item.contains('\n'),
            "an argument holds a newline: {item:?}"
        );
        text.push_str(item);
        text.push('\n');
    }
    Ok(text)
}

/// Single-quoted for sh.
fn quote(value: &str) -> anyhow::Result<String> {
    anyhow::ensure!(!value.contains('\n'), "a value holds a newline: {value:?}");
    Ok(format!("'{}'", value.replace('\'', r"'\''")))
}

/// [`ROOT_MODULES`] with their dependencies, each after what it needs, as paths
/// relative to `modules` (as `modules.dep` gives them).
fn root_modules(modules: &Path) -> anyhow::Result<Vec<String>> {
    let dep_path = modules.join("modules.dep");
    let deps = parse_modules_dep(
        &fs::read_to_string(&dep_path)
            .with_context(|| format!("cannot read {}", dep_path.display()))?,
    );
    let builtin = fs::read_to_string(modules.join("modules.builtin")).unwrap_or_default();
    let by_name: HashMap<String, &String> =
        deps.keys().map(|path| (module_stem(path), path)).collect();
    let mut order = Vec::new();
    for name in ROOT_MODULES {
        match by_name.get(*name) {
            Some(path) => load_order(path, &deps, &mut order),
            None if builtin.lines().any(|line| module_stem(line) == *name) => {}
            None => bail!(
                "{name} is neither a module nor built into {}",
                modules.display()
            ),
        }
    }
    Ok(order)
}

/// `modules.dep`: `kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko`,
/// every dependency of a module on its line, the ones loaded last first (as modprobe
/// reads it). Written by hand: the format is one `:` and spaces.
fn parse_modules_dep(text: &str) -> HashMap<String, Vec<String>> {
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(module, deps)| {
            (
                module.trim().to_owned(),
                deps.split_whitespace().map(str::to_owned).collect(),
            )
        })
        .collect()
}

fn load_order(module: &str, deps: &HashMap<String, Vec<String>>, order: &mut Vec<String>) {
    if order.iter().any(|loaded| loaded == module) {
        return;
    }
    for dep in deps.get(module).into_iter().flatten().rev() {
        load_order(dep, deps, order);
    }
    order.push(module.to_owned());
}

/// `kernel/net/9p/9pnet_virtio.ko.xz` -> `9pnet_virtio`.
fn module_stem(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.split(".ko").next().unwrap_or(file).replace('-', "_")
}

/// The file name stage one loads: `9p.ko`, decompressed.
fn module_name(path: &str) -> String {
    format!(
        "{}.ko",
        path.rsplit('/')
            .next()
            .unwrap_or(path)
            .split(".ko")
            .next()
            .unwrap_or(path)
    )
}

/// The module's bytes, decompressed when the package ships it as `.ko.xz` (6.12):
/// busybox's insmod takes plain modules only.
fn module_bytes(path: &Path) -> anyhow::Result<Vec<u8>> {
    let raw = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if path.extension().is_none_or(|ext| ext != "xz") {
        return Ok(raw);
    }
    let mut plain = Vec::new();
    lzma_rs::xz_decompress(&mut Cursor::new(raw), &mut plain)
        .map_err(|error| anyhow::anyhow!("{}: {error:?}", path.display()))?;
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_load_before_the_modules_that_need_them() {
        let deps = parse_modules_dep(
            "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko\n\
             kernel/net/9p/9pnet.ko:\n\
             kernel/fs/netfs/netfs.ko:\n\
             kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n\
             kernel/drivers/virtio/virtio_ring.ko: kernel/drivers/virtio/virtio.ko\n\
             kernel/drivers/virtio/virtio.ko:\n",
        );
        let mut order = Vec::new();
        load_order("kernel/net/9p/9pnet_virtio.ko", &deps, &mut order);
        load_order("kernel/fs/9p/9p.ko", &deps, &mut order);
        assert_eq!(
            order,
            [
                "kernel/drivers/virtio/virtio.ko",
                "kernel/drivers/virtio/virtio_ring.ko",
                "kernel/net/9p/9pnet.ko",
                "kernel/net/9p/9pnet_virtio.ko",
                "kernel/fs/netfs/netfs.ko",
                "kernel/fs/9p/9p.ko",
            ]
        );
    }

    #[test]
    fn module_names_drop_folders_and_compression() {
        assert_eq!(
            module_stem("kernel/net/9p/9pnet_virtio.ko.xz"),
            "9pnet_virtio"
        );
        assert_eq!(
            module_name("kernel/net/9p/9pnet_virtio.ko.xz"),
            "9pnet_virtio.ko"
        );
        assert_eq!(
            module_stem("kernel/drivers/virtio/virtio_pci.ko"),
            "virtio_pci"
        );
    }

    #[test]
    fn values_are_quoted_for_sh() {
        assert_eq!(quote("/a b/it's").expect("quoted"), r"'/a b/it'\''s'");
        assert!(quote("a\nb").is_err());
    }
}
