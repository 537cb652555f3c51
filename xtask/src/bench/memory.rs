//! Memory figures: the daemon's resident memory as endpoints are added, and the plugins'
//! peak memory during one ADD, recorded by running them under GNU time.

use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{bins, cni::Call, netns::Netns};

use super::{
    reference::RefNode,
    report::{Contender, Figure, Stats, Value},
};

/// The daemon's resident memory with 0, 100 and 250 endpoints; the plugins' peak memory.
pub(super) fn memory() -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: memory");
    let node = super::node("10.249.0.0/16");
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

pub(super) fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(kib / 1024.0)
}
