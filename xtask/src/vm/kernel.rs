//! The guests' kernels: Debian's own `linux-image-*-amd64` packages, unpacked through
//! the private apt (apt.rs), never installed, given a `modules.dep` by `depmod`, and
//! cached under the tools folder like bpf-linker.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use super::apt;
use crate::cmd;

/// A kernel `vm-test` can boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// What `--kernel` calls it.
    pub name: &'static str,
    /// The Debian suite whose `linux-image-amd64` names the kernel.
    pub suite: &'static str,
    /// What the guest runs on it.
    pub suite_kind: Suite,
}

/// What runs on a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// The integration suite.
    Integration,
    /// The integration suite's binaries whose outcome the kernel decides
    /// ([`KERNEL_BINARIES`]): what CI runs on 6.1 (see `vm::ci_kernels`).
    Kernel,
    /// The binaries that need netkit pairs ([`NETKIT_BINARIES`]), which the host's
    /// kernel may not make: what CI runs on 6.12.
    Netkit,
    /// Only the kernel-floor test: the kernel is older than the floor in docs/kernels.md, so the
    /// daemon must refuse it (`tests/tests/kernel_floor.rs`).
    Refusal,
}

/// Debian 12's kernel (no TCX), the 6.12 LTS from bookworm-backports (Debian 13's
/// series), and bullseye's 5.10, below the floor of 5.17.
pub const KERNELS: &[Spec] = &[
    Spec {
        name: "6.1",
        suite: "bookworm",
        suite_kind: Suite::Integration,
    },
    Spec {
        name: "6.12",
        suite: "bookworm-backports",
        suite_kind: Suite::Integration,
    },
    Spec {
        name: "5.10",
        suite: "bullseye",
        suite_kind: Suite::Refusal,
    },
];

/// The test binaries whose outcome depends on the kernel: `datapath` (the programs
/// through the verifier and `BPF_PROG_TEST_RUN`, the uplink's attach modes, pins across
/// restarts, and every datapath path: redirects into pods, source NAT, hostPorts, the
/// overlay's tunnel keys, FIB lookups, BIG TCP, `tbf`, the gateway, isolation,
/// services). What is left out is user space over netlink and files (plugin input and
/// output, runtimes' JSON, node sources, install, records, metrics, the image): the same
/// code on every kernel, run by the host's suite. `cargo xtask vm-test` runs every
/// binary.
pub const KERNEL_BINARIES: &[&str] = &["datapath"];

/// Why a test of [`KERNEL_BINARIES`] is left out of CI's 6.1 guest.
const SAME_ON_6_1: &str = "on 6.1, which has no TCX, the default attach mode is clsact: \
    this test repeats its default-mode twin there";
const USER_SPACE: &str = "what it checks is the daemon's or the plugin's own logic over \
    netlink and files, the same code on every kernel";
const PROGRAM_LOGIC: &str = "what it checks is a program's own logic (counts, port choice, \
    sequence windows, header bounds, which packets it refuses) on the maps and helpers \
    that kept tests cross on 6.1 too";
const SCALE: &str = "what it checks is a table's or the daemon's scale, not the kernel's \
    behaviour";
const ONE_OF_A_KIND: &str = "a variant of a kept test: another setting, size or address \
    of the same path through the kernel";

