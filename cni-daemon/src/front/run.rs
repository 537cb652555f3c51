//! `ebpf-cnid run`: the daemon's life from load to shutdown.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::Notify,
};

use crate::{
    clock,
    datapath::{Datapath, bpffs, overlay, overlay::OverlaySettings, sock::cgroup2_mount},
    front::{
        address_watch, cluster_watch,
        install::{self, InstallArgs, NodeSettings},
        metrics::{self, Install, NodeView, Telemetry},
        policy_watch, server,
    },
    model::{
        cluster::{Cluster, ClusterArgs, NodeSource},
        nat::{Flows, NatArgs, PortRange, Timeouts},
        node::{LocalNode, PolicySettings},
        policy::PolicyArgs,
    },
};

/// What `run` needs; every path is a flag so several simulated nodes can share a machine.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub bpf_dir: PathBuf,
    pub socket: PathBuf,
    /// Folder of the endpoint records (survives restarts).
    pub state_dir: PathBuf,
    pub attach: Vec<String>,
    /// `--service-cidr` and `--host-firewall-cidr`: see `Datapath::set_stack_cidrs`.
    pub service_cidrs: Vec<ipnet::Ipv4Net>,
    pub host_firewall_cidrs: Vec<ipnet::Ipv4Net>,
    /// `--service-node-port-range` and `--service-party-budget`: see
    /// `Datapath::set_service_config`.
    pub service_node_ports: PortRange,
    pub service_party_budget: u32,
    pub nat: NatArgs,
    /// `--enable-tcx`: see [`crate::datapath::tcx_in_use`].
    pub enable_tcx: bool,
    /// The cgroup v2 folder of the socket programs (hostPorts for the node's own
    /// processes); `None`: the root of the first cgroup v2 mount.
    pub cgroup: Option<PathBuf>,
    /// This node's name and where the cluster's nodes come from.
    pub cluster: ClusterArgs,
    /// Where NetworkPolicies come from, and `--policy-mode`.
    pub policy: PolicyArgs,
    /// `--metrics-address`: where `/healthz`, `/readyz` and `/metrics` are served.
    pub metrics_address: SocketAddr,
    /// `--health-address`: where `/healthz` and `/readyz` are served for the probes.
    pub health_address: SocketAddr,
    /// Where the CNI configuration is installed once the daemon serves.
    pub install: InstallArgs,
}

