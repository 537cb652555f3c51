//! A fake Kubernetes API server for watches of every object of a kind (Nodes, Namespaces,
//! Pods, NetworkPolicies: [`KINDS`]), in HTTP/1.1, plain or over TLS with a certificate
//! from a CA the test makes (`tls`), on 127.0.0.1 or where the caller bound its listener.
//! Shared by the daemon's tests (`tests/tests/cluster`), the policy benchmark (`cargo
//! xtask bench`), and cni-nodes' and cni-policy's tests, which include this file by path.
//!
//! It speaks the wire format kube's client reads from a real server: `GET /api/v1/nodes`
//! answered with a `NodeList` (a `PodList` for `/api/v1/pods`, ...) carrying
//! `metadata.resourceVersion`, and `GET /api/v1/nodes?watch=true&resourceVersion=...`
//! answered with a chunked stream of newline-delimited watch events (`ADDED`, `MODIFIED`,
//! `DELETED`, `BOOKMARK`, `ERROR` with a `Status`), which the test can end cleanly or cut
//! off mid-stream. Every request is handed to the test, which decides the answer, so the
//! test both scripts the server and asserts what the client asked for, and sent: the
//! `Authorization` header. A client watching several kinds sends its requests in any
//! order: the test takes the next one for a path, and the others wait their turn. Over
//! TLS, a failed handshake (a client refusing the certificate) is handed to the test too.
//!
//! Not covered: authentication and authorization (the `Authorization` header is recorded,
//! never checked; no client certificates; no 401 or 403 unless the test answers one),
//! HTTP/2, the protobuf encoding, pagination (`limit` is ignored and no `continue`
//! token is given), resourceVersion semantics (`resourceVersion`, `resourceVersionMatch`
//! and `timeoutSeconds` mean what the test makes of them), watch-list streaming
//! (`sendInitialEvents`), selectors, discovery, compression, and throttling (429, API
//! priority and fairness).

#![allow(
    dead_code,
    reason = "each test binary that includes it by path uses a part of it"
)]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::AUTHORIZATION;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

pub mod tls;

type Body = BoxBody<Bytes, io::Error>;

/// How long the test waits for the client's next request.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where every object of a kind is listed and watched.
pub const NODES: &str = "/api/v1/nodes";
pub const NAMESPACES: &str = "/api/v1/namespaces";
pub const PODS: &str = "/api/v1/pods";
pub const NETWORK_POLICIES: &str = "/apis/networking.k8s.io/v1/networkpolicies";

/// The kinds served: path, kind and apiVersion.
pub const KINDS: [(&str, &str, &str); 4] = [
    (NODES, "Node", "v1"),
    (NAMESPACES, "Namespace", "v1"),
    (PODS, "Pod", "v1"),
    (NETWORK_POLICIES, "NetworkPolicy", "networking.k8s.io/v1"),
];

/// The kind and apiVersion of the objects at `path`.
fn kind_at(path: &str) -> (&'static str, &'static str) {
    KINDS
        .iter()
        .find(|(at, _, _)| *at == path)
        .map(|(_, kind, api_version)| (*kind, *api_version))
        .unwrap_or_else(|| panic!("the fake API server serves nothing at {path}"))
}

