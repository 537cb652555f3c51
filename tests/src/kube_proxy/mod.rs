//! kube-proxy's rules for a list of Services, written into a simulated node's network
//! namespace as kube-proxy lays them out, in either of its modes:
//!
//! - iptables (after kube-proxy's `pkg/proxy/iptables/proxier.go`): the
//!   `iptables-restore --noflush` input of a full sync (nat KUBE-SERVICES, KUBE-SVC-*,
//!   KUBE-SVL-*, KUBE-EXT-*, KUBE-SEP-*, KUBE-NODEPORTS, KUBE-MARK-MASQ,
//!   KUBE-POSTROUTING; filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-FORWARD,
//!   KUBE-NODEPORTS, KUBE-PROXY-FIREWALL), and the jumps from the built-in chains that
//!   kube-proxy ensures before it restores.
//! - nftables (after `pkg/proxy/nftables/proxier.go`, in its current layout): the table
//!   `ip kube-proxy`, with its base chains (the filter ones that need the destination
//!   before DNAT at dstnat - 10), the `service-ips` / `service-nodeports` verdict maps,
//!   the no-endpoint maps, and the service, external, local and endpoint chains.
//!
//! Chain names hash as kube-proxy hashes them (base32 of a SHA-256), so a chain here has
//! the name kube-proxy would give it; the unit tests compare with the expected dumps of
//! the `proxier_test.go` files next to those sources.
//!
//! Not modelled: session affinity, LoadBalancerSourceRanges (firewall chains and maps,
//! left empty), health check node ports, internalTrafficPolicy, topology hints,
//! terminating endpoints, masquerade-all, SCTP, IPv6, nfacct counters, localhost
//! NodePorts in iptables mode (no `route_localnet`) and, in nftables mode, the drop of
//! unallocated ClusterIPs (kube-proxy writes it only when it knows the ServiceCIDRs).

mod iptables;
mod nftables;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Output,
};

use sha2::{Digest, Sha256};

use crate::netns::Netns;

/// The masquerade mark, kube-proxy's default (`--iptables-masquerade-bit=14`).
const MASQ_MARK: &str = "0x4000";

/// A Service port's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The lower-case name the rules use (`-p tcp`, `meta l4proto tcp`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// kube-proxy's `--proxy-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
}

/// One endpoint (backend) of a Service; `local` when it is a pod of this node (for
/// externalTrafficPolicy: Local).
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub local: bool,
}

impl Endpoint {
    /// An endpoint on another node.
    pub fn remote(ip: Ipv4Addr, port: u16) -> Self {
        Self {
            ip,
            port,
            local: false,
        }
    }

    /// An endpoint that is a pod of this node.
    pub fn local(ip: Ipv4Addr, port: u16) -> Self {
        Self {
            ip,
            port,
            local: true,
        }
    }

    /// `ip:port`: the DNAT target, and kube-proxy's endpoint string.
    fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }
}

/// One port of a Service, with its endpoints.
#[derive(Clone, Debug)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    /// The port's name; empty for the unnamed port of a single-port Service.
    pub port_name: String,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub protocol: Protocol,
    pub node_port: Option<u16>,
    /// externalIPs and LoadBalancer ingress IPs (kube-proxy treats both alike).
    pub external_ips: Vec<Ipv4Addr>,
    /// externalTrafficPolicy: Local.
    pub external_local: bool,
    pub endpoints: Vec<Endpoint>,
}

impl Service {
    /// A ClusterIP Service with one unnamed TCP port.
    pub fn tcp(
        namespace: &str,
        name: &str,
        cluster_ip: Ipv4Addr,
        port: u16,
        endpoints: Vec<Endpoint>,
    ) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port_name: String::new(),
            cluster_ip,
            port,
            protocol: Protocol::Tcp,
            node_port: None,
            external_ips: Vec::new(),
            external_local: false,
            endpoints,
        }
    }

    /// A ClusterIP Service with one unnamed UDP port.
    pub fn udp(
        namespace: &str,
        name: &str,
        cluster_ip: Ipv4Addr,
        port: u16,
        endpoints: Vec<Endpoint>,
    ) -> Self {
        Self {
            protocol: Protocol::Udp,
            ..Self::tcp(namespace, name, cluster_ip, port, endpoints)
        }
    }

    /// The same with its port named `port_name`.
    pub fn named(mut self, port_name: &str) -> Self {
        port_name.clone_into(&mut self.port_name);
        self
    }

    /// The same with a NodePort.
    pub fn with_node_port(mut self, node_port: u16) -> Self {
        self.node_port = Some(node_port);
        self
    }

    /// The same with externalIPs / LoadBalancer IPs.
    pub fn with_external_ips(mut self, ips: &[Ipv4Addr]) -> Self {
        self.external_ips = ips.to_vec();
        self
    }

    /// The same with externalTrafficPolicy: Local.
    pub fn with_external_local(mut self) -> Self {
        self.external_local = true;
        self
    }

    /// kube-proxy's name of the Service port: `namespace/name:port`, or `namespace/name`
    /// for an unnamed port (the comments of the iptables rules).
    pub fn port_name_string(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }

    /// The decisions both proxiers take from the Service's traffic policy and endpoints.
    fn policy(&self) -> Policy<'_> {
        let externally_accessible = self.node_port.is_some() || !self.external_ips.is_empty();
        let external_local = self.external_local && externally_accessible;
        let local: Vec<&Endpoint> = self.endpoints.iter().filter(|ep| ep.local).collect();
        let has_endpoints = !self.endpoints.is_empty();
        Policy {
            has_endpoints,
            has_external_endpoints: has_endpoints && (!external_local || !local.is_empty()),
            uses_external_chain: has_endpoints && externally_accessible,
            uses_local_chain: external_local && !local.is_empty(),
            external_local,
            local,
        }
    }
}

