//! NetworkPolicy on one node, from `--policy-file`: upstream's reachability model (pods
//! in namespaces x and y, every pair probed) through default deny each way, a rule by
//! pod label and port, replies of allowed connections, the node's own probes, a pod
//! isolated from its first packet, and policies removed; `ebpf-cnid policy` and the
//! policy metrics along the way; a Service in front of a protected pod, with
//! kube-proxy's own rules; audit mode; a hostPort into a protected pod.

use std::time::Duration;

use ebpf_cni_tests::{
    daemon::{Daemon, eventually},
    http,
    kube_proxy::{Endpoint, KubeProxy, Mode, Service},
    netpol::{
        ModelPod, PolicyFile, Protocol, Reachability, add_pod, expect_reachability, namespace_yaml,
        pod_yaml, reaches, stream,
    },
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, port_mappings},
    traffic::{round_trip, udp_round_trip},
};

/// The namespaces and pods of the model, with `policies` after them.
fn objects(policies: &[&str]) -> String {
    let mut documents = vec![
        namespace_yaml("x", &[("ns", "x")]),
        namespace_yaml("y", &[("ns", "y")]),
    ];
    for namespace in ["x", "y"] {
        for name in ["a", "b", "c"] {
            documents.push(pod_yaml(namespace, name, &[("pod", name)], None));
        }
    }
    documents.extend(policies.iter().map(|policy| (*policy).to_owned()));
    stream(&documents)
}

const DENY_INGRESS_X: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: deny-ingress
spec:
  podSelector: {}
  policyTypes: [Ingress]
";

const ALLOW_B_TO_A_ON_80: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: allow-b-to-a
spec:
  podSelector:
    matchLabels:
      pod: a
  ingress:
  - from:
    - podSelector:
        matchLabels:
          pod: b
    ports:
    - port: serve-80-tcp
";

/// A policy the source refuses (no such policy type), left out alone.
const SIDEWAYS_X: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: sideways
spec:
  podSelector: {}
  policyTypes: [Sideways]
";

const DENY_EGRESS_Y: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'y'
  name: deny-egress
spec:
  podSelector: {}
  policyTypes: [Egress]
";

fn in_x(label: &str) -> bool {
    label.starts_with("x/")
}

fn in_y(label: &str) -> bool {
    label.starts_with("y/")
}

fn any(_: &str) -> bool {
    true
}

