//! Bandwidth limits side by side: a pod limited to 50 and to 500 Mbit/s each way under
//! ebpf-cni (`tbf` on both veth ends, frames for the pod through its host veth's qdisc),
//! under the reference chain with Debian's `bandwidth` plugin after `bridge` (a `tbf` on
//! the host veth for what the pod receives, an `ifb` device with a `tbf` for what it
//! sends), and on a bare veth pair with a `tbf` on each end (the ceiling: the qdisc and
//! nothing else). Each stream lasts 10 s, the acceptance's length, whatever the plan;
//! a `ping` runs alongside it in the same direction, and its mean round trip is what
//! the stream's backlog costs every other packet.

use std::{net::Ipv4Addr, thread, time::Duration};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{
    netns::Netns,
    node::Pod,
    traffic::iperf::{self, Length},
};
use serde_json::{Value, json};

use super::{
    Plan, figure,
    reference::RefNode,
    report::{Contender, Figure},
};

/// The acceptance's stream length.
const STREAM_SECONDS: u32 = 10;
/// The limits measured, in bits per second; each burst is 100 ms at the rate.
const RATES: [u64; 2] = [50_000_000, 500_000_000];

/// One direction of traffic relative to the limited pod.
#[derive(Clone, Copy)]
enum Direction {
    /// The pod receives (its ingress limit).
    Into,
    /// The pod sends (its egress limit).
    OutOf,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::Into => "into the pod",
            Direction::OutOf => "out of the pod",
        }
    }
}

/// A limited pod and its unlimited peer, with the addresses each is reached at.
struct Pair<'a> {
    limited: &'a Netns,
    limited_ip: Ipv4Addr,
    peer: &'a Netns,
    peer_ip: Ipv4Addr,
}

/// `runtimeConfig.bandwidth` for `rate` both ways.
fn limits(rate: u64) -> Value {
    json!({
        "ingressRate": rate, "ingressBurst": rate / 10,
        "egressRate": rate, "egressBurst": rate / 10,
    })
}

/// One limited pod per rate of [`RATES`] for each contender, and each contender's peer.
struct Setups {
    _node: ebpf_cni_tests::node::Node,
    _refnode: RefNode,
    peer: Pod,
    ref_peer: (Netns, Ipv4Addr),
    /// One per rate of [`RATES`].
    limited: Vec<Limited>,
}

/// The limited ends at one rate: ebpf-cni's pod, the reference's, and a bare veth pair.
struct Limited {
    ours: Pod,
    reference: (Netns, Ipv4Addr),
    /// The limited end, the peer end, and their addresses.
    raw: (Netns, Netns, Ipv4Addr, Ipv4Addr),
}

impl Setups {
    fn build() -> anyhow::Result<Self> {
        let node = super::node("10.249.0.0/24");
        let peer = node.add_pod("bw-peer");
        let refnode = RefNode::new("10.250.0.0/24");
        let ref_peer = Netns::new("bwrefpeer");
        let ref_peer_ip = refnode.add("bw-ref-peer", &ref_peer)?;
        let mut limited = Vec::new();
        for (n, rate) in RATES.into_iter().enumerate() {
            let shaped =
                node.add_pod_with(&format!("bw-{n}"), &json!({ "bandwidth": limits(rate) }));
            let ref_shaped = Netns::new("bwref");
            let ref_ip = refnode.add_shaped(&format!("bw-ref-{n}"), &ref_shaped, &limits(rate))?;
            let (raw_a, raw_b) = (Netns::new("bwrawa"), Netns::new("bwrawb"));
            let (a_ip, b_ip) = (format!("10.251.{n}.1"), format!("10.251.{n}.2"));
            raw_a.link_veth(
                "eth0",
                &format!("{a_ip}/24"),
                &raw_b,
                "eth0",
                &format!("{b_ip}/24"),
            );
            // What the bandwidth plugin and ebpf-cni set: the burst in bytes, a 25 ms
            // backlog.
            for netns in [&raw_a, &raw_b] {
                let (rate, burst) = (format!("{rate}bit"), format!("{}b", rate / 80));
                let tbf = [
                    "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", &rate,
                ];
                let out = netns.run(
                    "tc",
                    &[&tbf[..], &["burst", &burst, "latency", "25ms"]].concat(),
                );
                ensure!(
                    out.status.success(),
                    "tc tbf: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            limited.push(Limited {
                ours: shaped,
                reference: (ref_shaped, ref_ip),
                raw: (raw_a, raw_b, a_ip.parse()?, b_ip.parse()?),
            });
        }
        Ok(Self {
            _node: node,
            _refnode: refnode,
            peer,
            ref_peer: (ref_peer, ref_peer_ip),
            limited,
        })
    }

