//! The two sysctls NAT depends on, both per network namespace: the daemon reads and
//! writes its own namespace's only (/proc/sys/net follows the namespace of the process
//! that opens the file).

use std::{fs, io};

use super::args::PortRange;

/// Pods' packets to the outside are routed by the node's stack from the pod's veth to
/// the uplink, where `uplink_egress` translates them: the node must forward.
pub const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// Where the node's own connections take their source ports from.
pub const LOCAL_PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// Turns IPv4 forwarding on, and says so in the log when it was off, naming `why` (the
/// traffic that needs it).
pub fn enable_ip_forward(why: &str) -> io::Result<()> {
    if fs::read_to_string(IP_FORWARD)?.trim() == "1" {
        return Ok(());
    }
    fs::write(IP_FORWARD, "1\n")?;
    tracing::info!("net.ipv4.ip_forward set to 1 in the daemon's network namespace: {why}");
    Ok(())
}

/// The node's ephemeral port range (`ip_local_port_range`'s text: "MIN\tMAX").
pub fn parse_local_port_range(text: &str) -> Option<PortRange> {
    let mut parts = text.split_whitespace().map(str::parse::<u16>);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(min)), Some(Ok(max)), None) => Some(PortRange { min, max }),
        _ => None,
    }
}

/// Warns when the node's own connections may take ports that NAT hands out: a reply to
/// such a port would be ambiguous between the node and a pod.
pub fn warn_on_port_overlap(nat: &PortRange) {
    let Some(local) = fs::read_to_string(LOCAL_PORT_RANGE)
        .ok()
        .as_deref()
        .and_then(parse_local_port_range)
    else {
        return;
    };
    if local.overlaps(nat) {
        tracing::warn!(
            nat_ports = %nat,
            local_ports = %local,
            "the NAT port range overlaps net.ipv4.ip_local_port_range: the node's own \
             connections may collide with translated flows"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_port_range_text_parses() {
        assert_eq!(
            parse_local_port_range("32768\t60999\n"),
            Some(PortRange {
                min: 32768,
                max: 60999
            })
        );
        assert_eq!(parse_local_port_range("32768"), None);
        assert_eq!(parse_local_port_range("a b"), None);
        assert_eq!(parse_local_port_range("1 2 3"), None);
    }
}