#[test]
fn policies_from_a_file_decide_who_reaches_whom_on_one_node() {
    let file = PolicyFile::new(&objects(&[]));
    let node = Node::start_with("10.78.0.0/24", &[], &file.flags());
    let pods: Vec<ModelPod> = [("x", "a"), ("x", "b"), ("y", "a"), ("y", "b")]
        .into_iter()
        .map(|(namespace, name)| add_pod(&node, namespace, name))
        .collect();
    let all: Vec<&ModelPod> = pods.iter().collect();
    let (x_a, y_a) = (&pods[0], &pods[2]);

    expect_reachability(
        "no policy",
        &all,
        80,
        Protocol::Tcp,
        &Reachability::all(&all, true),
    );

    file.replace(&objects(&[DENY_INGRESS_X, SIDEWAYS_X]));
    let mut deny_x = Reachability::all(&all, true);
    deny_x.set(any, in_x, false);
    for (port, protocol) in [
        (80, Protocol::Tcp),
        (81, Protocol::Tcp),
        (80, Protocol::Udp),
    ] {
        expect_reachability("ingress denied in x", &all, port, protocol, &deny_x);
    }
    // The node itself still reaches them (kubelet's probes).
    round_trip(&node.netns, x_a.addr(80), b"kubelet").expect("the node reaches x/a");
    // An ICMP error about x/a's own flow is let in as that flow's answer: a datagram to
    // a closed port is refused at once, not lost.
    let refused = udp_round_trip(&x_a.pod.netns, 0, y_a.addr(99), b"anyone?")
        .expect_err("nothing listens on 99");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "x/a hears the port unreachable: {refused}"
    );

    // The node says which policy isolates whom, what it dropped, and what it refused.
    let view = node.instance.cli_json(&["policy"]);
    let policies = view["policies"].as_array().expect("a list of policies");
    let deny = policies
        .iter()
        .find(|policy| policy["namespace"] == "x" && policy["name"] == "deny-ingress")
        .unwrap_or_else(|| panic!("no x/deny-ingress in {view:#}"));
    assert_eq!(
        deny["selects"],
        serde_json::json!(["x/a", "x/b"]),
        "{view:#}"
    );
    assert!(
        deny["ingress"] == true && deny["egress"] == false,
        "{deny:#}"
    );
    assert!(deny["denied"].as_u64().expect("a count") > 0, "{view:#}");
    let refused = view["refused"]
        .as_array()
        .expect("a list of refused objects");
    assert!(
        refused.iter().any(|refused| {
            refused["object"]
                .as_str()
                .is_some_and(|o| o.contains("x/sideways"))
                && refused["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("Sideways"))
        }),
        "the refused policy is listed with its reason: {view:#}"
    );
    let metrics = http::scrape(&node.netns);
    let drops = metrics.expect(
        "ebpf_cni_policy_drops_total",
        &[("namespace", "x"), ("policy", "deny-ingress")],
    );
    assert!(drops > 0.0, "{}", metrics.0);
    assert_eq!(metrics.expect("ebpf_cni_policy_refused_objects", &[]), 1.0);

    // A pod made while the policy holds is isolated from its first packet.
    let x_c = add_pod(&node, "x", "c");
    assert!(
        !reaches(&y_a.pod.netns, x_c.addr(80), Protocol::Tcp)
            .join()
            .expect("a probe"),
        "y/a reached x/c, made under a policy denying ingress in x"
    );
    drop(x_c);

    file.replace(&objects(&[DENY_INGRESS_X, ALLOW_B_TO_A_ON_80]));
    let mut b_to_a = deny_x.clone();
    b_to_a.set(|from| from == "x/b", |to| to == "x/a", true);
    expect_reachability("x/b to x/a on 80", &all, 80, Protocol::Tcp, &b_to_a);
    expect_reachability("nothing on 81", &all, 81, Protocol::Tcp, &deny_x);
    expect_reachability("no UDP", &all, 80, Protocol::Udp, &deny_x);

    // Egress denied in y: y's pods reach nobody, and answer whoever reaches them.
    file.replace(&objects(&[DENY_EGRESS_Y]));
    let mut deny_y = Reachability::all(&all, true);
    deny_y.set(in_y, any, false);
    for (port, protocol) in [(80, Protocol::Tcp), (80, Protocol::Udp)] {
        expect_reachability("egress denied in y", &all, port, protocol, &deny_y);
    }

    file.replace(&objects(&[]));
    expect_reachability(
        "policies removed",
        &all,
        80,
        Protocol::Tcp,
        &Reachability::all(&all, true),
    );
    let status = node.instance.cli(&["status"]);
    assert!(status.status.success(), "{status:?}");
}

/// A Service whose backend a policy protects, with kube-proxy's own rules (iptables
/// mode): the backend's ingress judges the client the stack's DNAT kept, and a client's
/// egress judges the backend the DNAT chose, not the Service's address.
#[test]
fn a_policy_judges_service_connections_after_kube_proxys_dnat() {
    let backend_only_from_a = BACKEND_ONLY_FROM_X_A;
    let b_only_to_y = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: b-only-to-y
spec:
  podSelector:
    matchLabels:
      pod: b
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: 'y'
";
    let file = PolicyFile::new(&objects(&[backend_only_from_a]));
    let mut flags = vec!["--service-cidr", SERVICE_RANGE];
    flags.extend(file.flags());
    let node = Node::start_with("10.78.1.0/24", &[], &flags);
    let (x_a, x_b, x_c) = (
        add_pod(&node, "x", "a"),
        add_pod(&node, "x", "b"),
        add_pod(&node, "x", "c"),
    );
    let _y_a = backend_behind_a_service(&node);
    assert!(
        through_the_service(&x_a),
        "x/a reaches the backend through its Service"
    );
    assert!(
        !through_the_service(&x_c),
        "x/c does not: the backend's ingress judges the client after the DNAT"
    );

    // x/b may only reach y's pods: through the Service it reaches the backend there,
    // and nothing in x.
    file.replace(&objects(&[backend_only_from_a, b_only_to_y]));
    let mut expected = Reachability::all(&[&x_a, &x_b, &x_c], true);
    expected.set(|from| from == "x/b", any, false);
    expect_reachability(
        "x/b only to y",
        &[&x_a, &x_b, &x_c],
        80,
        Protocol::Tcp,
        &expected,
    );
    assert!(
        !through_the_service(&x_b),
        "x/b is let out to the backend but the backend only takes x/a"
    );
    file.replace(&objects(&[b_only_to_y]));
    assert!(
        eventually(Duration::from_secs(5), || through_the_service(&x_b)),
        "with the backend open, x/b's egress lets it through the Service to y/a"
    );
}

