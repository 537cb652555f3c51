//! iptables mode: what kube-proxy's iptables proxier restores on a full sync (filter,
//! then nat), and the jumps from the built-in chains it ensures before (with `-C`, then
//! `-I` when missing; here as `-I` lines of the same input).

use super::{Endpoint, KubeProxy, MASQ_MARK, Netns, ScratchFile, Service, hash, run_rules};

/// A jump from a built-in chain to one of kube-proxy's: (table, from, to).
pub(super) type Jump = (&'static str, &'static str, &'static str);

/// The jumps in the order kube-proxy ensures them (each inserted first, so the last one
/// ends up on top).
const JUMPS: [Jump; 12] = [
    ("filter", "INPUT", "KUBE-EXTERNAL-SERVICES"),
    ("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES"),
    ("filter", "INPUT", "KUBE-NODEPORTS"),
    ("filter", "FORWARD", "KUBE-SERVICES"),
    ("filter", "OUTPUT", "KUBE-SERVICES"),
    ("filter", "FORWARD", "KUBE-FORWARD"),
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL"),
    ("filter", "OUTPUT", "KUBE-PROXY-FIREWALL"),
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL"),
    ("nat", "OUTPUT", "KUBE-SERVICES"),
    ("nat", "PREROUTING", "KUBE-SERVICES"),
    ("nat", "POSTROUTING", "KUBE-POSTROUTING"),
];

/// A jump's arguments after its chain, one word each (the comment unquoted). The filter
/// table's jumps are for new connections only, except those to the health check ports
/// and to KUBE-FORWARD.
fn jump_args(&(table, _, to): &Jump) -> Vec<&'static str> {
    let comment = match to {
        "KUBE-EXTERNAL-SERVICES" => "kubernetes externally-visible service portals",
        "KUBE-NODEPORTS" => "kubernetes health check service ports",
        "KUBE-FORWARD" => "kubernetes forwarding rules",
        "KUBE-PROXY-FIREWALL" => "kubernetes load balancer firewall",
        "KUBE-POSTROUTING" => "kubernetes postrouting rules",
        _ => "kubernetes service portals",
    };
    let mut args = Vec::new();
    if table == "filter" && !matches!(to, "KUBE-NODEPORTS" | "KUBE-FORWARD") {
        args.extend(["-m", "conntrack", "--ctstate", "NEW"]);
    }
    args.extend(["-m", "comment", "--comment", comment, "-j", to]);
    args
}

/// A jump as an `-I` line of an iptables-restore input.
fn jump_line(jump: &Jump) -> String {
    let args: Vec<String> = jump_args(jump)
        .into_iter()
        .map(|arg| {
            if arg.contains(' ') {
                format!("\"{arg}\"")
            } else {
                arg.to_owned()
            }
        })
        .collect();
    format!("-I {} {}", jump.1, args.join(" "))
}

/// Prefixes of the per-Service chains, which a sync deletes when no Service uses them.
const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// The 16 characters of hash in a Service port's chain names: over kube-proxy's name of
/// the port and its protocol.
fn port_hash(service: &Service) -> String {
    let mut hash = hash(&format!(
        "{}{}",
        service.port_name_string(),
        service.protocol.name()
    ));
    hash.truncate(16);
    hash
}

/// The KUBE-SEP chain of one endpoint of `service`.
fn endpoint_chain(service: &Service, endpoint: &Endpoint) -> String {
    let mut hash = hash(&format!(
        "{}{}{}",
        service.port_name_string(),
        service.protocol.name(),
        endpoint.addr()
    ));
    hash.truncate(16);
    format!("KUBE-SEP-{hash}")
}

