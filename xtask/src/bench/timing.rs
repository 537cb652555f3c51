//! ADD and DEL wall times: per pod one after another (median and p99 over the pods), and
//! a batch of parallel ADDs, for ebpf-cni and the reference chain.

use std::time::Instant;

use anyhow::ensure;
use ebpf_cni_tests::{cni::Call, netns::Netns};

use super::{
    PARALLEL_PODS, Plan, figure, interleaved,
    reference::RefNode,
    report::{Contender, Figure},
};

/// ADD and DEL wall time per pod (median, p99) and of 30 parallel ADDs.
pub(super) fn add_del_times(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: ADD/DEL times");
    let node = super::node("10.250.0.0/16");
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

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(rank).copied().unwrap_or(f64::NAN)
}
