//! Kubernetes' `networking.k8s.io/v1` NetworkPolicy into a [`Policy`], checked as the API
//! server checks it (a policy file never went through one) and with its defaults made
//! explicit: a policy without `policyTypes` isolates for ingress, and for egress when it
//! has egress rules; a port without a protocol is TCP; a rule without peers or ports is
//! open on that side; an ipBlock's CIDR may have host bits set (as Go's `ParseCIDR`
//! takes it) and means its network.

use cni_api::values::Protocol;
use ipnet::IpNet;
use k8s_openapi::{
    api::networking::v1::{IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    apimachinery::pkg::util::intstr::IntOrString,
};

use crate::{
    policy::{Namespaces, Peer, Policy, PortRule, Ports, Rule},
    selector::{Selector, SelectorError},
};

/// A policy refused: the field at fault and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {problem}")]
pub struct PolicyError {
    /// The field's path in the object, as `kubectl explain` names it
    /// (`spec.ingress[0].from[1].ipBlock.cidr`).
    pub field: String,
    pub problem: Problem,
}

/// What is wrong with a field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Problem {
    #[error("required")]
    Missing,
    #[error("{0:?} is not Ingress or Egress")]
    PolicyType(String),
    #[error("a peer needs a podSelector, a namespaceSelector or an ipBlock")]
    EmptyPeer,
    #[error("an ipBlock peer may not have a podSelector or a namespaceSelector too")]
    BlockAndSelector,
    #[error("{0:?} is not a CIDR")]
    Cidr(String),
    #[error("{except} is not strictly inside {cidr}")]
    ExceptOutside { except: IpNet, cidr: IpNet },
    #[error("{0:?} is not TCP, UDP or SCTP")]
    Protocol(String),
    #[error("{0} is not a port (1-65535)")]
    PortNumber(i32),
    #[error(
        "{0:?} is not a port name (1-15 lowercase letters, digits and inner hyphens, at least one letter)"
    )]
    PortName(String),
    #[error("endPort needs a numeric port")]
    EndPortWithoutNumber,
    #[error("endPort {end} is below port {port}")]
    EndPortBelow { port: u16, end: i32 },
    #[error(transparent)]
    Selector(#[from] SelectorError),
}

/// The namespace of an object that names none, as kubectl fills it in.
pub const DEFAULT_NAMESPACE: &str = "default";

fn error(field: impl Into<String>, problem: Problem) -> PolicyError {
    PolicyError {
        field: field.into(),
        problem,
    }
}

/// Checks and translates `object`.
pub fn policy(object: &NetworkPolicy) -> Result<Policy, PolicyError> {
    let name = object
        .metadata
        .name
        .clone()
        .filter(|name| !name.is_empty())
        .ok_or_else(|| error("metadata.name", Problem::Missing))?;
    let namespace = object
        .metadata
        .namespace
        .clone()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    let spec = object.spec.clone().unwrap_or_default();
    let selects = match &spec.pod_selector {
        Some(selector) => {
            Selector::new(selector).map_err(|e| error("spec.podSelector", Problem::Selector(e)))?
        }
        None => Selector::everything(),
    };
    let ingress_rules = spec.ingress.unwrap_or_default();
    let egress_rules = spec.egress.unwrap_or_default();
    let (isolates_ingress, isolates_egress) = match &spec.policy_types {
        Some(types) => {
            let mut both = (false, false);
            for (i, kind) in types.iter().enumerate() {
                match kind.as_str() {
                    "Ingress" => both.0 = true,
                    "Egress" => both.1 = true,
                    other => {
                        return Err(error(
                            format!("spec.policyTypes[{i}]"),
                            Problem::PolicyType(other.to_owned()),
                        ));
                    }
                }
            }
            both
        }
        None => (true, !egress_rules.is_empty()),
    };
    // Rules are checked even on a side the policy does not isolate, as the API server
    // checks them.
    let ingress = rules_of(
        "ingress",
        "from",
        ingress_rules
            .iter()
            .map(|rule| (rule.from.as_deref(), rule.ports.as_deref())),
    )?;
    let egress = rules_of(
        "egress",
        "to",
        egress_rules
            .iter()
            .map(|rule| (rule.to.as_deref(), rule.ports.as_deref())),
    )?;
    Ok(Policy {
        namespace,
        name,
        selects,
        ingress: isolates_ingress.then_some(ingress),
        egress: isolates_egress.then_some(egress),
    })
}

