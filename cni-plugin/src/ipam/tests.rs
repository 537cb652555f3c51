//! Delegation to a fake IPAM plugin: a shell script that speaks up to 1.0.0, like Debian's
//! host-local 1.1.1, and logs each of its executions.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use super::{Ipam, VersionCache};
use crate::spec::CniVersion;

/// A folder under the system's temp folder, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// `test` keeps the folders of tests running at the same time apart.
    pub(crate) fn new(test: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ecni-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("the temp folder is created");
        Self(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const PLUGIN: &str = "fake-ipam";

/// Installs the fake plugin in `dir`/bin; it appends "COMMAND cniVersion" to `dir`/calls.
fn install_fake_ipam(dir: &TempDir) -> PathBuf {
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).expect("the bin folder is created");
    let calls = dir.path().join("calls");
    let script = format!(
        r#"#!/bin/sh
config=$(cat)
version=$(printf '%s' "$config" | sed -n 's/.*"cniVersion":"\([^"]*\)".*/\1/p')
echo "$CNI_COMMAND $version" >> '{calls}'
case "$CNI_COMMAND $version" in
VERSION*)
    echo '{{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}}' ;;
*" 1.1.0")
    echo '{{"code":1,"msg":"incompatible CNI versions"}}'
    exit 1 ;;
ADD*)
    echo '{{"cniVersion":"1.0.0","ips":[{{"address":"10.1.0.2/24","gateway":"10.1.0.1"}}]}}' ;;
esac
"#,
        calls = calls.display()
    );
    let plugin = bin.join(PLUGIN);
    fs::write(&plugin, script).expect("the fake plugin is written");
    fs::set_permissions(&plugin, fs::Permissions::from_mode(0o755))
        .expect("the fake plugin is made executable");
    bin
}

/// The plugin's executions so far.
fn calls(dir: &TempDir) -> Vec<String> {
    fs::read_to_string(dir.path().join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What a new `ebpf-cni` process would find, with the cache in `cache_dir`.
fn find(bin: &Path, cache_dir: &Path) -> Ipam {
    Ipam::find(PLUGIN, &[bin.to_owned()], VersionCache::in_dir(cache_dir))
        .expect("the fake plugin is found")
}

fn network(version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "net",
        "type": "ebpf-cni",
        "ipam": { "type": PLUGIN },
    })
}

#[test]
fn second_add_execs_the_plugin_once() {
    let dir = TempDir::new("ipam-second-add");
    let bin = install_fake_ipam(&dir);
    let config = network("1.1.0");

    let first = find(&bin, dir.path()).add(&config).expect("the first ADD");
    assert_eq!(calls(&dir), ["ADD 1.1.0", "VERSION 1.1.0", "ADD 1.0.0"]);
    let second = find(&bin, dir.path()).add(&config).expect("the second ADD");
    assert_eq!(calls(&dir)[3..], ["ADD 1.0.0"], "straight to 1.0.0");
    assert_eq!(first, second);

    // STATUS and GC ask the cache, not the plugin.
    let speaks = find(&bin, dir.path()).supports(CniVersion::V1_1_0);
    assert!(!speaks.expect("answered from the cache"));
    assert_eq!(calls(&dir).len(), 4, "no VERSION exec");

    // A version the plugin speaks goes as is.
    find(&bin, dir.path())
        .add(&network("1.0.0"))
        .expect("a 1.0.0 ADD");
    assert_eq!(calls(&dir)[4..], ["ADD 1.0.0"]);
}

#[test]
fn without_a_cache_folder_every_add_negotiates() {
    let dir = TempDir::new("ipam-no-cache");
    let bin = install_fake_ipam(&dir);
    let no_daemon = dir.path().join("no-daemon-here");
    for _ in 0..2 {
        find(&bin, &no_daemon)
            .add(&network("1.1.0"))
            .expect("an ADD");
    }
    assert_eq!(calls(&dir).len(), 6, "ADD, VERSION, ADD each time");
}

#[test]
fn wrong_cache_costs_the_old_retry_and_is_corrected() {
    let dir = TempDir::new("ipam-wrong-cache");
    let bin = install_fake_ipam(&dir);
    let cache = VersionCache::in_dir(dir.path());
    cache.put(&bin.join(PLUGIN), &["1.1.0".to_owned()]);

    find(&bin, dir.path())
        .add(&network("1.1.0"))
        .expect("the ADD still works");
    assert_eq!(calls(&dir), ["ADD 1.1.0", "VERSION 1.1.0", "ADD 1.0.0"]);
    find(&bin, dir.path())
        .add(&network("1.1.0"))
        .expect("the next ADD");
    assert_eq!(
        calls(&dir)[3..],
        ["ADD 1.0.0"],
        "the answer replaced the wrong one"
    );
}
