//! The unix socket the plugin talks to: root-only (mode 0600), one request per
//! connection, answered from the synchronous core under a mutex, on a blocking thread.
//!
//! A client is bounded in number and in time: at most [`MAX_CONNECTIONS`] are served at
//! once (the rest wait in the listen backlog, using no file of the daemon's), each has
//! [`IO_TIMEOUT`] to send its request and take the answer, and a failed `accept` (out of
//! files) is retried with a backoff rather than ending the daemon.

use std::{
    fs, io,
    os::unix::fs::DirBuilderExt,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
    sync::Semaphore,
};

use cni_api::{self as api, DaemonError, Envelope, ErrorKind, PROTOCOL_VERSION, Request, Response};

use crate::{
    front::{
        big_tcp, link_stats,
        metrics::{self, NodeView, Telemetry},
    },
    model::{
        hostports::HostPortError,
        node::{LocalNode, NodeError},
        record::EndpointRecord,
    },
};

/// Connections served at once. Requests run one at a time under the node's lock, so
/// more in flight would not answer faster; 32 covers a runtime's parallel ADDs and DELs
/// (kubelet starts pods a few at a time) with room, while bounding what idle or slow
/// clients hold: 32 sockets and at most 32 request buffers (4 MiB each at most,
/// `cni_api::MAX_FRAME`).
pub const MAX_CONNECTIONS: usize = 32;

/// Time a client has to send its whole request, and then to take the answer. The
/// plugin writes its request as soon as it is connected (a few KiB) and waits 10 s for
/// the answer: 5 s is far more than a busy node needs, and frees an idle connection's
/// slot quickly.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// First and longest pause after a failed `accept` (doubling in between, reset by the
/// next success): long enough not to spin while the process is out of files, short
/// enough to serve again soon after a connection closes.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Binds `path`, replacing a stale socket left by a killed daemon, with mode 0600. A
/// folder it has to create is made 0700; an existing one is left as it is (it may be
/// `/run`). Both are created with their modes (the umask is narrowed around the calls),
/// never readable by others for a moment before a chmod.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        && !parent.exists()
    {
        with_umask(0o077, || {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
        })?;
    }
    crate::files::remove_file(path)?;
    // A socket is made with mode 0777 less the umask.
    with_umask(0o177, || UnixListener::bind(path))
}

/// Runs `make` under the umask `mask`, then puts the previous one back. The umask is
/// the process's: a file another thread made meanwhile could only come out less
/// readable, and the installer (which writes the plugin's executable) starts after.
fn with_umask<T>(mask: u32, make: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    use nix::sys::stat::{Mode, umask};
    let previous = umask(Mode::from_bits_truncate(mask));
    let made = make();
    umask(previous);
    made
}

/// Accepts connections for as long as the daemon runs, [`MAX_CONNECTIONS`] at a time.
/// Every request's time is counted in `telemetry`, and the node's view is published
/// there after every request that changes the endpoints.
pub async fn serve(listener: UnixListener, node: Arc<Mutex<LocalNode>>, telemetry: Arc<Telemetry>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        // The semaphore is never closed: acquiring only waits.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                stream
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "cannot accept a connection");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let node = Arc::clone(&node);
        let telemetry = Arc::clone(&telemetry);
        tokio::spawn(async move {
            if let Err(error) = handle(stream, node, telemetry).await {
                tracing::warn!(%error, "request failed");
            }
            drop(slot);
        });
    }
}

/// Reads the request frame of `stream`, within [`IO_TIMEOUT`].
async fn read_request(stream: &mut UnixStream) -> anyhow::Result<Vec<u8>> {
    let read = async {
        let mut prefix = [0u8; 4];
        stream.read_exact(&mut prefix).await?;
        let mut body = vec![0u8; api::frame_len(prefix)?];
        stream.read_exact(&mut body).await?;
        anyhow::Ok(body)
    };
    tokio::time::timeout(IO_TIMEOUT, read)
        .await
        .map_err(|_| anyhow::anyhow!("no complete request within {IO_TIMEOUT:?}"))?
}