const SERVICE_RANGE: &str = "10.96.0.0/12";
const CLUSTER_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 21);

/// y/a takes TCP 80 from x/a alone.
const BACKEND_ONLY_FROM_X_A: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'y'
  name: backend-from-x-a
spec:
  podSelector:
    matchLabels:
      pod: a
  ingress:
  - from:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: 'x'
      podSelector:
        matchLabels:
          pod: a
    ports:
    - port: 80
";

/// The pod y/a on `node`, the backend of Service `y/backend` (TCP 8080 at
/// [`CLUSTER_IP`]) as kube-proxy's iptables rules write it.
fn backend_behind_a_service(node: &Node) -> ModelPod {
    let y_a = add_pod(node, "y", "a");
    KubeProxy::new(Mode::Iptables).install(
        &node.netns,
        &[Service::tcp(
            "y",
            "backend",
            CLUSTER_IP,
            8080,
            vec![Endpoint::local(y_a.pod.ip, 80)],
        )],
    );
    y_a
}

/// Whether `client` reaches the backend through its Service.
fn through_the_service(client: &ModelPod) -> bool {
    reaches(
        &client.pod.netns,
        std::net::SocketAddr::from((CLUSTER_IP, 8080)),
        Protocol::Tcp,
    )
    .join()
    .expect("a probe")
}

/// A pod veth as release 0.1.0 bound it: its clsact's ingress bound to the pods' block
/// and its egress a block of its own, so what the stack delivers to the pod (a
/// Service's DNATed connections) meets no program. A daemon of this release, started
/// over it, puts `to_pod` on that egress; the next start replaces the program there
/// rather than adding a second.
#[test]
fn a_pod_bound_by_release_0_1_0_is_judged_after_the_dnat_once_the_daemon_starts() {
    /// The pods' ingress block (`tc_block::POD_BLOCK`).
    const POD_BLOCK: &str = "60417";
    let file = PolicyFile::new(&objects(&[BACKEND_ONLY_FROM_X_A]));
    let mut flags = vec!["--service-cidr", SERVICE_RANGE];
    flags.extend(file.flags());
    let mut node = Node::start_with("10.78.5.0/24", &[], &flags);
    let (x_a, x_c) = (add_pod(&node, "x", "a"), add_pod(&node, "x", "c"));
    let y_a = backend_behind_a_service(&node);
    assert!(!through_the_service(&x_c), "x/c is refused, bound as now");

    let veth = node.host_veth(&y_a.pod);
    for args in [
        ["qdisc", "del", "dev", &veth, "clsact"].as_slice(),
        &[
            "qdisc",
            "add",
            "dev",
            &veth,
            "ingress_block",
            POD_BLOCK,
            "clsact",
        ],
    ] {
        let out = node.netns.run("tc", args);
        assert!(out.status.success(), "tc {args:?}: {out:?}");
    }
    assert!(
        through_the_service(&x_c),
        "bound as 0.1.0 bound it, the backend judges nothing the stack delivers"
    );

    let egress_filters = |node: &Node| node.netns.bpf_filters(&["dev", &veth, "egress"]);
    for start in 1..=2 {
        assert!(node.daemon.stop(), "start {start}: the daemon stops");
        node.daemon = Daemon::start_with(&node.netns, &node.instance, &[], &flags);
        assert!(
            !through_the_service(&x_c),
            "start {start}: x/c is refused after the DNAT"
        );
        assert!(
            through_the_service(&x_a),
            "start {start}: x/a reaches the backend"
        );
        assert_eq!(
            egress_filters(&node),
            [("to_pod".to_owned(), 1)],
            "start {start}: to_pod, once, on the veth's own egress"
        );
    }
}