    /// The three contenders' pairs at the rate of index `n`.
    fn pairs(&self, n: usize) -> [(Contender, Pair<'_>); 3] {
        let Limited {
            ours,
            reference: (reference, reference_ip),
            raw: (raw_a, raw_b, a_ip, b_ip),
        } = &self.limited[n];
        [
            (
                Contender::EbpfCni,
                Pair {
                    limited: &ours.netns,
                    limited_ip: ours.ip,
                    peer: &self.peer.netns,
                    peer_ip: self.peer.ip,
                },
            ),
            (
                Contender::Reference,
                Pair {
                    limited: reference,
                    limited_ip: *reference_ip,
                    peer: &self.ref_peer.0,
                    peer_ip: self.ref_peer.1,
                },
            ),
            (
                Contender::Raw,
                Pair {
                    limited: raw_a,
                    limited_ip: *a_ip,
                    peer: raw_b,
                    peer_ip: *b_ip,
                },
            ),
        ]
    }
}

/// One 10 s stream in `direction` with a ping alongside it: (goodput in Mbit/s, mean
/// round trip in ms).
fn measure(pair: &Pair<'_>, direction: Direction) -> anyhow::Result<(f64, f64)> {
    // iperf3's client runs in the peer (`-R`: the limited pod's server sends); the
    // stream's sender pings the receiver, so the echo requests queue behind the stream.
    let (options, pinger, target): (&[&str], _, _) = match direction {
        Direction::Into => (&[], pair.peer, pair.limited_ip),
        Direction::OutOf => (&["-R"], pair.limited, pair.peer_ip),
    };
    let mut ping = pinger.command("ping");
    // Starts a second into the stream, ends a second before it: 40 echoes 200 ms apart.
    ping.args([
        "-q",
        "-c",
        "40",
        "-i",
        "0.2",
        "-w",
        "15",
        &target.to_string(),
    ]);
    let pinged = thread::spawn(move || {
        thread::sleep(Duration::from_secs(1));
        ping.output()
    });
    let report = iperf::stream(
        pair.peer,
        pair.limited,
        pair.limited_ip,
        Length::Seconds(STREAM_SECONDS),
        options,
    )
    .map_err(anyhow::Error::msg)?;
    let pinged = pinged
        .join()
        .map_err(|_| anyhow::anyhow!("the ping thread panicked"))?
        .context("cannot run ping")?;
    let text = String::from_utf8_lossy(&pinged.stdout);
    // `rtt min/avg/max/mdev = 0.052/0.081/0.113/0.017 ms`
    let mean = text
        .lines()
        .find_map(|line| {
            line.split(" = ")
                .nth(1)?
                .split('/')
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .with_context(|| format!("no round trip in ping's output: {text}"))?;
    Ok((report.received_bps / 1e6, mean))
}

pub(super) fn bandwidth(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: bandwidth limits");
    let setups = Setups::build()?;
    // Streams of 10 s whatever the plan: a quick run measures each once.
    let repeats = if plan.quick { 1 } else { 5 };
    let mut figures = Vec::new();
    for (n, rate) in RATES.iter().enumerate() {
        let pairs = setups.pairs(n);
        for direction in [Direction::Into, Direction::OutOf] {
            let mut goodput: Vec<(Contender, Vec<f64>)> = Vec::new();
            let mut rtt: Vec<(Contender, Vec<f64>)> = Vec::new();
            for (contender, _) in &pairs {
                goodput.push((*contender, Vec::new()));
                rtt.push((*contender, Vec::new()));
            }
            for _ in 0..repeats {
                for (at, (contender, pair)) in pairs.iter().enumerate() {
                    let (mbit, ms) = measure(pair, direction)
                        .with_context(|| format!("measuring {contender:?}"))?;
                    goodput[at].1.push(mbit);
                    rtt[at].1.push(ms);
                }
            }
            let mbit = rate / 1_000_000;
            figures.push(figure(
                &format!(
                    "goodput under a {mbit} Mbit/s limit, {} (10 s TCP stream)",
                    direction.label()
                ),
                "Mbit/s",
                true,
                goodput,
            ));
            figures.push(figure(
                &format!(
                    "ping round trip during that stream ({mbit} Mbit/s, {})",
                    direction.label()
                ),
                "ms",
                false,
                rtt,
            ));
        }
    }
    Ok(figures)
}
