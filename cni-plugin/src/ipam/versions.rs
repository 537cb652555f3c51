//! The cache of IPAM plugins' VERSION answers: `ipam-versions.json` in the daemon
//! socket's folder, a JSON object keyed by the plugin's absolute path:
//!
//! ```json
//! { "/opt/cni/bin/host-local": { "size": 3571200, "mtimeNs": 1700000000123456789,
//!     "inode": 1234, "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"] } }
//! ```
//!
//! An entry counts only while the file on disk still has that size, mtime and inode.
//! Reading never fails: a missing, unreadable or corrupt cache is "not cached". Writing is
//! best effort and atomic (a temp file renamed over the cache), so plugins running at the
//! same time race to "last writer wins", never to a torn file. A folder that does not
//! exist is not created: no daemon there, no cache.

use std::{
    collections::BTreeMap,
    fs, io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use cni_api::IPAM_VERSIONS_FILE as FILE_NAME;

use crate::{daemon, spec::CniVersion};

/// Where the VERSION answers are kept; see the module doc.
pub struct VersionCache {
    /// `None` when the socket path has no folder.
    file: Option<PathBuf>,
}

/// What tells an upgraded plugin from the one that answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Identity {
    size: u64,
    mtime_ns: i64,
    inode: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(flatten)]
    identity: Identity,
    /// As the plugin printed them, so versions this binary does not know survive it.
    supported_versions: Vec<String>,
}

type Entries = BTreeMap<String, Entry>;

impl VersionCache {
    /// The cache in the folder of `socket` (the config's `daemonSocket`), or of
    /// [`cni_api::DEFAULT_SOCKET`]: see [`daemon::beside_socket`].
    pub fn beside_socket(socket: Option<&Path>) -> Self {
        Self {
            file: daemon::beside_socket(socket, FILE_NAME),
        }
    }

    /// The versions cached for `plugin`, while its entry matches the file on disk.
    pub fn get(&self, plugin: &Path) -> Option<Vec<CniVersion>> {
        let key = key(plugin)?;
        let identity = Identity::of(plugin)?;
        let entry = read(self.file.as_deref()?).remove(&key)?;
        (entry.identity == identity).then(|| known(&entry.supported_versions))
    }

    /// Remembers what `plugin` answered to VERSION. Best effort: a failed write only
    /// means the plugin is asked again next time.
    pub fn put(&self, plugin: &Path, supported: &[String]) {
        let (Some(file), Some(key), Some(identity)) =
            (self.file.as_deref(), key(plugin), Identity::of(plugin))
        else {
            return;
        };
        let mut entries = read(file);
        let supported_versions = supported.to_vec();
        entries.insert(
            key,
            Entry {
                identity,
                supported_versions,
            },
        );
        let _ = write(file, &entries);
    }
}

/// The versions of `answered` this plugin knows; the others (0.1.0, 0.2.0) are skipped.
pub(super) fn known(answered: &[String]) -> Vec<CniVersion> {
    answered
        .iter()
        .filter_map(|version| version.parse().ok())
        .collect()
}

/// The plugin's absolute path as a string (CNI_PATH may hold relative folders).
fn key(plugin: &Path) -> Option<String> {
    std::path::absolute(plugin)
        .ok()?
        .to_str()
        .map(str::to_owned)
}

impl Identity {
    fn of(plugin: &Path) -> Option<Self> {
        let meta = fs::metadata(plugin).ok()?;
        let mtime_ns = meta
            .mtime()
            .checked_mul(1_000_000_000)?
            .checked_add(meta.mtime_nsec())?;
        Some(Self {
            size: meta.len(),
            mtime_ns,
            inode: meta.ino(),
        })
    }
}