/// A UDP datagram larger than the pods' MTU crosses in fragments, and the fragments
/// after the first carry no ports: each is judged as the flow its datagram's first
/// fragment was admitted as. x/a takes UDP 80 from x/b alone and x/b takes nothing, so
/// x/b's 4,000-byte datagram must pass a way open on one port, and its echo must pass
/// as a reply; x/c's is refused.
#[test]
fn the_fragments_of_a_large_datagram_are_judged_as_its_first() {
    const A_FROM_B_ON_UDP_80: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: a-from-b-on-udp-80
spec:
  podSelector:
    matchLabels:
      pod: a
  ingress:
  - from:
    - podSelector:
        matchLabels:
          pod: b
    ports:
    - port: 80
      protocol: UDP
";
    const B_TAKES_NOTHING: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: b-takes-nothing
spec:
  podSelector:
    matchLabels:
      pod: b
  policyTypes: [Ingress]
";
    let file = PolicyFile::new(&objects(&[]));
    let node = Node::start_with("10.78.6.0/24", &[], &file.flags());
    let (x_a, x_b, x_c) = (
        add_pod(&node, "x", "a"),
        add_pod(&node, "x", "b"),
        add_pod(&node, "x", "c"),
    );
    let to_a = std::net::SocketAddr::from((x_a.pod.ip, 80));
    let large: Vec<u8> = (0..4000u32).map(|n| (n % 251) as u8).collect();
    // The large datagram must leave x/b in fragments, or this test checks nothing.
    let link = x_b
        .pod
        .netns
        .run("ip", &["-o", "link", "show", "dev", "eth0"]);
    let mtu: usize = String::from_utf8_lossy(&link.stdout)
        .split_whitespace()
        .skip_while(|word| *word != "mtu")
        .nth(1)
        .and_then(|mtu| mtu.parse().ok())
        .expect("x/b's eth0 has an MTU");
    assert!(
        mtu < large.len(),
        "x/b's MTU ({mtu}) fragments the datagram"
    );
    let echoed = |from: &ModelPod, payload: &[u8]| {
        udp_round_trip(&from.pod.netns, 0, to_a, payload).is_ok_and(|echo| echo == payload)
    };
    assert!(
        echoed(&x_c, &large),
        "with no policy, a large datagram crosses in fragments"
    );
    file.replace(&objects(&[A_FROM_B_ON_UDP_80, B_TAKES_NOTHING]));
    assert!(
        eventually(Duration::from_secs(5), || !echoed(&x_c, &large[..100])),
        "the policies are applied"
    );
    for (size, payload) in [("small", &large[..100]), ("large", &large[..])] {
        assert!(
            echoed(&x_b, payload),
            "x/b's {size} datagram reaches x/a's UDP 80 and its echo comes back"
        );
        assert!(!echoed(&x_c, payload), "x/c's {size} datagram is refused");
    }
}

/// `--policy-mode audit`: what the policies would drop is counted for the policy that
/// isolates the pod, once per flow, and let through; nothing is dropped.
#[test]
fn audit_mode_counts_what_it_would_drop_and_lets_it_through() {
    let file = PolicyFile::new(&objects(&[DENY_INGRESS_X]));
    let mut flags = vec!["--policy-mode", "audit"];
    flags.extend(file.flags());
    let node = Node::start_with("10.78.2.0/24", &[], &flags);
    let pods: Vec<ModelPod> = [("x", "a"), ("y", "a")]
        .into_iter()
        .map(|(namespace, name)| add_pod(&node, namespace, name))
        .collect();
    let all: Vec<&ModelPod> = pods.iter().collect();
    expect_reachability(
        "audit: everything passes",
        &all,
        80,
        Protocol::Tcp,
        &Reachability::all(&all, true),
    );
    let view = node.instance.cli_json(&["policy"]);
    assert_eq!(view["mode"], "audit", "{view:#}");
    let deny = view["policies"]
        .as_array()
        .expect("a list of policies")
        .iter()
        .find(|policy| policy["name"] == "deny-ingress")
        .cloned()
        .unwrap_or_else(|| panic!("no deny-ingress in {view:#}"));
    assert_eq!(deny["denied"], 0, "{deny:#}");
    assert!(
        deny["audited"].as_u64().expect("a count") >= 1,
        "y/a's connection to x/a is audited: {deny:#}"
    );
    let metrics = http::scrape(&node.netns);
    assert!(
        metrics.expect(
            "ebpf_cni_policy_audited_total",
            &[("namespace", "x"), ("policy", "deny-ingress")],
        ) >= 1.0,
        "{}",
        metrics.0
    );
    assert_eq!(
        metrics.expect("ebpf_cni_drops_total", &[("reason", "policy_denied")]),
        0.0
    );
}