/// Tests of [`KERNEL_BINARIES`] that CI's 6.1 guest skips (`--skip`, each written as the
/// start of their names; libtest skips any name that holds it), and why. Under software emulation a daemon's start takes about 20 s there
/// (the verifier spends 11 s on `uplink_egress` alone) and the whole binary needed more
/// than the guest's 55 minutes. What stays is most of the programs' test runs, and one
/// or more tests with daemons for each path through the kernel:
/// forwarding, the overlay, native routes, source NAT and its ICMP, hostPorts,
/// Services, NetworkPolicy, attach modes across restarts, the uplink's changes, rate
/// limits, BIG TCP, the gateway, the pods' and the underlay's boundaries. The host runs
/// every test, and `cargo xtask vm-test` every test on 6.1 (`--ci`: this part). A
/// skip that is in no test's name is an error: a rename must not drop a test from CI,
/// nor a skip stay behind.
pub const KERNEL_SKIPS: &[(&str, &str)] = &[
    ("restart::with_clsact_filters_", SAME_ON_6_1),
    (
        "uplink_attach::with_clsact_filters_source_nat_",
        SAME_ON_6_1,
    ),
    (
        "uplink_attach::switching_between_tcx_and_clsact_",
        SAME_ON_6_1,
    ),
    ("uplink_lifecycle::with_clsact_filters_", SAME_ON_6_1),
    ("nat_program_budgets::", PROGRAM_LOGIC),
    ("nat_program_ports::", PROGRAM_LOGIC),
    ("nat_program_tcp_window::", PROGRAM_LOGIC),
    ("nat_program_malformed::", PROGRAM_LOGIC),
    ("tcp_blind_rst::a_", PROGRAM_LOGIC),
    ("snat::two_pods_with_the_same_source_port_", PROGRAM_LOGIC),
    ("snat::a_protocol_without_ports_", PROGRAM_LOGIC),
    (
        "pod_isolation::a_pod_sending_from_another_mac_",
        PROGRAM_LOGIC,
    ),
    ("pod_isolation::arp_about_another_address_", PROGRAM_LOGIC),
    ("pod_isolation::tagged_frames_from_a_pod_", PROGRAM_LOGIC),
    ("pod_boundaries::a_pod_cannot_tunnel_", PROGRAM_LOGIC),
    (
        "underlay_boundaries::a_frame_for_another_hosts_mac_",
        PROGRAM_LOGIC,
    ),
    ("snat::two_thousand_concurrent_connections_", SCALE),
    ("hostport::five_thousand_mappings_", SCALE),
    ("forwarding::what_the_node_sends_a_pod_", ONE_OF_A_KIND),
    (
        "bandwidth::a_tcp_stream_in_each_direction_holds_to_a_500_mbit_",
        ONE_OF_A_KIND,
    ),
    ("bandwidth::the_burst_passes_at_once_", ONE_OF_A_KIND),
    ("cross_node_vxlan::a_node_behind_a_router_", ONE_OF_A_KIND),
    (
        "cross_node_vxlan::neither_translated_flows_nor_host_ports_",
        ONE_OF_A_KIND,
    ),
    (
        "services_cluster::services_across_nodes_in_the_overlay_with_kube_proxys_nftables_",
        ONE_OF_A_KIND,
    ),
    (
        "services_cluster::services_across_nodes_natively_routed_with_kube_proxys_iptables_",
        ONE_OF_A_KIND,
    ),
    ("snat::bulk_pod_traffic_", ONE_OF_A_KIND),
    ("snat::pod_to_pod_and_cluster_traffic_", ONE_OF_A_KIND),
    (
        "snat::a_host_outside_reaching_a_pods_own_address_",
        ONE_OF_A_KIND,
    ),
    ("gateway::hosts_on_another_network_", ONE_OF_A_KIND),
    ("gateway::a_pod_pings_its_gateway_", ONE_OF_A_KIND),
    (
        "underlay_boundaries::with_strict_underlay_trust_",
        ONE_OF_A_KIND,
    ),
    ("uplink_lifecycle::a_second_uplink_", ONE_OF_A_KIND),
    (
        "big_tcp::packets_of_192_kib_",
        "6.1 has no IPv4 BIG TCP: the 64 KiB packets it \
        sends there are what the other tests send",
    ),
    ("bandwidth::check_finds_a_missing_limit_", USER_SPACE),
    ("bandwidth::the_plugins_own_keys_win_", USER_SPACE),
    (
        "cross_node_vxlan::a_node_restarted_over_pins_of_another_layout_",
        USER_SPACE,
    ),
    ("daemon_pod_veths::prepare_refuses_", USER_SPACE),
    (
        "forwarding::pods_added_after_the_block_anchor_was_deleted_",
        USER_SPACE,
    ),
    ("gateway::the_gateway_goes_with_the_last_pod_", USER_SPACE),
    ("hostport::a_taken_host_port_is_refused_", USER_SPACE),
    ("hostport::host_ports_of_the_ephemeral_range_", USER_SPACE),
    ("hostport::del_and_gc_remove_", USER_SPACE),
    ("hostport::a_mapping_without_host_ip_covers_", USER_SPACE),
];

