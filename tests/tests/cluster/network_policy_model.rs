//! Every upstream NetworkPolicy e2e case (`ebpf_cni_tests::netpol_cases`, kubernetes'
//! `test/e2e/network/netpol`), on upstream's model: namespaces x, y and z with pods a, b
//! and c, each serving TCP and UDP on 80 and 81, every ordered pair probed after each
//! step and the reachability seen compared with the expected one (both printed on a
//! mismatch). SCTP as `traffic::sctp` can: real associations where the kernel has SCTP
//! (the VM guests), raw SCTP packets and their echo where it has not.
//!
//! Through both sources: `--policy-file` on two nodes of the overlay, the pods spread
//! over both (so a pair is as often on one node as across), the file rewritten whole at
//! each step; and the Kubernetes API (the wire-format fake server) on one node, each
//! step sent as the ADDED, MODIFIED and DELETED events it amounts to. A marker policy
//! of each step, in a namespace without pods, tells when a daemon has taken the step:
//! probes start only then.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use cni_api::{Request, Response};
use ebpf_cni_tests::{
    cluster::TestCluster,
    daemon::{Daemon, Instance, eventually},
    netpol::{
        ModelPod, PolicyFile, Protocol, add_pod, expect_reachability, expected, namespace_json,
        objects_json, pod_json,
    },
    netpol_cases::{self, Case, PodRef, Proto, Step, World},
    node::{EXTERNAL_ADDR, NODE_ADDR, Node},
    require_root,
    traffic::run_in,
};
use serde_json::{Value, json};

use crate::fake_api::{FakeApi, NAMESPACES, NETWORK_POLICIES, PODS, WatchStream, node};

const NAMESPACES_OF_MODEL: [&str; 3] = ["x", "y", "z"];
const PODS_OF_MODEL: [&str; 3] = ["a", "b", "c"];
/// How long a daemon may take to take a step.
const TAKEN: Duration = Duration::from_secs(10);

/// The model's namespaces and pods, in order.
fn model() -> Vec<(&'static str, &'static str)> {
    NAMESPACES_OF_MODEL
        .iter()
        .flat_map(|namespace| PODS_OF_MODEL.iter().map(move |pod| (*namespace, *pod)))
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// A namespace's labels at `step`.
fn namespace_labels(step: &Step, namespace: &str) -> BTreeMap<String, String> {
    step.namespace_labels
        .iter()
        .find(|(name, _)| name == namespace)
        .map(|(_, labels)| labels.clone())
        .unwrap_or_else(|| {
            labels(&[
                ("kubernetes.io/metadata.name", namespace),
                ("ns", namespace),
            ])
        })
}

/// A pod's labels at `step`.
fn pod_labels(step: &Step, namespace: &str, name: &str) -> BTreeMap<String, String> {
    step.pod_labels
        .iter()
        .find(|((ns, pod), _)| ns == namespace && pod == name)
        .map(|(_, labels)| labels.clone())
        .unwrap_or_else(|| labels(&[("pod", name)]))
}

/// The policy that marks step `mark`: in a namespace without pods, it isolates nothing.
fn marker(mark: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "marker", "name": mark},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    })
}

/// The policies of `step`, with its marker.
fn policies(step: &Step, mark: &str) -> Vec<Value> {
    let mut all = step.policies.clone();
    all.push(marker(mark));
    all
}

/// Whether the daemon of `instance` lists the marker policy `mark`.
fn has_taken(instance: &Instance, mark: &str) -> bool {
    match instance.request(&Request::Policies) {
        Response::Policies(view) => view
            .policies
            .iter()
            .any(|policy| policy.namespace == "marker" && policy.name == mark),
        _ => false,
    }
}

fn world(pods: &[ModelPod]) -> World {
    World {
        ips: pods
            .iter()
            .map(|pod| ((pod.namespace.clone(), pod.name.clone()), pod.pod.ip))
            .collect(),
    }
}

fn protocol(proto: Proto) -> Protocol {
    match proto {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
        Proto::Sctp => Protocol::Sctp,
    }
}

/// Runs every case through `take` (which applies a step and returns once every daemon
/// has taken it), probing after each step.
fn run_cases(pods: &[ModelPod], mut take: impl FnMut(&Step, &str)) {
    let world = world(pods);
    let cases: Vec<Case> = netpol_cases::all(&world);
    for case in &cases {
        let all: Vec<&ModelPod> = pods.iter().collect();
        for (n, step) in case.steps.iter().enumerate() {
            let mark = format!("{}-{n}", case.name).replace('_', "-");
            take(step, &mark);
            for probe in &step.probes {
                let protocol = protocol(probe.proto);
                let truth = expected(&all, |from, to| {
                    (probe.reach)(
                        &PodRef {
                            namespace: from.namespace.clone(),
                            name: from.name.clone(),
                        },
                        &PodRef {
                            namespace: to.namespace.clone(),
                            name: to.name.clone(),
                        },
                    )
                });
                expect_reachability(
                    &format!("{} ({}), step {n}: {}", case.name, case.upstream, step.what),
                    &all,
                    probe.port,
                    protocol,
                    &truth,
                );
            }
        }
    }
}