pub struct FakeApi {
    addr: SocketAddr,
    /// `http` or `https`.
    scheme: &'static str,
    calls: mpsc::UnboundedReceiver<Call>,
    /// Requests received while the test waited for one to another path, in order.
    waiting: VecDeque<Call>,
    /// Why TLS handshakes failed, in order.
    refusals: mpsc::UnboundedReceiver<String>,
    server: JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeApi {
    pub async fn start() -> Self {
        Self::start_on(std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1"))
    }

    /// Serves plain HTTP on `listener`, bound by the caller (in another network
    /// namespace, say).
    pub fn start_on(listener: std::net::TcpListener) -> Self {
        Self::serve(listener, None)
    }

    /// Serves HTTPS on `listener` with `tls` (a [`tls::Ca`]'s server configuration).
    pub fn start_tls_on(listener: std::net::TcpListener, tls: Arc<ServerConfig>) -> Self {
        Self::serve(listener, Some(TlsAcceptor::from(tls)))
    }

    fn serve(listener: std::net::TcpListener, tls: Option<TlsAcceptor>) -> Self {
        listener
            .set_nonblocking(true)
            .expect("a nonblocking listener");
        let listener = TcpListener::from_std(listener).expect("a tokio listener");
        let addr = listener.local_addr().expect("listener address");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let (refusals_tx, refusals) = mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let calls_tx = calls_tx.clone();
                let refusals_tx = refusals_tx.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => serve_connection(stream, calls_tx).await,
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => serve_connection(stream, calls_tx).await,
                            Err(error) => {
                                let _ = refusals_tx.send(error.to_string());
                            }
                        },
                    }
                });
            }
        });
        Self {
            addr,
            scheme,
            calls,
            waiting: VecDeque::new(),
            refusals,
            server,
        }
    }

    /// Where clients reach this server: `http://IP:PORT` or `https://IP:PORT`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// A kubeconfig whose current context is this server, without credentials.
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_with("", "{}")
    }

    /// A kubeconfig whose current context is this server over TLS, trusting the CA in
    /// `ca_file`, with `token` as the bearer token.
    pub fn tls_kubeconfig(&self, ca_file: &std::path::Path, token: &str) -> String {
        let ca = format!("\n    certificate-authority: {}", ca_file.display());
        self.kubeconfig_with(&ca, &format!("\n    token: {token}"))
    }

    /// A kubeconfig for this server: `cluster` continues its cluster's fields (after
    /// `server`), `user` is its user's value.
    fn kubeconfig_with(&self, cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {}{cluster}
users:
- name: fake
  user: {user}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
current-context: fake
",
            self.url()
        )
    }

    /// The client's next request.
    pub async fn next_call(&mut self) -> Call {
        if let Some(call) = self.waiting.pop_front() {
            return call;
        }
        self.receive().await
    }

    /// The client's next request to `path`; those to other paths wait for
    /// [`Self::next_call`] or their own.
    pub async fn next_call_to(&mut self, path: &str) -> Call {
        if let Some(at) = self.waiting.iter().position(|call| call.path == path)
            && let Some(call) = self.waiting.remove(at)
        {
            return call;
        }
        loop {
            let call = self.receive().await;
            if call.path == path {
                return call;
            }
            self.waiting.push_back(call);
        }
    }

    async fn receive(&mut self) -> Call {
        match tokio::time::timeout(CALL_TIMEOUT, self.calls.recv()).await {
            Ok(Some(call)) => call,
            Ok(None) => panic!("the fake API server stopped"),
            Err(_) => panic!(
                "no request to the fake API server within {CALL_TIMEOUT:?}; waiting: {:?}",
                self.waiting
            ),
        }
    }

    /// The request the client sent and nobody took yet, if any: to show that none came.
    pub fn pending_call(&mut self) -> Option<Call> {
        self.waiting
            .pop_front()
            .or_else(|| self.calls.try_recv().ok())
    }

    /// Why the next TLS handshake failed (a client that refuses the server's
    /// certificate says so with an alert).
    pub async fn next_refusal(&mut self) -> String {
        match tokio::time::timeout(CALL_TIMEOUT, self.refusals.recv()).await {
            Ok(Some(refusal)) => refusal,
            Ok(None) => panic!("the fake API server stopped"),
            Err(_) => panic!("no TLS handshake failed within {CALL_TIMEOUT:?}"),
        }
    }

    /// The next request for the nodes, which must be a list (requests for other kinds
    /// wait for their own).
    pub async fn expect_list(&mut self) -> Call {
        let call = self.next_call_to(NODES).await;
        assert_eq!(call.path, NODES, "{call:?}");
        assert!(!call.is_watch(), "expected a list, got {call:?}");
        call
    }

    /// The next request for the nodes, which must be a watch from `resource_version`.
    pub async fn expect_watch(&mut self, resource_version: &str) -> WatchStream {
        let call = self.next_call_to(NODES).await;
        assert_eq!(call.path, NODES, "{call:?}");
        Self::watch_from(call, resource_version)
    }

    /// The next request to `path` (one of [`KINDS`]), which must be a list.
    pub async fn expect_list_of(&mut self, path: &str) -> Call {
        let call = self.next_call_to(path).await;
        assert!(!call.is_watch(), "expected a list, got {call:?}");
        call
    }

    /// The next request to `path`, which must be a watch from `resource_version`.
    pub async fn expect_watch_of(&mut self, path: &str, resource_version: &str) -> WatchStream {
        let call = self.next_call_to(path).await;
        Self::watch_from(call, resource_version)
    }

    fn watch_from(call: Call, resource_version: &str) -> WatchStream {
        assert!(call.is_watch(), "expected a watch, got {call:?}");
        assert_eq!(
            call.param("resourceVersion"),
            Some(resource_version),
            "{call:?}"
        );
        assert_eq!(call.param("allowWatchBookmarks"), Some("true"), "{call:?}");
        call.stream()
    }
}

/// One request, waiting for the test's answer.
pub struct Call {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
    reply: oneshot::Sender<Response<Body>>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {:?}", self.method, self.path, self.query)
    }
}

impl Call {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    pub fn is_watch(&self) -> bool {
        self.param("watch").is_some_and(|v| v == "true" || v == "1")
    }

