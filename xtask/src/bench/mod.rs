//! `cargo xtask bench`: ebpf-cni side by side with the reference chain (bridge +
//! host-local + portmap) and, where it applies, a raw veth pair (the ceiling), in one
//! run on one machine. Every load is bounded; runs are interleaved across contenders
//! and repeated, and reported as median (min-max). Figures whose capability is not
//! built are reported as missing, never invented.

mod load;
mod reference;
mod report;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{bins, cni::Call, netns::Netns, node::Node};

use crate::{
    build::{self, Profile},
    cmd, setup,
};
use reference::RefNode;
use report::{Contender, Figure, Report, Stats, Value};

/// How much work: `--quick` keeps the whole run under three minutes.
#[derive(Clone, Copy)]
pub struct Plan {
    pub quick: bool,
}

impl Plan {
    fn seconds(self) -> u32 {
        if self.quick { 2 } else { 5 }
    }
    fn repeats(self) -> usize {
        3
    }
    fn timed_pods(self) -> usize {
        50
    }
}

const PARALLEL_PODS: usize = 30;

pub fn run(root: &Path, plan: Plan) -> anyhow::Result<()> {
    let tools = setup::full()?;
    let built = build::all(root, &tools, Profile::Release)?;
    bins::use_dir(built.bin_dir.clone());
    ebpf_cni_tests::sweep_stale();
    let started = Instant::now();

    let mut figures = Vec::new();
    figures.extend(add_del_times(plan)?);
    figures.extend(pod_to_pod(plan)?);
    figures.extend(pod_to_external(plan)?);
    figures.extend(missing_figures());
    figures.extend(memory()?);

    let report = Report {
        title: "ebpf-cni benchmarks".into(),
        date: text(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        commit: commit(root),
        machine: machine(),
        kernel: text(Command::new("uname").arg("-r")),
        command: format!("cargo xtask bench{}", if plan.quick { " --quick" } else { "" }),
        notes: vec![
            format!(
                "Each traffic figure: {} runs of {} s per contender, interleaved; ADD/DEL: {} pods one after another, then {PARALLEL_PODS} in parallel; release builds.",
                plan.repeats(),
                plan.seconds(),
                plan.timed_pods()
            ),
            "Reference: Debian's containernetworking-plugins (bridge with isGateway, isDefaultGateway, ipMasq, hairpinMode; host-local; portmap), run as a runtime runs a conflist.".into(),
            "TCP_RR and TCP_CRR use the project's own bounded client and server (xtask/src/bench/load.rs); throughput uses iperf3.".into(),
            "2 shared cores: absolute numbers are noisy, ratios within one run are what to read.".into(),
            format!("The run took {:.0} s.", started.elapsed().as_secs_f64()),
        ],
        figures,
    };
    let (markdown, svg) = if plan.quick {
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

/// ADD and DEL wall time per pod (median, p99) and of 30 parallel ADDs.
fn add_del_times(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: ADD/DEL times");
    let node = Node::start("10.250.0.0/16");
    let config = node.network.config("1.0.0");
    let refnode = RefNode::new("10.251.0.0/16");
    // One namespace per pod and contender; ADDs alternate between the contenders.
    let pods: Vec<(Netns, Netns)> = (0..plan.timed_pods())
        .map(|_| (Netns::new("tpod"), Netns::new("tref")))
        .collect();
    let mut add = vec![
        (Contender::EbpfCni, Vec::new()),
        (Contender::Reference, Vec::new()),
    ];
    let mut del = add.clone();
    for (n, (ours, theirs)) in pods.iter().enumerate() {
        let id = format!("timed-{n}");
        let t = Instant::now();
        Call::new("ADD", &id, "eth0", Some(ours), &config)
            .run(&node.netns)
            .ok();
        add[0].1.push(ms(t));
        let t = Instant::now();
        refnode.add(&id, theirs).map(drop)?;
        add[1].1.push(ms(t));
    }
    for (n, (ours, theirs)) in pods.iter().enumerate() {
        let id = format!("timed-{n}");
        let t = Instant::now();
        Call::new("DEL", &id, "eth0", Some(ours), &config)
            .run(&node.netns)
            .ok();
        del[0].1.push(ms(t));
        let t = Instant::now();
        refnode.del(&id, theirs)?;
        del[1].1.push(ms(t));
    }
    let p99 = |samples: &[(Contender, Vec<f64>)]| -> Vec<(Contender, Vec<f64>)> {
        samples
            .iter()
            .map(|(c, v)| (*c, vec![percentile(v, 0.99)]))
            .collect()
    };
    let mut figures = vec![
        figure(
            "ADD time per pod (median of pods)",
            "ms",
            false,
            add.clone(),
        ),
        figure("ADD time per pod, p99", "ms", false, p99(&add)),
        figure(
            "DEL time per pod (median of pods)",
            "ms",
            false,
            del.clone(),
        ),
        figure("DEL time per pod, p99", "ms", false, p99(&del)),
    ];

    let parallel = interleaved(
        plan.repeats(),
        &[Contender::EbpfCni, Contender::Reference],
        |contender| {
            let pods: Vec<Netns> = (0..PARALLEL_PODS).map(|_| Netns::new("ppod")).collect();
            let t = Instant::now();
            std::thread::scope(|scope| -> anyhow::Result<()> {
                let handles: Vec<_> = pods
                    .iter()
                    .enumerate()
                    .map(|(n, pod)| {
                        let (node, refnode, config) = (&node, &refnode, &config);
                        scope.spawn(move || -> anyhow::Result<()> {
                            let id = format!("par-{n}");
                            match contender {
                                Contender::EbpfCni => {
                                    let out = Call::new("ADD", &id, "eth0", Some(pod), config)
                                        .run(&node.netns);
                                    ensure!(out.success, "ADD failed: {}", out.stdout);
                                    Ok(())
                                }
                                _ => refnode.add(&id, pod).map(drop),
                            }
                        })
                    })
                    .collect();
                for handle in handles {
                    handle
                        .join()
                        .map_err(|_| anyhow::anyhow!("an ADD thread panicked"))??;
                }
                Ok(())
            })?;
            let wall = ms(t);
            for (n, pod) in pods.iter().enumerate() {
                let id = format!("par-{n}");
                match contender {
                    Contender::EbpfCni => {
                        Call::new("DEL", &id, "eth0", Some(pod), &config)
                            .run(&node.netns)
                            .ok();
                    }
                    _ => refnode.del(&id, pod)?,
                }
            }
            Ok(wall)
        },
    )?;
    figures.push(figure("30 parallel ADDs, wall time", "ms", false, parallel));
    Ok(figures)
}

/// Two pods on one node for each contender, and a raw veth pair.
struct PodPairs {
    _node: Node,
    ebpf: (Netns, Netns, std::net::Ipv4Addr),
    _refnode: RefNode,
    reference: (Netns, Netns, std::net::Ipv4Addr),
    raw: (Netns, Netns, std::net::Ipv4Addr),
}

impl PodPairs {
    fn build() -> anyhow::Result<Self> {
        let node = Node::start("10.252.0.0/24");
        let a = node.add_pod("bench-a");
        let b = node.add_pod("bench-b");
        let refnode = RefNode::new("10.253.0.0/24");
        let (ra, rb) = (Netns::new("refa"), Netns::new("refb"));
        refnode.add("bench-ref-a", &ra)?;
        let rb_ip = refnode.add("bench-ref-b", &rb)?;
        let (xa, xb) = (Netns::new("rawa"), Netns::new("rawb"));
        xa.link_veth("eth0", "10.254.0.1/24", &xb, "eth0", "10.254.0.2/24");
        for netns in [&a.netns, &ra, &xa] {
            load::tune_client(netns);
        }
        Ok(Self {
            ebpf: (a.netns, b.netns, b.ip),
            _node: node,
            reference: (ra, rb, rb_ip),
            _refnode: refnode,
            raw: (xa, xb, "10.254.0.2".parse()?),
        })
    }

    fn pair(&self, contender: Contender) -> &(Netns, Netns, std::net::Ipv4Addr) {
        match contender {
            Contender::EbpfCni => &self.ebpf,
            Contender::Reference => &self.reference,
            Contender::Raw => &self.raw,
        }
    }
}

fn pod_to_pod(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: pod-to-pod traffic");
    let pairs = PodPairs::build()?;
    let all = [Contender::EbpfCni, Contender::Reference, Contender::Raw];
    let seconds = plan.seconds();
    let throughput = interleaved(plan.repeats(), &all, |c| {
        let (client, server, ip) = pairs.pair(c);
        load::throughput(client, server, *ip, seconds)
    })?;
    let rr = interleaved(plan.repeats(), &all, |c| {
        let (client, server, ip) = pairs.pair(c);
        load::tcp_rr(client, server, *ip, seconds)
    })?;
    let crr = interleaved(plan.repeats(), &all, |c| {
        let (client, server, ip) = pairs.pair(c);
        load::tcp_crr(client, server, *ip, seconds)
    })?;
    Ok(vec![
        figure(
            "pod-to-pod TCP throughput (iperf3)",
            "Gbit/s",
            true,
            throughput,
        ),
        figure("pod-to-pod TCP_RR (1-byte ping-pong)", "ops/s", true, rr),
        figure(
            "pod-to-pod TCP_CRR (connect, 1 byte, close)",
            "ops/s",
            true,
            crr,
        ),
    ])
}

/// A pod talking to the external host through source NAT: ours in eBPF, the
/// reference's through iptables MASQUERADE (bridge ipMasq) and the kernel's conntrack.
fn pod_to_external(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: pod-to-external traffic (source NAT)");
    let node = Node::start("10.247.0.0/24");
    let pod = node.add_pod("bench-snat");
    let refnode = RefNode::new("10.246.0.0/24");
    let rpod = Netns::new("refsnat");
    refnode.add("bench-ref-snat", &rpod)?;
    for netns in [&pod.netns, &rpod] {
        load::tune_client(netns);
    }
    let external: std::net::Ipv4Addr = ebpf_cni_tests::node::EXTERNAL_ADDR.parse()?;
    let pair = |c: Contender| match c {
        Contender::EbpfCni => (&pod.netns, &node.external),
        _ => (&rpod, &refnode.external),
    };
    let both = [Contender::EbpfCni, Contender::Reference];
    let seconds = plan.seconds();
    let throughput = interleaved(plan.repeats(), &both, |c| {
        let (client, server) = pair(c);
        load::throughput(client, server, external, seconds)
    })?;
    let crr = interleaved(plan.repeats(), &both, |c| {
        let (client, server) = pair(c);
        load::tcp_crr(client, server, external, seconds)
    })?;
    Ok(vec![
        figure(
            "pod-to-external TCP throughput (source NAT)",
            "Gbit/s",
            true,
            throughput,
        ),
        figure(
            "pod-to-external connection rate (source NAT, TCP_CRR)",
            "ops/s",
            true,
            crr,
        ),
    ])
}

/// Figures whose capability is an open issue: shown, never invented.
fn missing_figures() -> Vec<Figure> {
    let missing = |name: &str, unit: &str, higher: bool, why: &str| Figure {
        name: name.into(),
        unit: unit.into(),
        higher_is_better: higher,
        values: vec![
            (Contender::EbpfCni, Value::Missing(why.into())),
            (Contender::Reference, Value::Missing(why.into())),
            (Contender::Raw, Value::NotApplicable),
        ],
    };
    vec![
        missing(
            "hostPort connection rate, 0 other mappings",
            "ops/s",
            true,
            "hostPort not built yet",
        ),
        missing(
            "hostPort connection rate, 5,000 other mappings",
            "ops/s",
            true,
            "hostPort not built yet",
        ),
        missing(
            "ADD time with 5,000 mappings",
            "ms",
            false,
            "hostPort not built yet",
        ),
    ]
}

/// The daemon's resident memory with 0, 100 and 250 endpoints; the plugins' peak memory.
fn memory() -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: memory");
    let node = Node::start("10.249.0.0/16");
    let pid = node.daemon.pid().context("the daemon runs")?;
    let mut figures = Vec::new();
    let mut pods = Vec::new();
    for target in [0usize, 100, 250] {
        while pods.len() < target {
            pods.push(node.add_pod(&format!("mem-{}", pods.len())));
        }
        let rss = rss_mib(pid)?;
        figures.push(Figure {
            name: format!("daemon resident memory, {target} endpoints"),
            unit: "MiB".into(),
            higher_is_better: false,
            values: vec![
                (
                    Contender::EbpfCni,
                    Value::Measured(Stats::from_samples(&[rss]).context("one sample")?),
                ),
                (Contender::Reference, Value::NotApplicable),
                (Contender::Raw, Value::NotApplicable),
            ],
        });
    }
    drop(pods);

    let wrapper = PeakWrapper::new()?;
    let pod = Netns::new("mpod");
    let config = node.network.config("1.0.0");
    let ours = Call::new("ADD", "peak", "eth0", Some(&pod), &config).run_plugin(
        &node.netns,
        &wrapper.script("ebpf-cni", &bins::path("ebpf-cni"))?,
    );
    ensure!(ours.success, "ADD failed: {}", ours.stdout);
    let ours_kib = wrapper.peak_kib("ebpf-cni")?;
    let refnode = RefNode::new("10.248.0.0/24");
    let rpod = Netns::new("mref");
    let bridge = refnode.peak_bridge_add(&wrapper, &rpod)?;
    figures.push(Figure {
        name: "plugin peak memory during ADD (max RSS)".into(),
        unit: "MiB".into(),
        higher_is_better: false,
        values: vec![
            (
                Contender::EbpfCni,
                Value::Measured(Stats::from_samples(&[ours_kib / 1024.0]).context("sample")?),
            ),
            (
                Contender::Reference,
                Value::Measured(Stats::from_samples(&[bridge / 1024.0]).context("sample")?),
            ),
            (Contender::Raw, Value::NotApplicable),
        ],
    });
    Ok(figures)
}

/// Scripts that run a plugin under GNU time to record its peak RSS.
pub struct PeakWrapper {
    dir: PathBuf,
}

impl PeakWrapper {
    fn new() -> anyhow::Result<Self> {
        let dir = PathBuf::from("/run").join(ebpf_cni_tests::unique_name("peak"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// A script that runs `plugin` under `/usr/bin/time`, recording into `<tag>.kib`.
    pub fn script(&self, tag: &str, plugin: &Path) -> anyhow::Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let script = self.dir.join(tag);
        let out = self.dir.join(format!("{tag}.kib"));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nexec /usr/bin/time -f %M -o {} {} \"$@\"\n",
                out.display(),
                plugin.display()
            ),
        )?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        Ok(script)
    }

    pub fn peak_kib(&self, tag: &str) -> anyhow::Result<f64> {
        let text = std::fs::read_to_string(self.dir.join(format!("{tag}.kib")))?;
        text.trim()
            .lines()
            .last()
            .context("no time output")?
            .trim()
            .parse()
            .context("time output")
    }
}

impl Drop for PeakWrapper {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(kib / 1024.0)
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(rank).copied().unwrap_or(f64::NAN)
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
