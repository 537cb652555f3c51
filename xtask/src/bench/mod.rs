//! `cargo xtask bench`: ebpf-cni side by side with the reference chain (bridge +
//! host-local + portmap) and, where it applies, raw veth pairs (the ceiling: one pair
//! pod to pod, two through a namespace that only routes for source NAT), in one
//! run on one machine. Every load is bounded; runs are interleaved across contenders
//! and repeated, and reported as median (min-max). Figures whose capability is not
//! built are reported as missing, never invented.

mod bandwidth;
mod cross_node;
mod hostport;
mod load;
mod memory;
mod policy;
mod reference;
mod report;
mod services;
mod timing;
mod traffic;

use std::{path::Path, process::Command, time::Instant};

use anyhow::Context;
use ebpf_cni_tests::bins;

use crate::{
    build::{self, Profile},
    cmd, setup,
};
// `reference.rs` reaches the wrapper as `super::PeakWrapper`.
use memory::{PeakWrapper, memory};
use report::{Contender, Figure, Report, Stats, Value};
use timing::add_del_times;
use traffic::{pod_to_external, pod_to_pod};

/// How much work: `--quick` keeps the whole run under three minutes.
#[derive(Clone, Copy)]
pub struct Plan {
    pub quick: bool,
}

impl Plan {
    fn seconds(self) -> u32 {
        if self.quick { 1 } else { 5 }
    }

    /// ADDs timed at each mapping count in the hostPort figures.
    fn timed_adds(self) -> usize {
        if self.quick { 3 } else { 10 }
    }
    /// Pods of 100 mappings each in the hostPort figures (see `hostport`).
    fn mapped_pods(self) -> u16 {
        if self.quick { 5 } else { 50 }
    }
    /// Parallel-ADD runs per contender: on 2 shared cores single runs of the same code
    /// differ by 10%, and a median of 5 moves less than one of 3.
    fn repeats(self) -> usize {
        if self.quick { 3 } else { 5 }
    }
    /// Runs per traffic figure and contender. Throughput: one run's result depends on
    /// where the scheduler puts iperf3's client and server (our BIG TCP pods, cubic:
    /// about 51 Gbit/s with both on one CPU, 31 on the two CPUs), so five unpinned runs
    /// can land mostly on either side. TCP_RR and TCP_CRR: the reference's single runs
    /// spread by up to 13% within one figure (interleaved pairs of SNAT TCP_CRR runs gave
    /// ratios from 1.11 to 1.26), and with medians of 5 a connection-rate ratio moved by
    /// 5% from one full run to the next (1.23, 1.18) on the same datapath.
    fn traffic_repeats(self) -> usize {
        if self.quick { 3 } else { 9 }
    }
    fn timed_pods(self) -> usize {
        50
    }
}

const PARALLEL_PODS: usize = 30;

/// The sections, in run order; `--only <name>` runs one, its report under target/bench.
pub const SECTIONS: [&str; 9] = [
    "add-del",
    "pod-to-pod",
    "pod-to-external",
    "hostport",
    "cross-node",
    "services",
    "policy",
    "bandwidth",
    "memory",
];