#[test]
fn every_upstream_case_from_a_policy_file_on_two_nodes() {
    require_root();
    let file = PolicyFile::new(&objects_json(&[], &[], &[]));
    let cluster = TestCluster::start(&["10.244.61.0/24", "10.244.62.0/24"], &file.flags());
    let pods: Vec<ModelPod> = model()
        .into_iter()
        .enumerate()
        .map(|(i, (namespace, name))| add_pod(cluster.node(1 + i % 2), namespace, name))
        .collect();
    let addresses: HashMap<(String, String), String> = pods
        .iter()
        .map(|pod| {
            (
                (pod.namespace.clone(), pod.name.clone()),
                pod.pod.ip.to_string(),
            )
        })
        .collect();
    run_cases(&pods, |step, mark| {
        let namespaces: Vec<(String, BTreeMap<String, String>)> = NAMESPACES_OF_MODEL
            .iter()
            .map(|namespace| ((*namespace).to_owned(), namespace_labels(step, namespace)))
            .collect();
        let objects: Vec<(String, String, BTreeMap<String, String>, String)> = model()
            .into_iter()
            .map(|(namespace, name)| {
                (
                    namespace.to_owned(),
                    name.to_owned(),
                    pod_labels(step, namespace, name),
                    addresses[&(namespace.to_owned(), name.to_owned())].clone(),
                )
            })
            .collect();
        file.replace(&objects_json(&namespaces, &objects, &policies(step, mark)));
        for node in &cluster.nodes {
            assert!(
                eventually(TAKEN, || has_taken(&node.instance, mark)),
                "a daemon did not take step {mark}:\n{}",
                node.instance.log()
            );
        }
    });
}

/// What the fake API server has told the daemon, by kind and key, with the resource
/// version of the last event.
struct Told {
    version: u64,
    objects: BTreeMap<(&'static str, String), Value>,
}

impl Told {
    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// Sends the events that take what was told to `objects` (by kind and key).
    fn tell(
        &mut self,
        streams: &HashMap<&'static str, WatchStream>,
        objects: BTreeMap<(&'static str, String), Value>,
    ) {
        let gone: Vec<(&'static str, String)> = self
            .objects
            .keys()
            .filter(|key| !objects.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            let mut object = self.objects.remove(&key).expect("told before");
            object["metadata"]["resourceVersion"] = json!(self.next_version());
            streams[key.0].event("DELETED", object);
        }
        for (key, mut object) in objects {
            let before = self.objects.get(&key).map(|told| {
                let mut told = told.clone();
                told["metadata"]["resourceVersion"] = Value::Null;
                told
            });
            let mut bare = object.clone();
            bare["metadata"]["resourceVersion"] = Value::Null;
            if before.as_ref() == Some(&bare) {
                continue;
            }
            object["metadata"]["resourceVersion"] = json!(self.next_version());
            let kind = if before.is_some() {
                "MODIFIED"
            } else {
                "ADDED"
            };
            streams[key.0].event(kind, object.clone());
            self.objects.insert(key, object);
        }
    }
}

#[test]
fn every_upstream_case_from_the_kubernetes_api() {
    require_root();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut node_1 = Node::start("10.244.63.0/24");
    let listener = run_in(&node_1.external, || {
        std::net::TcpListener::bind((EXTERNAL_ADDR, 6443)).expect("bind the API's port")
    });
    let mut api = {
        let _entered = runtime.enter();
        FakeApi::start_on(listener)
    };
    let kubeconfig = node_1.instance.state_dir.with_file_name("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    node_1.daemon.kill();
    node_1.daemon = Daemon::start_with(
        &node_1.netns,
        &node_1.instance,
        &[],
        &[
            "--node-name",
            "node-1",
            "--kubeconfig",
            kubeconfig.to_str().expect("a UTF-8 path"),
            "--routing",
            "native",
        ],
    );
    let streams: HashMap<&'static str, WatchStream> = runtime.block_on(async {
        api.expect_list()
            .await
            .reply_list("10", &[node("node-1", "9", NODE_ADDR, &["10.244.63.0/24"])]);
        let nodes = api.expect_watch("10").await;
        let mut streams = HashMap::new();
        for path in [NAMESPACES, PODS, NETWORK_POLICIES] {
            api.expect_list_of(path).await.reply_list("10", &[]);
            streams.insert(path, api.expect_watch_of(path, "10").await);
        }
        streams.insert("nodes", nodes);
        streams
    });
    let pods: Vec<ModelPod> = model()
        .into_iter()
        .map(|(namespace, name)| add_pod(&node_1, namespace, name))
        .collect();
    let addresses: HashMap<(String, String), String> = pods
        .iter()
        .map(|pod| {
            (
                (pod.namespace.clone(), pod.name.clone()),
                pod.pod.ip.to_string(),
            )
        })
        .collect();
    let mut told = Told {
        version: 10,
        objects: BTreeMap::new(),
    };
    run_cases(&pods, |step, mark| {
        let mut objects = BTreeMap::new();
        for namespace in NAMESPACES_OF_MODEL {
            objects.insert(
                (NAMESPACES, namespace.to_owned()),
                namespace_json(namespace, &namespace_labels(step, namespace), ""),
            );
        }
        for (namespace, name) in model() {
            let ip = &addresses[&(namespace.to_owned(), name.to_owned())];
            objects.insert(
                (PODS, format!("{namespace}/{name}")),
                pod_json(namespace, name, &pod_labels(step, namespace, name), ip, ""),
            );
        }
        for policy in policies(step, mark) {
            let key = format!(
                "{}/{}",
                policy["metadata"]["namespace"].as_str().unwrap_or_default(),
                policy["metadata"]["name"].as_str().unwrap_or_default()
            );
            objects.insert((NETWORK_POLICIES, key), policy);
        }
        told.tell(&streams, objects);
        assert!(
            eventually(TAKEN, || has_taken(&node_1.instance, mark)),
            "the daemon did not take step {mark}:\n{}",
            node_1.instance.log()
        );
    });
}
