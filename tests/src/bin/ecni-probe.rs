//! `ecni-probe`: a one-shot client for the node-local hostPort tests. It is a process of
//! its own so that it can be placed in a cgroup (see `traffic::probe`), which the
//! daemon's connect4/sendmsg4/recvmsg4/getpeername4 programs watch.
//!
//! - `ecni-probe tcp <addr:port> <message>`: connects, sends, reads the echo back and
//!   prints `{"reply": <echo>, "peer": <getpeername>, "local": <getsockname>}`.
//! - `ecni-probe udp <addr:port> <message>`: an unconnected socket, so that the address
//!   goes through sendmsg and comes back through recvmsg: send_to, then recv_from;
//!   prints `{"reply": <echo>, "peer": <recv_from's source>, "local": <getsockname>}`.
//!
//! One JSON line on stdout on success; on failure (refused, timeout...) the error on
//! stderr and a non-zero exit. Every wait is bounded by [`TIMEOUT`].

use std::{
    io::{self, ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    process::ExitCode,
    time::Duration,
};

use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(5);
const USAGE: &str = "usage: ecni-probe tcp|udp <addr:port> <message>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [protocol, to, message] = args.as_slice() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let outcome = to
        .parse::<SocketAddr>()
        .map_err(|error| format!("{to}: {error}"))
        .and_then(|to| match protocol.as_str() {
            "tcp" => tcp(to, message.as_bytes()),
            "udp" => udp(to, message.as_bytes()),
            other => Err(format!("unknown protocol {other:?}; {USAGE}")),
        });
    match outcome {
        Ok(line) => {
            #[expect(clippy::print_stdout, reason = "the JSON line is the probe's answer")]
            {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("ecni-probe {protocol} {to}: {error}");
            ExitCode::FAILURE
        }
    }
}

fn tcp(to: SocketAddr, message: &[u8]) -> Result<Value, String> {
    let mut stream =
        TcpStream::connect_timeout(&to, TIMEOUT).map_err(|error| context("connect", &error))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|error| context("timeouts", &error))?;
    let peer = stream
        .peer_addr()
        .map_err(|error| context("getpeername", &error))?;
    let local = stream
        .local_addr()
        .map_err(|error| context("getsockname", &error))?;
    stream
        .write_all(message)
        .map_err(|error| context("write", &error))?;
    let mut reply = vec![0u8; message.len()];
    stream
        .read_exact(&mut reply)
        .map_err(|error| context("read", &error))?;
    Ok(json!({
        "reply": String::from_utf8_lossy(&reply),
        "peer": peer.to_string(),
        "local": local.to_string(),
    }))
}

fn udp(to: SocketAddr, message: &[u8]) -> Result<Value, String> {
    let socket = UdpSocket::bind(("0.0.0.0", 0)).map_err(|error| context("bind", &error))?;
    socket
        .set_read_timeout(Some(TIMEOUT))
        .map_err(|error| context("timeouts", &error))?;
    socket
        .send_to(message, to)
        .map_err(|error| context("sendto", &error))?;
    let mut buffer = vec![0u8; 2048];
    let (n, peer) = socket
        .recv_from(&mut buffer)
        .map_err(|error| context("recvfrom", &error))?;
    let local = socket
        .local_addr()
        .map_err(|error| context("getsockname", &error))?;
    Ok(json!({
        "reply": String::from_utf8_lossy(&buffer[..n]),
        "peer": peer.to_string(),
        "local": local.to_string(),
    }))
}

/// `step: error`, with a timeout said as such (a socket timeout reads as EAGAIN).
fn context(step: &str, error: &io::Error) -> String {
    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
        format!("{step}: timed out after {TIMEOUT:?}")
    } else {
        format!("{step}: {error}")
    }
}
