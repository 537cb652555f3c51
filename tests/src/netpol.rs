//! NetworkPolicy tests as Kubernetes' own e2e suite runs them (`test/e2e/network/netpol`):
//! pods in namespaces, each serving TCP, UDP and SCTP on 80 and 81 (SCTP as
//! `traffic::sctp` can: real associations, or raw packets where the kernel has no SCTP),
//! every pair probed,
//! and the reachability seen compared with the one expected, both printed on a
//! mismatch. Policies reach the daemon through `--policy-file`, written and replaced as
//! a sync job would.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{SocketAddr, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use crate::{
    netns::Netns,
    node::{Node, Pod},
    traffic::{
        EchoServer, UdpEcho,
        sctp::{self, SctpServer},
        spawn_in,
    },
};

/// How long a probe waits for a connection or an answer: a refused one waits it out.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// A policy file in its own folder under /run, removed on drop.
pub struct PolicyFile {
    dir: PathBuf,
    path: PathBuf,
}

impl PolicyFile {
    /// A file holding `yaml` (YAML documents, `---` between them).
    pub fn new(yaml: &str) -> Self {
        let dir = PathBuf::from("/run").join(crate::unique_name("policies"));
        std::fs::create_dir_all(&dir).expect("a folder for the policy file");
        let file = Self {
            path: dir.join("policies.yaml"),
            dir,
        };
        file.replace(yaml);
        file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `--policy-file PATH`, as daemon flags.
    pub fn flags(&self) -> [&str; 2] {
        ["--policy-file", self.path.to_str().expect("a UTF-8 path")]
    }

    /// Writes `yaml` to a new file and renames it over the old one.
    pub fn replace(&self, yaml: &str) {
        let temporary = self.dir.join("policies.yaml.new");
        std::fs::write(&temporary, yaml).expect("the policies written");
        std::fs::rename(&temporary, &self.path).expect("the policy file replaced");
    }
}

impl Drop for PolicyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Names and values are quoted: YAML 1.1, as Kubernetes reads it, takes a bare `y` or
/// `n` for a boolean.
///
/// A Namespace object with `labels` (Kubernetes adds the name label itself).
pub fn namespace_yaml(name: &str, labels: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: \"{name}\"\n  labels:\n    \
         kubernetes.io/metadata.name: \"{name}\"\n"
    );
    for (key, value) in labels {
        let _ = writeln!(yaml, "    {key}: \"{value}\"");
    }
    yaml
}

/// A Pod object of `namespace` with `labels`, serving TCP 80 and 81 and UDP 80 under
/// upstream's port names (`serve-80-tcp`, `serve-81-tcp`, `serve-80-udp`), at `ip`
/// when it has one yet.
pub fn pod_yaml(namespace: &str, name: &str, labels: &[(&str, &str)], ip: Option<&str>) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  namespace: \"{namespace}\"\n  name: \"{name}\"\n  labels:\n"
    );
    for (key, value) in labels {
        let _ = writeln!(yaml, "    {key}: \"{value}\"");
    }
    yaml.push_str(
        "spec:\n  containers:\n  - name: cont-80-tcp\n    ports:\n    - name: serve-80-tcp\n      \
         containerPort: 80\n      protocol: TCP\n  - name: cont-81-tcp\n    ports:\n    - name: \
         serve-81-tcp\n      containerPort: 81\n      protocol: TCP\n  - name: cont-80-udp\n    \
         ports:\n    - name: serve-80-udp\n      containerPort: 80\n      protocol: UDP\n",
    );
    if let Some(ip) = ip {
        let _ = write!(
            yaml,
            "status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n"
        );
    }
    yaml
}

/// Documents joined as one YAML stream.
pub fn stream(documents: &[String]) -> String {
    documents.join("---\n")
}

/// What a probe uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

/// A pod's servers: TCP, UDP and SCTP on 80 and 81.
type Servers = (
    EchoServer,
    EchoServer,
    UdpEcho,
    UdpEcho,
    SctpServer,
    SctpServer,
);

/// How long a model pod serves: a whole run of the upstream cases, with room.
fn serving() -> Duration {
    crate::scaled(Duration::from_secs(900))
}

