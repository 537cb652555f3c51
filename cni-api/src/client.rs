//! One typed client of the daemon, for the plugin and the CLI: a method per request,
//! each returning its answer's content, or a [`CallError`] that says whether the daemon
//! was not reached, refused, or answered something else.

use std::{path::PathBuf, time::Duration};

use crate::{
    ClientError, DaemonError, Endpoint, EndpointId, ErrorKind, LinkCounters, NodesView,
    PoliciesView, Request, Response, Status, frame,
};

/// Why a call did not give its answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The daemon was not reached, or its answer did not arrive whole.
    #[error(transparent)]
    Transport(#[from] ClientError),
    /// The daemon refused the request.
    #[error("the daemon refused: {0}")]
    Refused(DaemonError),
    /// The daemon answered with something this request does not take.
    #[error("unexpected answer from the daemon: {0:?}")]
    Unexpected(Box<Response>),
}

impl CallError {
    /// Whether nobody listens on the socket (as opposed to any answer).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Transport(ClientError::Unreachable { .. }))
    }
}

/// The endpoints and what the daemon adds to them for the CLI (see
/// [`Response::Endpoints`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointList {
    pub endpoints: Vec<Endpoint>,
    pub stack_sent: Vec<LinkCounters>,
    pub queued: Vec<u32>,
}

