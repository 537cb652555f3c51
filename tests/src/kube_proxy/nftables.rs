//! nftables mode: the table `ip kube-proxy` as kube-proxy's nftables proxier fills it on
//! a full sync, written as one `nft -f` script that first deletes the table (so that a
//! new list replaces the old one in a single transaction) and then declares every set,
//! map and chain before the rules and elements that name them.

use super::{Endpoint, KubeProxy, MASQ_MARK, Netns, ScratchFile, Service, hash, run_rules};

const TABLE: &str = "ip kube-proxy";

/// Base chains: (name, type, hook, priority). The filter chains that must see the
/// destination before DNAT run just ahead of it (dstnat - 10).
const BASE_CHAINS: [(&str, &str, &str, i32); 8] = [
    ("filter-prerouting-pre-dnat", "filter", "prerouting", -110),
    ("filter-output-pre-dnat", "filter", "output", -110),
    ("filter-input", "filter", "input", 0),
    ("filter-forward", "filter", "forward", 0),
    ("filter-output", "filter", "output", 0),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
];

/// Regular chains every sync has.
const TOP_CHAINS: [&str; 8] = [
    "cluster-ips-check",
    "firewall-check",
    "mark-for-masquerade",
    "masquerading",
    "nodeport-endpoints-check",
    "reject-chain",
    "services",
    "service-endpoints-check",
];

/// Jumps from the base chains: (from, to). Those of the filter chains are for new
/// connections only.
const JUMPS: [(&str, &str); 11] = [
    ("filter-prerouting-pre-dnat", "firewall-check"),
    ("filter-output-pre-dnat", "firewall-check"),
    ("filter-input", "nodeport-endpoints-check"),
    ("filter-input", "service-endpoints-check"),
    ("filter-forward", "service-endpoints-check"),
    ("filter-forward", "cluster-ips-check"),
    ("filter-output", "service-endpoints-check"),
    ("filter-output", "cluster-ips-check"),
    ("nat-prerouting", "services"),
    ("nat-output", "services"),
    ("nat-postrouting", "masquerading"),
];

/// A Service port's chain name after its prefix: hash, then kube-proxy's readable name
/// (`HASH-namespace/name/protocol/port`); the hash is 8 base32 characters of a SHA-256
/// of the readable part.
fn chain_base(service: &Service) -> String {
    let name = format!(
        "{}/{}/{}/{}",
        service.namespace,
        service.name,
        service.protocol.name(),
        service.port_name
    );
    format!("{}-{name}", &hash(&name)[..8])
}

/// One endpoint's chain: `endpoint-HASH-namespace/name/protocol/port__ip/port`.
fn endpoint_chain(service: &Service, endpoint: &Endpoint) -> String {
    let name = format!(
        "{}/{}/{}/{}__{}/{}",
        service.namespace,
        service.name,
        service.protocol.name(),
        service.port_name,
        endpoint.ip,
        endpoint.port
    );
    format!("endpoint-{}-{name}", &hash(&name)[..8])
}