pub async fn run(config: RunConfig) -> anyhow::Result<()> {
    raise_file_limit();
    // Before anything is loaded: a wrong --uplink, a metrics address in use or an
    // install without a node source stops the daemon with nothing changed.
    let nat_settings = config.nat.resolve().context("cannot set up source NAT")?;
    let node_name = config.cluster.node_name()?;
    let node_source = config.cluster.source(crate::model::cluster::in_cluster());
    if config.install.cni_conf_dir.is_some() && node_source.is_none() {
        anyhow::bail!(
            "--cni-conf-dir needs a node source (--nodes-file, --kubeconfig, or a daemon \
             in a pod): the installed conflist takes the pods' addresses from this node's \
             pod ranges (usePodCidr)"
        );
    }
    let telemetry = Telemetry::new(
        config.bpf_dir.clone(),
        if config.install.wanted() {
            Install::Pending
        } else {
            Install::NotAsked
        },
    );
    let metrics_listener = metrics::http::bind(config.metrics_address)
        .await
        .with_context(|| {
            format!(
                "cannot listen on --metrics-address {}",
                config.metrics_address
            )
        })?;
    let health_listener = metrics::http::bind(config.health_address)
        .await
        .with_context(|| {
            format!(
                "cannot listen on --health-address {}",
                config.health_address
            )
        })?;
    tracing::info!(
        address = %metrics_listener.local_addr()?,
        health = %health_listener.local_addr()?,
        "serving /healthz, /readyz and /metrics, and the probes' /healthz and /readyz"
    );
    let metrics_server = tokio::spawn(metrics::http::serve(
        metrics_listener,
        Arc::clone(&telemetry),
    ));
    let health_server = tokio::spawn(metrics::http::serve_health(
        health_listener,
        Arc::clone(&telemetry),
    ));
    // A nodes file that cannot be read, or a kubeconfig that does not load, stops the
    // daemon here, with nothing changed.
    let nodes = match &node_source {
        Some(source) => Some(watch_nodes(source).await?),
        None => None,
    };
    // A policy file that cannot be read, or a kubeconfig that does not load, stops the
    // daemon here too.
    let policy_objects = watch_policies(&config.policy, node_source.as_ref()).await?;
    tracing::info!(
        node = %node_name,
        source = %node_source.as_ref().map_or_else(|| "none".to_owned(), ToString::to_string),
        "this node in its cluster"
    );
    if node_source.is_some() && config.cluster.cluster_cidrs.is_empty() {
        tracing::warn!(
            "no --cluster-cidr: other nodes' pod ranges are taken anywhere but over an \
             address of this node, the Service and host-firewall ranges, link-local and \
             the networks this node reaches directly; name the cluster's pod ranges to \
             take them only there"
        );
    }
    bpffs::prepare(&config.bpf_dir)?;
    let tcx = crate::datapath::tcx_in_use(config.enable_tcx);
    tracing::info!(
        mode = if tcx { "tcx" } else { "clsact" },
        enable_tcx = config.enable_tcx,
        "uplink programs attach"
    );
    let mut datapath = Datapath::load(&config.bpf_dir, config.nat.nat_max_flows, tcx)?;
    datapath.set_stack_cidrs(&config.service_cidrs, &config.host_firewall_cidrs)?;
    datapath.set_service_config(
        (config.service_node_ports.min, config.service_node_ports.max),
        config.service_party_budget,
    )?;
    if !config.service_cidrs.is_empty() || !config.host_firewall_cidrs.is_empty() {
        // That traffic, and its replies between pods, is routed by the stack.
        crate::model::nat::sysctl::enable_ip_forward(
            "pods' Service and host firewall traffic is routed by the node's stack",
        )
        .with_context(|| format!("cannot set {}", crate::model::nat::sysctl::IP_FORWARD))?;
    }
    for interface in &config.attach {
        datapath
            .attach_counter(interface)
            .with_context(|| format!("cannot attach to {interface}"))?;
    }
    let cgroup = config.cgroup.clone().or_else(root_cgroup);
    let mut node = LocalNode::open(
        datapath,
        &config.state_dir,
        nat_settings,
        cgroup.as_deref(),
        Cluster::new(
            node_name,
            node_source,
            config.cluster.routing,
            config
                .cluster
                .cluster_cidrs
                .iter()
                .map(ipnet::Ipv4Net::trunc)
                .collect(),
        ),
        OverlaySettings {
            port: config.cluster.vxlan_port,
            vni: config.cluster.vxlan_vni,
            underlay_trust: config.cluster.underlay_trust.datapath_value(),
        },
        PolicySettings {
            mode: config.policy.policy_mode,
            has_source: policy_objects.is_some(),
        },
    )?;
    if let Some(source) = &policy_objects {
        node.name_policy_source(source.name.clone());
    }
    // The daemon's own listeners are no hostPort's.
    node.deny_host_ports([
        (
            config.metrics_address.port(),
            "the daemon's metrics port (--metrics-address)".to_owned(),
        ),
        (
            config.health_address.port(),
            "the daemon's health port (--health-address)".to_owned(),
        ),
    ]);
    let flows = node.take_nat_flows().map(|(mut flows, timeouts)| {
        flows.set_service_budget(config.service_party_budget);
        (flows, timeouts)
    });
    let detached = Arc::new(Notify::new());
    if flows.is_some() {
        node.on_detach(Arc::clone(&detached));
    }
    telemetry.publish(NodeView::of(&node));
    telemetry.set_datapath_loaded();
    let node_settings = node_settings(&node, &config.socket);
    let node = Arc::new(Mutex::new(node));
    let address_watch = tokio::spawn(address_watch::run(
        Arc::clone(&node),
        Arc::clone(&telemetry),
        address_watch::ADDRESS_GROUPS,
    ));
    let qdisc_watch = tokio::spawn(address_watch::run(
        Arc::clone(&node),
        Arc::clone(&telemetry),
        address_watch::QDISC_GROUPS,
    ));
    let listener = server::bind(&config.socket)
        .with_context(|| format!("cannot listen on {}", config.socket.display()))?;
    telemetry.set_serving();
    // The socket accepts from here on (and is served once the select below runs): the
    // runtime may now be told about the network.
    let installer = config.install.wanted().then(|| {
        tokio::spawn(install_until_done(
            config.install.clone(),
            node_settings,
            Arc::clone(&telemetry),
        ))
    });
    // Beside the socket, whose folder `bind` made.
    let pod_cidrs_file = config
        .socket
        .parent()
        .unwrap_or_else(|| std::path::Path::new("/"))
        .join(cni_api::NODE_POD_CIDRS_FILE);
    let cluster_watch = nodes.map(|nodes| {
        tokio::spawn(cluster_watch::run(
            nodes,
            Arc::clone(&node),
            Arc::clone(&telemetry),
            pod_cidrs_file,
        ))
    });
    let policy_watch = policy_objects.map(|source| {
        tokio::spawn(policy_watch::run(
            source.objects,
            source.wait_first,
            Arc::clone(&node),
            Arc::clone(&telemetry),
        ))
    });
    tracing::info!(
        socket = %config.socket.display(),
        bpf_dir = %config.bpf_dir.display(),
        "ready"
    );

    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let sweeper = flows.map(|(flows, timeouts)| {
        tokio::spawn(sweep_nat(
            flows,
            timeouts,
            config.nat.gc_interval(),
            detached,
            Arc::clone(&telemetry),
        ))
    });
    let outcome = tokio::select! {
        () = server::serve(listener, Arc::clone(&node), Arc::clone(&telemetry)) => Ok(()),
        _ = terminate.recv() => Ok(()),
        _ = interrupt.recv() => Ok(()),
    };
    if let Some(sweeper) = sweeper {
        sweeper.abort();
    }
    address_watch.abort();
    qdisc_watch.abort();
    metrics_server.abort();
    health_server.abort();
    if let Some(installer) = installer {
        installer.abort();
    }
    if let Some(cluster_watch) = cluster_watch {
        cluster_watch.abort();
    }
    if let Some(policy_watch) = policy_watch {
        policy_watch.abort();
    }
    // The counter programs detach when the datapath drops; the pods' TC block and the
    // uplink and socket programs stay in the kernel, and maps stay pinned, for the next
    // start.
    let _ = std::fs::remove_file(&config.socket);
    tracing::info!("stopped; maps stay pinned until `ebpf-cnid uninstall`");
    outcome
}