/// The daemon at `socket`, each call waiting at most `timeout` per read or write.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// Whether a daemon answers at all (with anything that decodes, a refusal too).
    pub fn answers(&self) -> bool {
        frame::call(&self.socket, &Request::Status, self.timeout).is_ok()
    }

    pub fn status(&self) -> Result<Status, CallError> {
        match self.request(&Request::Status)? {
            Response::Status(status) => Ok(status),
            other => Err(unexpected(other)),
        }
    }

    /// Gets `host_veth` ready ahead of [`Self::attach`].
    pub fn prepare(&self, host_veth: &str) -> Result<(), CallError> {
        let request = Request::Prepare {
            host_veth: host_veth.to_owned(),
        };
        match self.request(&request)? {
            Response::Prepared => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Undoes [`Self::prepare`]; returns whether the program was detached.
    pub fn unprepare(&self, host_veth: &str) -> Result<bool, CallError> {
        let request = Request::Unprepare {
            host_veth: host_veth.to_owned(),
        };
        match self.request(&request)? {
            Response::Unprepared { detached } => Ok(detached),
            other => Err(unexpected(other)),
        }
    }

    pub fn attach(&self, endpoint: Endpoint) -> Result<(), CallError> {
        match self.request(&Request::Attach(Box::new(endpoint)))? {
            Response::Attached => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Returns whether the daemon knew the endpoint.
    pub fn detach(&self, id: EndpointId) -> Result<bool, CallError> {
        match self.request(&Request::Detach(id))? {
            Response::Detached { existed } => Ok(existed),
            other => Err(unexpected(other)),
        }
    }

    pub fn get(&self, id: EndpointId) -> Result<Option<Endpoint>, CallError> {
        match self.request(&Request::Get(id))? {
            Response::Endpoint { endpoint } => Ok(endpoint),
            other => Err(unexpected(other)),
        }
    }

    pub fn list(&self) -> Result<EndpointList, CallError> {
        match self.request(&Request::List)? {
            Response::Endpoints {
                endpoints,
                stack_sent,
                queued,
            } => Ok(EndpointList {
                endpoints,
                stack_sent,
                queued,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Forgets `network`'s endpoints not in `keep`; returns them.
    pub fn gc(&self, network: &str, keep: Vec<EndpointId>) -> Result<Vec<Endpoint>, CallError> {
        let request = Request::Gc {
            network: network.to_owned(),
            keep,
        };
        match self.request(&request)? {
            Response::Collected { removed } => Ok(removed),
            other => Err(unexpected(other)),
        }
    }

    pub fn nodes(&self) -> Result<NodesView, CallError> {
        match self.request(&Request::Nodes)? {
            Response::Nodes(view) => Ok(view),
            other => Err(unexpected(other)),
        }
    }

    pub fn policies(&self) -> Result<PoliciesView, CallError> {
        match self.request(&Request::Policies)? {
            Response::Policies(view) => Ok(view),
            other => Err(unexpected(other)),
        }
    }

    /// The answer to `request`, refusals made errors.
    fn request(&self, request: &Request) -> Result<Response, CallError> {
        match frame::call(&self.socket, request, self.timeout)? {
            Response::Error(error) => Err(CallError::Refused(error)),
            Response::PortConflict { message } => Err(CallError::Refused(DaemonError::new(
                ErrorKind::PortConflict,
                message,
            ))),
            response => Ok(response),
        }
    }
}

fn unexpected(response: Response) -> CallError {
    CallError::Unexpected(Box::new(response))
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        os::unix::net::UnixListener,
        thread,
    };

    use super::*;
    use crate::{Envelope, PROTOCOL_VERSION, encode, frame_len};

    /// A daemon at a fresh socket that answers one request with `answer` (raw JSON of
    /// the response body); returns the client and the request it received.
    fn daemon_answering(answer: &str) -> (Client, thread::JoinHandle<Request>) {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cni-api-client-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let socket = dir.join("d.sock");
        let client = Client::new(&socket, Duration::from_secs(5));
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("a socket");
        let body: serde_json::Value = serde_json::from_str(answer).expect("JSON");
        let served = thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("a connection");
            std::fs::remove_dir_all(&dir).expect("the folder removed");
            let mut len = [0u8; 4];
            stream.read_exact(&mut len).expect("a length");
            let mut request = vec![0u8; frame_len(len).expect("a frame")];
            stream.read_exact(&mut request).expect("a request");
            let request: Envelope<Request> = serde_json::from_slice(&request).expect("a request");
            let envelope = Envelope {
                version: PROTOCOL_VERSION,
                body,
            };
            stream
                .write_all(&encode(&envelope).expect("encoded"))
                .expect("answered");
            request.body
        });
        (client, served)
    }

    #[test]
    fn a_refusal_comes_with_its_kind_and_an_older_daemons_without_one() {
        let (client, served) = daemon_answering(
            r#"{"response": "error", "kind": "address_taken", "message": "10.0.0.2 is taken"}"#,
        );
        match client.status() {
            Err(CallError::Refused(refusal)) => {
                assert_eq!(refusal.kind, ErrorKind::AddressTaken);
                assert_eq!(refusal.to_string(), "10.0.0.2 is taken");
            }
            other => panic!("a refusal, not {other:?}"),
        }
        assert_eq!(served.join().expect("served"), Request::Status);

        let (client, _) = daemon_answering(r#"{"response": "error", "message": "no"}"#);
        match client.detach(EndpointId {
            container_id: "c".into(),
            ifname: "eth0".into(),
        }) {
            Err(CallError::Refused(refusal)) => {
                assert_eq!(refusal.kind, ErrorKind::Unspecified, "no kind given");
            }
            other => panic!("a refusal, not {other:?}"),
        }

        let (client, _) =
            daemon_answering(r#"{"response": "port_conflict", "message": "30080/tcp is held"}"#);
        match client.prepare("veb0") {
            Err(CallError::Refused(refusal)) => {
                assert_eq!(refusal.kind, ErrorKind::PortConflict);
                assert_eq!(refusal.message, "30080/tcp is held");
            }
            other => panic!("a conflict, not {other:?}"),
        }
    }

    #[test]
    fn an_answer_of_another_request_is_unexpected_and_no_daemon_is_unreachable() {
        let (client, _) = daemon_answering(r#"{"response": "attached"}"#);
        assert!(matches!(client.list(), Err(CallError::Unexpected(_))));
        let (client, _) = daemon_answering(r#"{"response": "detached", "existed": true}"#);
        assert!(client.answers(), "any answer counts");

        let nobody = Client::new("/nonexistent/ebpf-cnid.sock", Duration::from_secs(1));
        let error = nobody.status().expect_err("nobody listens");
        assert!(error.is_unreachable(), "{error:?}");
        assert!(!nobody.answers());
    }

    #[test]
    fn the_policies_come_back_as_the_daemon_wrote_them() {
        let (client, served) = daemon_answering(
            r#"{"response": "policies", "source": "file /etc/policies.yaml", "answered": true,
                "mode": "enforce", "generation": 3,
                "policies": [{"namespace": "x", "name": "deny", "slot": 0, "ingress": true,
                              "egress": false, "selects": ["x/a"]}],
                "pods": [{"namespace": "x", "name": "a", "ingress": true, "egress": false}],
                "refused": [{"object": "NetworkPolicy x/odd", "reason": "no"}]}"#,
        );
        let view = client.policies().expect("the policies");
        assert_eq!(served.join().expect("served"), Request::Policies);
        assert_eq!(view.policies[0].selects, ["x/a"]);
        assert_eq!(view.refused[0].object, "NetworkPolicy x/odd");
        assert_eq!(view.generation, 3);
    }

    #[test]
    fn a_refusal_is_written_flat_with_its_kind() {
        let response = Response::Error(DaemonError::new(ErrorKind::InvalidRequest, "bad id"));
        assert_eq!(
            serde_json::to_value(&response).expect("JSON"),
            serde_json::json!({"response": "error", "kind": "invalid_request", "message": "bad id"})
        );
        let newer: Response = serde_json::from_value(
            serde_json::json!({"response": "error", "kind": "from_the_future", "message": "m"}),
        )
        .expect("a kind this side does not know still reads");
        assert_eq!(
            newer,
            Response::Error(DaemonError::new(ErrorKind::Unspecified, "m"))
        );
    }
}