/// The script: the table's skeleton, then per Service port its chains, rules and map
/// elements.
pub(super) fn rules(proxy: &KubeProxy, services: &[Service]) -> String {
    let mut chains: Vec<String> = Vec::new();
    let mut rules: Vec<String> = Vec::new();
    let mut elements: Vec<String> = Vec::new();

    for (from, to) in JUMPS {
        let new_only = if from.starts_with("filter-") {
            "ct state new "
        } else {
            ""
        };
        rules.push(format!("{from} {new_only}jump {to}"));
    }
    rules.extend([
        "cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid \
         ports of ClusterIPs\""
            .to_owned(),
        "firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips".to_owned(),
        format!("mark-for-masquerade mark set mark or {MASQ_MARK}"),
        format!("masquerading mark and {MASQ_MARK} == 0 return"),
        format!("masquerading mark set mark xor {MASQ_MARK}"),
        "masquerading masquerade fully-random".to_owned(),
        "reject-chain reject".to_owned(),
        "service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services"
            .to_owned(),
        "services ip daddr . meta l4proto . th dport vmap @service-ips".to_owned(),
    ]);
    // NodePorts on the given addresses, or (no --nodeport-addresses) on every local
    // one but loopback; the check for NodePorts without endpoints runs on input, where
    // every destination is local.
    let (node_ports, node_port_checks) = if proxy.node_ips.is_empty() {
        (
            "fib daddr type local ip daddr != 127.0.0.0/8",
            "ip daddr != 127.0.0.0/8",
        )
    } else {
        let ips: Vec<String> = proxy.node_ips.iter().map(ToString::to_string).collect();
        elements.push(format!("nodeport-ips {{ {} }}", ips.join(", ")));
        ("ip daddr @nodeport-ips", "ip daddr @nodeport-ips")
    };
    rules.push(format!(
        "services {node_ports} meta l4proto . th dport vmap @service-nodeports"
    ));
    rules.push(format!(
        "nodeport-endpoints-check {node_port_checks} meta l4proto . th dport vmap \
         @no-endpoint-nodeports"
    ));

    for service in services {
        service_rules(proxy, service, &mut chains, &mut rules, &mut elements);
    }

    let mut out = format!(
        "add table {TABLE}\ndelete table {TABLE}\n\
         add table {TABLE} {{ comment \"rules for kube-proxy\" ; }}\n\n"
    );
    let addr = "ipv4_addr";
    let sets = [
        ("set", "cluster-ips", addr.to_owned(), "Active ClusterIPs"),
        (
            "map",
            "firewall-ips",
            format!("{addr} . inet_proto . inet_service : verdict"),
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            "map",
            "no-endpoint-nodeports",
            "inet_proto . inet_service : verdict".to_owned(),
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            "map",
            "no-endpoint-services",
            format!("{addr} . inet_proto . inet_service : verdict"),
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            "map",
            "service-ips",
            format!("{addr} . inet_proto . inet_service : verdict"),
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (
            "map",
            "service-nodeports",
            "inet_proto . inet_service : verdict".to_owned(),
            "NodePort traffic",
        ),
    ];
    if !proxy.node_ips.is_empty() {
        out.push_str(&format!(
            "add set {TABLE} nodeport-ips {{ type {addr} ; comment \"IPs that accept NodePort \
             traffic\" ; }}\n"
        ));
    }
    for (kind, name, key, comment) in sets {
        out.push_str(&format!(
            "add {kind} {TABLE} {name} {{ type {key} ; comment \"{comment}\" ; }}\n"
        ));
    }
    out.push('\n');
    for (name, kind, hook, priority) in BASE_CHAINS {
        out.push_str(&format!(
            "add chain {TABLE} {name} {{ type {kind} hook {hook} priority {priority} ; }}\n"
        ));
    }
    for name in TOP_CHAINS {
        let comment = if name == "reject-chain" {
            " { comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }"
        } else {
            ""
        };
        out.push_str(&format!("add chain {TABLE} {name}{comment}\n"));
    }
    for chain in &chains {
        out.push_str(&format!("add chain {TABLE} {chain}\n"));
    }
    out.push('\n');
    for rule in &rules {
        out.push_str(&format!("add rule {TABLE} {rule}\n"));
    }
    out.push('\n');
    for element in &elements {
        out.push_str(&format!("add element {TABLE} {element}\n"));
    }
    out
}

/// One Service port's chains, rules and map elements, as kube-proxy writes them.
fn service_rules(
    proxy: &KubeProxy,
    service: &Service,
    chains: &mut Vec<String>,
    rules: &mut Vec<String>,
    elements: &mut Vec<String>,
) {
    let policy = service.policy();
    let name = service.port_name_string();
    let proto = service.protocol.name();
    let base = chain_base(service);
    let svc = format!("service-{base}");
    let local = format!("local-{base}");
    let ext = format!("external-{base}");
    let (cluster_ip, port) = (service.cluster_ip, service.port);

    // Without endpoints the Service's addresses are refused before DNAT: rejected when
    // it has none at all, dropped for external traffic when none is on this node.
    let external_verdict = if policy.has_endpoints {
        "drop"
    } else {
        "goto reject-chain"
    };

    elements.push(format!("cluster-ips {{ {cluster_ip} }}"));
    if policy.has_endpoints {
        elements.push(format!(
            "service-ips {{ {cluster_ip} . {proto} . {port} : goto {svc} }}"
        ));
    } else {
        elements.push(format!(
            "no-endpoint-services {{ {cluster_ip} . {proto} . {port} comment \"{name}\" : \
             goto reject-chain }}"
        ));
    }
    for ip in &service.external_ips {
        if policy.has_endpoints {
            elements.push(format!(
                "service-ips {{ {ip} . {proto} . {port} : goto {ext} }}"
            ));
        }
        if !policy.has_external_endpoints {
            elements.push(format!(
                "no-endpoint-services {{ {ip} . {proto} . {port} comment \"{name}\" : \
                 {external_verdict} }}"
            ));
        }
    }
    if let Some(node_port) = service.node_port {
        if policy.has_endpoints {
            elements.push(format!(
                "service-nodeports {{ {proto} . {node_port} : goto {ext} }}"
            ));
        }
        if !policy.has_external_endpoints {
            elements.push(format!(
                "no-endpoint-nodeports {{ {proto} . {node_port} comment \"{name}\" : \
                 {external_verdict} }}"
            ));
        }
    }
    if !policy.has_endpoints {
        return;
    }

    chains.push(svc.clone());
    // Off-cluster clients of the ClusterIP are masqueraded (they may have been routed
    // here through another node).
    if let Some(cidr) = &proxy.cluster_cidr {
        rules.push(format!(
            "{svc} ip daddr {cluster_ip} ip saddr != {cidr} jump mark-for-masquerade"
        ));
    }
    let all: Vec<&Endpoint> = service.endpoints.iter().collect();
    rules.push(spread(service, &svc, &all));

    if policy.uses_external_chain {
        chains.push(ext.clone());
        if policy.external_local {
            // The client's address is kept, except for the node's own traffic (its
            // source would be the external IP itself); pods and the node short-circuit
            // to the Cluster policy, as if through an outside load balancer.
            if let Some(cidr) = &proxy.cluster_cidr {
                rules.push(format!(
                    "{ext} ip saddr {cidr} goto {svc} comment \"short-circuit pod traffic\""
                ));
            }
            rules.push(format!(
                "{ext} fib saddr type local jump mark-for-masquerade comment \"masquerade \
                 local traffic\""
            ));
            rules.push(format!(
                "{ext} fib saddr type local goto {svc} comment \"short-circuit local traffic\""
            ));
            if policy.has_external_endpoints {
                rules.push(format!("{ext} goto {local}"));
            }
        } else {
            rules.push(format!("{ext} jump mark-for-masquerade"));
            rules.push(format!("{ext} goto {svc}"));
        }
    }
    if policy.uses_local_chain {
        chains.push(local.clone());
        rules.push(spread(service, &local, &policy.local));
    }

    for endpoint in &service.endpoints {
        let chain = endpoint_chain(service, endpoint);
        // Hairpin: a backend reaching itself through the Service is masqueraded, or
        // its reply would not come back through the DNAT.
        rules.push(format!(
            "{chain} ip saddr {} jump mark-for-masquerade",
            endpoint.ip
        ));
        rules.push(format!(
            "{chain} meta l4proto {proto} dnat to {}",
            endpoint.addr()
        ));
        chains.push(chain);
    }
}

/// The rule of `chain` choosing one of `endpoints` at random.
fn spread(service: &Service, chain: &str, endpoints: &[&Endpoint]) -> String {
    let targets: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, endpoint)| format!("{i} : goto {}", endpoint_chain(service, endpoint)))
        .collect();
    format!(
        "{chain} numgen random mod {} vmap {{ {} }}",
        endpoints.len(),
        targets.join(" , ")
    )
}