async fn handle(
    mut stream: UnixStream,
    node: Arc<Mutex<LocalNode>>,
    telemetry: Arc<Telemetry>,
) -> anyhow::Result<()> {
    let body = read_request(&mut stream).await?;
    let arrived = std::time::Instant::now();
    let response = match serde_json::from_slice::<Envelope<Request>>(&body) {
        Ok(envelope) if envelope.version == PROTOCOL_VERSION => {
            let command = metrics::command_of(&envelope.body);
            // Node work blocks (maps, netlink, files, the node's lock): on a blocking
            // thread, so that the runtime's workers keep serving I/O meanwhile.
            let published = Arc::clone(&telemetry);
            let mut response =
                tokio::task::spawn_blocking(move || answer(envelope.body, &node, &published))
                    .await
                    .unwrap_or_else(|error| {
                        Response::Error(DaemonError::new(
                            ErrorKind::Internal,
                            format!("the request failed: {error}"),
                        ))
                    });
            telemetry.observe_request(command, arrived.elapsed());
            match &mut response {
                Response::Endpoints { stack_sent, .. } => match link_stats::tx_counters().await {
                    Ok(counters) => *stack_sent = counters,
                    Err(error) => tracing::warn!(%error, "cannot read the veths' counters"),
                },
                Response::Status(status) => {
                    let uplinks: Vec<String> =
                        status.uplinks.iter().map(|u| u.name.clone()).collect();
                    // Read at each request: new pods follow the uplinks as they are now.
                    match big_tcp::pod_size_for_all(&uplinks).await {
                        Ok(size) => status.pod_gso_max_size = size,
                        Err(error) => {
                            tracing::warn!(%error, "cannot read the uplinks' GSO size")
                        }
                    }
                }
                _ => {}
            }
            response
        }
        Ok(envelope) => Response::Error(DaemonError::new(
            ErrorKind::Protocol,
            format!(
                "protocol version {} is not served (this daemon: {PROTOCOL_VERSION})",
                envelope.version
            ),
        )),
        Err(error) => Response::Error(DaemonError::new(
            ErrorKind::Protocol,
            format!("malformed request: {error}"),
        )),
    };
    let frame = api::encode(&Envelope {
        version: PROTOCOL_VERSION,
        body: response,
    })?;
    tokio::time::timeout(IO_TIMEOUT, stream.write_all(&frame))
        .await
        .map_err(|_| anyhow::anyhow!("the client took no answer within {IO_TIMEOUT:?}"))??;
    Ok(())
}

/// Why an endpoint id of `request` is refused, if one is: ids name the records' files,
/// so only what the CNI spec allows gets that far.
fn id_problem(request: &Request) -> Option<String> {
    match request {
        Request::Attach(endpoint) => endpoint.id.problem(),
        Request::Detach(id) | Request::Get(id) => id.problem(),
        Request::Gc { keep, .. } => keep.iter().find_map(api::EndpointId::problem),
        _ => None,
    }
}

/// Requests are short map, netlink and file operations on one [`LocalNode`] behind one
/// mutex: serializing them is simpler than finer locks and fast enough. One that can
/// change the endpoints publishes the node's view to `telemetry` before the lock goes.
fn answer(request: Request, node: &Mutex<LocalNode>, telemetry: &Telemetry) -> Response {
    let mut node = match node.lock() {
        Ok(node) => node,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(message) = id_problem(&request) {
        return Response::Error(DaemonError::new(ErrorKind::InvalidRequest, message));
    }
    let changes = matches!(
        request,
        Request::Attach(_) | Request::Detach(_) | Request::Gc { .. }
    );
    let outcome = match request {
        Request::Status => Ok(Response::Status(node.status())),
        Request::Prepare { host_veth } => node.prepare(&host_veth).map(|()| Response::Prepared),
        Request::Unprepare { host_veth } => node
            .unprepare(&host_veth)
            .map(|detached| Response::Unprepared { detached }),
        Request::Attach(endpoint) => node
            .attach(EndpointRecord::from_request(*endpoint))
            .map(|()| Response::Attached),
        Request::Detach(id) => node.detach(&id).map(|endpoint| Response::Detached {
            existed: endpoint.is_some(),
        }),
        Request::Get(id) => Ok(Response::Endpoint {
            endpoint: node.get(&id).map(EndpointRecord::to_wire),
        }),
        Request::List => Ok(Response::Endpoints {
            endpoints: node.list().iter().map(EndpointRecord::to_wire).collect(),
            // Filled in by `handle`, outside the lock.
            stack_sent: Vec::new(),
            queued: node.queued(),
        }),
        Request::Gc { network, keep } => {
            node.collect(&network, &keep)
                .map(|removed| Response::Collected {
                    removed: removed.iter().map(EndpointRecord::to_wire).collect(),
                })
        }
        Request::Nodes => Ok(Response::Nodes(node.cluster().view())),
        Request::Policies => Ok(Response::Policies(node.policies().view())),
    };
    if changes {
        telemetry.publish(NodeView::of(&node));
    }
    outcome.unwrap_or_else(|error| match error {
        NodeError::HostPort(HostPortError::Conflict(message)) => Response::PortConflict { message },
        other => Response::Error(DaemonError::new(other.kind(), other.to_string())),
    })
}