/// What the installed conflist says of `node`: the pods' MTU (the daemon's, else the
/// first uplink's) and the daemon's socket.
fn node_settings(node: &LocalNode, socket: &std::path::Path) -> NodeSettings {
    let status = node.status();
    let uplink_mtu = || {
        let uplink = status.uplink.as_deref()?;
        overlay::link_mtu(uplink)
            .inspect_err(|error| tracing::warn!(%error, uplink, "cannot read the uplink's MTU"))
            .ok()
            .flatten()
    };
    NodeSettings {
        mtu: status.pod_mtu.or_else(uplink_mtu),
        socket: socket.to_owned(),
    }
}

/// How long a failed install waits before its next attempt.
const INSTALL_RETRY: Duration = Duration::from_secs(10);

/// Installs the CNI configuration ([`install::install`]) on a blocking thread, again
/// every [`INSTALL_RETRY`] until it succeeds; readiness follows ([`Install`]). A failure
/// does not stop the daemon: the pods already on the node keep being served.
async fn install_until_done(args: InstallArgs, node: NodeSettings, telemetry: Arc<Telemetry>) {
    let args = Arc::new(args);
    loop {
        let (args, node) = (Arc::clone(&args), node.clone());
        let outcome = tokio::task::spawn_blocking(move || install::install(&args, &node)).await;
        let error = match outcome {
            Ok(Ok(())) => {
                telemetry.set_install(Install::Done);
                return;
            }
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        tracing::warn!(%error, retry_in = ?INSTALL_RETRY, "cannot install the CNI configuration");
        telemetry.set_install(Install::Failed(error));
        tokio::time::sleep(INSTALL_RETRY).await;
    }
}

/// A policy source being followed.
struct PolicySource {
    objects: tokio::sync::watch::Receiver<Arc<cni_policy::Objects>>,
    /// The first value is a placeholder (see `policy_watch::run`).
    wait_first: bool,
    /// As `ebpf-cnid policy` shows it.
    name: String,
}

/// Starts following the policy objects: from `--policy-file` (its first read must
/// succeed), else from the Kubernetes API when the nodes come from it (the watch starts
/// with a placeholder and retries on its own; until it has listed everything, no pod's
/// isolation changes), else from nowhere (no pod is isolated).
async fn watch_policies(
    args: &PolicyArgs,
    nodes: Option<&NodeSource>,
) -> anyhow::Result<Option<PolicySource>> {
    Ok(match (&args.policy_file, nodes) {
        (Some(path), _) => {
            tracing::info!(file = %path.display(), "network policies from a file");
            Some(PolicySource {
                objects: cni_policy::watch_file(path.clone()).await?,
                wait_first: false,
                name: NodeSource::File(path.clone()).to_string(),
            })
        }
        (None, Some(source @ NodeSource::Cluster(access))) => {
            tracing::info!("network policies from the Kubernetes API");
            let client = cni_nodes::connect(access).await?;
            Some(PolicySource {
                objects: cni_policy::watch_cluster(client),
                wait_first: true,
                name: format!("kubernetes API ({source})"),
            })
        }
        (None, Some(NodeSource::File(_)) | None) => {
            tracing::info!("no network policy source (--policy-file): no pod is isolated");
            None
        }
    })
}

/// Starts following the cluster's nodes from `source`: the first read of a nodes file
/// must succeed; the API's watch starts empty and retries on its own.
async fn watch_nodes(
    source: &NodeSource,
) -> anyhow::Result<tokio::sync::watch::Receiver<cni_nodes::NodeSet>> {
    Ok(match source {
        NodeSource::File(path) => cni_nodes::watch_file(path.clone()).await?,
        NodeSource::Cluster(access) => cni_nodes::watch_cluster(cni_nodes::connect(access).await?),
    })
}

/// Raises the soft limit of open files to the hard one: every pod's connection, every
/// map and program is a file, and the default soft limit (1024) is the runtime's
/// choice, not ours. A failure is logged; the daemon runs with what it has.
fn raise_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "open-file limit raised"),
            Err(error) => tracing::warn!(%error, soft, hard, "cannot raise the open-file limit"),
        },
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot read the open-file limit"),
    }
}

