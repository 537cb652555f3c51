//! `ebpf-cnid`: run the node daemon, or inspect and uninstall it.

use std::{io::IsTerminal, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use cni_api as api;

use cni_daemon::{
    clock,
    front::{
        inspect::{join, nat as nat_view, read, render},
        install::InstallArgs,
        metrics,
        run::{self, RunConfig},
        uninstall,
    },
    model::{
        cluster::ClusterArgs,
        nat::{NatArgs, PortRange},
        policy::PolicyArgs,
    },
};
use ipnet::Ipv4Net;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "ebpf-cnid", version, about = "ebpf-cni node daemon")]
struct Cli {
    /// bpffs folder holding this instance's pinned maps.
    #[arg(
        long,
        env = "EBPF_CNID_BPF_DIR",
        default_value = "/sys/fs/bpf/ebpf-cni",
        global = true
    )]
    bpf_dir: PathBuf,
    /// Unix socket the plugin talks to.
    #[arg(
        long,
        env = "EBPF_CNID_SOCKET",
        default_value = api::DEFAULT_SOCKET,
        global = true
    )]
    socket: PathBuf,
    /// Folder of the endpoint records, which survive restarts.
    #[arg(
        long,
        env = "EBPF_CNID_STATE_DIR",
        default_value = "/var/lib/ebpf-cni",
        global = true
    )]
    state_dir: PathBuf,
    /// cgroup v2 folder whose processes reach hostPorts through the node's addresses and
    /// 127.0.0.1 (socket programs; only sockets of the daemon's network namespace are
    /// touched). Default: the root of the first cgroup v2 mount.
    #[arg(long, env = "EBPF_CNID_CGROUP", global = true)]
    cgroup: Option<PathBuf>,
    /// Output of the inspection commands.
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "one value per process, parsed once from the command line"
)]
enum Command {
    /// Load and pin the datapath, attach it, serve the plugin until SIGTERM.
    Run {
        /// Interface (in the daemon's network namespace) to attach the counter to.
        #[arg(long, env = "EBPF_CNID_ATTACH", value_delimiter = ',')]
        attach: Vec<String>,
        /// The cluster's Service ranges (ClusterIPs, and any externalIP or LoadBalancer
        /// IP ranges; comma-separated or repeated), when kube-proxy runs in iptables or
        /// nftables mode: pods' traffic to them and to
        /// node addresses (NodePorts), and the replies of those connections, then goes
        /// through the node's stack, where kube-proxy's DNAT is. Without them, pods'
        /// traffic skips the node's netfilter and a ClusterIP is routed as it is.
        #[arg(
            long = "service-cidr",
            env = "EBPF_CNID_SERVICE_CIDRS",
            value_delimiter = ','
        )]
        service_cidrs: Vec<Ipv4Net>,
        /// The cluster's NodePort range, MIN-MAX (kube-apiserver's
        /// `--service-node-port-range`): a connection to a node address is taken for a
        /// Service's, and its client remembered, only on these ports.
        #[arg(
            long,
            env = "EBPF_CNID_SERVICE_NODE_PORT_RANGE",
            default_value = "30000-32767"
        )]
        service_node_port_range: PortRange,
        /// Entries one party (a pod, or an address outside the node) may hold in each
        /// Service table (the sockets of Service clients, of outside clients, and the
        /// connections): a new Service connection past it is dropped
        /// (`service_budget`), and the party's own unanswered and closing entries are
        /// removed first. The default, a quarter of a table (32,768), is more than
        /// Linux's whole default ephemeral port range.
        #[arg(
            long,
            env = "EBPF_CNID_SERVICE_PARTY_BUDGET",
            default_value_t = cni_ebpf_common::DEFAULT_PARTY_BUDGET,
            value_parser = clap::value_parser!(u32).range(1..=i64::from(cni_ebpf_common::MAX_SERVICE_SOCKETS))
        )]
        service_party_budget: u32,
        /// Destinations that pods' traffic always reaches through the node's stack, so
        /// that the node's netfilter (its host firewall) sees it: by default pods'
        /// traffic skips it. For example a cloud metadata address (169.254.169.254/32)
        /// that only the node may reach: drop it in the node's FORWARD chain.
        #[arg(
            long = "host-firewall-cidr",
            env = "EBPF_CNID_HOST_FIREWALL_CIDRS",
            value_delimiter = ','
        )]
        host_firewall_cidrs: Vec<Ipv4Net>,
        /// Attach the uplink programs (source NAT, hostPorts from outside) and the
        /// counter through TCX links where the kernel has them (Linux >= 6.6); `false`
        /// attaches them as clsact filters, as on older kernels (as Cilium's flag of the
        /// same name). Either way they stay in the kernel across restarts and a restart
        /// swaps them in place.
        #[arg(
            long,
            env = "EBPF_CNID_ENABLE_TCX",
            default_value_t = true,
            action = clap::ArgAction::Set
        )]
        enable_tcx: bool,
        /// Address and port of the HTTP listener serving `/healthz` (alive), `/readyz`
        /// (the datapath loaded, the plugin's socket serving, the uplink with an
        /// address, the CNI configuration installed when asked) and `/metrics`
        /// (Prometheus). Always on. It listens in the daemon's network namespace, so
        /// daemons in different namespaces share the default; the bound address is
        /// logged.
        #[arg(
            long,
            env = "EBPF_CNID_METRICS_ADDRESS",
            default_value = metrics::DEFAULT_ADDRESS
        )]
        metrics_address: std::net::SocketAddr,
        /// Address and port of the HTTP listener serving `/healthz` and `/readyz` alone,
        /// for kubelet's probes: on loopback, no client of the metrics port (which pods
        /// may reach) can keep the probes out. Always on.
        #[arg(
            long,
            env = "EBPF_CNID_HEALTH_ADDRESS",
            default_value = metrics::DEFAULT_HEALTH_ADDRESS
        )]
        health_address: std::net::SocketAddr,
        #[command(flatten)]
        install: InstallArgs,
        #[command(flatten)]
        nat: NatArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Ask the running daemon what it has loaded and attached.
    Status,
    /// Packets and bytes per source address, read from the pinned map.
    Counters,
    /// The pods' endpoints the running daemon knows.
    Endpoints,
    /// The hostPort mappings of the pods the running daemon knows, with the connections
    /// through each (read from the pinned map).
    Ports,
    /// Source NAT: its configuration, counters and every translated flow, read from the
    /// pinned maps.
    Nat,
    /// The cluster's nodes as the running daemon's node source gives them: name,
    /// address, pod ranges.
    Nodes,
    /// The NetworkPolicies in force: each with the directions it isolates, the pods of
    /// this node it selects and its counters (read from the pinned map); each pod of
    /// this node with the directions it is isolated in; the objects the source refused.
    Policy,
    /// Remove every pin and endpoint record of this instance (stop the daemon first),
    /// and the CNI configuration `run --cni-conf-dir` wrote.
    Uninstall {
        /// The CNI config folder to remove `05-ebpf-cni.conflist` from (only that file,
        /// and only when it is the one `run` writes). The plugin binary `run
        /// --cni-bin-dir` copied stays: pods it made need it for their DEL.
        #[arg(long, env = "EBPF_CNID_CNI_CONF_DIR")]
        cni_conf_dir: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("EBPF_CNID_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            attach,
            service_cidrs,
            service_node_port_range,
            service_party_budget,
            host_firewall_cidrs,
            enable_tcx,
            metrics_address,
            health_address,
            install,
            nat,
            cluster,
            policy,
        } => {
            let config = RunConfig {
                bpf_dir: cli.bpf_dir,
                socket: cli.socket,
                state_dir: cli.state_dir,
                attach,
                service_cidrs,
                service_node_ports: service_node_port_range,
                service_party_budget,
                host_firewall_cidrs,
                nat,
                enable_tcx,
                cgroup: cli.cgroup,
                cluster,
                policy,
                metrics_address,
                health_address,
                install,
            };
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(run::run(config))
        }
        Command::Status => {
            let status = client(&cli).status()?;
            let bpf_dir = status.bpf_dir.as_path();
            let view = join::StatusView {
                drops: read::drops(bpf_dir)?,
                nat_counters: read::nat_counters(bpf_dir)?,
                status,
            };
            match cli.output {
                Output::Json => print_json(&view),
                Output::Table => print(&render::status_table(&view)),
            }
        }
        Command::Endpoints => {
            let api::EndpointList {
                endpoints,
                stack_sent,
                queued,
            } = client(&cli).list()?;
            let counters = read::endpoint_counters(&cli.bpf_dir)?;
            let views = join::endpoint_views(endpoints, &counters, &stack_sent, &queued);
            match cli.output {
                Output::Json => print_json(&views),
                Output::Table => print(&render::endpoints_table(&views)),
            }
        }
        Command::Nat => {
            let now = clock::monotonic_now_ns().context("cannot read CLOCK_MONOTONIC")?;
            let view = nat_view::nat_view(read::nat_tables(&cli.bpf_dir)?, now);
            match cli.output {
                Output::Json => print_json(&view),
                Output::Table => print(&render::nat_table(&view)),
            }
        }
        Command::Nodes => {
            let view = client(&cli).nodes()?;
            let table = join::nodes_table(view, &read::node_counters(&cli.bpf_dir)?);
            match cli.output {
                Output::Json => print_json(&table),
                Output::Table => print(&render::nodes_table(&table)),
            }
        }
        Command::Policy => {
            let view = client(&cli).policies()?;
            let table = join::policy_table(view, &read::policy_counters(&cli.bpf_dir)?);
            match cli.output {
                Output::Json => print_json(&table),
                Output::Table => print(&render::policy_table(&table)),
            }
        }
        Command::Ports => {
            let endpoints = client(&cli).list()?.endpoints;
            let connections = join::live_connections(read::hostport_connections(&cli.bpf_dir)?);
            let rows = join::port_rows(&endpoints, &connections);
            match cli.output {
                Output::Json => print_json(&rows),
                Output::Table => print(&render::ports_table(&rows)),
            }
        }
        Command::Counters => {
            let rows = read::source_counters(&cli.bpf_dir)?;
            match cli.output {
                Output::Json => print_json(&rows),
                Output::Table => print(&render::counters_table(&rows)),
            }
        }
        Command::Uninstall { cni_conf_dir } => uninstall::uninstall(&uninstall::Paths {
            bpf_dir: cli.bpf_dir,
            state_dir: cli.state_dir,
            socket: cli.socket,
            cni_conf_dir,
        }),
    }
}

