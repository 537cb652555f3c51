//! The plugin <-> daemon protocol: versioned JSON messages, each framed by a 4-byte
//! big-endian length, one request and one response per connection.
//!
//! The synchronous [`call`] is what the short-lived plugin and the CLI use; the daemon's
//! async side is in [`crate::server`].

use std::{
    io::{self, Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change of [`Request`] or [`Response`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame either side accepts; a status with thousands of endpoints fits.
pub const MAX_FRAME: u32 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub version: u32,
    pub body: T,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// Is the datapath loaded, and where is it attached?
    Status,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    Status(Status),
    Error { message: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub daemon_version: String,
    pub bpf_dir: String,
    pub attachments: Vec<Attachment>,
}

/// One program attached to one interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub interface: String,
    pub ifindex: u32,
    pub program: String,
    /// `tcx` (kernel >= 6.6) or `clsact` (netlink, older kernels).
    pub mode: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens: the daemon is down or the path is wrong (CNI code 11 territory).
    #[error("the daemon is not reachable at {path}: {source}")]
    Unreachable { path: String, source: io::Error },
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
        path: socket.display().to_string(),
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
    fn oversized_frame_is_refused() {
        let err = frame_len((MAX_FRAME + 1).to_be_bytes()).expect_err("too large");
        assert!(matches!(err, ClientError::FrameTooLarge(len) if len == MAX_FRAME + 1));
    }
}
