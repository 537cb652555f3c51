//! Traffic figures: pod to pod on one node (ebpf-cni, the reference chain and a raw veth
//! pair) and pod to the external host through source NAT (ebpf-cni, the reference chain
//! and two raw veth pairs through a namespace that routes without NAT), with the bounded
//! loads of `load.rs`.

use ebpf_cni_tests::{
    netns::Netns,
    node::{Node, big_tcp_uplink},
};

use super::{
    Plan, figure, interleaved, load,
    reference::RefNode,
    report::{Contender, Figure},
};

/// Two pods on one node for each contender, and a raw veth pair. Both nodes' uplinks
/// have IPv4 BIG TCP (192 KiB), as a node whose NIC has it on: our pods follow it, the
/// reference's bridge ports stay at 64 KiB. `ebpf_64k` are two more of our pods, added
/// before the uplink got BIG TCP, so that the report also shows what we do without it.
struct PodPairs {
    _node: Node,
    ebpf: (Netns, Netns, std::net::Ipv4Addr),
    ebpf_64k: (Netns, Netns, std::net::Ipv4Addr),
    _refnode: RefNode,
    reference: (Netns, Netns, std::net::Ipv4Addr),
    raw: (Netns, Netns, std::net::Ipv4Addr),
}

impl PodPairs {
    fn build() -> anyhow::Result<Self> {
        let node = super::node("10.252.0.0/24");
        let a64 = node.add_pod("bench-a64k");
        let b64 = node.add_pod("bench-b64k");
        big_tcp_uplink(&node.netns, &node.external);
        let a = node.add_pod("bench-a");
        let b = node.add_pod("bench-b");
        let refnode = RefNode::new("10.253.0.0/24");
        let (ra, rb) = (Netns::new("refa"), Netns::new("refb"));
        refnode.add("bench-ref-a", &ra)?;
        let rb_ip = refnode.add("bench-ref-b", &rb)?;
        let (xa, xb) = (Netns::new("rawa"), Netns::new("rawb"));
        xa.link_veth("eth0", "10.254.0.1/24", &xb, "eth0", "10.254.0.2/24");
        for netns in [&a.netns, &a64.netns, &ra, &xa] {
            load::tune_client(netns);
        }
        Ok(Self {
            ebpf: (a.netns, b.netns, b.ip),
            ebpf_64k: (a64.netns, b64.netns, b64.ip),
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

pub(super) fn pod_to_pod(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: pod-to-pod traffic");
    let pairs = PodPairs::build()?;
    let all = [Contender::EbpfCni, Contender::Reference, Contender::Raw];
    let seconds = plan.seconds();
    let throughput = interleaved(plan.traffic_repeats(), &all, |c| {
        let (client, server, ip) = pairs.pair(c);
        load::throughput(client, server, *ip, seconds)
    })?;
    // Ours without BIG TCP, against the same reference and raw pair (at 64 KiB too).
    let throughput_64k = interleaved(plan.traffic_repeats(), &all, |c| {
        let (client, server, ip) = match c {
            Contender::EbpfCni => &pairs.ebpf_64k,
            other => pairs.pair(other),
        };
        load::throughput(client, server, *ip, seconds)
    })?;
    let rr = interleaved(plan.traffic_repeats(), &all, |c| {
        let (client, server, ip) = pairs.pair(c);
        load::tcp_rr(client, server, *ip, seconds)
    })?;
    let crr = interleaved(plan.traffic_repeats(), &all, |c| {
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
        figure(
            "pod-to-pod TCP throughput, our pods without BIG TCP (64 KiB)",
            "Gbit/s",
            true,
            throughput_64k,
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

/// The pod-to-external ceiling: a "pod" and an external host joined through a "node"
/// namespace that only routes, over two raw veth pairs, with no NAT, no netfilter rule
/// and no program (the external host routes the pod's subnet back through the node).
/// It is what the same two hops cost when nothing is translated: the most any source
/// NAT on this topology could reach.
struct Routed {
    pod: Netns,
    _node: Netns,
    external: Netns,
}

impl Routed {
    /// The external host's address on the routed path.
    const EXTERNAL: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 245, 1, 2);

    fn build() -> Self {
        let (pod, node, external) = (
            Netns::new("rtpod"),
            Netns::new("rtnode"),
            Netns::new("rtext"),
        );
        pod.link_veth("eth0", "10.245.0.2/24", &node, "pod0", "10.245.0.1/24");
        node.link_veth(
            "uplink0",
            "10.245.1.1/24",
            &external,
            "eth0",
            "10.245.1.2/24",
        );
        big_tcp_uplink(&node, &external);
        pod.ip(&["route", "add", "default", "via", "10.245.0.1"]);
        external.ip(&["route", "add", "10.245.0.0/24", "via", "10.245.1.1"]);
        node.run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"]);
        load::tune_client(&pod);
        Self {
            pod,
            _node: node,
            external,
        }
    }
}

/// A pod talking to the external host through source NAT: ours in eBPF, the
/// reference's through iptables MASQUERADE (bridge ipMasq) and the kernel's conntrack,
/// and the ceiling, the same two hops routed without NAT ([`Routed`]).
pub(super) fn pod_to_external(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: pod-to-external traffic (source NAT)");
    let node = super::node("10.247.0.0/24");
    big_tcp_uplink(&node.netns, &node.external);
    let pod = node.add_pod("bench-snat");
    let refnode = RefNode::new("10.246.0.0/24");
    let rpod = Netns::new("refsnat");
    refnode.add("bench-ref-snat", &rpod)?;
    for netns in [&pod.netns, &rpod] {
        load::tune_client(netns);
    }
    let routed = Routed::build();
    let external: std::net::Ipv4Addr = ebpf_cni_tests::node::EXTERNAL_ADDR.parse()?;
    let pair = |c: Contender| match c {
        Contender::EbpfCni => (&pod.netns, &node.external, external),
        Contender::Reference => (&rpod, &refnode.external, external),
        Contender::Raw => (&routed.pod, &routed.external, Routed::EXTERNAL),
    };
    let all = [Contender::EbpfCni, Contender::Reference, Contender::Raw];
    let seconds = plan.seconds();
    let throughput = interleaved(plan.traffic_repeats(), &all, |c| {
        let (client, server, to) = pair(c);
        load::throughput(client, server, to, seconds)
    })?;
    let crr = interleaved(plan.traffic_repeats(), &all, |c| {
        let (client, server, to) = pair(c);
        load::tcp_crr(client, server, to, seconds)
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