/// What kube-proxy's proxiers work out per Service port before writing rules
/// (internalTrafficPolicy is always Cluster here).
struct Policy<'a> {
    /// Any endpoint at all: without one, the Service's addresses are rejected.
    has_endpoints: bool,
    /// Endpoints for external traffic: none when the policy is Local and no endpoint
    /// is on this node (such traffic is dropped, unless short-circuited).
    has_external_endpoints: bool,
    /// The external chain (KUBE-EXT / external-), for NodePorts and external IPs.
    uses_external_chain: bool,
    /// The Local policy's chain (KUBE-SVL / local-), over this node's endpoints.
    uses_local_chain: bool,
    /// externalTrafficPolicy: Local, on a Service reachable from outside.
    external_local: bool,
    local: Vec<&'a Endpoint>,
}

/// kube-proxy in a node's network namespace.
pub struct KubeProxy {
    pub mode: Mode,
    /// kube-proxy's --cluster-cidr (None: not set, so no local-traffic detection, as
    /// kube-proxy's no-op detector).
    pub cluster_cidr: Option<String>,
    /// The node's addresses NodePorts answer on (nftables mode's `nodeport-ips`, from
    /// --nodeport-addresses; empty: every local address). iptables mode uses
    /// `addrtype LOCAL`, as kube-proxy does with --nodeport-addresses unset.
    pub node_ips: Vec<Ipv4Addr>,
}

impl KubeProxy {
    /// kube-proxy in `mode`, without --cluster-cidr, NodePorts on every local address.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            cluster_cidr: None,
            node_ips: Vec::new(),
        }
    }

    /// The rules text for `services` (iptables-restore input, or an nft script).
    pub fn rules(&self, services: &[Service]) -> String {
        match self.mode {
            Mode::Iptables => iptables::rules(self, services, &[], |_| true),
            Mode::Nftables => nftables::rules(self, services),
        }
    }

    /// Writes the rules into `netns` (panics with the tool's stderr on failure). Called
    /// again with a new list, it replaces kube-proxy's rules as a sync does, leaving
    /// other rules alone.
    pub fn install(&self, netns: &Netns, services: &[Service]) {
        match self.mode {
            Mode::Iptables => iptables::install(self, netns, services),
            Mode::Nftables => nftables::install(self, netns, services),
        }
    }
}

/// RFC 4648 base32 (Go's `base32.StdEncoding`) of a SHA-256 of `input`, without padding:
/// the hash in kube-proxy's chain names.
fn hash(input: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(input.as_bytes());
    let mut out = String::new();
    let (mut bits, mut count) = (0u32, 0u32);
    for byte in digest {
        bits = (bits << 8) | u32::from(byte);
        count += 8;
        while count >= 5 {
            count -= 5;
            out.push(char::from(ALPHABET[((bits >> count) & 31) as usize]));
        }
    }
    if count > 0 {
        out.push(char::from(ALPHABET[((bits << (5 - count)) & 31) as usize]));
    }
    out
}

/// A file holding a rules text for a tool to read, removed on drop.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn new(tag: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(crate::unique_name(tag));
        std::fs::write(&path, text)
            .unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `program args` in `netns`, panicking with its stderr and the rules it was given
