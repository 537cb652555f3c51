//! NetworkPolicy for a Service whose backend is on another node, with kube-proxy's own
//! rules on both nodes, in both routings: the backend's node judges the client the
//! DNAT kept (its ingress), and the client's node judges the backend the DNAT chose
//! where the stack hands the packet on (the overlay device's egress, or the uplink's
//! with native routes), not the Service's address.

use std::net::{Ipv4Addr, SocketAddr};

use ebpf_cni_tests::{
    cluster::TestCluster,
    kube_proxy::{Endpoint, KubeProxy, Mode, Service},
    netpol::{ModelPod, PolicyFile, Protocol, add_pod, objects_json, reaches},
    require_root,
};
use serde_json::{Value, json};

const SERVICE_RANGE: &str = "10.96.0.0/12";
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 31);

fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// y/a takes TCP 80 from x/a only.
fn backend_from_x_a() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "y", "name": "backend-from-x-a"},
        "spec": {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}},
                    "podSelector": {"matchLabels": {"pod": "a"}},
                }],
                "ports": [{"port": 80}],
            }],
        },
    })
}

/// x/c may reach namespace z only.
fn c_only_to_z() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "x", "name": "c-only-to-z"},
        "spec": {
            "podSelector": {"matchLabels": {"pod": "c"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector":
                {"matchLabels": {"kubernetes.io/metadata.name": "z"}}}]}],
        },
    })
}

fn services_behind_policies(routing: &str, tag: u8) {
    require_root();
    let ranges = [format!("10.{tag}.1.0/24"), format!("10.{tag}.2.0/24")];
    let file = PolicyFile::new(&objects_json(&[], &[], &[]));
    let mut flags = vec!["--routing", routing, "--service-cidr", SERVICE_RANGE];
    flags.extend(file.flags());
    let cluster = TestCluster::start(&[ranges[0].as_str(), ranges[1].as_str()], &flags);
    let x_a = add_pod(cluster.node(1), "x", "a");
    let x_c = add_pod(cluster.node(1), "x", "c");
    let y_a = add_pod(cluster.node(2), "y", "a");
    for n in 1..=2 {
        let backend = if n == 2 {
            Endpoint::local(y_a.pod.ip, 80)
        } else {
            Endpoint::remote(y_a.pod.ip, 80)
        };
        KubeProxy {
            cluster_cidr: Some(format!("10.{tag}.0.0/16")),
            ..KubeProxy::new(Mode::Iptables)
        }
        .install(
            &cluster.node(n).netns,
            &[Service::tcp(
                "y",
                "backend",
                CLUSTER_IP,
                8080,
                vec![backend],
            )],
        );
    }
    let objects = |policies: &[Value]| {
        let namespaces: Vec<_> = ["x", "y", "z"]
            .iter()
            .map(|name| {
                (
                    (*name).to_owned(),
                    labels(&[("kubernetes.io/metadata.name", name)]),
                )
            })
            .collect();
        let pods: Vec<_> = [&x_a, &x_c, &y_a]
            .iter()
            .map(|pod| {
                (
                    pod.namespace.clone(),
                    pod.name.clone(),
                    labels(&[("pod", &pod.name)]),
                    pod.pod.ip.to_string(),
                )
            })
            .collect();
        objects_json(&namespaces, &pods, policies)
    };
    let service = SocketAddr::from((CLUSTER_IP, 8080));
    let through = |client: &ModelPod| {
        reaches(&client.pod.netns, service, Protocol::Tcp)
            .join()
            .expect("a probe")
    };
    let settles = |client: &ModelPod, reached: bool| {
        ebpf_cni_tests::daemon::eventually(std::time::Duration::from_secs(5), || {
            through(client) == reached
        })
    };
    assert!(
        settles(&x_a, true),
        "{routing}: no policy, x/a reaches y/a's Service"
    );
    assert!(settles(&x_c, true), "{routing}: no policy, x/c too");

    file.replace(&objects(&[backend_from_x_a()]));
    assert!(
        settles(&x_c, false),
        "{routing}: y/a's ingress refuses x/c, which the DNAT kept as the source"
    );
    assert!(through(&x_a), "{routing}: and takes x/a");

    file.replace(&objects(&[c_only_to_z()]));
    assert!(
        settles(&x_c, false),
        "{routing}: x/c's egress refuses the backend in y the DNAT chose"
    );
    assert!(through(&x_a), "{routing}: x/a is not isolated");
    let direct = SocketAddr::from((y_a.pod.ip, 80));
    assert!(
        !reaches(&x_c.pod.netns, direct, Protocol::Tcp)
            .join()
            .expect("a probe"),
        "{routing}: nor directly"
    );

    file.replace(&objects(&[]));
    assert!(
        settles(&x_c, true),
        "{routing}: policies gone, x/c reaches it"
    );
}

#[test]
fn services_behind_policies_across_the_overlay() {
    services_behind_policies("vxlan", 141);
}

#[test]
fn services_behind_policies_across_native_routes() {
    services_behind_policies("native", 142);
}
