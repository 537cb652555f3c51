//! NetworkPolicy's cost. Pod to pod across two nodes with native routes, the server pod
//! selected by 0, 100 and 1,000 NetworkPolicies of ten peer addresses (ipBlocks) each,
//! the client allowed by one more: ebpf-cni from a policy file, against the reference
//! pair (bridge + host-local, flannel's host-gw) with the same allowance written as an
//! iptables agent without ipsets writes it into the server's node (a chain for the
//! server pod: established connections first, then one ACCEPT per allowed peer, the
//! client's last, then DROP), and the two nodes themselves (the ceiling, no policy).
//!
//! Then ebpf-cni alone, with 1,000 policies loaded: the time from the file's rename to
//! the first probe that sees the new verdict (a policy allowing the client taken away
//! and given back), the same from a Kubernetes API watch event (a node of its own whose
//! daemon watches the fake API server of the tests, `ebpf_cni_tests::fake_api`, which
//! speaks the real list and watch wire format), a bulk load of 1,000 policies (from none
//! to the first probe refused),
//! the ADD of a pod that policies select (which returns once they are in the datapath),
//! and the daemon's resident memory with 10,000 pods and 1,000 policies in its file.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use ebpf_cni_tests::{
    cluster::{TestCluster, node_addr},
    netns::Netns,
    netpol::PolicyFile,
    node::{Node, Pod},
    traffic::{EchoServer, spawn_in},
    unique_name,
};
use serde_json::{Value, json};

use super::{
    Plan,
    cross_node::{Mode, RefPair},
    figure, interleaved, load,
    report::{Contender, Figure, Stats, Value as Measured},
};

/// The policy counts measured, the first none at all.
const COUNTS: [usize; 3] = [0, 100, 1000];
/// Peer addresses each policy allows (ipBlocks of one address): 10,000 at 1,000 policies.
const PEERS_PER_POLICY: usize = 10;
/// The namespace of the bench's pods and policies.
const NAMESPACE: &str = "bench";
/// The port of the latency probes' server.
const PROBE_PORT: u16 = 7010;
/// How long a latency probe waits for its connection: far above a connection's time
/// between two nodes on one machine (well under a millisecond), so a wait this long is
/// a dropped SYN.
const PROBE_WAIT: Duration = Duration::from_millis(20);
/// How long the first probe of a new pod waits for its connection: a dropped SYN, not
/// a slow answer, when it runs out.
const FIRST_PROBE_WAIT: Duration = Duration::from_millis(200);
/// How long a policy change may take before the bench gives up.
const CHANGE_LIMIT: Duration = Duration::from_secs(30);
/// How long the latency probes' server listens: the whole section, with room.
const SERVING: Duration = Duration::from_secs(3600);
/// The iptables chain of the reference's server pod.
const CHAIN: &str = "BENCH-POLICY-SERVER";

pub(super) fn policy(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    eprintln!("bench: NetworkPolicy, pod to pod across nodes");
    let setup = Setup::build()?;
    let all = [Contender::EbpfCni, Contender::Reference, Contender::Raw];
    // Each repeat goes through every count, so that a drift of the machine over the
    // run (other work, thermal limits) weighs on every count alike: the ratio of a
    // count to none is the section's figure.
    let mut samples: BTreeMap<(usize, Test), Samples> = BTreeMap::new();
    for _ in 0..plan.traffic_repeats() {
        for count in COUNTS {
            setup.apply(count)?;
            for test in [Test::Crr, Test::Rr] {
                let measured = interleaved(1, &all, |c| {
                    let (client, server, ip) = setup.pair(c);
                    match test {
                        Test::Crr => load::tcp_crr(client, server, ip, plan.seconds()),
                        Test::Rr => load::tcp_rr(client, server, ip, plan.seconds()),
                    }
                })?;
                let kept = samples.entry((count, test)).or_default();
                for (contender, values) in measured {
                    match kept.iter_mut().find(|(c, _)| *c == contender) {
                        Some((_, all)) => all.extend(values),
                        None => kept.push((contender, values)),
                    }
                }
            }
        }
    }
    let mut figures = Vec::new();
    for ((count, test), measured) in samples {
        figures.push(figure(
            &format!(
                "pod -> pod {}, {count} NetworkPolicies selecting the server ({} peer addresses), native routes",
                test.name(),
                count * PEERS_PER_POLICY
            ),
            "ops/s",
            true,
            measured,
        ));
    }
    figures.extend(setup.latency(plan)?);
    figures.extend(api_latency(plan)?);
    figures.extend(setup.bulk_load(plan)?);
    figures.extend(setup.selected_add(plan)?);
    figures.extend(setup.memory()?);
    Ok(figures)
}

