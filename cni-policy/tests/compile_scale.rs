//! Compiling at the scale the issue states (10,000 pods in 100 namespaces, 1,000
//! policies, a node of 110 pods): every address gets its identity and every local pod
//! exactly the way its policy opens. (Its time belongs to `cargo xtask bench`; in a
//! release build it is about 15 ms here.)

use std::collections::BTreeMap;

use cni_policy::{Cluster, Identities, Pod, compile, translate};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;

fn team(n: usize) -> String {
    format!("team-{n:03}")
}

#[test]
fn ten_thousand_pods_and_a_thousand_policies_compile_for_a_node() {
    let mut namespaces = BTreeMap::new();
    let mut pods = Vec::new();
    let mut policies = Vec::new();
    for ns in 0..100 {
        let mut labels = BTreeMap::new();
        labels.insert("team".to_owned(), team(ns));
        labels.insert("kubernetes.io/metadata.name".to_owned(), team(ns));
        namespaces.insert(team(ns), labels);
        for n in 0..100 {
            let mut labels = BTreeMap::new();
            labels.insert("app".to_owned(), format!("app-{}", n % 10));
            labels.insert("pod-template-hash".to_owned(), "7d4b9c8f6".to_owned());
            pods.push(Pod {
                namespace: team(ns),
                name: format!("pod-{n}"),
                labels,
                addrs: vec![
                    format!("10.{}.{}.{}", 100 + ns / 100, ns % 100, n + 1)
                        .parse()
                        .expect("an address"),
                ],
                ports: vec![],
            });
        }
        for n in 0..10 {
            let object: NetworkPolicy = serde_json::from_value(json!({
                "metadata": {"namespace": team(ns), "name": format!("allow-{n}")},
                "spec": {
                    "podSelector": {"matchLabels": {"app": format!("app-{n}")}},
                    "policyTypes": ["Ingress"],
                    "ingress": [{
                        "from": [{
                            "namespaceSelector": {"matchLabels": {"team": team((ns + 1) % 100)}},
                            "podSelector": {"matchLabels": {"app": format!("app-{}", (n + 1) % 10)}},
                        }],
                        "ports": [{"protocol": "TCP", "port": 8080}],
                    }],
                },
            }))
            .expect("a NetworkPolicy");
            policies.push(translate::policy(&object).expect("a valid policy"));
        }
    }
    let cluster = Cluster {
        namespaces: &namespaces,
        pods: &pods,
        policies: &policies,
    };
    let local: Vec<usize> = (0..110).map(|i| i * 91).collect();
    let mut identities = Identities::default();
    let compiled = compile(cluster, &local, &mut identities);
    assert_eq!(compiled.addresses.len(), 10_000);
    assert_eq!(compiled.endpoints.len(), local.len());
    for endpoint in &compiled.endpoints {
        let pod = &pods[endpoint.pod];
        let ways = endpoint.ingress.as_ref().expect("every app has a policy");
        assert_eq!(ways.len(), 1, "{pod:?}: {ways:?}");
        assert_eq!(ways[0].ports.range(), (8080, 8080));
        assert_eq!(
            policies[ways[0].policy].namespace, pod.namespace,
            "the pod's own namespace's policy"
        );
        assert_eq!(endpoint.egress, None);
    }
    // The peer's identity is the one of the next team's next app's pods, and only theirs.
    let first = &compiled.endpoints[0];
    let id = first.ingress.as_ref().expect("isolated")[0].identity;
    let holders = compiled
        .addresses
        .iter()
        .filter(|(_, identity)| *identity == id)
        .count();
    assert_eq!(holders, 10, "ten pods of one app in one namespace");
}
