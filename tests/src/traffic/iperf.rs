//! iperf3, the real client operators measure with: one TCP stream of a given duration
//! or size from a client namespace to a server namespace, as its JSON report tells it.

use std::{
    net::Ipv4Addr,
    process::{Child, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// What one iperf3 run reports, in bits per second.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// What the server received: the stream's goodput.
    pub received_bps: f64,
    /// What the client wrote into its socket.
    pub sent_bps: f64,
    /// TCP retransmissions the client counted.
    pub retransmits: u64,
    /// How long the receiver took, from the test's start to the last byte.
    pub seconds: f64,
}

/// How long a stream lasts: a duration (`-t`) or a size (`-n`).
#[derive(Debug, Clone, Copy)]
pub enum Length {
    Seconds(u32),
    Bytes(u64),
}

/// Streams TCP from `client` to `server_ip` (inside `server`) for `length`, with extra
/// client `options` (`-R` reverses the direction: the server sends). Fails when
/// iperf3 gives no report within five (scaled) seconds of retries.
pub fn stream(
    client: &Netns,
    server: &Netns,
    server_ip: Ipv4Addr,
    length: Length,
    options: &[&str],
) -> Result<Report, String> {
    let length = match length {
        Length::Seconds(seconds) => ["-t".to_owned(), seconds.to_string()],
        Length::Bytes(bytes) => ["-n".to_owned(), bytes.to_string()],
    };
    let port = "5201";
    let mut daemon = KillOnDrop(
        server
            .command("iperf3")
            .args(["-s", "-1", "-p", port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("cannot start iperf3 -s: {error}"))?,
    );
    // iperf3 needs a moment to listen; its client retries are not configurable.
    let deadline = Instant::now() + crate::scaled(Duration::from_secs(5));
    loop {
        let out = client
            .command("iperf3")
            .args(["-c", &server_ip.to_string(), "-p", port])
            .args(&length)
            .arg("-J")
            .args(options)
            .output()
            .map_err(|error| format!("cannot run iperf3 -c: {error}"))?;
        // iperf3 -J can exit 0 with an "error" (server not listening yet): retried.
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let end = &report["end"];
        if let (true, Some(received_bps), Some(sent_bps), Some(seconds)) = (
            out.status.success(),
            end["sum_received"]["bits_per_second"].as_f64(),
            end["sum_sent"]["bits_per_second"].as_f64(),
            end["sum_received"]["seconds"].as_f64(),
        ) {
            let _ = daemon.0.wait();
            return Ok(Report {
                received_bps,
                sent_bps,
                retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
                seconds,
            });
        }
        if Instant::now() > deadline {
            return Err(format!("iperf3 to {server_ip} failed: {}", report["error"]));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
