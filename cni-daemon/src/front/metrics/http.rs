//! The health and metrics listeners: axum on the daemon's tokio runtime.
//!
//! - `GET /healthz`: 200 while the process serves;
//! - `GET /readyz`: 200 when ready, else 503 with one reason per line
//!   ([`super::view::not_ready`]);
//! - `GET /metrics`: the Prometheus text format ([`super::collect`]), read on a blocking
//!   thread.
//!
//! The metrics listener serves all three; the health listener (on loopback, for
//! kubelet's probes) the first two, so that no client of the metrics port can fail the
//! probes.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::encoding::prometheus_text;
use tokio::net::TcpListener;

use super::{
    Telemetry, collect,
    listener::{self, Limits},
    view,
};

/// Binds `address`; an address in use stops the daemon before it loads anything.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}

/// Serves the three endpoints on `listener` until the task is dropped, its connections
/// bounded ([`Limits::METRICS`]).
pub async fn serve(listener: TcpListener, telemetry: Arc<Telemetry>) {
    let app = health(Router::new())
        .route("/metrics", get(metrics))
        .with_state(telemetry);
    let _ = listener::serve(listener, app, Limits::METRICS).await;
}

/// Serves `/healthz` and `/readyz` on `listener` until the task is dropped
/// ([`Limits::HEALTH`]).
pub async fn serve_health(listener: TcpListener, telemetry: Arc<Telemetry>) {
    let app = health(Router::new()).with_state(telemetry);
    let _ = listener::serve(listener, app, Limits::HEALTH).await;
}

fn health(router: Router<Arc<Telemetry>>) -> Router<Arc<Telemetry>> {
    router
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(telemetry): State<Arc<Telemetry>>) -> Response {
    let reasons = view::not_ready(&telemetry);
    if reasons.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let text = reasons.join("\n") + "\n";
        (StatusCode::SERVICE_UNAVAILABLE, text).into_response()
    }
}

async fn metrics(State(telemetry): State<Arc<Telemetry>>) -> Response {
    match tokio::task::spawn_blocking(move || collect::encode(&telemetry)).await {
        Ok(Ok(text)) => (
            [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}
