//! The daemon's health and metrics listeners (`ebpf-cnid run --metrics-address`, by
//! default 127.0.0.1:9876 in the daemon's namespace, and the probes' `--health-address`,
//! 127.0.0.1:9877): `/healthz` answers while the
//! process serves, `/readyz` only once the uplink has an address, and `/metrics`
//! follows the pods' traffic (under their Kubernetes namespace and name), the drops by
//! reason, source NAT's flows and refusals, hostPorts, the requests and the sweeps;
//! it answers while an ADD holds the node's lock; a pod holding idle connections to the
//! metrics port keeps neither the probes nor other scrapers out.

use std::{
    fs,
    io::Read,
    net::{Ipv4Addr, SocketAddrV4},
    thread,
    time::Duration,
};

use ebpf_cni_tests::{
    cni::{Call, first_ip},
    daemon::{Daemon, Instance, eventually},
    http::{self, Metrics},
    netns::Netns,
    node::{EXTERNAL_ADDR, NODE_ADDR, Node, Pod, external_host, port_mappings},
    require_root,
    traffic::spoof::send_udp_as,
};

/// Pings `count` times from `from` to `to`; panics unless every one is answered.
fn ping(from: &Netns, to: &str, count: u32) {
    let out = from.run(
        "ping",
        &["-c", &count.to_string(), "-i", "0.2", "-W", "2", to],
    );
    assert!(out.status.success(), "ping {to}: {out:?}");
}

/// ADD as kubelet's runtime does it: `CNI_ARGS` naming the pod.
fn add_named(node: &Node, container_id: &str, namespace: &str, name: &str) -> Pod {
    let netns = Netns::new("pod");
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID=uid-{name}"
    );
    let result = Call::new(
        "ADD",
        container_id,
        "eth0",
        Some(&netns),
        &node.network.config("1.0.0"),
    )
    .var("CNI_ARGS", &args)
    .run(&node.netns)
    .ok();
    Pod {
        container_id: container_id.to_owned(),
        ip: first_ip(&result),
        netns,
    }
}

fn packets(metrics: &Metrics, pod: &str, ip: Ipv4Addr, direction: &str) -> f64 {
    let ip = ip.to_string();
    metrics.expect(
        "ebpf_cni_endpoint_packets_total",
        &[
            ("namespace", "shop"),
            ("pod", pod),
            ("ip", &ip),
            ("interface", "eth0"),
            ("direction", direction),
        ],
    )
}

#[test]
fn readiness_waits_for_the_uplinks_address_while_health_answers() {
    require_root();
    let netns = Netns::new("node");
    let _external = external_host(&netns);
    // The uplink is named but has no address yet (a NIC whose DHCP has not answered).
    netns.ip(&["addr", "flush", "dev", "uplink0"]);
    let instance = Instance::new();
    let _daemon = Daemon::start_with(&netns, &instance, &[], &["--uplink", "uplink0"]);

    let health = http::get(&netns, "/healthz");
    assert_eq!(health.status, 200, "{health:?}");
    let ready = http::get(&netns, "/readyz");
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(
        ready.body.contains("uplink0 has no IPv4 address"),
        "the reason is said: {ready:?}"
    );

    netns.ip(&["addr", "add", &format!("{NODE_ADDR}/24"), "dev", "uplink0"]);
    assert!(
        eventually(Duration::from_secs(10), || http::get(&netns, "/readyz")
            .status
            == 200),
        "/readyz never became ready: {:?}",
        http::get(&netns, "/readyz")
    );
    assert_eq!(http::get(&netns, "/readyz").body, "ready\n");
}

