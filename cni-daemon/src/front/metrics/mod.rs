//! Health and metrics over HTTP: `/healthz`, `/readyz` and `/metrics` in the Prometheus
//! text format on `ebpf-cnid run --metrics-address`, the first two also on
//! `--health-address` (loopback, for kubelet's probes).
//!
//! Nothing here holds the node (`Arc<Mutex<Node>>`), so serving never waits for the lock
//! ADD and DEL take: counters come from the pinned maps ([`crate::front::inspect::read`]), and
//! what only the daemon knows lives in [`Telemetry`]: readiness flags, a [`NodeView`]
//! the front publishes after every change of the node (made while it holds the lock,
//! swapped in under a lock of its own that is only held to clone an `Arc`), and the
//! request and sweep histograms (prometheus-client's own atomics).
//!
//! - [`view`]: the published node view and the readiness it gives;
//! - [`collect`]: the metrics, read and encoded at each scrape;
//! - [`http`]: the endpoints (axum), on a [`listener`] whose connections are bounded in
//!   number, per client and in time.

pub mod collect;
pub mod http;
pub mod listener;
pub mod view;

use std::{
    path::PathBuf,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cni_api::Request;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
};

pub use view::{Install, NodeView};

/// Where the metrics listener binds unless told otherwise: loopback, so that only the
/// node reaches it (the DaemonSet opens it to Prometheus).
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:9876";

/// Where the health listener binds unless told otherwise: loopback, where kubelet's
/// probes of a host-network pod reach it and no pod does.
pub const DEFAULT_HEALTH_ADDRESS: &str = "127.0.0.1:9877";

/// The label of the request histogram: which request of the plugin.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    pub command: &'static str,
}

fn request_histogram() -> Histogram {
    // 0.5 ms to about 8 s: a request is a few map and netlink operations, plus the wait
    // for the node's lock behind other requests.
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

/// What the health and metrics endpoints read besides the pinned maps; shared by the
/// front's tasks (`Arc`), each updating its part.
#[derive(Debug)]
pub struct Telemetry {
    bpf_dir: PathBuf,
    datapath_loaded: AtomicBool,
    serving: AtomicBool,
    install: RwLock<Install>,
    view: RwLock<Arc<NodeView>>,
    requests: Family<CommandLabel, Histogram, fn() -> Histogram>,
    sweeps: Histogram,
}

impl Telemetry {
    /// Nothing loaded yet; `install` says whether the CNI configuration (plugin or
    /// conflist) is to be installed ([`Install::Pending`]) or not ([`Install::NotAsked`]).
    pub fn new(bpf_dir: PathBuf, install: Install) -> Arc<Self> {
        Arc::new(Self {
            bpf_dir,
            datapath_loaded: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            install: RwLock::new(install),
            view: RwLock::new(Arc::new(NodeView::default())),
            requests: Family::new_with_constructor(request_histogram),
            // 1 ms to about 33 s: a sweep reads whole tables in batches.
            sweeps: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        })
    }

    pub fn bpf_dir(&self) -> &std::path::Path {
        &self.bpf_dir
    }

    /// The eBPF object is loaded and its maps pinned.
    pub fn set_datapath_loaded(&self) {
        self.datapath_loaded.store(true, Ordering::Release);
    }

    pub fn datapath_loaded(&self) -> bool {
        self.datapath_loaded.load(Ordering::Acquire)
    }

    /// The plugin's socket is bound and its requests are served.
    pub fn set_serving(&self) {
        self.serving.store(true, Ordering::Release);
    }

    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    pub fn set_install(&self, install: Install) {
        match self.install.write() {
            Ok(mut state) => *state = install,
            Err(poisoned) => *poisoned.into_inner() = install,
        }
    }

    pub fn install(&self) -> Install {
        match self.install.read() {
            Ok(state) => state.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the node view (see [`NodeView::of`]).
    pub fn publish(&self, view: NodeView) {
        let view = Arc::new(view);
        match self.view.write() {
            Ok(mut current) => *current = view,
            Err(poisoned) => *poisoned.into_inner() = view,
        }
    }

    /// The node view last published.
    pub fn view(&self) -> Arc<NodeView> {
        match self.view.read() {
            Ok(view) => Arc::clone(&view),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Counts one request of the plugin, of `command` ([`command_of`]), that took
    /// `elapsed` from its arrival to its answer (the wait for the node's lock included).
    pub fn observe_request(&self, command: &'static str, elapsed: Duration) {
        let label = CommandLabel { command };
        self.requests
            .get_or_create(&label)
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one NAT sweep that took `elapsed`.
    pub fn observe_sweep(&self, elapsed: Duration) {
        self.sweeps.observe(elapsed.as_secs_f64());
    }
}

/// The `command` label of `request`: the CNI verb it serves where there is one (`add`
/// is the attach step of ADD, which the plugin sends once IPAM answered and the veth
/// is made; `prepare` and `unprepare` are ADD's earlier step and its undo), else the
/// request's own name.
pub fn command_of(request: &Request) -> &'static str {
    match request {
        Request::Attach(_) => "add",
        Request::Detach(_) => "del",
        Request::Get(_) => "check",
        Request::Gc { .. } => "gc",
        Request::Status => "status",
        Request::Prepare { .. } => "prepare",
        Request::Unprepare { .. } => "unprepare",
        Request::List => "list",
        Request::Nodes => "nodes",
        Request::Policies => "policies",
    }
}
