//! The kubelet side of the CRI (v1, k8s-cri's client) over a runtime's unix socket, as
//! blocking calls: each runs on the client's own single-threaded tokio runtime, bounded
//! by [`CALL_TIMEOUT`].

use std::{collections::HashMap, path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    ImageSpec, ImageStatusRequest, LinuxPodSandboxConfig, ListPodSandboxRequest, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxState, PodSandboxStatusRequest, PortMapping, Protocol,
    RemovePodSandboxRequest, RunPodSandboxRequest, StopPodSandboxRequest, VersionRequest,
    VersionResponse, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use tokio::net::UnixStream;
use tonic::{
    Status,
    transport::{Channel, Endpoint, Uri},
};

/// The longest one call may take (RunPodSandbox runs the CNI ADD, a few seconds at most).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A connected CRI client.
pub struct Cri {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
}

/// What PodSandboxStatus tells about one pod.
#[derive(Debug)]
pub struct SandboxStatus {
    pub ready: bool,
    /// The pod's address, empty when it has none.
    pub ip: String,
    /// The pod's network namespace, from the verbose info's runtime spec.
    pub netns: Option<std::path::PathBuf>,
}

impl Cri {
    /// Connects to the runtime's socket; fails while nothing listens there.
    pub fn connect(socket: &Path) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| format!("a tokio runtime: {error}"))?;
        let socket = socket.to_owned();
        let channel = runtime.block_on(async move {
            // The URI is a placeholder: the connector always dials the socket.
            Endpoint::try_from("http://[::]")
                .map_err(|error| error.to_string())?
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await
                .map_err(|error| format!("{error:?}"))
        })?;
        Ok(Self { runtime, channel })
    }

    fn call<T>(
        &self,
        work: impl Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, Status> {
        self.runtime.block_on(async {
            match tokio::time::timeout(CALL_TIMEOUT, work).await {
                Ok(result) => result.map(tonic::Response::into_inner),
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "no answer within {CALL_TIMEOUT:?}"
                ))),
            }
        })
    }

    fn runtime_service(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    pub fn version(&self) -> Result<VersionResponse, Status> {
        let mut client = self.runtime_service();
        self.call(client.version(VersionRequest {
            version: "v1".into(),
        }))
    }

    /// Whether the runtime's image service knows `image`.
    pub fn has_image(&self, image: &str) -> Result<bool, Status> {
        let mut client = ImageServiceClient::new(self.channel.clone());
        let request = ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        self.call(client.image_status(request))
            .map(|status| status.image.is_some())
    }

    /// RunPodSandbox; returns the sandbox's id.
    pub fn run_pod(&self, config: PodSandboxConfig) -> Result<String, Status> {
        let mut client = self.runtime_service();
        let request = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        self.call(client.run_pod_sandbox(request))
            .map(|response| response.pod_sandbox_id)
    }

    /// PodSandboxStatus, verbose (for the namespace path).
    pub fn pod_status(&self, id: &str) -> Result<SandboxStatus, Status> {
        let mut client = self.runtime_service();
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        let response = self.call(client.pod_sandbox_status(request))?;
        let status = response.status.unwrap_or_default();
        Ok(SandboxStatus {
            ready: status.state == PodSandboxState::SandboxReady as i32,
            ip: status.network.map(|network| network.ip).unwrap_or_default(),
            netns: netns_from_info(&response.info),
        })
    }

    pub fn stop_pod(&self, id: &str) -> Result<(), Status> {
        let mut client = self.runtime_service();
        self.call(client.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        }))
        .map(drop)
    }

    pub fn remove_pod(&self, id: &str) -> Result<(), Status> {
        let mut client = self.runtime_service();
        self.call(client.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        }))
        .map(drop)
    }

    /// The ids of every sandbox the runtime has, ready or not.
    pub fn list_pods(&self) -> Result<Vec<String>, Status> {
        let mut client = self.runtime_service();
        self.call(client.list_pod_sandbox(ListPodSandboxRequest { filter: None }))
            .map(|response| response.items.into_iter().map(|pod| pod.id).collect())
    }
}

/// A pod's sandbox config as kubelet would send it: metadata, a log folder, a cgroup
/// parent (the cgroupfs driver's path), and a TCP hostPort for each (host, container)
/// port of `host_ports`.
pub fn sandbox_config(
    name: &str,
    log_dir: &Path,
    cgroup_parent: &str,
    host_ports: &[(u16, u16)],
) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("{name}-uid"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.display().to_string(),
        port_mappings: host_ports
            .iter()
            .map(|(host, container)| PortMapping {
                protocol: Protocol::Tcp as i32,
                container_port: i32::from(*container),
                host_port: i32::from(*host),
                host_ip: String::new(),
            })
            .collect(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The network namespace in a verbose status's `info`: containerd puts its runtime spec
/// there, whose namespaces list the pod's network one with its path.
fn netns_from_info(info: &HashMap<String, String>) -> Option<std::path::PathBuf> {
    let info: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|namespace| namespace["type"] == "network")?["path"]
        .as_str()
        .map(std::path::PathBuf::from)
}