pub fn run(root: &Path, plan: Plan, only: Option<&str>) -> anyhow::Result<()> {
    if let Some(only) = only {
        anyhow::ensure!(
            SECTIONS.contains(&only),
            "no section {only}; sections: {}",
            SECTIONS.join(", ")
        );
    }
    let tools = setup::full()?;
    // --quick reuses the debug build of the plugin and the daemon (the one `cargo xtask
    // test` makes): compiling release binaries would take most of its three minutes on
    // a fresh clone. The datapath is the same optimized eBPF object either way; only
    // the plugin's and daemon's own work (about 1 ms of an ADD) runs slower, which can
    // only make our figures worse. Full runs use release builds.
    let profile = if plan.quick {
        Profile::Dev
    } else {
        Profile::Release
    };
    let built = build::all(root, &tools, profile)?;
    bins::use_dir(built.bin_dir.clone());
    ebpf_cni_tests::sweep_stale();
    let started = Instant::now();

    let mut figures = Vec::new();
    let mut sections = Vec::new();
    let runs = |name: &str| only.is_none_or(|only| only == name);
    let mut section = |name: &str, measure: &dyn Fn() -> anyhow::Result<Vec<Figure>>| {
        if !runs(name) {
            return Ok(());
        }
        let measured = measure();
        let took = started.elapsed().as_secs_f64()
            - sections
                .iter()
                .map(|(_, secs): &(String, f64)| secs)
                .sum::<f64>();
        eprintln!("bench: {name} took {took:.0} s");
        sections.push((name.to_owned(), took));
        measured.map(|measured| figures.extend(measured))
    };
    section("add-del", &|| add_del_times(plan))?;
    section("pod-to-pod", &|| pod_to_pod(plan))?;
    section("pod-to-external", &|| pod_to_external(plan))?;
    section("hostport", &|| hostport::hostport(plan))?;
    section("cross-node", &|| cross_node::cross_node(plan))?;
    section("services", &|| services::services(plan))?;
    section("policy", &|| policy::policy(plan))?;
    section("bandwidth", &|| bandwidth::bandwidth(plan))?;
    section("memory", &memory)?;
    let sections = sections
        .iter()
        .map(|(name, secs)| format!("{name} {secs:.0} s"))
        .collect::<Vec<_>>()
        .join(", ");

    let policy_notes = policy::notes(&figures);
    let mut report = Report {
        title: "ebpf-cni benchmarks".into(),
        date: text(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        commit: commit(root),
        machine: machine(),
        kernel: text(Command::new("uname").arg("-r")),
        command: format!("cargo xtask bench{}", if plan.quick { " --quick" } else { "" }),
        notes: vec![
            format!(
                "Each traffic figure: {} runs of {} s per contender, interleaved; ADD/DEL: {} pods one after another, then {PARALLEL_PODS} in parallel ({} runs); {} builds of ebpf-cni's binaries.",
                plan.traffic_repeats(),
                plan.seconds(),
                plan.timed_pods(),
                plan.repeats(),
                if plan.quick { "debug" } else { "release" }
            ),
            "Reference: Debian's containernetworking-plugins (bridge with isGateway, isDefaultGateway, ipMasq, hairpinMode; host-local; portmap), run as a runtime runs a conflist.".into(),
            "Both simulated nodes' uplinks have IPv4 BIG TCP (GSO/GRO 192 KiB, as a NIC with it switched on): new ebpf-cni pods follow the uplink's size, the reference's bridge ports stay at 64 KiB. The figure \"without BIG TCP\" is two of our pods created before the uplink got it.".into(),
            format!("TCP_RR and TCP_CRR use the project's own bounded client and server (xtask/src/bench/load.rs); throughput uses iperf3 with TCP {}, the kernel's default, whatever the machine sets (a paced BBR stream left the CPUs idle and measured its own rate estimate, not the datapath).", load::CONGESTION_CONTROL),
            "Bandwidth figures: a pod limited both ways (burst: 100 ms at the rate) streams 10 s with iperf3 (5 runs per contender, interleaved; 1 with --quick) to or from an unlimited pod while ping runs alongside in the stream's direction. The reference there is bridge + host-local + Debian's bandwidth plugin (tbf on the host veth, ifb + tbf for the pod's egress); the raw veth pair has a tbf of the same rate, burst and 25 ms latency on each end: the qdisc alone, the ceiling.".into(),
            "NetworkPolicy figures: the server pod on another node (native routes) selected by 0, 100 or 1,000 policies of ten ipBlock peers each plus one allowing the client; the reference has the same allowance as an iptables chain in the server's node (established first, one ACCEPT per peer, the client's last, DROP), the ceiling no policy. Latency probes are TCP connections every millisecond, a refused one waiting 20 ms for its SYN's answer.".into(),
            "2 shared cores: absolute numbers are noisy, ratios within one run are what to read.".into(),
            format!(
                "The run took {:.0} s ({sections}).",
                started.elapsed().as_secs_f64()
            ),
        ],
        figures,
    };
    report.notes.extend(policy_notes);
    // BENCHMARKS.md holds full runs of every section; the rest go under target/bench.
    let (markdown, svg) = if plan.quick || only.is_some() {
        let dir = root.join("target").join("bench");
        std::fs::create_dir_all(&dir)?;
        (dir.join("BENCHMARKS.md"), dir.join("benchmarks.svg"))
    } else {
        (
            root.join("BENCHMARKS.md"),
            root.join("docs").join("benchmarks.svg"),
        )
    };
    report::write(&report, &markdown, &svg)?;
    eprintln!("bench: wrote {} and {}", markdown.display(), svg.display());
    #[expect(clippy::print_stdout, reason = "the table is the command's output")]
    {
        println!("{}", std::fs::read_to_string(&markdown)?);
    }
    Ok(())
}

/// A simulated node running ebpf-cni, configured as the reference chain is: no `mtu` in
/// the config (the tests' 1450 would shrink our segments against the reference's 1500).
fn node(subnet: &str) -> ebpf_cni_tests::node::Node {
    let mut node = ebpf_cni_tests::node::Node::start(subnet);
    node.network.mtu = None;
    node
}

/// Runs `measure` for every contender, `repeats` times, interleaved.
fn interleaved(
    repeats: usize,
    contenders: &[Contender],
    mut measure: impl FnMut(Contender) -> anyhow::Result<f64>,
) -> anyhow::Result<Vec<(Contender, Vec<f64>)>> {
    let mut samples: Vec<(Contender, Vec<f64>)> =
        contenders.iter().map(|c| (*c, Vec::new())).collect();
    for _ in 0..repeats {
        for (contender, values) in &mut samples {
            values.push(measure(*contender).with_context(|| format!("measuring {contender:?}"))?);
        }
    }
    Ok(samples)
}

fn figure(
    name: &str,
    unit: &str,
    higher_is_better: bool,
    samples: Vec<(Contender, Vec<f64>)>,
) -> Figure {
    let mut values: Vec<(Contender, Value)> = samples
        .into_iter()
        .map(|(contender, values)| {
            let value = Stats::from_samples(&values)
                .map_or(Value::Missing("no sample".into()), Value::Measured);
            (contender, value)
        })
        .collect();
    for contender in [Contender::EbpfCni, Contender::Reference, Contender::Raw] {
        if !values.iter().any(|(c, _)| *c == contender) {
            values.push((contender, Value::NotApplicable));
        }
    }
    Figure {
        name: name.into(),
        unit: unit.into(),
        higher_is_better,
        values,
    }
}

fn text(command: &mut Command) -> String {
    cmd::output(command)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

fn commit(root: &Path) -> String {
    let head =
        text(
            Command::new("git")
                .current_dir(root)
                .args(["rev-parse", "--short=12", "HEAD"]),
        );
    let dirty = cmd::output(
        Command::new("git")
            .current_dir(root)
            .args(["status", "--porcelain"]),
    )
    .is_some_and(|status| !status.trim().is_empty());
    if dirty {
        format!("{head} (with uncommitted changes)")
    } else {
        head
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{cores} cores, {cpu}")
}