#[test]
fn metrics_follow_pods_traffic_drops_nat_hostports_requests_and_sweeps() {
    require_root();
    // One flow per pod: the second flow of a pod is refused, which the metrics count.
    let node = Node::start_with(
        "10.244.81.0/24",
        &[],
        &["--nat-pod-max-flows", "1", "--nat-gc-interval", "1"],
    );
    let before = http::scrape(&node.netns);
    assert_eq!(before.expect("ebpf_cni_endpoints", &[]), 0.0);
    assert_eq!(
        before.expect("ebpf_cni_nat_flows_capacity", &[]),
        262_144.0,
        "the default --nat-max-flows"
    );

    let a = add_named(&node, "metrics-a", "shop", "web-0");
    let b = add_named(&node, "metrics-b", "shop", "web-1");
    ping(&a.netns, &b.ip.to_string(), 5);
    let after = http::scrape(&node.netns);
    assert_eq!(after.expect("ebpf_cni_endpoints", &[]), 2.0);
    assert!(
        packets(&after, "web-0", a.ip, "from_pod") >= 5.0,
        "{}",
        after.0
    );
    assert!(
        packets(&after, "web-1", b.ip, "from_pod") >= 5.0,
        "{}",
        after.0
    );
    assert!(
        packets(&after, "web-1", b.ip, "to_pod") >= 5.0,
        "{}",
        after.0
    );
    let bytes = after.expect(
        "ebpf_cni_endpoint_bytes_total",
        &[("pod", "web-0"), ("direction", "from_pod")],
    );
    assert!(
        bytes >= 5.0 * 84.0,
        "five ICMP echoes of 84 bytes at least: {bytes}"
    );
    assert_eq!(
        after.expect(
            "ebpf_cni_request_duration_seconds_count",
            &[("command", "add")]
        ),
        2.0,
        "one attach per ADD"
    );

    // A spoofed source is dropped and counted under its reason.
    let spoofed = before.expect("ebpf_cni_drops_total", &[("reason", "spoofed_ipv4_source")]);
    let external = SocketAddrV4::new(EXTERNAL_ADDR.parse().expect("an address"), 9000);
    send_udp_as(
        &a.netns,
        Ipv4Addr::new(10, 244, 81, 200),
        40000,
        external,
        b"x",
    )
    .expect("sent");
    assert!(
        eventually(Duration::from_secs(5), || {
            http::scrape(&node.netns)
                .expect("ebpf_cni_drops_total", &[("reason", "spoofed_ipv4_source")])
                > spoofed
        }),
        "the spoofed packet is not counted"
    );

    // The pod's first flow out is translated; its second is over its budget.
    ping(&a.netns, EXTERNAL_ADDR, 1);
    send_udp_as(&a.netns, a.ip, 40001, external, b"second flow").expect("sent");
    let nat = http::scrape(&node.netns);
    assert_eq!(
        nat.expect("ebpf_cni_nat_flows", &[("table", "translated")]),
        1.0
    );
    assert!(nat.expect("ebpf_cni_nat_events_total", &[("event", "new_flows")]) >= 1.0);
    assert!(
        nat.expect(
            "ebpf_cni_nat_refused_flows_total",
            &[("reason", "flow_budget")]
        ) >= 1.0,
        "{}",
        nat.0
    );
    assert!(nat.expect("ebpf_cni_nat_events_total", &[("event", "over_budget")]) >= 1.0);

    // hostPorts.
    assert_eq!(nat.expect("ebpf_cni_hostport_mappings", &[]), 0.0);
    let mapped = node.add_pod_with(
        "metrics-c",
        &port_mappings(80, &[(8080, "tcp", None), (8080, "udp", None)]),
    );
    let mapped_metrics = http::scrape(&node.netns);
    assert_eq!(
        mapped_metrics.expect("ebpf_cni_hostport_mappings", &[]),
        2.0
    );
    // A pod without CNI_ARGS has its counters with empty names.
    let ip = mapped.ip.to_string();
    assert!(
        mapped_metrics
            .value(
                "ebpf_cni_endpoint_packets_total",
                &[("pod", ""), ("ip", &ip), ("direction", "from_pod")]
            )
            .is_some(),
        "{}",
        mapped_metrics.0
    );

    // DEL: the pod's series go, the request is counted, and the sweeper ran.
    node.del_pod(&a);
    node.del_pod(&mapped);
    let gone = http::scrape(&node.netns);
    assert_eq!(gone.expect("ebpf_cni_endpoints", &[]), 1.0);
    assert_eq!(gone.expect("ebpf_cni_hostport_mappings", &[]), 0.0);
    assert!(
        gone.value("ebpf_cni_endpoint_packets_total", &[("pod", "web-0")])
            .is_none(),
        "a deleted pod's counters are gone: {}",
        gone.0
    );
    assert!(
        gone.expect(
            "ebpf_cni_request_duration_seconds_count",
            &[("command", "del")]
        ) >= 2.0
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            http::scrape(&node.netns).expect("ebpf_cni_nat_sweep_duration_seconds_count", &[])
                >= 1.0
        }),
        "no sweep was counted"
    );
    node.del_pod(&b);
}

