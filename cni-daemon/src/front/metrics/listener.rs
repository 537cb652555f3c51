//! The listeners' connections, bounded so that no client can keep others out: at most
//! [`Limits::connections`] are served at once (the others wait in the listen backlog),
//! at most [`Limits::per_client`] from one address (more are closed at once), a request's
//! headers must arrive within [`HEADER_READ_TIMEOUT`] (hyper's header-read timeout), and
//! each connection is closed [`CONNECTION_LIFETIME`] after it was accepted, whatever it
//! does. A pod that opens connections to the metrics port and sends nothing holds none
//! of them for long, nor more than its share; the probes have a listener of their own.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};

/// How long a connection lives: a scrape answers well within it; a scraper's kept-alive
/// connection is closed after it and the scraper opens a new one.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// How long a request's headers may take to arrive, from the connection's start or the
/// previous answer.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);

/// How many connections a listener serves.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// At once, from everyone.
    pub connections: usize,
    /// At once, from one address.
    pub per_client: usize,
}

impl Limits {
    /// The metrics listener, which pods may reach: Prometheus servers and people, a few
    /// connections each.
    pub const METRICS: Self = Self {
        connections: 64,
        per_client: 4,
    };
    /// The probes' listener on loopback: kubelet's two probes and a person, all from
    /// 127.0.0.1.
    pub const HEALTH: Self = Self {
        connections: 16,
        per_client: 16,
    };
}

/// Serves `app` on `listener` under `limits` until the task is dropped.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits) -> Result<(), Infallible> {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let clients = Arc::new(Mutex::new(HashMap::<IpAddr, usize>::new()));
    loop {
        // The semaphore is never closed: acquiring only waits for a connection to end.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return std::future::pending().await;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of files, or a connection reset before it was accepted: pause, as
            // axum does, and go on.
            Err(error) => {
                tracing::debug!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(client) = Client::admit(&clients, peer.ip(), limits.per_client) else {
            tracing::debug!(client = %peer.ip(), "a client over its connections, closed");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let connection = http.serve_connection(TokioIo::new(stream), service);
            // Either way the connection ends: served, failed, or out of time.
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop((client, slot));
        });
    }
}

/// One served connection of a client, counted while it lives.
struct Client {
    clients: Arc<Mutex<HashMap<IpAddr, usize>>>,
    addr: IpAddr,
}

impl Client {
    /// Counts a connection of `addr`; `None` when it holds `per_client` already.
    fn admit(
        clients: &Arc<Mutex<HashMap<IpAddr, usize>>>,
        addr: IpAddr,
        per_client: usize,
    ) -> Option<Self> {
        let mut counts = clients.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(addr).or_default();
        if *count >= per_client {
            return None;
        }
        *count += 1;
        Some(Self {
            clients: Arc::clone(clients),
            addr,
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut counts = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.addr) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.addr);
            }
        }
    }
}
