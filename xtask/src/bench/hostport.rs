//! hostPort figures: the connection rate from the external host through one host port
//! with 0 and with 5,000 other mappings installed, and ADD time with 5,000 mappings;
//! ebpf-cni (one hash lookup) against the reference portmap (iptables DNAT chains).
//!
//! Both phases have the same number of pods: first pods without mappings, then as many
//! pods with 100 mappings each in their place (and the timed pods of a phase are deleted
//! after it), so that the mappings are the only difference between the phases.
//! `--quick` installs 500 mappings instead of 5,000: portmap alone needs about 100 s
//! to install 5,000 here (every ADD rewrites its growing chains), more than the quick
//! run's whole budget; the figures say which count they measured.

use std::{net::SocketAddr, time::Instant};

use ebpf_cni_tests::{
    netns::Netns,
    node::{NODE_ADDR, Node},
};
use serde_json::{Value, json};

use super::{
    Plan, figure, load,
    reference::RefNode,
    report::{Contender, Figure},
};

const HOST_PORT: u16 = 30400;
const CONTAINER_PORT: u16 = 7002;
/// Mappings per pod of the "other mappings" (50 pods of them in a full run).
const PER_POD: u16 = 100;

fn mappings(first: u16, count: u16) -> Value {
    let list: Vec<Value> = (0..count)
        .map(|k| json!({ "hostPort": first + k, "containerPort": CONTAINER_PORT, "protocol": "tcp" }))
        .collect();
    Value::Array(list)
}

/// One contender's node, able to add pods with mappings.
trait Mapper {
    fn add(&self, id: &str, pod: &Netns, mappings: &Value) -> anyhow::Result<()>;
    fn del(&self, id: &str, pod: &Netns) -> anyhow::Result<()>;
    fn external(&self) -> &Netns;
}

impl Mapper for Node {
    fn add(&self, id: &str, pod: &Netns, mappings: &Value) -> anyhow::Result<()> {
        let mut config = self.network.config("1.1.0");
        config["runtimeConfig"] = json!({ "portMappings": mappings });
        let out =
            ebpf_cni_tests::cni::Call::new("ADD", id, "eth0", Some(pod), &config).run(&self.netns);
        anyhow::ensure!(out.success, "ADD failed: {}", out.stdout);
        Ok(())
    }
    fn del(&self, id: &str, pod: &Netns) -> anyhow::Result<()> {
        let config = self.network.config("1.1.0");
        let out =
            ebpf_cni_tests::cni::Call::new("DEL", id, "eth0", Some(pod), &config).run(&self.netns);
        anyhow::ensure!(out.success, "DEL failed: {}", out.stdout);
        Ok(())
    }
    fn external(&self) -> &Netns {
        &self.external
    }
}

impl Mapper for RefNode {
    fn add(&self, id: &str, pod: &Netns, mappings: &Value) -> anyhow::Result<()> {
        self.add_with_ports(id, pod, mappings).map(drop)
    }
    fn del(&self, id: &str, pod: &Netns) -> anyhow::Result<()> {
        RefNode::del(self, id, pod)
    }
    fn external(&self) -> &Netns {
        &self.external
    }
}

/// Samples of one contender: CRR at 0 and at 5,000 mappings, ADD times at both.
struct Samples {
    crr: [Vec<f64>; 2],
    add: [Vec<f64>; 2],
}

fn measure(mapper: &dyn Mapper, plan: Plan, tag: &str) -> anyhow::Result<Samples> {
    let target = Netns::new(&format!("{tag}hp"));
    mapper.add(&format!("{tag}-target"), &target, &mappings(HOST_PORT, 1))?;
    load::tune_client(mapper.external());
    let to = SocketAddr::from((NODE_ADDR.parse::<std::net::Ipv4Addr>()?, HOST_PORT));
    let mut samples = Samples {
        crr: [Vec::new(), Vec::new()],
        add: [Vec::new(), Vec::new()],
    };
    let pods = plan.mapped_pods();
    let mut plain = Vec::new();
    for n in 0..pods {
        let pod = Netns::new(&format!("{tag}pp"));
        mapper.add(&format!("{tag}-plain-{n}"), &pod, &json!([]))?;
        plain.push(pod);
    }
    let mut others: Vec<Netns> = Vec::new();
    for size in 0..2 {
        for _ in 0..plan.traffic_repeats() {
            samples.crr[size].push(load::tcp_crr_via(
                mapper.external(),
                &target,
                CONTAINER_PORT,
                to,
                plan.seconds(),
            )?);
        }
        for n in 0..plan.timed_adds() {
            let pod = Netns::new(&format!("{tag}ta"));
            let id = format!("{tag}-timed-{size}-{n}");
            let first = 30000 + u16::try_from(size * plan.timed_adds() + n)?;
            let start = Instant::now();
            mapper.add(&id, &pod, &mappings(first, 1))?;
            samples.add[size].push(start.elapsed().as_secs_f64() * 1000.0);
            mapper.del(&id, &pod)?;
        }
        if size == 0 {
            eprintln!("bench: installing {} mappings for {tag}", pods * PER_POD);
            for n in 0..pods {
                let pod = Netns::new(&format!("{tag}mp"));
                mapper.add(
                    &format!("{tag}-map-{n}"),
                    &pod,
                    &mappings(20000 + n * PER_POD, PER_POD),
                )?;
                others.push(pod);
            }
            for (n, pod) in plain.iter().enumerate() {
                mapper.del(&format!("{tag}-plain-{n}"), pod)?;
            }
        }
    }
    Ok(samples)
}

pub(super) fn hostport(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: hostPort");
    let node = super::node("10.245.0.0/16");
    let ours = measure(&node, plan, "e")?;
    drop(node);
    let refnode = RefNode::new("10.244.0.0/16");
    let theirs = measure(&refnode, plan, "r")?;
    drop(refnode);
    let pick = |index: usize, add: bool| {
        vec![
            (
                Contender::EbpfCni,
                if add {
                    ours.add[index].clone()
                } else {
                    ours.crr[index].clone()
                },
            ),
            (
                Contender::Reference,
                if add {
                    theirs.add[index].clone()
                } else {
                    theirs.crr[index].clone()
                },
            ),
        ]
    };
    let many = match plan.mapped_pods() * PER_POD {
        5000 => "5,000".to_owned(),
        other => other.to_string(),
    };
    Ok(vec![
        figure(
            "hostPort connection rate, 0 other mappings",
            "ops/s",
            true,
            pick(0, false),
        ),
        figure(
            &format!("hostPort connection rate, {many} other mappings"),
            "ops/s",
            true,
            pick(1, false),
        ),
        figure(
            "ADD time with one mapping, 0 other mappings",
            "ms",
            false,
            pick(0, true),
        ),
        figure(
            &format!("ADD time with one mapping, {many} other mappings"),
            "ms",
            false,
            pick(1, true),
        ),
    ])
}