fn servers(netns: &Netns) -> Servers {
    (
        EchoServer::start_for(netns, 80, serving()),
        EchoServer::start_for(netns, 81, serving()),
        UdpEcho::start_for(netns, 80, serving()),
        UdpEcho::start_for(netns, 81, serving()),
        SctpServer::start_for(netns, 80, serving()),
        SctpServer::start_for(netns, 81, serving()),
    )
}

/// A pod of the model: its namespace and name, the pod itself, and its servers (kept
/// running while it lives, up to [`serving`]).
pub struct ModelPod {
    pub namespace: String,
    pub name: String,
    pub pod: Pod,
    _servers: Servers,
}

impl ModelPod {
    /// `namespace/name`, as the matrices print it.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.pod.ip, port))
    }
}

/// Adds pod `namespace/name` to `node` through the real plugin, its runtime naming it
/// as kubelet does (`K8S_POD_NAMESPACE`, `K8S_POD_NAME` in `CNI_ARGS`), and starts its
/// servers.
pub fn add_pod(node: &Node, namespace: &str, name: &str) -> ModelPod {
    let pod = node.add_kubernetes_pod(&crate::unique_name(name), namespace, name);
    serve(namespace, name, pod)
}

/// Like [`add_pod`], the pod on a netkit pair.
pub fn add_netkit_pod(node: &Node, namespace: &str, name: &str) -> ModelPod {
    let pod = node.add_kubernetes_pod_on(&crate::unique_name(name), namespace, name, true);
    serve(namespace, name, pod)
}

/// `pod`, serving as the model's pods do.
pub fn serve(namespace: &str, name: &str, pod: Pod) -> ModelPod {
    ModelPod {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        _servers: servers(&pod.netns),
        pod,
    }
}

/// A `List` of Namespaces (name and labels), Pods (namespace, name, labels, address;
/// serving as [`pod_yaml`]'s) and `policies`, as JSON: what `kubectl get -o json`
/// prints.
pub fn objects_json(
    namespaces: &[(String, BTreeMap<String, String>)],
    pods: &[(String, String, BTreeMap<String, String>, String)],
    policies: &[serde_json::Value],
) -> String {
    let mut items: Vec<serde_json::Value> = namespaces
        .iter()
        .map(|(name, labels)| namespace_json(name, labels, "1"))
        .collect();
    items.extend(
        pods.iter()
            .map(|(namespace, name, labels, ip)| pod_json(namespace, name, labels, ip, "1")),
    );
    items.extend(policies.iter().cloned());
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// A Namespace object, at `version`.
pub fn namespace_json(
    name: &str,
    labels: &BTreeMap<String, String>,
    version: &str,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels, "resourceVersion": version},
    })
}

/// A Pod object at `ip`, serving TCP, UDP and SCTP on 80 and 81 under upstream's port names,
/// at `version`.
pub fn pod_json(
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    ip: &str,
    version: &str,
) -> serde_json::Value {
    let containers: Vec<serde_json::Value> = [
        (80, "TCP"),
        (81, "TCP"),
        (80, "UDP"),
        (81, "UDP"),
        (80, "SCTP"),
        (81, "SCTP"),
    ]
    .iter()
    .map(|(port, protocol)| {
        let lower = protocol.to_lowercase();
        serde_json::json!({
            "name": format!("cont-{port}-{lower}"),
            "image": "agnhost",
            "ports": [{"name": format!("serve-{port}-{lower}"), "containerPort": port,
                       "protocol": protocol}],
        })
    })
    .collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "labels": labels,
                     "resourceVersion": version},
        "spec": {"containers": containers},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

/// Whether a client in `from` reaches `to` with `protocol`: a TCP connection
/// established, a UDP datagram echoed, or an SCTP association made (or its raw packet
/// echoed: `traffic::sctp`), within [`PROBE_TIMEOUT`].
pub fn reaches(from: &Netns, to: SocketAddr, protocol: Protocol) -> thread::JoinHandle<bool> {
    spawn_in(from, move || match protocol {
        Protocol::Tcp => TcpStream::connect_timeout(&to, PROBE_TIMEOUT).is_ok(),
        Protocol::Udp => {
            let Ok(socket) = UdpSocket::bind(("0.0.0.0", 0)) else {
                return false;
            };
            let _ = socket.set_read_timeout(Some(PROBE_TIMEOUT));
            if socket.connect(to).is_err() || socket.send(b"probe").is_err() {
                return false;
            }
            let mut buffer = [0u8; 16];
            socket.recv(&mut buffer).is_ok()
        }
        Protocol::Sctp => sctp::reaches(to, PROBE_TIMEOUT),
    })
}