    /// Answers with a list of the kind its path serves (a `NodeList`, a `PodList`, ...) at
    /// `resource_version`.
    pub fn reply_list(self, resource_version: &str, items: &[Value]) {
        let (kind, api_version) = kind_at(&self.path);
        let list = json!({
            "kind": format!("{kind}List"),
            "apiVersion": api_version,
            "metadata": {"resourceVersion": resource_version},
            "items": items,
        });
        let body = Full::new(Bytes::from(list.to_string()))
            .map_err(|never| match never {})
            .boxed();
        self.reply(StatusCode::OK, body);
    }

    /// Answers with a failure `Status`, as the API server does.
    pub fn reply_failure(self, code: u16, reason: &str) {
        let status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("the fake server says {reason}"),
            "reason": reason,
            "code": code,
        });
        let body = Full::new(Bytes::from(status.to_string()))
            .map_err(|never| match never {})
            .boxed();
        self.reply(StatusCode::from_u16(code).expect("an HTTP status"), body);
    }

    /// Answers with a stream of watch events that the returned handle writes.
    pub fn stream(self) -> WatchStream {
        let (tx, rx) = mpsc::unbounded_channel::<Result<Bytes, io::Error>>();
        let frames = futures::stream::unfold(rx, |mut rx| async move {
            let item = rx.recv().await?;
            Some((item.map(Frame::data), rx))
        });
        let (kind, api_version) = kind_at(&self.path);
        self.reply(StatusCode::OK, StreamBody::new(frames).boxed());
        WatchStream {
            tx,
            kind,
            api_version,
        }
    }

    fn reply(self, status: StatusCode, body: Body) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(body)
            .expect("a valid response");
        // The client may have given up on this request; then nobody reads the answer.
        let _ = self.reply.send(response);
    }
}

/// The body of a watch response, open until dropped.
pub struct WatchStream {
    tx: mpsc::UnboundedSender<Result<Bytes, io::Error>>,
    /// The kind watched, for bookmarks.
    kind: &'static str,
    api_version: &'static str,
}

impl WatchStream {
    /// Writes one event, a line of JSON, in a chunk of its own.
    pub fn event(&self, kind: &str, object: Value) {
        let mut line = json!({"type": kind, "object": object}).to_string();
        line.push('\n');
        self.tx
            .send(Ok(Bytes::from(line)))
            .expect("the watch response is still being sent");
    }

    pub fn bookmark(&self, resource_version: &str) {
        self.event(
            "BOOKMARK",
            json!({
                "kind": self.kind,
                "apiVersion": self.api_version,
                "metadata": {"resourceVersion": resource_version},
            }),
        );
    }

    /// Sends what the API server sends when the watched version was compacted away,
    /// then ends the response as it does.
    pub fn expire(self) {
        self.event(
            "ERROR",
            json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "too old resource version: 10 (25)",
                "reason": "Expired",
                "code": 410,
            }),
        );
    }

    /// Resolves when the client has closed the connection.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Cuts the connection in the middle of the chunked body.
    pub fn cut(self) {
        let _ = self
            .tx
            .send(Err(io::Error::other("connection cut by the test")));
    }
}

/// Serves HTTP/1.1 on one connection, plain or TLS, until it ends.
async fn serve_connection<S>(stream: S, calls: mpsc::UnboundedSender<Call>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| handle(request, calls.clone()));
    // A connection the test cuts off ends here with an error, on purpose.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(
    request: Request<Incoming>,
    calls: mpsc::UnboundedSender<Call>,
) -> Result<Response<Body>, Infallible> {
    let query = request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) => (key.to_owned(), value.to_owned()),
            None => (pair.to_owned(), String::new()),
        })
        .collect();
    let (reply, answer) = oneshot::channel();
    let call = Call {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
        query,
        authorization: request
            .headers()
            .get(AUTHORIZATION)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned()),
        reply,
    };
    if calls.send(call).is_ok()
        && let Ok(response) = answer.await
    {
        return Ok(response);
    }
    let body = Full::new(Bytes::from_static(b"{}"))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    Ok(response)
}

/// A node as the API server serves it, with the fields the crate reads and some it does
/// not.
pub fn node(name: &str, resource_version: &str, address: &str, pod_cidrs: &[&str]) -> Value {
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": format!("00000000-0000-4000-8000-{:012}", name.len()),
            "resourceVersion": resource_version,
            "creationTimestamp": "2026-11-02T09:14:27Z",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {
            "podCIDR": pod_cidrs.first(),
            "podCIDRs": pod_cidrs,
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "lastHeartbeatTime": "2026-11-03T10:01:55Z",
                "lastTransitionTime": "2026-11-02T09:14:40Z",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
            }],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    })
}
