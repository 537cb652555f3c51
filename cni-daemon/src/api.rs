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
    /// Attach the pod program to a new host veth ahead of [`Request::Attach`]: its TCX
    /// attach waits for an RCU grace period, and the plugin runs IPAM meanwhile.
    Prepare { host_veth: String },
    /// Undo a [`Request::Prepare`] whose ADD failed before [`Request::Attach`].
    Unprepare { host_veth: String },
    /// Record a pod's endpoint and write it into the datapath (replaces an earlier record
    /// of the same id, so a retried ADD is harmless).
    Attach(Box<Endpoint>),
    /// Forget a pod's endpoint; an unknown id is not an error.
    Detach(EndpointId),
    /// One endpoint's record, for CHECK.
    Get(EndpointId),
    /// Every endpoint record.
    List,
    /// Forget every endpoint of `network` whose id is not in `keep`.
    Gc {
        network: String,
        keep: Vec<EndpointId>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    Status(Status),
    Prepared,
    Unprepared {
        /// Whether the program was detached (false: unknown, or an endpoint uses it).
        detached: bool,
    },
    Attached,
    Detached {
        existed: bool,
    },
    Endpoint {
        endpoint: Option<Endpoint>,
    },
    Endpoints {
        endpoints: Vec<Endpoint>,
        /// What the node's own stack sent into each pod (its host veth's kernel TX
        /// counters): the part of "to pod" the datapath does not see. A list, as the
        /// tagged enum cannot carry maps with integer keys through JSON.
        #[serde(default)]
        stack_sent: Vec<LinkCounters>,
    },
    Collected {
        removed: Vec<Endpoint>,
    },
    /// A hostPort another endpoint holds (CNI code 105 for the plugin).
    PortConflict {
        message: String,
    },
    Error {
        message: String,
    },
}

/// What identifies an attachment, as in the CNI spec: (container id, interface name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EndpointId {
    pub container_id: String,
    pub ifname: String,
}

/// A pod's interface as the daemon records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: EndpointId,
    /// The CNI network name (GC works per network).
    pub network: String,
    pub netns: String,
    pub host_veth: String,
    pub host_ifindex: u32,
    /// The host-side veth's MAC: the pod's ARP requests are answered with it.
    pub host_mac: String,
    /// The pod interface's MAC, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    pub ips: Vec<ipnet::IpNet>,
    /// Source-NAT this pod's traffic to destinations outside `cluster_cidrs`.
    pub masquerade: bool,
    /// Destinations that keep the pod's address (the cluster's pod ranges).
    #[serde(default)]
    pub cluster_cidrs: Vec<ipnet::Ipv4Net>,
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    pub host_ip: Option<std::net::IpAddr>,
}

/// Rates in bits per second, bursts in bits, as Kubernetes passes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub daemon_version: String,
    pub bpf_dir: String,
    /// The eBPF object is loaded and its maps are pinned: the datapath can take pods.
    pub datapath_loaded: bool,
    pub endpoints: usize,
    pub attachments: Vec<Attachment>,
    /// Source NAT is on: the uplink programs are attached and translate pods' traffic to
    /// `node_addr`.
    #[serde(default)]
    pub nat_enabled: bool,
    /// The first interface translated traffic leaves by (all of them: `uplinks`).
    #[serde(default)]
    pub uplink: Option<String>,
    /// The address pods' traffic out of the first uplink is translated to.
    #[serde(default)]
    pub node_addr: Option<std::net::Ipv4Addr>,
    /// Every interface source NAT translates on, with its address.
    #[serde(default)]
    pub uplinks: Vec<UplinkStatus>,
    /// The Service ranges whose traffic goes through the node's stack (kube-proxy).
    #[serde(default)]
    pub service_cidrs: Vec<ipnet::Ipv4Net>,
    /// The node addresses a hostPort mapping without hostIP covers (loopback aside),
    /// as the datapath has them now.
    #[serde(default)]
    pub host_port_addrs: Vec<std::net::Ipv4Addr>,
    /// The IPv4 GSO/GRO size new pods' veths get (BIG TCP): the uplink's, when above the
    /// 64 KiB default (see `big_tcp`); `None`: the kernel's default.
    #[serde(default)]
    pub pod_gso_max_size: Option<u32>,
}

/// A device source NAT translates on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkStatus {
    pub name: String,
    pub ifindex: u32,
    /// The address of what leaves by it; `None` while it has none (that traffic is
    /// dropped).
    pub node_addr: Option<std::net::Ipv4Addr>,
}

/// Packets and bytes through a link, from the kernel's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCounters {
    pub ifindex: u32,
    pub packets: u64,
    pub bytes: u64,
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
