//! What a container runtime leaves on the host outside its own folders, found and
//! removed after a test (also one that failed): processes that name the test's folder,
//! mounts under it, the pods' cgroups, and libcni's cached results. Every step is
//! best effort and only touches what carries the test's unique names.

use std::{
    fs,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use nix::{
    mount::{MntFlags, umount2},
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Where libcni caches every result it got, whatever the runtime's own folders.
pub const CNI_CACHE: &str = "/var/lib/cni/results";

/// How long killed processes and emptied cgroups may take to go.
const GONE_TIMEOUT: Duration = Duration::from_secs(5);

/// Pids of the processes (not this one) whose command line contains `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid: i32 = name.parse().ok()?;
            if name == me {
                return None;
            }
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some(pid)
        })
        .collect()
}

/// Gives the processes that mention `needle` up to `grace` to exit by themselves (a
/// runtime's cleanup helpers finishing), then kills the rest.
pub fn end_processes_mentioning(needle: &str, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        let pids: Vec<i32> = processes_mentioning(needle)
            .into_iter()
            .filter(|pid| !is_zombie(*pid))
            .collect();
        if pids.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            kill_all(&pids);
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs `pids` and waits (bounded) until they are gone.
pub fn kill_all(pids: &[i32]) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + GONE_TIMEOUT;
    while pids
        .iter()
        .any(|pid| Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(*pid))
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(20));
    }
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Mount points of this mount namespace (`/proc/self/mountinfo`'s fifth field, octal
/// escapes undone) and their filesystem types.
fn mounts() -> Vec<(PathBuf, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = fields.get(4)?;
            let separator = fields.iter().position(|field| *field == "-")?;
            let kind = fields.get(separator + 1)?;
            Some((PathBuf::from(unescape(point)), (*kind).to_owned()))
        })
        .collect()
}

fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Mount points at or under `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .map(|(point, _)| point)
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// Detaches every mount at or under `dir`, deepest first.
pub fn unmount_under(dir: &Path) {
    let mut points = mounts_under(dir);
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    for point in points {
        let _ = umount2(&point, MntFlags::MNT_DETACH);
    }
}

/// Removes a network namespace a runtime mounted at `path`, if it is still there.
pub fn remove_netns(path: &Path) {
    if path.exists() {
        let _ = umount2(path, MntFlags::MNT_DETACH);
        let _ = fs::remove_file(path);
    }
}

/// libcni's cached results for `network` (files named `<network>-<container>-<ifname>`).
pub fn cni_cache_entries(network: &str) -> Vec<PathBuf> {
    let prefix = format!("{network}-");
    let Ok(entries) = fs::read_dir(CNI_CACHE) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

/// Removes libcni's cached results for `network`.
pub fn remove_cni_cache(network: &str) {
    for entry in cni_cache_entries(network) {
        let _ = fs::remove_file(entry);
    }
}

/// Removes libcni's cached results for `network` of the containers `ids` only (the
/// network's name may be one others use too).
pub fn remove_cni_cache_of(network: &str, ids: &[String]) {
    for entry in cni_cache_entries(network) {
        let name = entry
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        if ids
            .iter()
            .any(|id| name.starts_with(&format!("{network}-{id}-")))
        {
            let _ = fs::remove_file(entry);
        }
    }
}

/// The folders of cgroup `relative` (e.g. `ecni-1-2-pods`) in every mounted cgroup
/// hierarchy (v1 controllers and the unified one).
pub fn cgroup_folders(relative: &str) -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .filter(|(_, kind)| kind == "cgroup" || kind == "cgroup2")
        .map(|(point, _)| point.join(relative))
        .filter(|folder| folder.is_dir())
        .collect()
}

/// Kills what runs in cgroup `relative` and below, in every hierarchy, and removes its
/// folders, deepest first.
pub fn remove_cgroup(relative: &str) {
    let folders = cgroup_folders(relative);
    let mut tree: Vec<PathBuf> = Vec::new();
    for folder in &folders {
        collect_tree(folder, &mut tree);
    }
    let pids: Vec<i32> = tree
        .iter()
        .filter_map(|folder| fs::read_to_string(folder.join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .lines()
                .filter_map(|pid| pid.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    kill_all(&pids);
    tree.sort_by_key(|folder| std::cmp::Reverse(folder.components().count()));
    let deadline = Instant::now() + GONE_TIMEOUT;
    for folder in tree {
        // A killed process leaves its cgroup a moment after it is reaped.
        while fs::remove_dir(&folder).is_err() && folder.exists() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
}

fn collect_tree(folder: &Path, tree: &mut Vec<PathBuf>) {
    tree.push(folder.to_owned());
    if let Ok(entries) = fs::read_dir(folder) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                collect_tree(&entry.path(), tree);
            }
        }
    }
}
