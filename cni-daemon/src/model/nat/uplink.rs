//! Finding the uplink: the device of the default IPv4 route and its address, both in the
//! daemon's own network namespace.

use std::net::Ipv4Addr;

use super::NatError;

/// The IPv4 routes of the main table, of the reading process's network namespace.
pub const ROUTES: &str = "/proc/net/route";

/// `RTF_UP` in the `Flags` column of [`ROUTES`].
const RTF_UP: u32 = 0x1;

/// The device of the default route of the daemon's namespace now (see
/// [`default_route_device`]).
pub fn default_route_device_now() -> Result<Option<String>, NatError> {
    let routes = std::fs::read_to_string(ROUTES).map_err(|source| NatError::Routes {
        path: ROUTES,
        source,
    })?;
    Ok(default_route_device(&routes))
}

/// The device of the default route in `table` (the text of [`ROUTES`]): the usable
/// 0.0.0.0/0 route with the lowest metric, the first one listed on a tie, as the kernel
/// picks it.
pub fn default_route_device(table: &str) -> Option<String> {
    let mut best: Option<(u32, &str)> = None;
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Iface Destination Gateway Flags RefCnt Use Metric Mask MTU Window IRTT
        let [iface, destination, _, flags, _, _, metric, mask, ..] = fields[..] else {
            continue;
        };
        let hex = |field: &str| u32::from_str_radix(field, 16).ok();
        let (Some(destination), Some(flags), Some(mask)) =
            (hex(destination), hex(flags), hex(mask))
        else {
            continue;
        };
        let Ok(metric) = metric.parse::<u32>() else {
            continue;
        };
        if destination != 0 || mask != 0 || flags & RTF_UP == 0 {
            continue;
        }
        if best.is_none_or(|(lowest, _)| metric < lowest) {
            best = Some((metric, iface));
        }
    }
    best.map(|(_, iface)| iface.to_owned())
}

/// The first IPv4 address of `interface` (the primary one: the kernel lists it first).
pub fn ipv4_address(interface: &str) -> Result<Option<Ipv4Addr>, NatError> {
    let addresses = nix::ifaddrs::getifaddrs().map_err(|source| NatError::Addresses {
        interface: interface.to_owned(),
        source,
    })?;
    Ok(addresses
        .filter(|entry| entry.interface_name == interface)
        .find_map(|entry| {
            entry
                .address
                .and_then(|address| address.as_sockaddr_in().map(|sin| sin.ip()))
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT                                                       \n";

    fn table(rows: &[&str]) -> String {
        let mut text = HEADER.to_owned();
        for row in rows {
            text.push_str(row);
            text.push_str("                                                    \n");
        }
        text
    }

    #[test]
    fn default_route_device_is_found() {
        let text = table(&[
            "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0",
            "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0",
        ]);
        assert_eq!(default_route_device(&text).as_deref(), Some("eth0"));
    }

    #[test]
    fn no_default_route_means_no_uplink() {
        let text = table(&[
            "veth0\t0012C6C6\t00000000\t0001\t0\t0\t0\t00FEFFFF\t0\t0\t0",
            // 0.0.0.0/8 starts at 0 but is not the default route.
            "dummy0\t00000000\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0",
        ]);
        assert_eq!(default_route_device(&text), None);
        assert_eq!(default_route_device(HEADER), None);
        assert_eq!(default_route_device(""), None);
    }

    #[test]
    fn lowest_metric_default_route_wins() {
        let text = table(&[
            "wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0",
            "eth1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0",
            "eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0",
        ]);
        assert_eq!(default_route_device(&text).as_deref(), Some("eth1"));
    }

    #[test]
    fn default_route_that_is_not_up_is_skipped() {
        let text = table(&[
            "eth0\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\t0\t0\t0",
            "eth1\t00000000\t0100000A\t0003\t0\t0\t50\t00000000\t0\t0\t0",
        ]);
        assert_eq!(default_route_device(&text).as_deref(), Some("eth1"));
    }

    #[test]
    fn malformed_lines_are_ignored() {
        let text = table(&[
            "garbage",
            "eth9\tzzzzzzzz\t00000000\t0003\t0\t0\t0\t00000000\t0\t0\t0",
            "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0",
        ]);
        assert_eq!(default_route_device(&text).as_deref(), Some("eth0"));
    }

    #[test]
    fn loopback_has_an_ipv4_address() {
        // Every network namespace has lo; it is 127.0.0.1 once up, and has no address
        // while down (a fresh namespace): both are valid answers, an error is not.
        let address = ipv4_address("lo").expect("getifaddrs works");
        assert!(address.is_none_or(|a| a.is_loopback()), "{address:?}");
    }
}
