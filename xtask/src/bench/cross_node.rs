//! Pod to pod across two nodes on one segment: ebpf-cni's overlay (`--routing vxlan`)
//! and native routes against what flannel builds from the reference plugins on each
//! node (`bridge` + `host-local`, then a kernel VXLAN device `flannel.1` with the FDB
//! and neighbour entries and the route flannel's vxlan backend programs, or for
//! host-gw a route to the other node's pod subnet via its address), and, as the
//! ceiling, the two nodes talking to each other: directly for native routes, over the
//! reference's kernel VXLAN devices (no pod, no bridge) for the overlay, since every
//! overlay pays the encapsulation that direct talk does not. Native routes are measured
//! a second time with netkit pods (`"podDevice": "netkit"`) where the kernel makes
//! netkit pairs; elsewhere those figures are "missing", with the reason.

use std::{net::Ipv4Addr, path::PathBuf};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{
    cluster::{TestCluster, new_segment, node_addr, plug},
    cni::{Call, REFERENCE_PLUGINS},
    netns::Netns,
    unique_name,
};
use serde_json::json;

use super::{
    Plan, figure, interleaved, load,
    report::{Contender, Figure, Value},
};

/// How the pods of two nodes reach each other.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// ebpf-cni `--routing vxlan`; flannel's vxlan backend.
    Overlay,
    /// ebpf-cni `--routing native`; flannel's host-gw.
    Native,
}

/// Two nodes with the reference chain, flannel-style, one pod each: node `n` (from 1)
/// at [`node_addr`]`(n)`, its pods in `10.250.n.0/24`.
pub(super) struct RefPair {
    _segment: Netns,
    pub(super) nodes: Vec<Netns>,
    pub(super) pods: Vec<Netns>,
    pub(super) pod_ips: Vec<Ipv4Addr>,
    data_dir: PathBuf,
}

impl RefPair {
    pub(super) fn build(mode: Mode) -> anyhow::Result<Self> {
        let segment = new_segment();
        let name = unique_name("xref");
        let data_dir = PathBuf::from("/run").join(&name);
        let (mut nodes, mut pods, mut pod_ips) = (Vec::new(), Vec::new(), Vec::new());
        for n in 1..=2 {
            let node = Netns::new("refnode");
            plug(&segment, n, &node);
            node.run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"]);
            let mut config = json!({
                "cniVersion": "1.0.0",
                "name": name,
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "isDefaultGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "subnet": format!("10.250.{n}.0/24"),
                    "dataDir": data_dir,
                },
            });
            if mode == Mode::Overlay {
                config["mtu"] = json!(1450);
            }
            let pod = Netns::new("refpod");
            let added = Call::new("ADD", &format!("xref-{n}"), "eth0", Some(&pod), &config)
                .run_plugin(&node, &PathBuf::from(REFERENCE_PLUGINS).join("bridge"));
            ensure!(added.success, "bridge ADD failed: {}", added.stdout);
            let ip: Ipv4Addr = added.json()["ips"][0]["address"]
                .as_str()
                .and_then(|address| address.split('/').next()?.parse().ok())
                .context("bridge returned no IPv4 address")?;
            load::tune_client(&pod);
            nodes.push(node);
            pods.push(pod);
            pod_ips.push(ip);
        }
        match mode {
            Mode::Native => {
                for (n, node) in nodes.iter().enumerate() {
                    let other = 2 - n;
                    node.ip(&[
                        "route",
                        "add",
                        &format!("10.250.{other}.0/24"),
                        "via",
                        &node_addr(other),
                    ]);
                }
            }
            Mode::Overlay => flannel_vxlan(&nodes)?,
        }
        Ok(Self {
            _segment: segment,
            nodes,
            pods,
            pod_ips,
            data_dir,
        })
    }
}