/// Each contender's readings of one figure.
type Samples = Vec<(Contender, Vec<f64>)>;

/// The two traffic figures of each count.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Test {
    Crr,
    Rr,
}

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::Crr => "TCP_CRR",
            Test::Rr => "TCP_RR",
        }
    }
}

/// What the figures say against the target of the same run with no policy.
pub(super) fn notes(figures: &[Figure]) -> Vec<String> {
    let median = |name: &str, contender: Contender| {
        figures
            .iter()
            .find(|f| f.name.starts_with(name))
            .and_then(|f| match f.value(contender)? {
                Measured::Measured(stats) => Some(stats.median),
                _ => None,
            })
    };
    let mut notes = Vec::new();
    for test in ["TCP_CRR", "TCP_RR"] {
        let of = |count: usize, contender| {
            median(
                &format!("pod -> pod {test}, {count} NetworkPolicies"),
                contender,
            )
        };
        let ratios = |contender| -> Option<String> {
            let none = of(0, contender)?;
            Some(
                COUNTS[1..]
                    .iter()
                    .filter_map(|&count| {
                        Some(format!("{count}: {:.2}x", of(count, contender)? / none))
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        };
        if let (Some(ours), Some(reference)) =
            (ratios(Contender::EbpfCni), ratios(Contender::Reference))
        {
            notes.push(format!(
                "NetworkPolicy {test}, each against the same contender's run with no policy: \
                 ebpf-cni {ours} (target >= 0.95x); the reference's iptables chain {reference}."
            ));
        }
    }
    notes
}

/// The two clusters of the figures: ebpf-cni's nodes (client pod on node 1, server pod
/// on node 2, their policy file) and the reference pair with its iptables chain.
struct Setup {
    cluster: TestCluster,
    file: PolicyFile,
    client: Pod,
    server: Pod,
    reference: RefPair,
    rules: PathBuf,
    /// The latency probes' server, in the server pod.
    _probe_server: EchoServer,
}

impl Setup {
    fn build() -> anyhow::Result<Self> {
        let file = PolicyFile::new(&objects(&[], &[], 0, true).to_string());
        let mut flags = vec!["--routing", "native"];
        flags.extend(file.flags());
        let cluster = TestCluster::start(&["10.245.1.0/24", "10.245.2.0/24"], &flags);
        let client =
            cluster
                .node(1)
                .add_kubernetes_pod(&unique_name("pclient"), NAMESPACE, "client");
        let server =
            cluster
                .node(2)
                .add_kubernetes_pod(&unique_name("pserver"), NAMESPACE, "server");
        load::tune_client(&client.netns);
        let reference = RefPair::build(Mode::Native)?;
        // The ceiling's client is a node: it opens as many connections as a pod does.
        load::tune_client(&reference.nodes[0]);
        let rules = PathBuf::from("/run").join(unique_name("bench-rules"));
        // The server pod's chain, empty, and the jump to it.
        restore(
            &reference.nodes[1],
            &rules,
            &format!(
                "*filter\n:{CHAIN} - [0:0]\n-I FORWARD -d {}/32 -j {CHAIN}\nCOMMIT\n",
                reference.pod_ips[1]
            ),
        )?;
        let probe_server = EchoServer::start_for(&server.netns, PROBE_PORT, SERVING);
        Ok(Self {
            cluster,
            file,
            client,
            server,
            reference,
            rules,
            _probe_server: probe_server,
        })
    }

    /// (client, server, server's address) of `contender`.
    fn pair(&self, contender: Contender) -> (&Netns, &Netns, Ipv4Addr) {
        match contender {
            Contender::EbpfCni => (&self.client.netns, &self.server.netns, self.server.ip),
            Contender::Reference => (
                &self.reference.pods[0],
                &self.reference.pods[1],
                self.reference.pod_ips[1],
            ),
            Contender::Raw => (
                &self.reference.nodes[0],
                &self.reference.nodes[1],
                node_addr(2).parse().expect("an address"),
            ),
        }
    }

    fn server_node(&self) -> &Node {
        self.cluster.node(2)
    }

    /// The file's objects: the two pods at their addresses, and `count` peer policies
    /// (with the client's when `client` and `count` > 0).
    fn objects(&self, count: usize, client: bool) -> Value {
        objects(
            &[("client", self.client.ip), ("server", self.server.ip)],
            &[],
            count,
            client,
        )
    }

    /// Both contenders' policies for `count`, and waits until ebpf-cni's server node
    /// holds them and the client reaches the server again.
    fn apply(&self, count: usize) -> anyhow::Result<()> {
        self.file.replace(&self.objects(count, true).to_string());
        let expected = if count == 0 { 0 } else { count + 1 };
        self.wait_policies(expected)?;
        let mut rules = format!("*filter\n:{CHAIN} - [0:0]\n");
        if count > 0 {
            rules.push_str(&format!(
                "-A {CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
            ));
            for k in 0..count * PEERS_PER_POLICY {
                rules.push_str(&format!("-A {CHAIN} -s {}/32 -j ACCEPT\n", peer(k)));
            }
            rules.push_str(&format!(
                "-A {CHAIN} -s {}/32 -j ACCEPT\n-A {CHAIN} -j DROP\n",
                self.reference.pod_ips[0]
            ));
        }
        rules.push_str("COMMIT\n");
        restore(&self.reference.nodes[1], &self.rules, &rules)
    }

    /// Waits until the server's node lists `expected` policies.
    fn wait_policies(&self, expected: usize) -> anyhow::Result<()> {
        wait_policies(self.server_node(), expected)
    }

    /// Enforcement latency with 1,000 policies: the client's allowance taken away and
    /// given back by renaming a new file over the old, timed to the first probe that sees
    /// each new verdict.
    fn latency(&self, plan: Plan) -> anyhow::Result<Vec<Figure>> {
        eprintln!("bench: NetworkPolicy enforcement latency");
        let to = SocketAddr::from((self.server.ip, PROBE_PORT));
        let count = COUNTS[COUNTS.len() - 1];
        let allowed = self.objects(count, true).to_string();
        let denied = self.objects(count, false).to_string();
        self.file.replace(&allowed);
        self.wait_policies(count + 1)?;
        ensure!(
            self.probe_until(to, true)? < CHANGE_LIMIT,
            "the client is let in"
        );
        let trials = if plan.quick { 5 } else { 20 };
        let mut samples = Vec::new();
        for _ in 0..trials {
            for (text, open) in [(&denied, false), (&allowed, true)] {
                let start = Instant::now();
                self.file.replace(text);
                self.probe_until(to, open)?;
                samples.push(start.elapsed().as_secs_f64() * 1000.0);
            }
        }
        let p99 = percentile(&samples, 0.99);
        Ok(vec![
            single_figure(
                &format!(
                    "NetworkPolicy enforcement latency, p50 (min-max), policy file rename to the first probe seeing the change, {count} policies loaded"
                ),
                "ms",
                Stats::from_samples(&samples).context("samples")?,
            ),
            single_figure(
                &format!(
                    "NetworkPolicy enforcement latency, p99 of {} changes, {count} policies loaded",
                    samples.len()
                ),
                "ms",
                Stats::from_samples(&[p99]).context("a sample")?,
            ),
        ])
    }

    /// Probes the server from the client until a connection is `open` (made) or not (its
    /// SYN dropped); returns how long that took.
    fn probe_until(&self, to: SocketAddr, open: bool) -> anyhow::Result<Duration> {
        probe_until(&self.client.netns, to, open)
    }

    /// A bulk load: from no policy to 1,000 at once (the client not among the allowed),
    /// timed to the first probe refused.
    fn bulk_load(&self, plan: Plan) -> anyhow::Result<Vec<Figure>> {
        eprintln!("bench: NetworkPolicy bulk load");
        let to = SocketAddr::from((self.server.ip, PROBE_PORT));
        let count = COUNTS[COUNTS.len() - 1];
        let none = self.objects(0, true).to_string();
        let loaded = self.objects(count, false).to_string();
        let mut samples = Vec::new();
        for _ in 0..if plan.quick { 2 } else { 5 } {
            self.file.replace(&none);
            self.wait_policies(0)?;
            self.probe_until(to, true)?;
            let start = Instant::now();
            self.file.replace(&loaded);
            self.probe_until(to, false)?;
            samples.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(vec![single_figure(
            &format!(
                "NetworkPolicy bulk load, {count} policies ({} peer addresses) from none, file rename to the first probe refused (target <= 2,000 ms)",
                count * PEERS_PER_POLICY
            ),
            "ms",
            Stats::from_samples(&samples).context("samples")?,
        )])
    }

    /// The ADD of a pod the 1,000 policies select, which returns once its policies are
    /// in the datapath, against the ADD of the same pod with no policy loaded, in turns.
    /// After each ADD the pod listens and the client probes it once: with no policy the
    /// first probe connects, with the 1,000 (the client not among those they allow) it
    /// is dropped, the pod isolated from its first packet.
    fn selected_add(&self, plan: Plan) -> anyhow::Result<Vec<Figure>> {
        eprintln!("bench: ADD of a pod under NetworkPolicy");
        let count = COUNTS[COUNTS.len() - 1];
        let node = self.server_node();
        let (mut none, mut selected) = (Vec::new(), Vec::new());
        let mut isolated = 0;
        let adds = if plan.quick { 3 } else { 10 };
        for n in 0..adds {
            for (policies, samples) in [(0, &mut none), (count, &mut selected)] {
                self.file
                    .replace(&self.objects(policies, false).to_string());
                self.wait_policies(policies)?;
                // Named as the file's server pod is: the policies select it.
                let id = unique_name(&format!("padd{n}"));
                let start = Instant::now();
                let pod = node.add_kubernetes_pod(&id, NAMESPACE, "server");
                samples.push(start.elapsed().as_secs_f64() * 1000.0);
                let _server = EchoServer::start_for(&pod.netns, PROBE_PORT, SERVING);
                let to = SocketAddr::from((pod.ip, PROBE_PORT));
                let first_made = spawn_in(&self.client.netns, move || {
                    TcpStream::connect_timeout(&to, FIRST_PROBE_WAIT).is_ok()
                })
                .join()
                .map_err(|_| anyhow::anyhow!("the probe panicked"))?;
                node.del_pod(&pod);
                if policies == 0 {
                    ensure!(
                        first_made,
                        "with no policy, the new pod's first probe connects"
                    );
                } else if !first_made {
                    isolated += 1;
                }
            }
        }
        ensure!(
            isolated == adds,
            "a new pod {count} policies select let the client's first probe in ({} of {adds} times)",
            adds - isolated
        );
        Ok(vec![
            single_figure(
                "ADD of a Kubernetes pod, no NetworkPolicy loaded",
                "ms",
                Stats::from_samples(&none).context("samples")?,
            ),
            single_figure(
                &format!(
                    "ADD of a Kubernetes pod {count} NetworkPolicies select (their ways written before ADD answers)"
                ),
                "ms",
                Stats::from_samples(&selected).context("samples")?,
            ),
            single_figure(
                &format!(
                    "new pod {count} NetworkPolicies select: first probe after ADD dropped, share of {adds} ADDs"
                ),
                "%",
                Stats::from_samples(&[100.0 * isolated as f64 / adds as f64])
                    .context("a sample")?,
            ),
        ])
    }

    /// The server node's daemon's resident memory with the bench's two pods and no
    /// policy, then with 10,000 pods of other nodes and 1,000 policies in its file.
    fn memory(&self) -> anyhow::Result<Vec<Figure>> {
        eprintln!("bench: daemon memory with NetworkPolicy objects");
        let node = self.server_node();
        let pid = node.daemon.pid().context("the daemon runs")?;
        self.file.replace(&self.objects(0, true).to_string());
        self.wait_policies(0)?;
        let before = super::memory::rss_mib(pid)?;
        let others: Vec<(String, Ipv4Addr)> = (0..10_000u32)
            .map(|k| {
                let [_, _, c, d] = (k + 1).to_be_bytes();
                (format!("other-{k}"), Ipv4Addr::new(10, 201, c, d))
            })
            .collect();
        let count = COUNTS[COUNTS.len() - 1];
        let big = objects(
            &[("client", self.client.ip), ("server", self.server.ip)],
            &others,
            count,
            true,
        );
        self.file.replace(&big.to_string());
        self.wait_policies(count + 1)?;
        // The daemon frees what it parsed; read once it settled.
        std::thread::sleep(Duration::from_secs(1));
        let after = super::memory::rss_mib(pid)?;
        Ok(vec![
            single_figure(
                "daemon resident memory, policy file with 2 pods and no policy",
                "MiB",
                Stats::from_samples(&[before]).context("a sample")?,
            ),
            single_figure(
                &format!(
                    "daemon resident memory, policy file with 10,002 pods (100 namespaces) and {count} policies"
                ),
                "MiB",
                Stats::from_samples(&[after]).context("a sample")?,
            ),
        ])
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.rules);
    }
}

/// The node of the latency through the Kubernetes API: its pods' range, its name.
const API_NODE_RANGE: &str = "10.245.9.0/24";
const API_NODE_NAME: &str = "node-1";
/// The least quiet time before each change through the API: the source publishes a
/// change that follows a quiet `cni_policy::cluster::DEBOUNCE` (100 ms) at once, and
/// coalesces the ones that follow closer.
const API_QUIET: Duration = Duration::from_millis(200);

/// Enforcement latency through the Kubernetes source, with 1,000 policies loaded: a
/// node of its own, whose daemon lists and watches Nodes, Namespaces, Pods and
/// NetworkPolicies on the tests' fake API server (no policy file), the client and the
/// server pods on it. The policy allowing the client is DELETED and ADDED again by watch
/// events, each timed from the event's write to the first probe that sees its verdict.
fn api_latency(plan: Plan) -> anyhow::Result<Vec<Figure>> {
    use ebpf_cni_tests::{
        daemon::Daemon,
        fake_api::{self, FakeApi, NAMESPACES, NETWORK_POLICIES, PODS},
        node::{EXTERNAL_ADDR, NODE_ADDR},
        traffic::run_in,
    };
    eprintln!("bench: NetworkPolicy enforcement latency through the Kubernetes API");
    let runtime = tokio::runtime::Runtime::new().context("a tokio runtime")?;
    let mut node = Node::start(API_NODE_RANGE);
    let listener = run_in(&node.external, || {
        std::net::TcpListener::bind((EXTERNAL_ADDR, 6443))
    })
    .context("binding the API server's port")?;
    let mut api = {
        let _entered = runtime.enter();
        FakeApi::start_on(listener)
    };
    let kubeconfig = node.instance.state_dir.with_file_name("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig())?;
    node.daemon.kill();
    node.daemon = Daemon::start_with(
        &node.netns,
        &node.instance,
        &[],
        &[
            "--node-name",
            API_NODE_NAME,
            "--kubeconfig",
            kubeconfig.to_str().context("a UTF-8 path")?,
            "--routing",
            "native",
        ],
    );
    let count = COUNTS[COUNTS.len() - 1];
    // The namespace and the policies as the file's; the pods without addresses, as the
    // API has them before their sandboxes exist (the daemon knows them by their ADD).
    let listed = objects(&[], &[], count, true);
    let of_kind = |kind: &str| -> Vec<Value> {
        listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|item| item["kind"] == kind)
            .cloned()
            .enumerate()
            .map(|(n, mut item)| {
                item["metadata"]["resourceVersion"] = json!(format!("{}", n + 1));
                item
            })
            .collect()
    };
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"namespace": NAMESPACE, "name": name, "resourceVersion": "1",
                            "labels": {"app": name, "tier": "bench"}},
               "spec": {"nodeName": API_NODE_NAME,
                        "containers": [{"name": "main", "image": "bench"}]}})
    };
    let allow_client = of_kind("NetworkPolicy")
        .into_iter()
        .find(|policy| policy["metadata"]["name"] == "client")
        .context("the policy allowing the client")?;
    let streams = runtime.block_on(async {
        api.expect_list().await.reply_list(
            "10",
            &[fake_api::node(
                API_NODE_NAME,
                "9",
                NODE_ADDR,
                &[API_NODE_RANGE],
            )],
        );
        let nodes = api.expect_watch("10").await;
        api.expect_list_of(NAMESPACES)
            .await
            .reply_list("20", &of_kind("Namespace"));
        let namespaces = api.expect_watch_of(NAMESPACES, "20").await;
        api.expect_list_of(PODS)
            .await
            .reply_list("30", &[pod("client"), pod("server")]);
        let pods = api.expect_watch_of(PODS, "30").await;
        api.expect_list_of(NETWORK_POLICIES)
            .await
            .reply_list("40", &of_kind("NetworkPolicy"));
        let policies = api.expect_watch_of(NETWORK_POLICIES, "40").await;
        (nodes, namespaces, pods, policies)
    });
    let policies = &streams.3;
    let client = node.add_kubernetes_pod(&unique_name("aclient"), NAMESPACE, "client");
    let server = node.add_kubernetes_pod(&unique_name("aserver"), NAMESPACE, "server");
    let _probe_server = EchoServer::start_for(&server.netns, PROBE_PORT, SERVING);
    let to = SocketAddr::from((server.ip, PROBE_PORT));
    wait_policies(&node, count + 1)?;
    ensure!(
        probe_until(&client.netns, to, true)? < CHANGE_LIMIT,
        "the client is let in"
    );
    let trials = if plan.quick { 5 } else { 20 };
    let mut samples = Vec::new();
    let mut version = 100u32;
    for _ in 0..trials {
        for (event, open) in [("DELETED", false), ("ADDED", true)] {
            std::thread::sleep(API_QUIET);
            version += 1;
            let mut object = allow_client.clone();
            object["metadata"]["resourceVersion"] = json!(version.to_string());
            let start = Instant::now();
            policies.event(event, object);
            probe_until(&client.netns, to, open)?;
            samples.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    drop(streams);
    let p99 = percentile(&samples, 0.99);
    Ok(vec![
        single_figure(
            &format!(
                "NetworkPolicy enforcement latency, p50 (min-max), Kubernetes API watch event to the first probe seeing the change, {count} policies loaded"
            ),
            "ms",
            Stats::from_samples(&samples).context("samples")?,
        ),
        single_figure(
            &format!(
                "NetworkPolicy enforcement latency, p99 of {} watch events, {count} policies loaded",
                samples.len()
            ),
            "ms",
            Stats::from_samples(&[p99]).context("a sample")?,
        ),
    ])
}

/// Waits until `node` lists `expected` policies.
fn wait_policies(node: &Node, expected: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + CHANGE_LIMIT;
    loop {
        let view = node.instance.cli_json(&["policy"]);
        let listed = view["policies"].as_array().map_or(0, Vec::len);
        if listed == expected {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the node lists {listed} policies, not {expected}, after {CHANGE_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Probes `to` from `client` until a connection is `open` (made) or not (its SYN
/// dropped); returns how long that took.
fn probe_until(client: &Netns, to: SocketAddr, open: bool) -> anyhow::Result<Duration> {
    let start = Instant::now();
    spawn_in(client, move || {
        loop {
            let made = TcpStream::connect_timeout(&to, PROBE_WAIT).is_ok();
            if made == open {
                return Ok(start.elapsed());
            }
            if start.elapsed() > CHANGE_LIMIT {
                anyhow::bail!(
                    "no probe saw the connection {} after {CHANGE_LIMIT:?}",
                    if open { "made" } else { "refused" }
                );
            }
            if made {
                // Refused connections waited PROBE_WAIT; a made one did not.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the probe panicked"))?
}

/// Loads `rules` (iptables-restore input, without flushing the table) in `node`,
/// through the file `path`.
fn restore(node: &Netns, path: &std::path::Path, rules: &str) -> anyhow::Result<()> {
    std::fs::write(path, rules)?;
    let path = path.to_str().context("a UTF-8 path")?;
    let restored = node.run("iptables-restore", &["--noflush", path]);
    ensure!(
        restored.status.success(),
        "iptables-restore: {}",
        String::from_utf8_lossy(&restored.stderr)
    );
    Ok(())
}

/// Peer address `k` of the policies' ipBlocks (none of them a pod's).
fn peer(k: usize) -> Ipv4Addr {
    let k = u32::try_from(k).unwrap_or(u32::MAX);
    let [_, _, c, d] = k.to_be_bytes();
    Ipv4Addr::new(10, 200, c, d)
}

/// A `List` of the bench's namespace, its pods (`name`, address; the client and server
/// labelled `app: <name>`), pods of other nodes in 100 namespaces of their own, and
/// `count` policies selecting the server, each allowing ten peer addresses, with one
/// allowing the client after them when `client` (and `count` > 0).
fn objects(
    pods: &[(&str, Ipv4Addr)],
    others: &[(String, Ipv4Addr)],
    count: usize,
    client: bool,
) -> Value {
    let namespace = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}})
    };
    let pod = |namespace: &str, name: &str, ip: Ipv4Addr| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"namespace": namespace, "name": name,
                            "labels": {"app": name, "tier": "bench"}},
               "spec": {"containers": [{"name": "main", "ports": [
                   {"name": "serve", "containerPort": 7001, "protocol": "TCP"}]}]},
               "status": {"phase": "Running", "podIP": ip.to_string(),
                          "podIPs": [{"ip": ip.to_string()}]}})
    };
    let mut items = vec![namespace(NAMESPACE)];
    for (name, ip) in pods {
        items.push(pod(NAMESPACE, name, *ip));
    }
    let spread = 100;
    for n in 0..spread.min(others.len()) {
        items.push(namespace(&format!("other-{n}")));
    }
    for (k, (name, ip)) in others.iter().enumerate() {
        items.push(pod(&format!("other-{}", k % spread), name, *ip));
    }
    let selecting = |name: String, from: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"namespace": NAMESPACE, "name": name},
               "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                        "policyTypes": ["Ingress"], "ingress": [{"from": from}]}})
    };
    for i in 0..count {
        let from: Vec<Value> = (0..PEERS_PER_POLICY)
            .map(|j| json!({"ipBlock": {"cidr": format!("{}/32", peer(i * PEERS_PER_POLICY + j))}}))
            .collect();
        items.push(selecting(format!("peers-{i}"), Value::Array(from)));
    }
    if client && count > 0 {
        items.push(selecting(
            "client".into(),
            json!([{"podSelector": {"matchLabels": {"app": "client"}}}]),
        ));
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// A figure measured for ebpf-cni alone.
fn single_figure(name: &str, unit: &str, stats: Stats) -> Figure {
    Figure {
        name: name.into(),
        unit: unit.into(),
        higher_is_better: false,
        values: vec![
            (Contender::EbpfCni, Measured::Measured(stats)),
            (Contender::Reference, Measured::NotApplicable),
            (Contender::Raw, Measured::NotApplicable),
        ],
    }
}

/// The `q` quantile of `samples` (nearest rank).
fn percentile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
}