/// The daemon of `cli`'s socket, for the views' requests.
fn client(cli: &Cli) -> api::Client {
    api::Client::new(cli.socket.clone(), Duration::from_secs(5))
}

fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("cannot encode JSON")?;
    print(&format!("{text}\n"))
}

fn print(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write to stdout")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// docs/configuration.md's table of the daemon's flags: each row's subcommand (none
    /// for a global flag), flag and environment variable.
    fn documented() -> Vec<(Option<String>, String, Option<String>)> {
        let doc = include_str!("../../docs/configuration.md");
        let table = doc
            .split("## The daemon (`ebpf-cnid`)")
            .nth(1)
            .expect("the daemon's section");
        table
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split(" | ").collect();
                let flag = cells.first()?.strip_prefix("| `")?.split('`').next()?;
                let words: Vec<&str> = flag.split_whitespace().collect();
                let (command, long) = match words.as_slice() {
                    [long, ..] if long.starts_with("--") => (None, *long),
                    [command, long, ..] if long.starts_with("--") => (Some(*command), *long),
                    _ => return None,
                };
                let env = cells
                    .get(1)
                    .and_then(|cell| cell.strip_prefix('`')?.strip_suffix('`'))
                    .map(str::to_owned);
                Some((
                    command.map(str::to_owned),
                    long.trim_start_matches('-').to_owned(),
                    env,
                ))
            })
            .collect()
    }

    /// Every long flag of `ebpf-cnid` with its subcommand (none: global) and variable.
    fn declared() -> Vec<(Option<String>, String, Option<String>)> {
        let cli = Cli::command();
        let flags = |command: &clap::Command, name: Option<&str>| {
            command
                .get_arguments()
                .filter(|arg| name.is_none() || !arg.is_global_set())
                .filter_map(|arg| {
                    Some((
                        name.map(str::to_owned),
                        arg.get_long()?.to_owned(),
                        arg.get_env().map(|env| env.to_string_lossy().into_owned()),
                    ))
                })
                .filter(|(_, long, _)| long != "help" && long != "version")
                .collect::<Vec<_>>()
        };
        let mut all = flags(&cli, None);
        for sub in cli.get_subcommands() {
            all.extend(flags(sub, Some(sub.get_name())));
        }
        all
    }

    #[test]
    fn the_configuration_page_lists_every_flag_with_its_variable_and_nothing_else() {
        let mut documented = documented();
        let mut declared = declared();
        documented.sort();
        declared.sort();
        assert_eq!(
            documented, declared,
            "docs/configuration.md's daemon table against `ebpf-cnid --help`"
        );
    }
}