impl Drop for RefPair {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// What flannel's vxlan backend programs on each of `nodes` (node `n` at index `n - 1`,
/// pod subnet `10.250.n.0/24`): `flannel.1` (VNI 1, port 8472, no learning, MTU 1450)
/// with the network address of the node's subnet, and for the other node a route
/// `10.250.R.0/24 via 10.250.R.0 dev flannel.1 onlink`, a permanent neighbour entry for
/// that gateway with the other `flannel.1`'s MAC, and an FDB entry sending that MAC to
/// the other node's address.
fn flannel_vxlan(nodes: &[Netns]) -> anyhow::Result<()> {
    let mut macs = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let n = i + 1;
        node.ip(&[
            "link",
            "add",
            "flannel.1",
            "type",
            "vxlan",
            "id",
            "1",
            "local",
            &node_addr(n),
            "dev",
            "uplink0",
            "dstport",
            "8472",
            "nolearning",
        ]);
        node.ip(&[
            "addr",
            "add",
            &format!("10.250.{n}.0/32"),
            "dev",
            "flannel.1",
        ]);
        node.ip(&["link", "set", "flannel.1", "mtu", "1450", "up"]);
        let shown: serde_json::Value =
            serde_json::from_str(&node.ip(&["-j", "link", "show", "flannel.1"]))?;
        macs.push(
            shown[0]["address"]
                .as_str()
                .context("flannel.1 has no MAC")?
                .to_owned(),
        );
    }
    for (i, node) in nodes.iter().enumerate() {
        let other = 2 - i;
        let gateway = format!("10.250.{other}.0");
        let mac = &macs[other - 1];
        node.ip(&[
            "route",
            "add",
            &format!("10.250.{other}.0/24"),
            "via",
            &gateway,
            "dev",
            "flannel.1",
            "onlink",
        ]);
        node.ip(&[
            "neigh",
            "replace",
            &gateway,
            "lladdr",
            mac,
            "dev",
            "flannel.1",
            "nud",
            "permanent",
        ]);
        let out = node.run(
            "bridge",
            &[
                "fdb",
                "append",
                mac,
                "dev",
                "flannel.1",
                "dst",
                &node_addr(other),
            ],
        );
        ensure!(out.status.success(), "bridge fdb append failed: {out:?}");
    }
    Ok(())
}

/// The pods ebpf-cni's nodes get.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pods {
    Veth,
    /// `"podDevice": "netkit"`: measured where the kernel makes netkit pairs.
    Netkit,
}

/// The three contenders of one mode: ebpf-cni's two nodes with a pod each, the
/// reference's, and the ceiling: for native routes the two nodes of ebpf-cni's cluster
/// themselves, for the overlay the reference's two nodes over their `flannel.1`.
struct Contenders {
    mode: Mode,
    cluster: TestCluster,
    ours: (Netns, Netns, Ipv4Addr),
    reference: RefPair,
}

impl Contenders {
    fn build(mode: Mode, pods: Pods) -> anyhow::Result<Self> {
        let (routing, ranges) = match mode {
            Mode::Overlay => ("vxlan", ["10.248.1.0/24", "10.248.2.0/24"]),
            Mode::Native => ("native", ["10.249.1.0/24", "10.249.2.0/24"]),
        };
        let cluster = TestCluster::start(&ranges, &["--routing", routing]);
        let (a, b) = match pods {
            Pods::Veth => (
                cluster.node(1).add_pod("bench-xa"),
                cluster.node(2).add_pod("bench-xb"),
            ),
            Pods::Netkit => (
                cluster.node(1).add_netkit_pod("bench-xa"),
                cluster.node(2).add_netkit_pod("bench-xb"),
            ),
        };
        load::tune_client(&a.netns);
        load::tune_client(&cluster.node(1).netns);
        let reference = RefPair::build(mode)?;
        load::tune_client(&reference.nodes[0]);
        Ok(Self {
            mode,
            ours: (a.netns, b.netns, b.ip),
            reference,
            cluster,
        })
    }