/// (numbered, as the tools' messages count lines) when it fails.
fn run_rules(netns: &Netns, program: &str, args: &[&str], rules: &str) -> Output {
    let out = netns.run(program, args);
    if !out.status.success() {
        let numbered: Vec<String> = rules
            .lines()
            .enumerate()
            .map(|(n, line)| format!("{:4} {line}", n + 1))
            .collect();
        panic!(
            "{program} {args:?} in {}: {}\n{}",
            netns.name(),
            String::from_utf8_lossy(&out.stderr),
            numbered.join("\n")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::{Endpoint, KubeProxy, Mode, Service, hash};
    use crate::netns::Netns;

    #[test]
    fn hashes_are_kube_proxys() {
        // Chain names of kube-proxy's expected dumps (proxier_test.go, both modes).
        assert_eq!(&hash("ns1/svc1:p80tcp")[..16], "XPGD46QRK7WJZT7O");
        assert_eq!(
            &hash("ns1/svc1:p80tcp10.180.0.1:80")[..16],
            "SXIVWICOYRO3J4NJ"
        );
        assert_eq!(&hash("ns1/svc1/tcp/p80")[..8], "ULMVA6XW");
        assert_eq!(&hash("ns1/svc1/tcp/p80__10.180.0.1/80")[..8], "5OJB2KTY");
        // 256 bits make 52 characters, the last one padded with zero bits.
        assert_eq!(hash("").len(), 52);
    }

    fn services(endpoints: u8) -> Vec<Service> {
        let web = Service::tcp(
            "default",
            "web",
            Ipv4Addr::new(10, 96, 0, 10),
            80,
            (1..=endpoints)
                .map(|n| Endpoint::remote(Ipv4Addr::new(10, 244, 1, n), 8080))
                .collect(),
        )
        .with_node_port(30080)
        .with_external_ips(&[Ipv4Addr::new(203, 0, 113, 10)]);
        let dns = Service::udp(
            "kube-system",
            "kube-dns",
            Ipv4Addr::new(10, 96, 0, 53),
            53,
            vec![Endpoint::local(Ipv4Addr::new(10, 244, 0, 5), 53)],
        )
        .named("dns")
        .with_node_port(30053)
        .with_external_local();
        let empty = Service::tcp(
            "default",
            "none",
            Ipv4Addr::new(10, 96, 0, 99),
            80,
            Vec::new(),
        )
        .with_node_port(30099);
        vec![web, dns, empty]
    }

    fn lines_with(text: &str, word: &str) -> usize {
        text.lines().filter(|line| line.contains(word)).count()
    }

    /// What `program args` prints in `netns`; panics when it fails.
    fn stdout(netns: &Netns, program: &str, args: &[&str]) -> String {
        let out = netns.run(program, args);
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn iptables_rules_load_and_reload() {
        crate::require_root();
        let node = Netns::new("kproxy");
        // A rule of the test's own, which installs must leave alone.
        let own = [
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            "192.0.2.1",
            "-j",
            "ACCEPT",
        ];
        stdout(&node, "iptables", &own);
        let proxy = KubeProxy {
            cluster_cidr: Some("10.244.0.0/16".to_owned()),
            ..KubeProxy::new(Mode::Iptables)
        };

        proxy.install(&node, &services(3));
        let nat = stdout(&node, "iptables-save", &["-t", "nat"]);
        for chain in ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING"] {
            assert!(nat.contains(&format!(":{chain} ")), "{chain} in\n{nat}");
        }
        assert_eq!(lines_with(&nat, ":KUBE-SEP-"), 4, "{nat}");
        assert_eq!(lines_with(&nat, "--probability"), 2, "{nat}");
        assert_eq!(lines_with(&nat, ":KUBE-SVL-"), 1, "{nat}");
        let filter = stdout(&node, "iptables-save", &["-t", "filter"]);
        assert!(filter.contains("-j REJECT"), "{filter}");

        // A sync with fewer endpoints: the jumps stay single, the stale chains go.
        proxy.install(&node, &services(1));
        let nat = stdout(&node, "iptables-save", &["-t", "nat"]);
        assert_eq!(lines_with(&nat, "-A PREROUTING"), 1, "{nat}");
        assert_eq!(lines_with(&nat, ":KUBE-SEP-"), 2, "{nat}");
        assert_eq!(lines_with(&nat, "--probability"), 0, "{nat}");
        assert!(
            nat.contains("-A POSTROUTING -s 192.0.2.1/32 -j ACCEPT"),
            "{nat}"
        );
    }

    #[test]
    fn nftables_rules_load_and_reload() {
        crate::require_root();
        let node = Netns::new("kproxy");
        let proxy = KubeProxy {
            cluster_cidr: Some("10.244.0.0/16".to_owned()),
            node_ips: vec![Ipv4Addr::new(192, 168, 0, 2)],
            ..KubeProxy::new(Mode::Nftables)
        };
        let list = ["list", "table", "ip", "kube-proxy"];

        proxy.install(&node, &services(3));
        let table = stdout(&node, "nft", &list);
        for name in [
            "map service-ips",
            "map service-nodeports",
            "set nodeport-ips",
            "chain nat-prerouting",
        ] {
            assert!(table.contains(name), "{name} in\n{table}");
        }
        assert!(table.contains("numgen random mod 3 vmap"), "{table}");
        assert_eq!(lines_with(&table, "chain endpoint-"), 4, "{table}");

        proxy.install(&node, &services(1));
        let table = stdout(&node, "nft", &list);
        assert_eq!(lines_with(&table, "chain endpoint-"), 2, "{table}");
    }
}
