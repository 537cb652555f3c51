//! Bandwidth limits (`runtimeConfig.bandwidth` and the plugin's own keys): a TCP stream
//! in each direction holds to the rate, the burst passes at once after an idle time,
//! CHECK finds a limit that is gone, DEL takes the qdiscs with the veths, and the daemon
//! shows the limits. The shaped pod's peer is another pod of the node, so what it
//! receives comes through the datapath's redirect (see `endpoint_flags::SHAPED`).

use std::time::Duration;

use ebpf_cni_tests::{
    cni::Call,
    http,
    netns::Netns,
    node::{Node, Pod},
    require_root,
    traffic::{
        bulk,
        iperf::{self, Length},
    },
};
use serde_json::{Value, json};

fn limits(rate: u64, burst: u64) -> Value {
    json!({"bandwidth": {
        "ingressRate": rate, "ingressBurst": burst,
        "egressRate": rate, "egressBurst": burst,
    }})
}

/// The root qdisc of `device` in `netns` as `tc -j` shows it.
fn root_qdisc(netns: &Netns, device: &str) -> Value {
    let out = netns.run("tc", &["-j", "qdisc", "show", "dev", device, "root"]);
    let shown: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|error| panic!("tc -j: {error}: {}", String::from_utf8_lossy(&out.stderr)));
    shown[0].clone()
}

/// Streams 10 s from `client` to `server`'s `server_ip` (reversed with `-R`) and checks
/// the goodput is within 10% of `rate`.
fn assert_held(what: &str, client: &Netns, server: &Pod, options: &[&str], rate: u64) {
    let report = iperf::stream(
        client,
        &server.netns,
        server.ip,
        Length::Seconds(10),
        options,
    )
    .unwrap_or_else(|error| panic!("{what}: {error}"));
    let ratio = report.received_bps / rate as f64;
    println!(
        "{what}: {:.1} Mbit/s received for a {} Mbit/s limit ({:.3}), {} retransmits",
        report.received_bps / 1e6,
        rate / 1_000_000,
        ratio,
        report.retransmits
    );
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{what}: {:.1} Mbit/s for a {} Mbit/s limit ({report:?})",
        report.received_bps / 1e6,
        rate / 1_000_000
    );
}

/// Whether this run is inside `cargo xtask vm-test`'s emulated guest, which says how
/// much slower it runs (`ebpf_cni_tests::TIME_SCALE_VAR`).
fn in_emulated_guest() -> bool {
    std::env::var(ebpf_cni_tests::TIME_SCALE_VAR).is_ok_and(|scale| scale != "1")
}

/// A shaped pod at `rate` (burst: 100 ms at the rate, 1% of what a 10 s stream carries)
/// streams 10 s each way with an unlimited pod; each direction must land within 10% of
/// the rate. The pods' ceiling is measured first: a rate this machine cannot carry
/// with room to spare would measure the machine, not the limit. Natively that fails;
/// in vm-test's emulated guest (about 190 Mbit/s between two pods under TCG) the
/// rate is replaced by a quarter of the ceiling, and the test says so.
fn assert_rate_held(subnet: &str, rate: u64) {
    require_root();
    let node = Node::start(subnet);
    let peer = node.add_pod("bw-peer");
    let free = node.add_pod("bw-free");
    let ceiling = iperf::stream(&peer.netns, &free.netns, free.ip, Length::Seconds(3), &[])
        .expect("an unlimited stream")
        .received_bps;
    println!("ceiling between two pods: {:.0} Mbit/s", ceiling / 1e6);
    let rate = if ceiling > 1.5 * rate as f64 {
        rate
    } else if in_emulated_guest() {
        let reduced = (ceiling / 4.0 / 1e6) as u64 * 1_000_000;
        println!(
            "emulated guest: {} Mbit/s is above what it carries; measuring {} Mbit/s",
            rate / 1_000_000,
            reduced / 1_000_000
        );
        reduced
    } else {
        panic!(
            "this machine carries {:.0} Mbit/s between two pods: a {} Mbit/s limit cannot \
             be told from the ceiling",
            ceiling / 1e6,
            rate / 1_000_000
        )
    };
    let shaped = node.add_pod_with("bw-shaped", &limits(rate, rate / 10));
    assert_held("ingress", &peer.netns, &shaped, &[], rate);
    assert_held("egress", &peer.netns, &shaped, &["-R"], rate);
}