    /// (client, server, server address) of `contender`.
    fn pair(&self, contender: Contender) -> (&Netns, &Netns, Ipv4Addr) {
        match contender {
            Contender::EbpfCni => (&self.ours.0, &self.ours.1, self.ours.2),
            Contender::Reference => (
                &self.reference.pods[0],
                &self.reference.pods[1],
                self.reference.pod_ips[1],
            ),
            // Node 1 to node 2's `flannel.1` address, through the tunnel.
            Contender::Raw if self.mode == Mode::Overlay => (
                &self.reference.nodes[0],
                &self.reference.nodes[1],
                Ipv4Addr::new(10, 250, 2, 0),
            ),
            Contender::Raw => (
                &self.cluster.node(1).netns,
                &self.cluster.node(2).netns,
                node_addr(2).parse().expect("an address"),
            ),
        }
    }
}

/// Why the reference and the ceiling have no figures beside netkit pods that were not
/// measured.
const NOT_RUN: &str = "not run: no netkit pods to compare with";

/// Each mode's figures, (name, unit), in the order measured.
const FIGURES: [(&str, &str); 3] = [
    ("TCP throughput", "Gbit/s"),
    ("TCP_RR", "ops/s"),
    ("TCP_CRR", "ops/s"),
];

pub(super) fn cross_node(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: pod to pod across nodes");
    let all = [Contender::EbpfCni, Contender::Reference, Contender::Raw];
    let seconds = plan.seconds();
    let mut figures = Vec::new();
    for (mode, pods, label) in [
        (
            Mode::Overlay,
            Pods::Veth,
            "overlay (ours: vxlan; reference: flannel's vxlan; ceiling: the nodes over VXLAN)",
        ),
        (
            Mode::Native,
            Pods::Veth,
            "native (ours: native; reference: flannel's host-gw)",
        ),
        (
            Mode::Native,
            Pods::Netkit,
            "native, netkit pods (ours: native, \"podDevice\": \"netkit\"; reference: \
             flannel's host-gw)",
        ),
    ] {
        if pods == Pods::Netkit && !ebpf_cni_tests::netkit::supported() {
            eprintln!("bench: {label}: not measured, this kernel makes no netkit pairs");
            for (name, unit) in FIGURES {
                figures.push(Figure {
                    name: format!("cross-node {name}, {label}"),
                    unit: unit.to_owned(),
                    higher_is_better: true,
                    values: vec![
                        (
                            Contender::EbpfCni,
                            Value::Missing(
                                "this kernel makes no netkit pairs (Linux 6.7, CONFIG_NETKIT)"
                                    .to_owned(),
                            ),
                        ),
                        (Contender::Reference, Value::Missing(NOT_RUN.to_owned())),
                        (Contender::Raw, Value::Missing(NOT_RUN.to_owned())),
                    ],
                });
            }
            continue;
        }
        let contenders = Contenders::build(mode, pods)?;
        // The reference's nodes stay up as long as its pods.
        let _nodes = &contenders.reference.nodes;
        let throughput = interleaved(plan.traffic_repeats(), &all, |c| {
            let (client, server, ip) = contenders.pair(c);
            load::throughput(client, server, ip, seconds)
        })?;
        let rr = interleaved(plan.traffic_repeats(), &all, |c| {
            let (client, server, ip) = contenders.pair(c);
            load::tcp_rr(client, server, ip, seconds)
        })?;
        let crr = interleaved(plan.traffic_repeats(), &all, |c| {
            let (client, server, ip) = contenders.pair(c);
            load::tcp_crr(client, server, ip, seconds)
        })?;
        for ((name, unit), values) in FIGURES.into_iter().zip([throughput, rr, crr]) {
            figures.push(figure(
                &format!("cross-node {name}, {label}"),
                unit,
                true,
                values,
            ));
        }
    }
    Ok(figures)
}
