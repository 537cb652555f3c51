//! The unix socket the plugin talks to: root-only (mode 0600), one request per
//! connection, answered from the synchronous core under a mutex, on a blocking thread.

use std::{
    fs, io,
    os::unix::fs::PermissionsExt,
    path::Path,
    sync::{Arc, Mutex},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
};

use cni_api::{self as api, Envelope, PROTOCOL_VERSION, Request, Response};

use crate::{
    big_tcp,
    hostports::HostPortError,
    link_stats,
    node::{Node, NodeError},
};

/// Binds `path`, replacing a stale socket left by a killed daemon, with mode 0600 and
/// its folder created 0700.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
        fs::set_permissions(parent, fs::Permissions::from_mode(0o700))?;
    }
    crate::files::remove_file(path)?;
    let listener = UnixListener::bind(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Accepts connections until the listener fails.
pub async fn serve(listener: UnixListener, node: Arc<Mutex<Node>>) -> io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            if let Err(error) = handle(stream, node).await {
                tracing::warn!(%error, "request failed");
            }
        });
    }
}

async fn handle(mut stream: UnixStream, node: Arc<Mutex<Node>>) -> anyhow::Result<()> {
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix).await?;
    let mut body = vec![0u8; api::frame_len(prefix)?];
    stream.read_exact(&mut body).await?;
    let response = match serde_json::from_slice::<Envelope<Request>>(&body) {
        Ok(envelope) if envelope.version == PROTOCOL_VERSION => {
            // Node work blocks (maps, netlink, files, the node's lock): on a blocking
            // thread, so that the runtime's workers keep serving I/O meanwhile.
            let mut response = tokio::task::spawn_blocking(move || answer(envelope.body, &node))
                .await
                .unwrap_or_else(|error| Response::Error {
                    message: format!("the request failed: {error}"),
                });
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
        Ok(envelope) => Response::Error {
            message: format!(
                "protocol version {} is not served (this daemon: {PROTOCOL_VERSION})",
                envelope.version
            ),
        },
        Err(error) => Response::Error {
            message: format!("malformed request: {error}"),
        },
    };
    let frame = api::encode(&Envelope {
        version: PROTOCOL_VERSION,
        body: response,
    })?;
    stream.write_all(&frame).await?;
    Ok(())
}

/// Requests are short map, netlink and file operations on one [`Node`] behind one
/// mutex: serializing them is simpler than finer locks and fast enough.
fn answer(request: Request, node: &Mutex<Node>) -> Response {
    let mut node = match node.lock() {
        Ok(node) => node,
        Err(poisoned) => poisoned.into_inner(),
    };
    let outcome = match request {
        Request::Status => Ok(Response::Status(node.status())),
        Request::Prepare { host_veth } => node.prepare(&host_veth).map(|()| Response::Prepared),
        Request::Unprepare { host_veth } => node
            .unprepare(&host_veth)
            .map(|detached| Response::Unprepared { detached }),
        Request::Attach(endpoint) => node.attach(*endpoint).map(|()| Response::Attached),
        Request::Detach(id) => node.detach(&id).map(|endpoint| Response::Detached {
            existed: endpoint.is_some(),
        }),
        Request::Get(id) => Ok(Response::Endpoint {
            endpoint: node.get(&id).cloned(),
        }),
        Request::List => Ok(Response::Endpoints {
            endpoints: node.list(),
            // Filled in by `handle`, outside the lock.
            stack_sent: Vec::new(),
        }),
        Request::Gc { network, keep } => node
            .collect(&network, &keep)
            .map(|removed| Response::Collected { removed }),
    };
    outcome.unwrap_or_else(|error| match error {
        NodeError::HostPort(HostPortError::Conflict(message)) => Response::PortConflict { message },
        other => Response::Error {
            message: other.to_string(),
        },
    })
}