#[test]
fn a_tcp_stream_in_each_direction_holds_to_a_50_mbit_limit() {
    assert_rate_held("10.244.60.0/24", 50_000_000);
}

#[test]
fn a_tcp_stream_in_each_direction_holds_to_a_500_mbit_limit() {
    assert_rate_held("10.244.65.0/24", 500_000_000);
}

#[test]
fn the_burst_passes_at_once_after_an_idle_time_and_the_rate_holds_after_it() {
    require_root();
    let node = Node::start("10.244.61.0/24");
    let peer = node.add_pod("burst-peer");
    // 10 Mbit/s with a 5 MB bucket. After an idle time (the bucket full), 4 MB pass at
    // once; 9 MB pass their first 5 MB at once and the other 4 MB at the rate (3.2 s).
    // Each transfer starts with a full bucket, and is timed by its receiver from the
    // first byte to the last, so neither the connection's set-up nor a loaded machine's
    // slow start of a process can stretch or shrink what the bucket lets through.
    let (rate, burst) = (10_000_000u64, 40_000_000u64);
    let shaped = node.add_pod_with("burst", &limits(rate, burst));
    let refill = Duration::from_secs_f64(burst as f64 / rate as f64);
    let seconds_at_rate = |bytes: u64| bytes as f64 * 8.0 / rate as f64;
    let (small, large) = (4_000_000u64, 9_000_000u64);
    let beyond_burst = seconds_at_rate(large - burst / 8);

    // Into the pod (its ingress limit), then out of it (its egress limit).
    let directions = [
        ("ingress", (&peer, &shaped), 7100),
        ("egress", (&shaped, &peer), 7102),
    ];
    for (what, (sender, receiver), port) in directions {
        let transfer = |bytes: u64, port: u16| {
            std::thread::sleep(refill);
            let size = usize::try_from(bytes).expect("a size");
            let receiving = bulk::sink(&receiver.netns, port, size);
            bulk::send(&sender.netns, (receiver.ip, port).into(), size)
                .unwrap_or_else(|error| panic!("{what}: {error}"));
            let received = receiving.join().expect("the sink");
            assert!(received.intact, "{what}: {bytes} bytes arrive intact");
            received.flowing.as_secs_f64()
        };
        let (within, past) = (transfer(small, port), transfer(large, port + 1));
        println!("{what}: 4 MB in {within:.2} s, 9 MB in {past:.2} s (5 MB bucket)");
        assert!(
            within < seconds_at_rate(small) / 2.0,
            "{what}: 4 MB of a full 5 MB bucket took {within:.2} s (at the rate: {} s)",
            seconds_at_rate(small)
        );
        // The bucket's 5 MB go at once and the rest at the rate: about 3.2 s; all 9 MB
        // at the rate would be 7.2 s, and all at once (a bucket too large) well under one.
        assert!(
            (0.75 * beyond_burst..1.5 * beyond_burst).contains(&past),
            "{what}: 9 MB took {past:.2} s, not the {beyond_burst} s of 4 MB at the rate \
             after a full 5 MB bucket"
        );
    }
}