/// Loads the script in `netns`, replacing the table of an earlier call.
pub(super) fn install(proxy: &KubeProxy, netns: &Netns, services: &[Service]) {
    let text = rules(proxy, services);
    let file = ScratchFile::new("kube-proxy-nft", &text);
    let path = file.path().to_string_lossy().into_owned();
    run_rules(netns, "nft", &["-f", &path], &text);
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::{Endpoint, KubeProxy, Mode, Service};

    fn ip(text: &str) -> Ipv4Addr {
        text.parse().expect("an IPv4 address")
    }

    fn proxy() -> KubeProxy {
        KubeProxy {
            cluster_cidr: Some("10.0.0.0/8".to_owned()),
            node_ips: vec![ip("192.168.0.2")],
            ..KubeProxy::new(Mode::Nftables)
        }
    }

    fn has(text: &str, line: &str) {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }

    #[test]
    fn lines_are_kube_proxys() {
        // ns1/svc1 and ns3/svc3 of kube-proxy's TestOverallNFTablesRules.
        let svc1 = Service::tcp(
            "ns1",
            "svc1",
            ip("172.30.0.41"),
            80,
            vec![Endpoint::remote(ip("10.180.0.1"), 80)],
        )
        .named("p80");
        let svc3 = Service::tcp(
            "ns3",
            "svc3",
            ip("172.30.0.43"),
            80,
            vec![Endpoint::remote(ip("10.180.0.3"), 80)],
        )
        .named("p80")
        .with_node_port(3003);
        let text = proxy().rules(&[svc1, svc3]);
        for line in [
            "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }",
            "add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }",
            "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
            "add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
            "add rule ip kube-proxy masquerading mark and 0x4000 == 0 return",
            "add rule ip kube-proxy masquerading masquerade fully-random",
            "add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000",
            "add element ip kube-proxy nodeport-ips { 192.168.0.2 }",
            "add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80",
            "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
            "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }",
            "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade",
            "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80",
            "add element ip kube-proxy cluster-ips { 172.30.0.41 }",
            "add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }",
            "add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade",
            "add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80",
            "add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80",
            "add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }",
        ] {
            has(&text, line);
        }
    }

    #[test]
    fn local_policy_and_missing_endpoints() {
        // ns2/svc2 of kube-proxy's test (Local, its endpoint on another node), ns6/svc6
        // (no endpoints), and ns4/svc4 with its endpoints spread.
        let svc2 = Service::tcp(
            "ns2",
            "svc2",
            ip("172.30.0.42"),
            80,
            vec![Endpoint::remote(ip("10.180.0.2"), 80)],
        )
        .named("p80")
        .with_node_port(3001)
        .with_external_ips(&[ip("192.168.99.22")])
        .with_external_local();
        let svc6 = Service::tcp("ns6", "svc6", ip("172.30.0.46"), 80, Vec::new()).named("p80");
        let svc4 = Service::tcp(
            "ns4",
            "svc4",
            ip("172.30.0.44"),
            80,
            vec![
                Endpoint::remote(ip("10.180.0.4"), 80),
                Endpoint::local(ip("10.180.0.5"), 80),
            ],
        )
        .named("p80")
        .with_node_port(3004)
        .with_external_local();
        let text = proxy().rules(&[svc2, svc6, svc4]);
        for line in [
            "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment \"short-circuit pod traffic\"",
            "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"",
            "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment \"short-circuit local traffic\"",
            "add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }",
            "add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment \"ns2/svc2:p80\" : drop }",
            "add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment \"ns2/svc2:p80\" : drop }",
            "add element ip kube-proxy cluster-ips { 172.30.0.46 }",
            "add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment \"ns6/svc6:p80\" : goto reject-chain }",
            "add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }",
            "add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto local-LAUZTJTB-ns4/svc4/tcp/p80",
            "add rule ip kube-proxy local-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }",
        ] {
            has(&text, line);
        }
        // Local policy: no unconditional masquerade of external clients; no chains for
        // a Service without endpoints; no goto to an empty Local chain.
        assert!(!text.contains("external-LAUZTJTB-ns4/svc4/tcp/p80 jump mark-for-masquerade"));
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("add chain") && l.contains("ns6/svc6")),
            "{text}"
        );
        assert!(!text.contains("local-42NFTM6N"), "{text}");
    }

    #[test]
    fn nodeports_without_addresses_take_every_local_one() {
        let service = Service::udp(
            "kube-system",
            "kube-dns",
            ip("10.96.0.10"),
            53,
            vec![Endpoint::local(ip("10.244.0.5"), 53)],
        )
        .named("dns")
        .with_node_port(30053);
        let text = KubeProxy::new(Mode::Nftables).rules(&[service]);
        has(
            &text,
            "add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
        );
        has(
            &text,
            "add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports",
        );
        assert!(!text.contains("nodeport-ips"), "{text}");
        assert!(!text.contains("saddr != "), "no --cluster-cidr: {text}");
        assert!(
            text.contains("meta l4proto udp dnat to 10.244.0.5:53"),
            "{text}"
        );
    }
}
