//! The health and metrics listener: axum on the daemon's tokio runtime.
//!
//! - `GET /healthz`: 200 while the process serves;
//! - `GET /readyz`: 200 when ready, else 503 with one reason per line
//!   ([`super::view::not_ready`]);
//! - `GET /metrics`: the Prometheus text format ([`super::collect`]), read on a blocking
//!   thread.

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

use super::{Telemetry, collect, listener::BoundedListener, view};

/// Binds `address`; an address in use stops the daemon before it loads anything.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}

/// Serves the endpoints on `listener` until the task is dropped, its connections
/// bounded in number and time ([`super::listener`]).
pub async fn serve(listener: TcpListener, telemetry: Arc<Telemetry>) {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(telemetry);
    if let Err(error) = axum::serve(BoundedListener::new(listener), app).await {
        tracing::error!(%error, "the health and metrics listener stopped");
    }
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
