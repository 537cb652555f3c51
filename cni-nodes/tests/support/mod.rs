//! What the tests share: building expected sets, waiting on a receiver with a deadline,
//! and reading what the crate logged.

#![allow(dead_code, reason = "each test binary uses a part of it")]

use std::net::Ipv4Addr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use cni_nodes::{Node, NodeSet};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Builds a set from `(name, address, [pod CIDRs])`.
pub fn set(nodes: &[(&str, &str, &[&str])]) -> NodeSet {
    nodes
        .iter()
        .map(|(name, address, cidrs)| Node {
            name: (*name).to_owned(),
            address: address.parse::<Ipv4Addr>().expect("test address"),
            pod_cidrs: cidrs
                .iter()
                .map(|c| c.parse().expect("test CIDR"))
                .collect(),
        })
        .collect()
}

/// Waits until the receiver holds `expected`, failing after `within`.
pub async fn wait_for(rx: &mut watch::Receiver<NodeSet>, expected: &NodeSet, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if *rx.borrow_and_update() == *expected {
            return;
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("the source stopped before publishing {expected:?}"),
            Err(_) => panic!(
                "not published within {within:?}: expected {expected:?}, the receiver holds {:?}",
                *rx.borrow()
            ),
        }
    }
}

/// The log lines of this test binary, captured from every thread.
struct Logs {
    lines: Mutex<Vec<String>>,
    added: Notify,
}

fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs {
            lines: Mutex::new(Vec::new()),
            added: Notify::new(),
        };
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .without_time()
            .with_writer(|| LogWriter)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        logs
    })
}

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let logs = logs();
        {
            let mut lines = logs.lines.lock().expect("log lock");
            lines.extend(text.lines().map(str::to_owned));
        }
        logs.added.notify_waiters();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts capturing this binary's logs; call before the code that logs.
pub fn capture_logs() {
    logs();
}

/// The captured lines that contain every one of `parts`.
pub fn log_lines(parts: &[&str]) -> Vec<String> {
    let lines = logs().lines.lock().expect("log lock");
    lines
        .iter()
        .filter(|line| parts.iter().all(|part| line.contains(part)))
        .cloned()
        .collect()
}

/// Waits until a line containing every one of `parts` is logged, failing after `within`.
pub async fn wait_for_log(parts: &[&str], within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let added = logs().added.notified();
        if let Some(line) = log_lines(parts).pop() {
            return line;
        }
        if tokio::time::timeout_at(deadline, added).await.is_err() {
            panic!(
                "no log line with {parts:?} within {within:?}; logged:\n{}",
                log_lines(&[]).join("\n")
            );
        }
    }
}
