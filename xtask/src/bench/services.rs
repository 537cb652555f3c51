//! Pod to a ClusterIP whose backend is a pod on another node, with kube-proxy's own
//! iptables rules on every node (`ebpf_cni_tests::kube_proxy`, `--cluster-cidr` set):
//! ebpf-cni with `--service-cidr`, in the overlay and with native routes, against the
//! reference nodes of `cross_node` (bridge + host-local, flannel's vxlan or host-gw)
//! with the same rules. The ceiling: node 1 of the reference pair reaching a ClusterIP
//! whose backend is node 2 itself (over `flannel.1` for the overlay, directly for native
//! routes): kube-proxy's DNAT without pods, bridge or overlay of ours.

use std::net::{Ipv4Addr, SocketAddr};

use ebpf_cni_tests::{
    cluster::{TestCluster, node_addr},
    kube_proxy::{Endpoint, KubeProxy, Mode as ProxyMode, Service},
    netns::Netns,
};

use super::{
    Plan,
    cross_node::{Mode, RefPair},
    figure, interleaved, load,
    report::{Contender, Figure},
};

const SERVICE_RANGE: &str = "10.96.0.0/12";
/// The ClusterIP pods reach (the backend a pod on the other node).
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 31);
/// The ClusterIP the ceiling reaches (the backend the other node itself).
const CEILING_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 32);
/// The port the Services and their backends use.
const PORT: u16 = 7003;

/// kube-proxy's iptables rules on `node`, with `cluster_cidr`, for the Services
/// (ClusterIP, backend, whether the backend is on `node`) at [`PORT`].
fn services_on(node: &Netns, cluster_cidr: &str, services: &[(Ipv4Addr, Ipv4Addr, bool)]) {
    let proxy = KubeProxy {
        cluster_cidr: Some(cluster_cidr.to_owned()),
        ..KubeProxy::new(ProxyMode::Iptables)
    };
    let services: Vec<Service> = services
        .iter()
        .enumerate()
        .map(|(i, &(cluster_ip, backend, local))| {
            let endpoint = if local {
                Endpoint::local(backend, PORT)
            } else {
                Endpoint::remote(backend, PORT)
            };
            Service::tcp(
                "default",
                &format!("bench-{i}"),
                cluster_ip,
                PORT,
                vec![endpoint],
            )
        })
        .collect();
    proxy.install(node, &services);
}

/// One mode's contenders: ebpf-cni's two nodes and the reference's, each with a pod per
/// node and the Service on both nodes.
struct Contenders {
    _cluster: TestCluster,
    ours: (Netns, Netns),
    reference: RefPair,
}

impl Contenders {
    fn build(mode: Mode) -> anyhow::Result<Self> {
        let (routing, ranges, cidr) = match mode {
            Mode::Overlay => ("vxlan", ["10.246.1.0/24", "10.246.2.0/24"], "10.246.0.0/16"),
            Mode::Native => (
                "native",
                ["10.247.1.0/24", "10.247.2.0/24"],
                "10.247.0.0/16",
            ),
        };
        let cluster = TestCluster::start(
            &ranges,
            &["--routing", routing, "--service-cidr", SERVICE_RANGE],
        );
        let a = cluster.node(1).add_pod("bench-sa");
        let b = cluster.node(2).add_pod("bench-sb");
        for n in 1..=2 {
            services_on(&cluster.node(n).netns, cidr, &[(CLUSTER_IP, b.ip, n == 2)]);
        }
        load::tune_client(&a.netns);
        let reference = RefPair::build(mode)?;
        load::tune_client(&reference.nodes[0]);
        let ceiling = match mode {
            Mode::Overlay => Ipv4Addr::new(10, 250, 2, 0),
            Mode::Native => node_addr(2).parse().expect("an address"),
        };
        for (n, node) in reference.nodes.iter().enumerate() {
            // A node's own connection to a ClusterIP is routed before the DNAT: by the
            // default route a node has (the reference pair's segment has no gateway).
            node.ip(&["route", "add", "default", "dev", "uplink0"]);
            services_on(
                node,
                "10.250.0.0/16",
                &[
                    (CLUSTER_IP, reference.pod_ips[1], n == 1),
                    (CEILING_IP, ceiling, false),
                ],
            );
        }
        Ok(Self {
            _cluster: cluster,
            ours: (a.netns, b.netns),
            reference,
        })
    }

    /// (client, server, address reached) of `contender`.
    fn pair(&self, contender: Contender) -> (&Netns, &Netns, SocketAddr) {
        match contender {
            Contender::EbpfCni => (&self.ours.0, &self.ours.1, (CLUSTER_IP, PORT).into()),
            Contender::Reference => (
                &self.reference.pods[0],
                &self.reference.pods[1],
                (CLUSTER_IP, PORT).into(),
            ),
            Contender::Raw => (
                &self.reference.nodes[0],
                &self.reference.nodes[1],
                (CEILING_IP, PORT).into(),
            ),
        }
    }
}

pub(super) fn services(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: pod to a ClusterIP whose backend is on another node");
    let all = [Contender::EbpfCni, Contender::Reference, Contender::Raw];
    let mut figures = Vec::new();
    for (mode, label) in [
        (
            Mode::Overlay,
            "overlay (ours: vxlan; reference: flannel's vxlan; ceiling: the nodes over VXLAN)",
        ),
        (
            Mode::Native,
            "native (ours: native; reference: flannel's host-gw; ceiling: the nodes)",
        ),
    ] {
        let contenders = Contenders::build(mode)?;
        let crr = interleaved(plan.traffic_repeats(), &all, |c| {
            let (client, server, to) = contenders.pair(c);
            load::tcp_crr_via(client, server, PORT, to, plan.seconds())
        })?;
        figures.push(figure(
            &format!("pod -> ClusterIP TCP_CRR, backend on another node, {label}"),
            "ops/s",
            true,
            crr,
        ));
    }
    Ok(figures)
}