/// The restore input. `existing_nat` names the nat chains already there (their stale
/// per-Service ones are flushed and deleted); `jump_wanted` says which built-in jumps
/// to insert (those not there yet).
pub(super) fn rules(
    proxy: &KubeProxy,
    services: &[Service],
    existing_nat: &[String],
    jump_wanted: impl Fn(&Jump) -> bool,
) -> String {
    let mut filter_rules = Vec::new();
    let mut nat_chains: Vec<String> = Vec::new();
    let mut nat_rules = vec![
        format!("-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
        // Clears the mark, so that a packet going through the stack again is not
        // masqueraded twice.
        format!("-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}"),
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" \
         -j MASQUERADE --random-fully"
            .to_owned(),
        format!("-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"),
    ];
    for service in services {
        service_rules(
            proxy,
            service,
            &mut filter_rules,
            &mut nat_chains,
            &mut nat_rules,
        );
    }
    for chain in existing_nat {
        let stale = SERVICE_CHAIN_PREFIXES
            .iter()
            .any(|prefix| chain.starts_with(prefix))
            && !nat_chains.contains(chain);
        if stale {
            // Declared, it is flushed (its jumps to other stale chains go), then deleted.
            nat_chains.push(chain.clone());
            nat_rules.push(format!("-X {chain}"));
        }
    }
    // Last in KUBE-SERVICES, after every Service's own addresses.
    nat_rules.push(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must \
         be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
            .to_owned(),
    );
    // Drops packets conntrack finds INVALID (they would reset connections), then lets
    // through what kube-proxy marked and the rest of its connections.
    filter_rules.extend([
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP".to_owned(),
        format!(
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" \
             -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
        ),
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" \
         -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
            .to_owned(),
    ]);

    let mut out = String::new();
    let mut table = |name: &str, top: &[&str], chains: &[String], rules: &[String]| {
        out.push_str(&format!("*{name}\n"));
        for chain in top.iter().copied().chain(chains.iter().map(String::as_str)) {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for jump in JUMPS
            .iter()
            .filter(|jump| jump.0 == name && jump_wanted(jump))
        {
            out.push_str(&jump_line(jump));
            out.push('\n');
        }
        for rule in rules {
            out.push_str(rule);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    };
    table(
        "filter",
        &[
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
        ],
        &[],
        &filter_rules,
    );
    table(
        "nat",
        &[
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
        ],
        &nat_chains,
        &nat_rules,
    );
    out
}

/// One Service port's rules, in the order kube-proxy writes them.
fn service_rules(
    proxy: &KubeProxy,
    service: &Service,
    filter_rules: &mut Vec<String>,
    nat_chains: &mut Vec<String>,
    nat_rules: &mut Vec<String>,
) {
    let policy = service.policy();
    let name = service.port_name_string();
    let proto = service.protocol.name();
    let matches = format!("-m {proto} -p {proto}");
    let hash = port_hash(service);
    let svc = format!("KUBE-SVC-{hash}");
    let svl = format!("KUBE-SVL-{hash}");
    let ext = format!("KUBE-EXT-{hash}");
    let (cluster_ip, port) = (service.cluster_ip, service.port);

    // Without endpoints the filter table refuses the Service's addresses: REJECT when
    // it has none at all, DROP for external traffic when none is on this node.
    let (external_target, external_comment) = if policy.has_endpoints {
        ("DROP", format!("\"{name} has no local endpoints\""))
    } else {
        ("REJECT", format!("\"{name} has no endpoints\""))
    };

    if policy.has_endpoints {
        nat_rules.push(format!(
            "-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" {matches} \
             -d {cluster_ip} --dport {port} -j {svc}"
        ));
    } else {
        filter_rules.push(format!(
            "-A KUBE-SERVICES -m comment --comment \"{name} has no endpoints\" {matches} \
             -d {cluster_ip} --dport {port} -j REJECT"
        ));
    }
    for ip in &service.external_ips {
        if policy.has_endpoints {
            nat_rules.push(format!(
                "-A KUBE-SERVICES -m comment --comment \"{name} external IP\" {matches} \
                 -d {ip} --dport {port} -j {ext}"
            ));
        }
        if !policy.has_external_endpoints {
            filter_rules.push(format!(
                "-A KUBE-EXTERNAL-SERVICES -m comment --comment {external_comment} {matches} \
                 -d {ip} --dport {port} -j {external_target}"
            ));
        }
    }
    if let Some(node_port) = service.node_port {
        if policy.has_endpoints {
            nat_rules.push(format!(
                "-A KUBE-NODEPORTS -m comment --comment {name} {matches} \
                 --dport {node_port} -j {ext}"
            ));
        }
        if !policy.has_external_endpoints {
            filter_rules.push(format!(
                "-A KUBE-EXTERNAL-SERVICES -m comment --comment {external_comment} \
                 -m addrtype --dst-type LOCAL {matches} --dport {node_port} -j {external_target}"
            ));
        }
    }
    if !policy.has_endpoints {
        return;
    }

    // Off-cluster clients of the ClusterIP are masqueraded (they may have been routed
    // here through another node).
    if let Some(cidr) = &proxy.cluster_cidr {
        nat_rules.push(format!(
            "-A {svc} -m comment --comment \"{name} cluster IP\" {matches} \
             -d {cluster_ip} --dport {port} ! -s {cidr} -j KUBE-MARK-MASQ"
        ));
    }

    if policy.uses_external_chain {
        nat_chains.push(ext.clone());
        if policy.external_local {
            // The client's address is kept, except for the node's own traffic (its
            // source would be the external IP itself); pods and the node short-circuit
            // to the Cluster policy, as if through an outside load balancer.
            if let Some(cidr) = &proxy.cluster_cidr {
                nat_rules.push(format!(
                    "-A {ext} -m comment --comment \"pod traffic for {name} external \
                     destinations\" -s {cidr} -j {svc}"
                ));
            }
            nat_rules.push(format!(
                "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {name} external \
                 destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"
            ));
            nat_rules.push(format!(
                "-A {ext} -m comment --comment \"route LOCAL traffic for {name} external \
                 destinations\" -m addrtype --src-type LOCAL -j {svc}"
            ));
        } else {
            nat_rules.push(format!(
                "-A {ext} -m comment --comment \"masquerade traffic for {name} external \
                 destinations\" -j KUBE-MARK-MASQ"
            ));
        }
        if policy.has_external_endpoints {
            let target = if policy.external_local { &svl } else { &svc };
            nat_rules.push(format!("-A {ext} -j {target}"));
        }
    }

    nat_chains.push(svc.clone());
    let all: Vec<&Endpoint> = service.endpoints.iter().collect();
    spread(service, &name, &svc, &all, nat_rules);
    if policy.uses_local_chain {
        nat_chains.push(svl.clone());
        spread(service, &name, &svl, &policy.local, nat_rules);
    }

    for endpoint in &service.endpoints {
        let sep = endpoint_chain(service, endpoint);
        nat_chains.push(sep.clone());
        // Hairpin: a backend reaching itself through the Service is masqueraded, or
        // its reply would not come back through the DNAT.
        nat_rules.push(format!(
            "-A {sep} -m comment --comment {name} -s {} -j KUBE-MARK-MASQ",
            endpoint.ip
        ));
        nat_rules.push(format!(
            "-A {sep} -m comment --comment {name} {matches} -j DNAT --to-destination {}",
            endpoint.addr()
        ));
    }
}

/// Rules of `chain` choosing among `endpoints` evenly: the i-th of n matches with
/// probability 1/(n-i) of what reaches it, the last one always.
fn spread(
    service: &Service,
    name: &str,
    chain: &str,
    endpoints: &[&Endpoint],
    nat_rules: &mut Vec<String>,
) {
    for (i, endpoint) in endpoints.iter().enumerate() {
        let left = endpoints.len() - i;
        let statistic = if left > 1 {
            format!(
                " -m statistic --mode random --probability {:.10}",
                1.0 / left as f64
            )
        } else {
            String::new()
        };
        nat_rules.push(format!(
            "-A {chain} -m comment --comment \"{name} -> {}\"{statistic} -j {}",
            endpoint.addr(),
            endpoint_chain(service, endpoint)
        ));
    }
}

/// Restores the rules in `netns` with --noflush: kube-proxy's chains are replaced, the
/// stale per-Service ones deleted, the built-in jumps inserted once.
pub(super) fn install(proxy: &KubeProxy, netns: &Netns, services: &[Service]) {
    let saved = netns.run("iptables-save", &["-t", "nat"]);
    let existing: Vec<String> = String::from_utf8_lossy(&saved.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let text = rules(proxy, services, &existing, |jump| {
        let mut args = vec!["-t", jump.0, "-C", jump.1];
        args.extend(jump_args(jump));
        !netns.run("iptables", &args).status.success()
    });
    let file = ScratchFile::new("kube-proxy-iptables", &text);
    let path = file.path().to_string_lossy().into_owned();
    run_rules(netns, "iptables-restore", &["--noflush", &path], &text);
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
            ..KubeProxy::new(Mode::Iptables)
        }
    }

    /// ns4/svc4 of kube-proxy's TestOverallIPTablesRules: two endpoints, an external IP.
    fn svc4() -> Service {
        Service::tcp(
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
        .with_external_ips(&[ip("192.168.99.33")])
    }

    fn position(text: &str, line: &str) -> usize {
        text.lines()
            .position(|l| l == line)
            .unwrap_or_else(|| panic!("no line {line:?} in\n{text}"))
    }

    #[test]
    fn lines_are_kube_proxys() {
        let text = proxy().rules(&[svc4()]);
        // Lines of kube-proxy's expected dump for the same Service.
        for line in [
            "-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK",
            "-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 external IP\" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK",
            "-A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment \"masquerade traffic for ns4/svc4:p80 external destinations\" -j KUBE-MARK-MASQ",
            "-A KUBE-EXT-4SW47YFZTEDKD3PK -j KUBE-SVC-4SW47YFZTEDKD3PK",
            "-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ",
            "-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80",
            "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
            "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.4:80\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC",
            "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.5:80\" -j KUBE-SEP-C6EBXVWJJZMIWKLZ",
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
            ":KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]",
        ] {
            position(&text, line);
        }
    }

    #[test]
    fn jumps_come_in_order() {
        let text = proxy().rules(&[svc4().with_node_port(30080)]);
        let nat = position(&text, "*nat");
        let prerouting = position(
            &text,
            "-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        );
        let output = position(
            &text,
            "-I OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        );
        position(
            &text,
            "-I POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        );
        assert!(nat < output && output < prerouting);
        let cluster_ip = position(
            &text,
            "-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK",
        );
        let node_port = position(
            &text,
            "-A KUBE-NODEPORTS -m comment --comment ns4/svc4:p80 -m tcp -p tcp --dport 30080 -j KUBE-EXT-4SW47YFZTEDKD3PK",
        );
        let nodeports = text
            .lines()
            .position(|l| l.starts_with("-A KUBE-SERVICES") && l.ends_with("-j KUBE-NODEPORTS"))
            .expect("the jump to KUBE-NODEPORTS");
        assert!(cluster_ip < nodeports && node_port < nodeports);
        // The jump to KUBE-NODEPORTS is KUBE-SERVICES' last rule.
        assert!(
            !text
                .lines()
                .skip(nodeports + 1)
                .any(|l| l.starts_with("-A KUBE-SERVICES")),
            "{text}"
        );
    }

    #[test]
    fn probabilities_are_one_over_what_is_left() {
        let endpoints = (1..=4)
            .map(|n| Endpoint::remote(Ipv4Addr::new(10, 1, 0, n), 8080))
            .collect();
        let service = Service::tcp("default", "web", ip("10.96.0.10"), 80, endpoints);
        let text = KubeProxy::new(Mode::Iptables).rules(&[service]);
        let spread: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SVC-") && l.contains(" -> "))
            .collect();
        assert_eq!(spread.len(), 4, "{text}");
        for (line, probability) in
            spread
                .iter()
                .zip(["0.2500000000", "0.3333333333", "0.5000000000"])
        {
            assert!(
                line.contains(&format!("--probability {probability} ")),
                "{line}"
            );
        }
        assert!(!spread[3].contains("statistic"), "{}", spread[3]);
        // No --cluster-cidr: no masquerade rule for off-cluster clients.
        assert!(!text.contains("! -s "), "{text}");
    }

    #[test]
    fn local_policy_keeps_external_clients() {
        let service = svc4().with_node_port(30080).with_external_local();
        let text = proxy().rules(&[service]);
        let ext = "KUBE-EXT-4SW47YFZTEDKD3PK";
        let ext_rules: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("-A {ext} ")))
            .collect();
        assert_eq!(ext_rules.len(), 4, "{text}");
        assert!(ext_rules[0].contains("-s 10.0.0.0/8 -j KUBE-SVC-4SW47YFZTEDKD3PK"));
        assert!(ext_rules[1].ends_with("-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"));
        assert!(
            ext_rules[2].ends_with("-m addrtype --src-type LOCAL -j KUBE-SVC-4SW47YFZTEDKD3PK")
        );
        assert_eq!(
            ext_rules[3],
            format!("-A {ext} -j KUBE-SVL-4SW47YFZTEDKD3PK")
        );
        // The Local chain holds only this node's endpoint, unconditionally.
        let svl: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SVL-"))
            .collect();
        assert_eq!(
            svl,
            [
                "-A KUBE-SVL-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.5:80\" -j KUBE-SEP-C6EBXVWJJZMIWKLZ"
            ]
        );
    }

    #[test]
    fn without_endpoints_the_filter_table_refuses() {
        let mut nobody = svc4().with_node_port(30080);
        nobody.endpoints.clear();
        let mut no_local = svc4().with_external_local().named("p81");
        no_local.endpoints.retain(|ep| !ep.local);
        let text = proxy().rules(&[nobody, no_local]);
        for line in [
            "-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 has no endpoints\" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j REJECT",
            "-A KUBE-EXTERNAL-SERVICES -m comment --comment \"ns4/svc4:p80 has no endpoints\" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j REJECT",
            "-A KUBE-EXTERNAL-SERVICES -m comment --comment \"ns4/svc4:p80 has no endpoints\" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j REJECT",
            "-A KUBE-EXTERNAL-SERVICES -m comment --comment \"ns4/svc4:p81 has no local endpoints\" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j DROP",
        ] {
            let at = position(&text, line);
            assert!(
                at < position(&text, "*nat"),
                "{line} is not in the filter table"
            );
        }
    }

    #[test]
    fn stale_chains_go_and_present_jumps_stay() {
        let existing = ["KUBE-SVC-AAAAAAAAAAAAAAAA", "KUBE-SERVICES", "MINE"].map(str::to_owned);
        let text = super::rules(&proxy(), &[svc4()], &existing, |jump| jump.0 == "nat");
        position(&text, ":KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]");
        position(&text, "-X KUBE-SVC-AAAAAAAAAAAAAAAA");
        assert!(
            !text.contains("-X KUBE-SERVICES") && !text.contains("MINE"),
            "{text}"
        );
        assert!(!text.contains("-I FORWARD"), "{text}");
    }
}