#[test]
fn check_finds_a_missing_limit_del_takes_the_qdiscs_and_the_daemon_shows_the_limits() {
    require_root();
    let node = Node::start("10.244.62.0/24");
    let runtime = json!({"bandwidth": {
        "ingressRate": 20_000_000, "ingressBurst": 2_000_000,
        "egressRate": 30_000_000, "egressBurst": 3_000_000,
    }});
    let (netns, outcome) = node.try_add("bw-check", &runtime);
    let result = outcome.ok();
    let pod = Pod {
        container_id: "bw-check".to_owned(),
        ip: ebpf_cni_tests::cni::first_ip(&result),
        netns,
    };
    let veth = node.host_veth(&pod);

    // Both ends carry a tbf: the host veth for what the pod receives (20 Mbit/s is
    // 2.5 MB/s), the pod's interface for what it sends.
    let ingress = root_qdisc(&node.netns, &veth);
    assert_eq!(ingress["kind"], "tbf", "{ingress}");
    assert_eq!(ingress["options"]["rate"], 2_500_000, "{ingress}");
    let egress = root_qdisc(&pod.netns, "eth0");
    assert_eq!(egress["kind"], "tbf", "{egress}");
    assert_eq!(egress["options"]["rate"], 3_750_000, "{egress}");

    let endpoint = node.endpoint(&pod);
    assert_eq!(
        endpoint["bandwidth"],
        json!({"ingress_rate": 20_000_000, "ingress_burst": 2_000_000,
               "egress_rate": 30_000_000, "egress_burst": 3_000_000}),
        "{endpoint}"
    );
    // Prometheus has them beside the pod's byte counters.
    let metrics = http::scrape(&node.netns);
    let ip = pod.ip.to_string();
    for (direction, rate) in [("to_pod", 20_000_000.0), ("from_pod", 30_000_000.0)] {
        let limit = metrics.expect(
            "ebpf_cni_endpoint_rate_limit_bits_per_second",
            &[("ip", &ip), ("direction", direction)],
        );
        assert_eq!(limit, rate, "{direction}");
    }
    let table = node.instance.cli(&["endpoints"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("in 20M/2M out 30M/3M"), "{table}");

    let mut config = node.network.config("1.1.0");
    config["runtimeConfig"] = runtime.clone();
    config["prevResult"] = result;
    let check = || Call::new("CHECK", "bw-check", "eth0", Some(&pod.netns), &config);
    check().run(&node.netns).ok();

    // Asked for other limits, CHECK tells the difference.
    let mut other = config.clone();
    other["runtimeConfig"]["bandwidth"]["egressRate"] = json!(40_000_000);
    let error = Call::new("CHECK", "bw-check", "eth0", Some(&pod.netns), &other)
        .run(&node.netns)
        .error(106);
    assert!(
        error["msg"].as_str().is_some_and(|m| m.contains("egress")),
        "{error}"
    );

    // A limit taken away behind the plugin's back fails CHECK, on either end.
    ebpf_cni_tests::netns::run_ok(
        pod.netns
            .command("tc")
            .args(["qdisc", "del", "dev", "eth0", "root"]),
    );
    let error = check().run(&node.netns).error(106);
    assert!(
        error["msg"].as_str().is_some_and(|m| m.contains("egress")),
        "{error}"
    );

    Call::new("DEL", "bw-check", "eth0", Some(&pod.netns), &config)
        .run(&node.netns)
        .ok();
    assert!(node.host_veths().is_empty(), "DEL left the host veth");
    let endpoints = node.instance.cli_json(&["endpoints"]);
    assert_eq!(endpoints, json!([]), "DEL left the record");
}

#[test]
fn the_plugins_own_keys_win_over_the_runtimes_as_in_the_bandwidth_plugin() {
    require_root();
    let node = Node::start("10.244.63.0/24");
    let mut config = node.network.config("1.1.0");
    config["ingressRate"] = json!(8_000_000);
    config["ingressBurst"] = json!(800_000);
    config["runtimeConfig"] = limits(50_000_000, 5_000_000);
    let netns = Netns::new("pod");
    Call::new("ADD", "bw-own", "eth0", Some(&netns), &config)
        .run(&node.netns)
        .ok();
    let endpoints = node.instance.cli_json(&["endpoints"]);
    assert_eq!(
        endpoints[0]["bandwidth"],
        json!({"ingress_rate": 8_000_000, "ingress_burst": 800_000,
               "egress_rate": null, "egress_burst": null}),
        "{endpoints}"
    );
    let veth = endpoints[0]["host_veth"]
        .as_str()
        .expect("a veth")
        .to_owned();
    assert_eq!(root_qdisc(&node.netns, &veth)["options"]["rate"], 1_000_000);
    assert_ne!(root_qdisc(&netns, "eth0")["kind"], "tbf");
    Call::new("DEL", "bw-own", "eth0", Some(&netns), &config)
        .run(&node.netns)
        .ok();
}

#[test]
fn a_qdisc_put_on_a_host_veth_after_add_is_honoured_and_so_is_its_removal() {
    require_root();
    let node = Node::start("10.244.64.0/24");
    let peer = node.add_pod("late-peer");
    let pod = node.add_pod("late");
    let veth = node.host_veth(&pod);
    // What the reference bandwidth plugin does after ebpf-cni in a chain, or an
    // operator by hand: a tbf on the host veth, which the datapath must not skip.
    let rate = 20_000_000u64;
    ebpf_cni_tests::netns::run_ok(node.netns.command("tc").args([
        "qdisc", "add", "dev", &veth, "root", "tbf", "rate", "20mbit", "burst", "250000b",
        "latency", "25ms",
    ]));
    let limited = iperf::stream(&peer.netns, &pod.netns, pod.ip, Length::Seconds(3), &[])
        .expect("a stream")
        .received_bps;
    println!("with the tbf: {:.1} Mbit/s", limited / 1e6);
    assert!(
        (0.85..=1.15).contains(&(limited / rate as f64)),
        "a 20 Mbit/s tbf put on {veth} after ADD let {:.1} Mbit/s through",
        limited / 1e6
    );
    ebpf_cni_tests::netns::run_ok(
        node.netns
            .command("tc")
            .args(["qdisc", "del", "dev", &veth, "root"]),
    );
    let free = iperf::stream(&peer.netns, &pod.netns, pod.ip, Length::Seconds(3), &[])
        .expect("a stream")
        .received_bps;
    println!("without it: {:.1} Mbit/s", free / 1e6);
    assert!(
        free > 3.0 * rate as f64,
        "with the tbf gone the pod still gets {:.1} Mbit/s",
        free / 1e6
    );
}

#[test]
fn a_raw_socket_that_skips_the_pods_qdisc_is_held_to_its_egress_limit() {
    use std::net::{SocketAddrV4, UdpSocket};

    use ebpf_cni_tests::{
        node::EXTERNAL_ADDR,
        traffic::{
            spawn_in,
            spoof::{flood_bypassing_qdisc, udp_frame},
        },
    };

    require_root();
    let node = Node::start("10.244.66.0/24");
    // 8 Mbit/s (1 MB/s) out, a burst of 80 kbit.
    let pod = node.add_pod_with("raw-flood", &limits(8_000_000, 80_000));
    let external: std::net::Ipv4Addr = EXTERNAL_ADDR.parse().expect("an address");
    let counter = spawn_in(&node.external, || {
        let socket = UdpSocket::bind("0.0.0.0:9700").expect("bind");
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("a timeout");
        let (mut bytes, mut quiet) = (0u64, 0);
        let mut buffer = [0u8; 2048];
        // Until the flood has been over for a second.
        while quiet < 5 {
            match socket.recv(&mut buffer) {
                Ok(n) => {
                    bytes += n as u64;
                    quiet = 0;
                }
                Err(_) => quiet += 1,
            }
        }
        bytes
    });
    std::thread::sleep(Duration::from_millis(200));
    let host_mac = node.netns.mac(&node.host_veth(&pod));
    let frame = udp_frame(
        host_mac,
        pod.netns.mac("eth0"),
        None,
        SocketAddrV4::new(pod.ip, 40000),
        SocketAddrV4::new(external, 9700),
        &[0x5a; 1400],
    );
    let seconds = 2;
    let sent = flood_bypassing_qdisc(&pod.netns, "eth0", &frame, Duration::from_secs(seconds))
        .expect("the flood");
    let received = counter.join().expect("the counter");
    let sent_bytes = sent * 1428;
    println!("flood: {sent_bytes} bytes sent past the qdisc in {seconds} s, {received} received");
    // The limit's 2 MB in two seconds, its slack and burst, and a second of margin.
    assert!(
        received <= 3_500_000,
        "{received} bytes received of {sent_bytes} sent at 1 MB/s"
    );
    assert!(
        sent_bytes > 4 * received,
        "the flood outran the limit: {sent_bytes}"
    );
    let status = node.instance.cli_json(&["status"]);
    assert!(
        status["drops"]["pod_rate_limited"].as_u64() > Some(0),
        "counted: {status}"
    );
}