/// The rules of `spec.<direction>`, each given as its peers (field `side`: `from`,
/// `to`) and ports.
fn rules_of<'a>(
    direction: &str,
    side: &str,
    rules: impl Iterator<
        Item = (
            Option<&'a [NetworkPolicyPeer]>,
            Option<&'a [NetworkPolicyPort]>,
        ),
    >,
) -> Result<Vec<Rule>, PolicyError> {
    rules
        .enumerate()
        .map(|(i, (peers, ports))| rule_of(&format!("spec.{direction}[{i}]"), side, peers, ports))
        .collect()
}

/// A rule at `at` whose peers are in its field `side` (`from`, `to`).
fn rule_of(
    at: &str,
    side: &str,
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
) -> Result<Rule, PolicyError> {
    let peers = match peers {
        None | Some([]) => None,
        Some(peers) => Some(
            peers
                .iter()
                .enumerate()
                .map(|(i, peer)| peer_of(&format!("{at}.{side}[{i}]"), peer))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let ports = match ports {
        None | Some([]) => None,
        Some(ports) => Some(
            ports
                .iter()
                .enumerate()
                .map(|(i, port)| port_of(&format!("{at}.ports[{i}]"), port))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(Rule { peers, ports })
}

fn peer_of(at: &str, peer: &NetworkPolicyPeer) -> Result<Peer, PolicyError> {
    let selector = |field: &str, selector| {
        Selector::new(selector).map_err(|e| error(format!("{at}.{field}"), Problem::Selector(e)))
    };
    match (&peer.ip_block, &peer.namespace_selector, &peer.pod_selector) {
        (Some(block), None, None) => block_of(&format!("{at}.ipBlock"), block),
        (Some(_), _, _) => Err(error(at, Problem::BlockAndSelector)),
        (None, None, None) => Err(error(at, Problem::EmptyPeer)),
        (None, namespaces, pods) => Ok(Peer::Pods {
            namespaces: match namespaces {
                Some(namespaces) => {
                    Namespaces::Matching(selector("namespaceSelector", namespaces)?)
                }
                None => Namespaces::Own,
            },
            pods: match pods {
                Some(pods) => selector("podSelector", pods)?,
                None => Selector::everything(),
            },
        }),
    }
}

fn block_of(at: &str, block: &IPBlock) -> Result<Peer, PolicyError> {
    let cidr = cidr_of(&format!("{at}.cidr"), &block.cidr)?;
    let mut except = Vec::new();
    for (i, text) in block.except.iter().flatten().enumerate() {
        let field = format!("{at}.except[{i}]");
        let inner = cidr_of(&field, text)?;
        if !(cidr.contains(&inner) && inner.prefix_len() > cidr.prefix_len()) {
            return Err(error(
                field,
                Problem::ExceptOutside {
                    except: inner,
                    cidr,
                },
            ));
        }
        except.push(inner);
    }
    except.sort();
    except.dedup();
    Ok(Peer::Block { cidr, except })
}

/// A CIDR, host bits dropped; an address alone is not one.
fn cidr_of(field: &str, text: &str) -> Result<IpNet, PolicyError> {
    text.parse::<IpNet>()
        .map(|cidr| cidr.trunc())
        .map_err(|_| error(field, Problem::Cidr(text.to_owned())))
}

fn port_of(at: &str, port: &NetworkPolicyPort) -> Result<PortRule, PolicyError> {
    let protocol = Protocol::from_kubernetes(port.protocol.as_deref()).ok_or_else(|| {
        error(
            format!("{at}.protocol"),
            Problem::Protocol(port.protocol.clone().unwrap_or_default()),
        )
    })?;
    let ports = match (&port.port, port.end_port) {
        (None, None) => Ports::All,
        (None, Some(_)) | (Some(IntOrString::String(_)), Some(_)) => {
            return Err(error(
                format!("{at}.endPort"),
                Problem::EndPortWithoutNumber,
            ));
        }
        (Some(IntOrString::String(name)), None) => {
            if !is_port_name(name) {
                return Err(error(format!("{at}.port"), Problem::PortName(name.clone())));
            }
            Ports::Named(name.clone())
        }
        (Some(IntOrString::Int(number)), end) => {
            let first = port_number(&format!("{at}.port"), *number)?;
            let last = match end {
                None => first,
                Some(end) if end < i32::from(first) => {
                    return Err(error(
                        format!("{at}.endPort"),
                        Problem::EndPortBelow { port: first, end },
                    ));
                }
                Some(end) => port_number(&format!("{at}.endPort"), end)?,
            };
            Ports::Range { first, last }
        }
    };
    Ok(PortRule { protocol, ports })
}

fn port_number(field: &str, number: i32) -> Result<u16, PolicyError> {
    u16::try_from(number)
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| error(field, Problem::PortNumber(number)))
}

/// Whether `name` is an IANA service name, as a container port's name must be.
fn is_port_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(value).expect("a NetworkPolicy")
    }

    fn with_spec(spec: serde_json::Value) -> Result<Policy, PolicyError> {
        policy(&parse(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "p", "namespace": "x"},
            "spec": spec,
        })))
    }

    fn field_of(result: Result<Policy, PolicyError>) -> (String, Problem) {
        let e = result.expect_err("refused");
        (e.field, e.problem)
    }

    #[test]
    fn without_policy_types_a_policy_isolates_ingress_and_egress_only_with_egress_rules() {
        let p = with_spec(json!({"podSelector": {}})).expect("valid");
        assert_eq!(p.ingress, Some(vec![]), "deny all ingress");
        assert_eq!(p.egress, None);
        let p = with_spec(json!({"podSelector": {}, "egress": [{}]})).expect("valid");
        assert_eq!(p.ingress, Some(vec![]));
        assert_eq!(
            p.egress,
            Some(vec![Rule {
                peers: None,
                ports: None
            }]),
            "one rule open to everything"
        );
        // An empty egress list is no egress rule.
        let p = with_spec(json!({"podSelector": {}, "egress": []})).expect("valid");
        assert_eq!(p.egress, None);
    }

    #[test]
    fn policy_types_decide_the_sides_even_against_the_rules_present() {
        let p = with_spec(json!({
            "podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
        }))
        .expect("valid");
        assert_eq!(p.ingress, None, "ingress rules without Ingress do nothing");
        assert_eq!(p.egress, Some(vec![]), "deny all egress");
        assert_eq!(
            field_of(with_spec(json!({"policyTypes": ["ingress"]}))),
            (
                "spec.policyTypes[0]".into(),
                Problem::PolicyType("ingress".into())
            )
        );
    }

    #[test]
    fn a_missing_namespace_is_default_and_a_missing_name_is_refused() {
        let p = policy(&parse(json!({"metadata": {"name": "p"}, "spec": {}}))).expect("valid");
        assert_eq!((p.namespace.as_str(), p.name.as_str()), ("default", "p"));
        assert!(p.selects.is_everything());
        let e = policy(&parse(json!({"metadata": {}, "spec": {}}))).expect_err("no name");
        assert_eq!(
            (e.field.as_str(), e.problem),
            ("metadata.name", Problem::Missing)
        );
    }

    #[test]
    fn peers_are_pods_of_the_own_namespace_of_matching_namespaces_or_blocks() {
        let p = with_spec(json!({"ingress": [{"from": [
            {"podSelector": {"matchLabels": {"pod": "b"}}},
            {"namespaceSelector": {"matchLabels": {"ns": "y"}}},
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "c"}}},
            {"ipBlock": {"cidr": "10.0.0.7/8", "except": ["10.1.0.0/16", "10.1.0.0/16"]}},
        ]}]}))
        .expect("valid");
        let peers = p.ingress.expect("isolates")[0]
            .peers
            .clone()
            .expect("peers");
        assert!(matches!(
            &peers[0],
            Peer::Pods { namespaces: Namespaces::Own, pods } if !pods.is_everything()
        ));
        assert!(matches!(
            &peers[1],
            Peer::Pods { namespaces: Namespaces::Matching(ns), pods } if !ns.is_everything() && pods.is_everything()
        ));
        assert!(matches!(
            &peers[2],
            Peer::Pods { namespaces: Namespaces::Matching(ns), .. } if ns.is_everything()
        ));
        assert_eq!(
            peers[3],
            Peer::Block {
                cidr: "10.0.0.0/8".parse().expect("cidr"),
                except: vec!["10.1.0.0/16".parse().expect("cidr")],
            },
            "host bits dropped, excepts once"
        );
    }

    #[test]
    fn malformed_peers_are_refused_with_their_field() {
        let cases = [
            (json!({}), "spec.ingress[0].from[0]", Problem::EmptyPeer),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}),
                "spec.ingress[0].from[0]",
                Problem::BlockAndSelector,
            ),
            (
                json!({"ipBlock": {"cidr": "10.0.0.1"}}),
                "spec.ingress[0].from[0].ipBlock.cidr",
                Problem::Cidr("10.0.0.1".into()),
            ),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}),
                "spec.ingress[0].from[0].ipBlock.except[0]",
                Problem::ExceptOutside {
                    except: "10.0.0.0/8".parse().expect("cidr"),
                    cidr: "10.0.0.0/8".parse().expect("cidr"),
                },
            ),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/64"]}}),
                "spec.ingress[0].from[0].ipBlock.except[0]",
                Problem::ExceptOutside {
                    except: "fd00::/64".parse().expect("cidr"),
                    cidr: "10.0.0.0/8".parse().expect("cidr"),
                },
            ),
        ];
        for (peer, field, problem) in cases {
            assert_eq!(
                field_of(with_spec(json!({"ingress": [{"from": [peer]}]}))),
                (field.to_owned(), problem)
            );
        }
        let (field, problem) = field_of(with_spec(json!({"egress": [{"to": [
            {"podSelector": {"matchExpressions": [{"key": "k", "operator": "In", "values": []}]}}
        ]}]})));
        assert_eq!(field, "spec.egress[0].to[0].podSelector");
        assert!(matches!(
            problem,
            Problem::Selector(SelectorError::NoValues { .. })
        ));
    }

    #[test]
    fn ports_take_tcp_by_default_ranges_and_names() {
        let p = with_spec(json!({"ingress": [{"ports": [
            {"port": 80},
            {"protocol": "UDP", "port": 81},
            {"protocol": "SCTP"},
            {"port": 32000, "endPort": 32768},
            {"port": "serve-80-tcp"},
        ]}]}))
        .expect("valid");
        let ports = p.ingress.expect("isolates")[0]
            .ports
            .clone()
            .expect("ports");
        let rule = |protocol, ports| PortRule { protocol, ports };
        assert_eq!(
            ports,
            vec![
                rule(
                    Protocol::Tcp,
                    Ports::Range {
                        first: 80,
                        last: 80
                    }
                ),
                rule(
                    Protocol::Udp,
                    Ports::Range {
                        first: 81,
                        last: 81
                    }
                ),
                rule(Protocol::Sctp, Ports::All),
                rule(
                    Protocol::Tcp,
                    Ports::Range {
                        first: 32000,
                        last: 32768
                    }
                ),
                rule(Protocol::Tcp, Ports::Named("serve-80-tcp".into())),
            ]
        );
    }

    #[test]
    fn malformed_ports_are_refused_with_their_field() {
        let cases = [
            (
                json!({"protocol": "tcp"}),
                ".protocol",
                Problem::Protocol("tcp".into()),
            ),
            (
                json!({"protocol": "ICMP"}),
                ".protocol",
                Problem::Protocol("ICMP".into()),
            ),
            (json!({"port": 0}), ".port", Problem::PortNumber(0)),
            (json!({"port": 65536}), ".port", Problem::PortNumber(65536)),
            (
                json!({"port": "80"}),
                ".port",
                Problem::PortName("80".into()),
            ),
            (
                json!({"port": "Http"}),
                ".port",
                Problem::PortName("Http".into()),
            ),
            (
                json!({"port": "a-very-long-port-name"}),
                ".port",
                Problem::PortName("a-very-long-port-name".into()),
            ),
            (
                json!({"port": "a--b"}),
                ".port",
                Problem::PortName("a--b".into()),
            ),
            (
                json!({"endPort": 90}),
                ".endPort",
                Problem::EndPortWithoutNumber,
            ),
            (
                json!({"port": "http", "endPort": 90}),
                ".endPort",
                Problem::EndPortWithoutNumber,
            ),
            (
                json!({"port": 90, "endPort": 80}),
                ".endPort",
                Problem::EndPortBelow { port: 90, end: 80 },
            ),
            (
                json!({"port": 90, "endPort": 70000}),
                ".endPort",
                Problem::PortNumber(70000),
            ),
        ];
        for (port, field, problem) in cases {
            assert_eq!(
                field_of(with_spec(json!({"egress": [{"ports": [port]}]}))),
                (format!("spec.egress[0].ports[0]{field}"), problem)
            );
        }
    }
}