/// Every entry of the cache; none when it cannot be read or parsed.
fn read(file: &Path) -> Entries {
    fs::read(file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Writes the cache whole or not at all, through a temporary file of this process's
/// (`cni_api::files::write_shared`: plugins run in parallel). Fails (with nothing
/// written) when the folder does not exist.
fn write(file: &Path, entries: &Entries) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(entries)?;
    cni_api::files::write_shared(file, &json, 0o644)
}

#[cfg(test)]
impl VersionCache {
    pub(super) fn in_dir(dir: &Path) -> Self {
        Self {
            file: Some(dir.join(FILE_NAME)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;
    use crate::ipam::tests::TempDir;

    fn strings(versions: &[&str]) -> Vec<String> {
        versions
            .iter()
            .map(|version| (*version).to_owned())
            .collect()
    }

    /// Host-local 1.1.1's answer.
    fn up_to_1_0_0() -> Vec<String> {
        strings(&["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"])
    }

    fn plugin_in(dir: &TempDir, name: &str, content: &str) -> PathBuf {
        let path = dir.path().join(name);
        fs::write(&path, content).expect("the fake plugin is written");
        path
    }

    #[test]
    fn answer_round_trips_with_unknown_versions_skipped() {
        let dir = TempDir::new("versions-round-trip");
        let plugin = plugin_in(&dir, "host-local", "v1");
        let cache = VersionCache::in_dir(dir.path());
        assert_eq!(cache.get(&plugin), None, "nothing cached yet");

        cache.put(&plugin, &up_to_1_0_0());
        assert_eq!(
            cache.get(&plugin),
            Some(vec![
                CniVersion::V0_3_0,
                CniVersion::V0_3_1,
                CniVersion::V0_4_0,
                CniVersion::V1_0_0,
            ])
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("the folder lists")
            .map(|entry| entry.expect("an entry").file_name())
            .collect();
        assert!(
            names
                .iter()
                .all(|name| !name.to_string_lossy().ends_with(".tmp")),
            "the temp file was renamed away: {names:?}"
        );
        let on_disk: serde_json::Value = serde_json::from_slice(
            &fs::read(dir.path().join(FILE_NAME)).expect("the cache is written"),
        )
        .expect("the cache is JSON");
        let entry = &on_disk[plugin.to_str().expect("a UTF-8 path")];
        assert_eq!(entry["supportedVersions"][0], "0.1.0", "kept as answered");
        assert!(entry["size"].is_u64() && entry["mtimeNs"].is_i64() && entry["inode"].is_u64());
    }

    #[test]
    fn each_plugin_keeps_its_own_entry() {
        let dir = TempDir::new("versions-two-plugins");
        let old = plugin_in(&dir, "host-local", "v1");
        let new = plugin_in(&dir, "whereabouts", "v2");
        let cache = VersionCache::in_dir(dir.path());
        cache.put(&old, &up_to_1_0_0());
        cache.put(&new, &strings(&["1.0.0", "1.1.0"]));
        assert_eq!(cache.get(&old).map(|v| v.len()), Some(4));
        assert_eq!(
            cache.get(&new),
            Some(vec![CniVersion::V1_0_0, CniVersion::V1_1_0])
        );
    }

    #[test]
    fn upgraded_plugin_is_not_cached() {
        let dir = TempDir::new("versions-upgrade");
        let plugin = plugin_in(&dir, "host-local", "v1");
        let cache = VersionCache::in_dir(dir.path());
        cache.put(&plugin, &up_to_1_0_0());
        fs::write(&plugin, "version 2").expect("the plugin is upgraded in place");
        assert_eq!(cache.get(&plugin), None, "the size changed");
    }

    #[test]
    fn replaced_plugin_with_same_size_and_mtime_is_not_cached() {
        let dir = TempDir::new("versions-replace");
        let plugin = plugin_in(&dir, "host-local", "v1");
        let cache = VersionCache::in_dir(dir.path());
        cache.put(&plugin, &up_to_1_0_0());
        let mtime = fs::metadata(&plugin)
            .and_then(|meta| meta.modified())
            .expect("the plugin has an mtime");

        // What a package manager does: a new file renamed over the old one.
        let staged = plugin_in(&dir, "host-local.new", "v2");
        File::options()
            .write(true)
            .open(&staged)
            .and_then(|file| file.set_modified(mtime))
            .expect("the mtime is copied");
        fs::rename(&staged, &plugin).expect("the new plugin replaces the old one");
        let meta = fs::metadata(&plugin).expect("the new plugin is there");
        assert_eq!((meta.len(), meta.modified().ok()), (2, Some(mtime)));
        assert_eq!(cache.get(&plugin), None, "only the inode changed");
    }

    #[test]
    fn corrupt_cache_is_not_cached_and_is_replaced() {
        let dir = TempDir::new("versions-corrupt");
        let plugin = plugin_in(&dir, "host-local", "v1");
        let cache = VersionCache::in_dir(dir.path());
        for corrupt in ["{\"/opt/cni/bin/host-local\": {\"size\": ", "[]", ""] {
            fs::write(dir.path().join(FILE_NAME), corrupt).expect("the cache is written");
            assert_eq!(cache.get(&plugin), None, "{corrupt:?} is not cached");
        }
        cache.put(&plugin, &up_to_1_0_0());
        assert!(
            cache.get(&plugin).is_some(),
            "the corrupt cache was replaced"
        );
    }

    #[test]
    fn missing_folder_is_not_created() {
        let dir = TempDir::new("versions-no-folder");
        let plugin = plugin_in(&dir, "host-local", "v1");
        let absent = dir.path().join("no-daemon-here");
        let cache = VersionCache::in_dir(&absent);
        cache.put(&plugin, &up_to_1_0_0());
        assert!(!absent.exists(), "the folder is not created");
        assert_eq!(cache.get(&plugin), None);
    }

    #[test]
    fn cache_is_in_the_daemon_socket_folder() {
        let file = |socket: Option<&str>| VersionCache::beside_socket(socket.map(Path::new)).file;
        assert_eq!(
            file(None),
            Some(PathBuf::from("/run/ebpf-cni/ipam-versions.json"))
        );
        assert_eq!(
            file(Some("/run/ecni-7-1-d/ebpf-cnid.sock")),
            Some(PathBuf::from("/run/ecni-7-1-d/ipam-versions.json"))
        );
        assert_eq!(file(Some("ebpf-cnid.sock")), None, "no folder, no cache");
    }
}