/// Who reaches whom: `(from, to) -> reached`, by label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reachability {
    pub cells: BTreeMap<(String, String), bool>,
}

impl Reachability {
    /// Every pair of `pods` (a pod and itself too) as `all` says.
    pub fn all(pods: &[&ModelPod], all: bool) -> Self {
        let mut cells = BTreeMap::new();
        for from in pods {
            for to in pods {
                cells.insert((from.label(), to.label()), all);
            }
        }
        Self { cells }
    }

    /// Sets every pair whose source label satisfies `from` and destination `to`, but a
    /// pod and itself: what a pod sends to its own address never leaves it (upstream's
    /// `AllowLoopback`).
    pub fn set(
        &mut self,
        from: impl Fn(&str) -> bool,
        to: impl Fn(&str) -> bool,
        reached: bool,
    ) -> &mut Self {
        for ((source, destination), cell) in &mut self.cells {
            if source != destination && from(source) && to(destination) {
                *cell = reached;
            }
        }
        self
    }

    /// The matrix as upstream prints it: a row per source, `.` reached, `X` not.
    pub fn table(&self) -> String {
        let labels: Vec<&String> = {
            let mut labels: Vec<&String> = self.cells.keys().map(|(from, _)| from).collect();
            labels.dedup();
            labels
        };
        let mut text = format!("{:<10}", "");
        for to in &labels {
            let _ = write!(text, " {to:<6}");
        }
        text.push('\n');
        for from in &labels {
            let _ = write!(text, "{from:<10}");
            for to in &labels {
                let mark = match self.cells.get(&((*from).clone(), (*to).clone())) {
                    Some(true) => ".",
                    Some(false) => "X",
                    None => "?",
                };
                let _ = write!(text, " {mark:<6}");
            }
            text.push('\n');
        }
        text
    }
}

/// What `reach` says of every pair of `pods`.
pub fn expected(pods: &[&ModelPod], reach: impl Fn(&ModelPod, &ModelPod) -> bool) -> Reachability {
    let mut cells = BTreeMap::new();
    for from in pods {
        for to in pods {
            cells.insert((from.label(), to.label()), reach(from, to));
        }
    }
    Reachability { cells }
}

/// Probes every pair of `pods` on `port` with `protocol`, all at once.
pub fn probe_all(pods: &[&ModelPod], port: u16, protocol: Protocol) -> Reachability {
    let probes: Vec<((String, String), thread::JoinHandle<bool>)> = pods
        .iter()
        .flat_map(|from| {
            pods.iter().map(move |to| {
                (
                    (from.label(), to.label()),
                    reaches(&from.pod.netns, to.addr(port), protocol),
                )
            })
        })
        .collect();
    Reachability {
        cells: probes
            .into_iter()
            .map(|(pair, probe)| (pair, probe.join().unwrap_or(false)))
            .collect(),
    }
}

/// Probes until the reachability seen is `expected` (a policy change takes effect
/// within a second or so; the wait is stretched in a slow guest); panics with both
/// matrices when it never is.
pub fn expect_reachability(
    what: &str,
    pods: &[&ModelPod],
    port: u16,
    protocol: Protocol,
    expected: &Reachability,
) {
    let deadline = std::time::Instant::now() + crate::scaled(Duration::from_secs(8));
    let mut seen = probe_all(pods, port, protocol);
    while &seen != expected && std::time::Instant::now() < deadline {
        thread::sleep(Duration::from_millis(500));
        seen = probe_all(pods, port, protocol);
    }
    assert_eq!(
        &seen,
        expected,
        "{what}, {protocol:?} port {port}:\nexpected\n{}\nseen\n{}",
        expected.table(),
        seen.table()
    );
}
