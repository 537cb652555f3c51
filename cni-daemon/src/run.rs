//! `ebpf-cnid run`: the daemon's life from load to shutdown.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

use crate::{bpffs, datapath::Datapath, node::Node, server};

/// What `run` needs; every path is a flag so several simulated nodes can share a machine.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub bpf_dir: PathBuf,
    pub socket: PathBuf,
    /// Folder of the endpoint records (survives restarts).
    pub state_dir: PathBuf,
    pub attach: Vec<String>,
}

pub async fn run(config: RunConfig) -> anyhow::Result<()> {
    bpffs::prepare(&config.bpf_dir)?;
    let mut datapath = Datapath::load(&config.bpf_dir)?;
    for interface in &config.attach {
        datapath
            .attach_counter(interface)
            .with_context(|| format!("cannot attach to {interface}"))?;
    }
    let node = Arc::new(Mutex::new(Node::open(datapath, &config.state_dir)?));
    let listener = server::bind(&config.socket)
        .with_context(|| format!("cannot listen on {}", config.socket.display()))?;
    tracing::info!(
        socket = %config.socket.display(),
        bpf_dir = %config.bpf_dir.display(),
        "ready"
    );

    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let outcome = tokio::select! {
        served = server::serve(listener, Arc::clone(&node)) => served.context("socket failed"),
        _ = terminate.recv() => Ok(()),
        _ = interrupt.recv() => Ok(()),
    };
    // The counter programs detach when the datapath drops; pod programs stay attached
    // through their pinned links, and maps stay pinned, for the next start.
    let _ = std::fs::remove_file(&config.socket);
    tracing::info!("stopped; maps stay pinned until `ebpf-cnid uninstall`");
    outcome
}
