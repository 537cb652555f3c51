//! Framing and the client: JSON messages, each framed by a 4-byte big-endian length, one
//! request and one response per connection. The synchronous [`call`] is what the
//! short-lived plugin and the daemon's CLI use; the daemon serves with [`encode`] and
//! [`frame_len`] on its async side.

use std::{
    io::{self, Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Serialize;

use crate::messages::{Envelope, PROTOCOL_VERSION, Request, Response};

/// Largest frame either side accepts; a status with thousands of endpoints fits.
pub const MAX_FRAME: u32 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens: the daemon is down or the path is wrong (CNI code 11 territory).
    #[error("the daemon is not reachable at {}: {source}", path.display())]
    Unreachable { path: PathBuf, source: io::Error },
    #[error("talking to the daemon failed: {0}")]
    Io(#[from] io::Error),
    #[error("the daemon sent a malformed response: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("the daemon speaks protocol {theirs}, this client {PROTOCOL_VERSION}")]
    Version { theirs: u32 },
    #[error("frame of {0} bytes exceeds the limit")]
    FrameTooLarge(u32),
}

/// Sends one request and waits (at most `timeout` per read or write) for its response.
pub fn call(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| ClientError::Unreachable {
        path: socket.to_path_buf(),
        source,
    })?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let envelope = Envelope {
        version: PROTOCOL_VERSION,
        body: request,
    };
    stream.write_all(&encode(&envelope)?)?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = frame_len(len)?;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    let envelope: Envelope<Response> = serde_json::from_slice(&body)?;
    if envelope.version != PROTOCOL_VERSION {
        return Err(ClientError::Version {
            theirs: envelope.version,
        });
    }
    Ok(envelope.body)
}

/// Serializes `message` with its length prefix.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, ClientError> {
    let body = serde_json::to_vec(message)?;
    let len = u32::try_from(body.len()).map_err(|_| ClientError::FrameTooLarge(u32::MAX))?;
    if len > MAX_FRAME {
        return Err(ClientError::FrameTooLarge(len));
    }
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Checks a received length prefix against [`MAX_FRAME`].
pub fn frame_len(prefix: [u8; 4]) -> Result<usize, ClientError> {
    let len = u32::from_be_bytes(prefix);
    if len > MAX_FRAME {
        return Err(ClientError::FrameTooLarge(len));
    }
    Ok(len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Status;

    #[test]
    fn status_request_round_trips_through_a_frame() {
        let envelope = Envelope {
            version: PROTOCOL_VERSION,
            body: Request::Status,
        };
        let frame = encode(&envelope).expect("encodes");
        let len = frame_len(frame[..4].try_into().expect("4 bytes")).expect("within limit");
        assert_eq!(len, frame.len() - 4);
        let back: Envelope<Request> = serde_json::from_slice(&frame[4..]).expect("decodes");
        assert_eq!(back, envelope);
        assert_eq!(
            std::str::from_utf8(&frame[4..]).expect("utf-8"),
            r#"{"version":1,"body":{"request":"status"}}"#
        );
    }

    #[test]
    fn status_of_a_daemon_without_nat_fields_still_decodes() {
        let status: Status = serde_json::from_str(
            r#"{"daemon_version":"0.1.0","bpf_dir":"/sys/fs/bpf/x","datapath_loaded":true,
                "endpoints":0,"attachments":[]}"#,
        )
        .expect("decodes");
        assert!(!status.nat_enabled);
        assert_eq!(status.uplink, None);
        assert_eq!(status.node_addr, None);
        assert_eq!(status.pod_gso_max_size, None);
    }

    #[test]
    fn oversized_frame_is_refused() {
        let err = frame_len((MAX_FRAME + 1).to_be_bytes()).expect_err("too large");
        assert!(matches!(err, ClientError::FrameTooLarge(len) if len == MAX_FRAME + 1));
    }
}
