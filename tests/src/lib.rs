//! Building blocks for tests and the demo: network namespaces, cgroups, the daemon as a
//! real process, and the project's binaries. Everything created has a per-process unique
//! name and is removed on drop, also when a test panics.
//!
//! Nothing here touches the machine's own network namespace: links are created with
//! `ip -n <ns>` directly inside the namespaces the caller made.
//!
//! `frames` holds what the pod program's BPF_PROG_TEST_RUN tests share: the seeded
//! endpoints, hand-written frames, an independent IPv4 checksum, the checks, and the
//! random frames with their reference model.
//! `nat_frames` is its counterpart for the uplink's source NAT programs; `snat` holds
//! what the source NAT integration tests share.
//! `runtimes` runs real container runtimes (containerd through the CRI, podman) on a
//! simulated node, with the real plugin.
//! `oci` writes OCI image archives (the runtime tests' image, `cargo xtask image`);
//! `deploy` reads the Kubernetes manifests under `deploy/`; `kubelet` turns the
//! DaemonSet's container into the `podman run` that starts it on a simulated node;
//! `service_account` gives a daemon a pod's in-cluster configuration.
//! `netpol` runs NetworkPolicy tests as Kubernetes' e2e suite does (a reachability
//! matrix of pods in namespaces, probed pair by pair).
//! `netpol_cases` holds every case of that suite as data: policies, labels, expected reach.
//! `kube_proxy` writes kube-proxy's own rules for a list of Services into a node's
//! namespace, in its iptables or its nftables mode.
//! `fake_api` is a Kubernetes API server scripted by the test, in the real list and
//! watch wire format (cni-nodes' and cni-policy's tests include it by path).

pub mod big_tcp;
pub mod bins;
pub mod bpf_object;
pub mod cgroup;
pub mod chain;
pub mod cluster;
pub mod cni;
pub mod daemon;
pub mod deploy;
pub mod fake_api;
pub mod frames;
pub mod http;
pub mod kernel;
pub mod kube_proxy;
pub mod kubelet;
pub mod nat_frames;
pub mod netkit;
pub mod netns;
pub mod netpol;
pub mod netpol_cases;
pub mod node;
pub mod oci;
pub mod runtimes;
pub mod service_account;
pub mod snat;
pub mod traffic;

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

/// Prefix of every namespace, bpffs folder, socket folder and cgroup this code creates,
/// so that leftovers of a killed run are recognisable.
pub const PREFIX: &str = "ecni";

/// A name unique to this process and call: `ecni-<pid>-<n>-<tag>`.
pub fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{PREFIX}-{}-{n}-{tag}", std::process::id())
}

/// The variable through which `cargo xtask vm-test` tells the tests how much slower
/// than this machine the guest runs (about 10 under software emulation).
pub const TIME_SCALE_VAR: &str = "EBPF_CNI_TIME_SCALE";

/// `limit` stretched by the run's time scale ([`TIME_SCALE_VAR`], 1 when unset): the
/// waits for something to happen, never the lengths of timers the product runs (a
/// flow's timeout, a sweep interval), which pass at the same speed in a slow guest.
pub fn scaled(limit: Duration) -> Duration {
    limit * time_scale()
}

/// How much slower than this machine the run goes ([`TIME_SCALE_VAR`], 1 when unset).
pub fn time_scale() -> u32 {
    static SCALE: OnceLock<u32> = OnceLock::new();
    *SCALE.get_or_init(|| {
        std::env::var(TIME_SCALE_VAR).map_or(1, |value| {
            value
                .parse::<u32>()
                .ok()
                .filter(|scale| *scale >= 1)
                .unwrap_or_else(|| panic!("{TIME_SCALE_VAR}={value}: a whole number from 1"))
        })
    })
}

/// Fails loudly (never skips) when not root: CI runs as root, so a skip would hide a
/// test that never ran.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test builds network namespaces and loads eBPF: run it as root (`sudo cargo xtask test`)"
    );
}

/// Removes namespaces, bpffs folders, socket folders and cgroups (killing what still
/// runs in them) left by runs that were killed before their guards ran (their pid no
/// longer exists). Returns what it removed.
pub fn sweep_stale() -> Vec<String> {
    let mut removed = Vec::new();
    let cgroup_mount = cgroup::mount_point();
    let netns = std::fs::read_dir("/run/netns").into_iter().flatten();
    let bpf = std::fs::read_dir("/sys/fs/bpf").into_iter().flatten();
    let run = std::fs::read_dir("/run").into_iter().flatten();
    let cgroups = cgroup_mount
        .as_ref()
        .and_then(|mount| std::fs::read_dir(mount).ok())
        .into_iter()
        .flatten();
    for entry in netns
        .chain(bpf)
        .chain(run)
        .chain(cgroups)
        .filter_map(Result::ok)
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&format!("{PREFIX}-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        let gone = if path.starts_with("/run/netns") {
            std::process::Command::new("ip")
                .args(["netns", "del", &name])
                .status()
                .is_ok_and(|status| status.success())
        } else if cgroup_mount
            .as_ref()
            .is_some_and(|mount| path.parent() == Some(mount.as_path()))
        {
            // A cgroup's files cannot be deleted: only rmdir of the emptied folder works.
            cgroup::remove(&path)
        } else {
            std::fs::remove_dir_all(&path).is_ok()
        };
        if gone {
            removed.push(path.display().to_string());
        }
    }
    removed
}