/// The root of the machine's cgroup v2 hierarchy: where the socket programs reach every
/// process of the node (those of other namespaces are skipped by the programs).
fn root_cgroup() -> Option<PathBuf> {
    let found = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|mountinfo| cgroup2_mount(&mountinfo));
    if found.is_none() {
        tracing::warn!(
            "no cgroup v2 is mounted and no --cgroup was given: the node's own processes \
             cannot reach hostPorts (pods and other hosts still can)"
        );
    }
    found
}

/// How often the sweeper looks whether a new flow met a full table.
const PRESSURE_CHECK: Duration = Duration::from_secs(1);

/// Every `interval`, whenever a pod is detached (`detached`; detaches during a sweep
/// make one more sweep, not one each), and within a second of a new flow refused for a
/// full table, removes the NAT flows idle past their timeout and those of pods gone,
/// and makes room in a table nearly full (early drop). The sweep is synchronous map work:
/// it runs on a blocking thread, which owns the flow tables for the sweep and hands
/// them back; it never takes the node's lock.
async fn sweep_nat(
    flows: Flows,
    timeouts: Timeouts,
    interval: Duration,
    detached: Arc<Notify>,
    telemetry: Arc<Telemetry>,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; start sweeping one interval after start.
    ticks.tick().await;
    // Once a second: has a new flow met a full table since?
    let mut pressure = tokio::time::interval(PRESSURE_CHECK);
    pressure.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refused_for_room = flows.refused_for_room().unwrap_or_default();
    let mut flows = Some(flows);
    // Chunks the sweep program failed to run since start (each sweep's are logged).
    let mut failed_chunks = 0usize;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = detached.notified() => {}
            _ = pressure.tick() => {
                let refused = flows.as_ref().and_then(|f| f.refused_for_room().ok());
                match refused {
                    Some(count) if count > refused_for_room => refused_for_room = count,
                    _ => continue,
                }
            }
        }
        let Some(mut owned) = flows.take() else {
            return;
        };
        let started = Instant::now();
        let swept = tokio::task::spawn_blocking(move || {
            let outcome = clock::monotonic_now_ns()
                .context("cannot read CLOCK_MONOTONIC")
                .and_then(|now| owned.sweep(now, &timeouts).context("NAT sweep failed"));
            (owned, outcome)
        })
        .await;
        telemetry.observe_sweep(started.elapsed());
        match swept {
            Ok((owned, outcome)) => {
                flows = Some(owned);
                match outcome {
                    Ok(sweep) if sweep.failed_chunks > 0 => {
                        failed_chunks += sweep.failed_chunks;
                        tracing::warn!(
                            failed_chunks = sweep.failed_chunks,
                            since_start = failed_chunks,
                            "NAT sweep incomplete: the flows of its failed chunks wait for \
                             the next sweep"
                        );
                    }
                    Ok(sweep) if sweep.early_dropped > 0 => {
                        tracing::warn!(
                            early_dropped = sweep.early_dropped,
                            flows = sweep.flows,
                            from_outside = sweep.from_outside,
                            hostport = sweep.hostport,
                            "a flow table was nearly full: unanswered, opening and closing \
                             flows removed to make room (established ones stay)"
                        );
                    }
                    Ok(sweep) if sweep.removed_any() => {
                        tracing::debug!(
                            flows = sweep.flows,
                            orphans = sweep.orphans,
                            from_outside = sweep.from_outside,
                            hostport = sweep.hostport,
                            "NAT flows expired"
                        );
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!("{error:#}"),
                }
            }
            Err(error) => {
                // The tables went down with the panicked task: no more sweeps. The
                // datapath still takes expired ports over; new flows meeting a full
                // table are refused.
                tracing::error!(%error, "NAT sweep task failed; sweeping stops");
                return;
            }
        }
    }
}
