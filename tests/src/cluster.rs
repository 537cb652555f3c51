//! The cluster's nodes as a daemon reads them from `--nodes-file`: a file in the form
//! `kubectl get nodes -o yaml` prints, written and replaced as a person or a sync job
//! would.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

/// One node of the file: name, InternalIP, pod ranges.
pub type NodeEntry<'a> = (&'a str, &'a str, &'a [&'a str]);

/// A nodes file in its own folder under /run, removed on drop.
pub struct NodesFile {
    dir: PathBuf,
    path: PathBuf,
}

impl NodesFile {
    pub fn new(nodes: &[NodeEntry<'_>]) -> Self {
        let dir = PathBuf::from("/run").join(crate::unique_name("nodes"));
        std::fs::create_dir_all(&dir).expect("a folder for the nodes file");
        let file = Self {
            path: dir.join("nodes.yaml"),
            dir,
        };
        file.replace(nodes);
        file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `--nodes-file PATH`, as daemon flags.
    pub fn flags(&self) -> [&str; 2] {
        ["--nodes-file", self.path.to_str().expect("a UTF-8 path")]
    }

    /// Writes `nodes` to a new file and renames it over the old one, as `kubectl ... >
    /// tmp && mv tmp nodes.yaml` does.
    pub fn replace(&self, nodes: &[NodeEntry<'_>]) {
        let temporary = self.dir.join("nodes.yaml.new");
        std::fs::write(&temporary, list_yaml(nodes)).expect("the nodes written");
        std::fs::rename(&temporary, &self.path).expect("the nodes file replaced");
    }

    /// Writes raw `text` in place.
    pub fn write_raw(&self, text: &str) {
        std::fs::write(&self.path, text).expect("the nodes file written");
    }
}

impl Drop for NodesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `nodes` as the `List` that `kubectl get nodes -o yaml` prints.
pub fn list_yaml(nodes: &[NodeEntry<'_>]) -> String {
    let mut yaml =
        String::from("apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n");
    for (name, address, cidrs) in nodes {
        let _ = write!(
            yaml,
            "- apiVersion: v1\n  kind: Node\n  metadata:\n    name: {name}\n    labels:\n      \
             kubernetes.io/hostname: {name}\n  spec:\n"
        );
        if let Some(first) = cidrs.first() {
            let _ = writeln!(yaml, "    podCIDR: {first}\n    podCIDRs:");
            for cidr in *cidrs {
                let _ = writeln!(yaml, "    - {cidr}");
            }
        }
        let _ = write!(
            yaml,
            "  status:\n    addresses:\n    - address: {address}\n      type: InternalIP\n    \
             - address: {name}\n      type: Hostname\n"
        );
    }
    yaml
}

/// The underlay's addresses: node `n` (from 1) at `198.19.0.n`, the segment's own
/// host (the nodes' default gateway, standing for the outside) at [`SEGMENT_HOST`].
pub const SEGMENT_PREFIX: &str = "198.19.0";
pub const SEGMENT_HOST: &str = "198.19.0.254";

/// The network behind the segment's host, which routes between the two: nodes there
/// are not on the segment's L2 (native routing cannot reach them, the overlay can).
pub const ROUTED_PREFIX: &str = "198.20.0";
pub const ROUTER_ON_ROUTED: &str = "198.20.0.254";

/// Node `n`'s address on the segment.
pub fn node_addr(n: usize) -> String {
    format!("{SEGMENT_PREFIX}.{n}")
}

/// Node `n`'s address behind the router.
pub fn routed_node_addr(n: usize) -> String {
    format!("{ROUTED_PREFIX}.{n}")
}

/// Node `n`'s name in the nodes file.
pub fn node_name(n: usize) -> String {
    format!("node-{n}")
}

/// Nodes on one L2 segment (a bridge in a namespace of its own, standing for the
/// switch), each running its own daemon, all reading one nodes file. Fields drop in
/// order: the nodes (daemons first) before the file and the segment.
pub struct TestCluster {
    pub nodes: Vec<crate::node::Node>,
    pub file: NodesFile,
    pub segment: crate::netns::Netns,
}

impl TestCluster {
    /// `ranges[n - 1]` is node `n`'s pod range; every daemon gets `flags` too.
    pub fn start(ranges: &[&str], flags: &[&str]) -> Self {
        Self::start_routed(ranges, 0, flags)
    }

    /// Like [`Self::start`], the last `routed` nodes behind the segment's host, which
    /// routes between the segment and their network ([`ROUTED_PREFIX`]).
    pub fn start_routed(ranges: &[&str], routed: usize, flags: &[&str]) -> Self {
        let segment = new_segment();
        segment.ip(&["addr", "add", &format!("{SEGMENT_HOST}/24"), "dev", "br0"]);
        segment.run("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"]);
        let first_routed = ranges.len() - routed + 1;
        let names: Vec<String> = (1..=ranges.len()).map(node_name).collect();
        let addrs: Vec<String> = (1..=ranges.len())
            .map(|n| {
                if n >= first_routed {
                    routed_node_addr(n)
                } else {
                    node_addr(n)
                }
            })
            .collect();
        let entries: Vec<NodeEntry<'_>> = ranges
            .iter()
            .enumerate()
            .map(|(i, range)| {
                (
                    names[i].as_str(),
                    addrs[i].as_str(),
                    std::slice::from_ref(range),
                )
            })
            .collect();
        let file = NodesFile::new(&entries);
        let nodes = (1..=ranges.len())
            .map(|n| join(&segment, n, n >= first_routed, &file, flags))
            .collect();
        Self {
            nodes,
            file,
            segment,
        }
    }

    /// Node `n` (from 1).
    pub fn node(&self, n: usize) -> &crate::node::Node {
        &self.nodes[n - 1]
    }
}

/// A segment: a namespace holding a bridge `br0`, up, standing for the switch.
pub fn new_segment() -> crate::netns::Netns {
    let segment = crate::netns::Netns::new("seg");
    segment.ip(&["link", "add", "br0", "type", "bridge"]);
    segment.ip(&["link", "set", "br0", "up"]);
    segment
}

/// Puts `netns` on `segment` as node `n`: its `uplink0` in the bridge, at
/// [`node_addr`]`(n)`/24, up (no route beyond the segment).
pub fn plug(segment: &crate::netns::Netns, n: usize, netns: &crate::netns::Netns) {
    let port = veth_to(segment, n, netns);
    segment.ip(&["link", "set", &port, "master", "br0", "up"]);
    netns.ip(&[
        "addr",
        "add",
        &format!("{}/24", node_addr(n)),
        "dev",
        "uplink0",
    ]);
    netns.ip(&["link", "set", "uplink0", "up"]);
}

/// A veth from `segment` (`p<n>`, returned) to `netns` (`uplink0`).
fn veth_to(segment: &crate::netns::Netns, n: usize, netns: &crate::netns::Netns) -> String {
    let port = format!("p{n}");
    segment.ip(&[
        "link",
        "add",
        &port,
        "type",
        "veth",
        "peer",
        "name",
        "uplink0",
        "netns",
        netns.name(),
    ]);
    port
}

/// The routes the daemon of `netns` installed to other nodes' pods (`ip route show
/// proto 208`), one per line.
pub fn daemon_routes(netns: &crate::netns::Netns) -> Vec<String> {
    netns
        .ip(&["-4", "route", "show", "proto", "208"])
        .lines()
        .map(|line| line.trim().to_owned())
        .filter(|line| !line.is_empty())
        .collect()
}

/// The address of the last peer in `peers` (what a server saw last).
pub fn last_peer(peers: &[std::net::SocketAddr]) -> std::net::IpAddr {
    peers.last().expect("a peer seen").ip()
}

/// What every routing must give pods `a` (node 1), `b` (node 2) and `c` (node 3) of
/// `cluster`: TCP a -> b and UDP a -> c with a's own address, ICMP c -> b, and b's
/// traffic to the outside (the segment's host) translated to node 2's address. Servers
/// listen on `port`.
pub fn pods_talk_as_themselves(cluster: &TestCluster, pods: [&crate::node::Pod; 3], port: u16) {
    use crate::traffic::{EchoServer, UdpEcho, round_trip, udp_round_trip};
    let [a, b, c] = pods;
    let tcp_b = EchoServer::start(&b.netns, port);
    round_trip(&a.netns, (b.ip, port).into(), b"tcp across nodes").expect("pod a reaches pod b");
    assert_eq!(
        last_peer(&tcp_b.peers()),
        std::net::IpAddr::V4(a.ip),
        "b sees a's own address"
    );
    let udp_c = UdpEcho::start(&c.netns, port);
    udp_round_trip(&a.netns, 0, (c.ip, port).into(), b"udp across nodes")
        .expect("pod a reaches pod c");
    assert_eq!(
        last_peer(&udp_c.peers()),
        std::net::IpAddr::V4(a.ip),
        "c sees a's own address"
    );
    let ping = c.netns.run(
        "ping",
        &["-c", "2", "-i", "0.2", "-W", "2", &b.ip.to_string()],
    );
    assert!(ping.status.success(), "pod c pings pod b: {ping:?}");
    let outside = EchoServer::start(&cluster.segment, port);
    let host: std::net::Ipv4Addr = SEGMENT_HOST.parse().expect("an address");
    round_trip(&b.netns, (host, port).into(), b"out").expect("pod b reaches the outside");
    assert_eq!(
        last_peer(&outside.peers()),
        node_addr(2)
            .parse::<std::net::IpAddr>()
            .expect("an address"),
        "translated to node 2's address"
    );
}

/// Node `n`: its uplink `uplink0` in the segment's bridge (or, `routed`, on a link of
/// its own to the segment's host, which routes), a default route to the segment's host,
/// its daemon reading `file` as `node-n`.
fn join(
    segment: &crate::netns::Netns,
    n: usize,
    routed: bool,
    file: &NodesFile,
    flags: &[&str],
) -> crate::node::Node {
    let netns = crate::netns::Netns::new("node");
    let gateway = if routed {
        let port = veth_to(segment, n, &netns);
        // One router port per routed node, each with a /32 route to its node.
        segment.ip(&[
            "addr",
            "add",
            &format!("{ROUTER_ON_ROUTED}/32"),
            "dev",
            &port,
        ]);
        segment.ip(&["link", "set", &port, "up"]);
        segment.ip(&["route", "add", &routed_node_addr(n), "dev", &port]);
        netns.ip(&[
            "addr",
            "add",
            &format!("{}/24", routed_node_addr(n)),
            "dev",
            "uplink0",
        ]);
        netns.ip(&["link", "set", "uplink0", "up"]);
        ROUTER_ON_ROUTED
    } else {
        plug(segment, n, &netns);
        SEGMENT_HOST
    };
    netns.ip(&["route", "add", "default", "via", gateway]);
    let instance = crate::daemon::Instance::new();
    let name = node_name(n);
    let [file_flag, path] = file.flags();
    let mut all_flags = vec!["--node-name", name.as_str(), file_flag, path];
    all_flags.extend_from_slice(flags);
    let daemon = crate::daemon::Daemon::start_with(&netns, &instance, &[], &all_flags);
    let mut network = crate::cni::Network::new(&instance, "usePodCidr");
    // No `mtu` in the config: pods get the daemon's (the overlay's room taken off).
    network.mtu = None;
    crate::node::Node {
        daemon,
        network,
        instance,
        netns,
        external: crate::netns::Netns::existing(&segment.path()),
    }
}