/// A hostPort into a pod under a policy: the pod's ingress judges the client the
/// mapping kept (a host outside the node), refused by default deny, let in by an
/// ipBlock holding it.
#[test]
fn a_host_port_into_a_protected_pod_is_judged_by_the_pods_ingress() {
    let allow_external = format!(
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: allow-external
spec:
  podSelector: {{}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock:
        cidr: {EXTERNAL_ADDR}/32
"
    );
    let file = PolicyFile::new(&objects(&[DENY_INGRESS_X]));
    let node = Node::start_with("10.78.3.0/24", &[], &file.flags());
    let pod = node.add_kubernetes_pod_with(
        "hostport-x-a",
        "x",
        "a",
        false,
        &port_mappings(80, &[(30080, "tcp", None)]),
    );
    let x_a = ebpf_cni_tests::netpol::serve("x", "a", pod);
    let mapped = std::net::SocketAddr::from((
        NODE_ADDR.parse::<std::net::Ipv4Addr>().expect("an address"),
        30080,
    ));
    let from_outside = || {
        reaches(&node.external, mapped, Protocol::Tcp)
            .join()
            .expect("a probe")
    };
    assert!(
        !from_outside(),
        "the external host reaches x/a through its hostPort under default deny"
    );
    file.replace(&objects(&[DENY_INGRESS_X, &allow_external]));
    assert!(
        eventually(Duration::from_secs(5), from_outside),
        "an ipBlock holding the external host lets it in through the hostPort"
    );
    drop(x_a);
}

/// Upstream's SCTP ports case ("should enforce policy based on Ports", over SCTP): x's
/// pods take SCTP 81 from namespace y only. SCTP 80 stays closed into x, and the SCTP
/// rule opens no TCP. Real associations where the kernel has SCTP (the 6.1 guest in CI),
/// raw SCTP packets and their echo where it has not (`traffic::sctp`); a guest whose
/// kernel has SCTP cannot take the raw way (`sctp::KERNEL_VAR`).
#[test]
fn sctp_is_judged_by_its_ports_as_tcp_and_udp_are() {
    const ALLOW_Y_ON_SCTP_81: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  namespace: 'x'
  name: allow-y-on-sctp-81
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector:
        matchLabels:
          ns: 'y'
    ports:
    - port: 81
      protocol: SCTP
";
    eprintln!(
        "SCTP: {}",
        if ebpf_cni_tests::traffic::sctp::available() {
            "the kernel's associations"
        } else {
            "raw packets (the kernel has no SCTP)"
        }
    );
    let file = PolicyFile::new(&objects(&[]));
    let node = Node::start_with("10.78.4.0/24", &[], &file.flags());
    let pods: Vec<ModelPod> = [("x", "a"), ("x", "b"), ("y", "a"), ("y", "b")]
        .into_iter()
        .map(|(namespace, name)| add_pod(&node, namespace, name))
        .collect();
    let all: Vec<&ModelPod> = pods.iter().collect();
    expect_reachability(
        "no policy, SCTP 80",
        &all,
        80,
        Protocol::Sctp,
        &Reachability::all(&all, true),
    );

    file.replace(&objects(&[ALLOW_Y_ON_SCTP_81]));
    let mut from_y_only = Reachability::all(&all, true);
    from_y_only.set(in_x, in_x, false);
    expect_reachability(
        "SCTP 81 into x from y only",
        &all,
        81,
        Protocol::Sctp,
        &from_y_only,
    );
    let mut closed_into_x = Reachability::all(&all, true);
    closed_into_x.set(any, in_x, false);
    for (port, protocol) in [(80, Protocol::Sctp), (81, Protocol::Tcp)] {
        expect_reachability("nothing else into x", &all, port, protocol, &closed_into_x);
    }
}