/// The test binaries whose tests take another path on a kernel without netkit pairs.
pub const NETKIT_BINARIES: &[&str] = &["netkit_pods"];

/// An unpacked kernel.
pub struct Kernel {
    pub spec: Spec,
    /// The package's version (`6.1.176-1`).
    pub version: String,
    /// `uname -r` of the kernel (`6.1.0-50-amd64`).
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/RELEASE` of the unpacked package, with `modules.dep`.
    pub modules: PathBuf,
}

/// The kernel of `spec`: from the cache when it is there, else downloaded.
///
/// The cache is kept per name and is not refreshed once complete: a later point release
/// of the suite is taken only after `rm -r` of the folder (`vm-test` prints it).
pub fn get(cache: &Path, source: &apt::Source, spec: Spec) -> anyhow::Result<Kernel> {
    let home = cache.join(format!("kernel-{}", spec.name));
    let ready = home.join("ready");
    if let Ok(text) = fs::read_to_string(&ready)
        && let Some((version, release)) = text.trim().split_once(' ')
    {
        return Ok(unpacked(&home, spec, version, release));
    }
    let apt = source.open()?;
    let (package, version) = image_package(&apt, spec.suite)?;
    eprintln!(
        "vm-test: downloading {package} {version} from {}",
        spec.suite
    );
    let _ = fs::remove_dir_all(&home);
    let root = home.join("root");
    apt.unpack(&package, &version, &root)?;
    let release = package
        .strip_prefix("linux-image-")
        .context("the image package is not named linux-image-*")?
        .to_owned();
    cmd::run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
    let kernel = unpacked(&home, spec, &version, &release);
    for path in [&kernel.vmlinuz, &kernel.modules.join("modules.dep")] {
        anyhow::ensure!(
            path.exists(),
            "{} is missing after unpacking",
            path.display()
        );
    }
    fs::write(&ready, format!("{version} {release}\n"))?;
    Ok(kernel)
}

impl Kernel {
    /// Whether the kernel's configuration (the package's `boot/config-RELEASE`) has
    /// `option` built in or as a module.
    pub fn configured(&self, option: &str) -> anyhow::Result<bool> {
        let path = self
            .vmlinuz
            .with_file_name(format!("config-{}", self.release));
        let config = fs::read_to_string(&path)
            .with_context(|| format!("reading the kernel's configuration {}", path.display()))?;
        Ok(config
            .lines()
            .any(|line| line == format!("{option}=y") || line == format!("{option}=m")))
    }
}

fn unpacked(home: &Path, spec: Spec, version: &str, release: &str) -> Kernel {
    let root = home.join("root");
    Kernel {
        spec,
        version: version.to_owned(),
        release: release.to_owned(),
        vmlinuz: root.join(format!("boot/vmlinuz-{release}")),
        modules: root.join(format!("lib/modules/{release}")),
    }
}

/// The versioned image package that `suite`'s `linux-image-amd64` depends on, and that
/// package's version in the suite.
fn image_package(apt: &apt::Apt, suite: &str) -> anyhow::Result<(String, String)> {
    let meta_version = apt.version_in("linux-image-amd64", suite)?;
    let depends = cmd::output(
        apt.command("apt-cache")
            .args(["depends", &format!("linux-image-amd64={meta_version}")]),
    )
    .context("apt-cache depends failed")?;
    let package = depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|name| name.starts_with("linux-image-"))
        .with_context(|| format!("linux-image-amd64 {meta_version} names no image"))?
        .to_owned();
    // The image package carries the same source version as its meta package.
    Ok((package, meta_version))
}

/// `--kernel`'s values: a name of [`KERNELS`], or `all`.
pub fn select(name: &str) -> anyhow::Result<Vec<Spec>> {
    if name == "all" {
        return Ok(KERNELS.to_vec());
    }
    match KERNELS.iter().find(|spec| spec.name == name) {
        Some(spec) => Ok(vec![*spec]),
        None => bail!(
            "--kernel {name}: one of {}, or all",
            KERNELS
                .iter()
                .map(|spec| spec.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
