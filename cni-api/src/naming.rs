//! The names of a pod's host veth, deterministic so that DEL, CHECK and GC find what ADD
//! made without any saved state, and shared with the daemon, which accepts only such
//! veths and rebuilds lost records from them.

use sha2::{Digest, Sha256};

/// Whether `text` is a CNI spec identifier (a container id, a network name): letters,
/// digits, '_', '.' and '-', starting with a letter or digit (ASCII, as libcni's regex).
pub fn is_spec_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Linux `IFNAMSIZ` is 16 including the terminating NUL.
const IFNAME_MAX_BYTES: usize = 15;

/// Why `name` cannot be an interface name, if it cannot: the kernel's `dev_valid_name`
/// rules, which the spec repeats (1..=15 bytes, not "." or "..", no '/', ':' or
/// whitespace).
pub fn ifname_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("empty")
    } else if name.len() > IFNAME_MAX_BYTES {
        Some("longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("\".\" and \"..\" are reserved")
    } else if name.contains(['/', ':']) {
        Some("contains '/' or ':'")
    } else if name.chars().any(char::is_whitespace) {
        Some("contains whitespace")
    } else {
        None
    }
}

/// Prefix of every host-side veth this plugin creates.
pub const HOST_VETH_PREFIX: &str = "veb";

/// Prefix of the alias set on every host-side veth: `ebpf-cni/<network>/<container id>/<ifname>`.
/// GC reads it to find veths of vanished pods even when the daemon lost its records.
pub const ALIAS_PREFIX: &str = "ebpf-cni/";

/// The host-side veth of (container id, ifname): `veb` + 12 hex digits of a SHA-256 of
/// both, 15 characters, the longest name Linux accepts. SHA-256 rather than std's hasher,
/// whose output may change between Rust releases, which would orphan veths on upgrade.
pub fn host_veth(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::new()
        .chain_update(container_id.as_bytes())
        .chain_update([0])
        .chain_update(ifname.as_bytes())
        .finalize();
    let hex: String = digest
        .iter()
        .take(6)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{HOST_VETH_PREFIX}{hex}")
}

/// Whether `name` has the shape of [`host_veth`]'s names: the prefix and 12 lowercase
/// hex digits.
pub fn is_host_veth(name: &str) -> bool {
    name.strip_prefix(HOST_VETH_PREFIX).is_some_and(|hex| {
        hex.len() == 12
            && hex
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    })
}

/// The alias of a host-side veth.
pub fn host_alias(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{ALIAS_PREFIX}{network}/{container_id}/{ifname}")
}

/// (network, container id, ifname) from an alias made by [`host_alias`]. Container ids
/// and ifnames contain no '/', so the last two fields split cleanly even when the
/// network name has one.
pub fn parse_alias(alias: &str) -> Option<(&str, &str, &str)> {
    let rest = alias.strip_prefix(ALIAS_PREFIX)?;
    let (rest, ifname) = rest.rsplit_once('/')?;
    let (network, container_id) = rest.rsplit_once('/')?;
    Some((network, container_id, ifname))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_veth_is_stable_short_and_distinct_per_ifname() {
        let a = host_veth("0123456789abcdef", "eth0");
        assert_eq!(a, host_veth("0123456789abcdef", "eth0"), "deterministic");
        assert_eq!(a.len(), 15, "the longest valid Linux name");
        assert!(a.starts_with(HOST_VETH_PREFIX));
        assert_ne!(a, host_veth("0123456789abcdef", "eth1"));
        assert_ne!(a, host_veth("0123456789abcdeg", "eth0"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(host_veth("ab", "c"), host_veth("a", "bc"));
        assert!(is_host_veth(&a));
        for other in [
            "uplink0",
            "eth0",
            "ecnblock0",
            "veb0123456789a",
            "veb0123456789abc",
            "veb0123456789AB",
            "veb0123456789ag",
            "",
        ] {
            assert!(!is_host_veth(other), "{other}");
        }
    }

    #[test]
    fn alias_round_trips_even_with_a_slash_in_the_network_name() {
        let alias = host_alias("team/net", "c0ffee", "eth0");
        assert_eq!(parse_alias(&alias), Some(("team/net", "c0ffee", "eth0")));
        assert_eq!(parse_alias("something else"), None);
    }
}