#[test]
fn metrics_answer_while_an_add_holds_the_nodes_lock() {
    require_root();
    let node = Node::start("10.244.82.0/24");
    // The attach writes the pod's record through `<id>.json.tmp`: a FIFO there blocks
    // the daemon in open(2), inside the node's lock, until the test reads it.
    let fifo = node.instance.state_dir.join("held@eth0.json.tmp");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("a FIFO");
    let pod_netns = Netns::new("pod");
    let config = node.network.config("1.0.0");
    let add = {
        let call = Call::new("ADD", "held", "eth0", Some(&pod_netns), &config);
        let node_netns = node.netns.path();
        thread::spawn(move || {
            let netns = Netns::existing(&node_netns);
            call.run(&netns)
        })
    };
    let status = cni_api::Request::Status;
    let socket = node.instance.socket.clone();
    let locked = || cni_api::call(&socket, &status, Duration::from_millis(500)).is_err();
    assert!(
        eventually(Duration::from_secs(8), locked),
        "the ADD never held the node's lock"
    );

    let metrics = http::get_at(
        &node.netns,
        http::METRICS_ADDRESS,
        "/metrics",
        Duration::from_secs(3),
    )
    .expect("/metrics answers while the lock is held");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("ebpf_cni_endpoints 0"),
        "{}",
        metrics.body
    );
    let ready = http::get_at(
        &node.netns,
        http::METRICS_ADDRESS,
        "/readyz",
        Duration::from_secs(3),
    )
    .expect("/readyz answers while the lock is held");
    assert_eq!(ready.status, 200, "{ready:?}");
    assert!(locked(), "the lock was held throughout");

    // Let the attach go on (its record cannot be fsynced on a FIFO: the ADD fails and
    // is rolled back, which is not what this test is about).
    let mut reader = fs::File::open(&fifo).expect("the FIFO opens");
    let mut written = Vec::new();
    reader.read_to_end(&mut written).expect("the record read");
    let outcome = add.join().expect("the ADD thread");
    assert!(
        !written.is_empty(),
        "the daemon wrote the record into the FIFO: {outcome:?}"
    );
    let _ = fs::remove_file(&fifo);
    assert!(
        eventually(Duration::from_secs(5), || !locked()),
        "the lock is free again"
    );
}

#[test]
fn a_pod_holding_connections_keeps_neither_the_probes_nor_scrapers_out() {
    require_root();
    // The metrics port on every address of the node, as the DaemonSet has it.
    let node = Node::start_with(
        "10.244.83.0/24",
        &[],
        &["--metrics-address", "0.0.0.0:9876"],
    );
    let pod = node.add_pod("hostile");
    let metrics_port = format!("{NODE_ADDR}:9876");
    // Sixty-four connections from the pod that never send a byte.
    let target = metrics_port.clone();
    let idle = ebpf_cni_tests::traffic::run_in(&pod.netns, move || {
        (0..64)
            .filter_map(|_| std::net::TcpStream::connect(target.as_str()).ok())
            .collect::<Vec<_>>()
    });
    assert!(!idle.is_empty(), "the pod reaches the metrics port");
    thread::sleep(Duration::from_millis(300));
    let started = std::time::Instant::now();
    // Kubelet's probes, on loopback, and a scraper outside the node are served at once.
    let probe = http::get_at(
        &node.netns,
        http::HEALTH_ADDRESS,
        "/healthz",
        Duration::from_secs(2),
    );
    assert_eq!(
        probe.map(|answer| answer.status),
        Ok(200),
        "the liveness probe"
    );
    let scrape = http::get_at(
        &node.external,
        &metrics_port,
        "/metrics",
        Duration::from_secs(2),
    );
    assert_eq!(
        scrape.map(|answer| answer.status),
        Ok(200),
        "a scraper outside the node"
    );
    // The daemon closes every one of the pod's connections, those past its share at
    // once and the rest once their headers are late: each read ends with nothing read.
    for mut stream in idle {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("a read timeout");
        let mut byte = [0u8; 1];
        let read = stream.read(&mut byte);
        assert!(
            matches!(read, Ok(0))
                || read
                    .as_ref()
                    .is_err_and(|error| error.kind() == std::io::ErrorKind::ConnectionReset),
            "an idle connection was not closed: {read:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "closed late: {:?}",
        started.elapsed()
    );
    assert_eq!(http::get(&node.netns, "/healthz").status, 200);
}
