//! The running kernel's version, for the tests whose expectations differ between the
//! kernels users run (`cargo xtask vm-test` runs the suite on Debian's 6.1 and 6.12).

use std::fs;

/// `uname -r`: `6.1.0-50-amd64`.
pub fn release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("the kernel's release")
        .trim()
        .to_owned()
}

/// The running kernel's (major, minor).
pub fn version() -> (u32, u32) {
    major_minor(&release())
}

/// `6.1.0-50-amd64` -> (6, 1).
pub fn major_minor(release: &str) -> (u32, u32) {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().expect("a number"));
    (
        numbers.next().expect("a major version"),
        numbers.next().expect("a minor version"),
    )
}

/// TCX links (Linux 6.6): where the daemon attaches the uplink programs by default.
pub fn has_tcx() -> bool {
    version() >= (6, 6)
}

/// IPv4 BIG TCP (`gso_ipv4_max_size`, Linux 6.3): pods follow the uplink's size there;
/// before, every link has the 64 KiB limit and no such attribute.
pub fn has_big_tcp_ipv4() -> bool {
    version() >= (6, 3)
}

/// `made`, what a probe of the running kernel found (it made `what`), held to the
/// kernel's configuration where `cargo xtask vm-test` tells it in `var` (`y` or `n`;
/// unset on a host, whose kernel the probe alone decides): a guest whose kernel has
/// the feature can never take the path of a kernel without it.
pub fn as_configured(var: &str, made: bool, what: &str) -> bool {
    if let Ok(expected) = std::env::var(var) {
        assert_eq!(
            made,
            expected == "y",
            "{var}={expected} (the kernel's configuration), but the probe {} {what}",
            if made { "made" } else { "did not make" }
        );
    }
    made
}

#[cfg(test)]
mod tests {
    use super::major_minor;

    #[test]
    fn releases_read_as_major_and_minor() {
        assert_eq!(major_minor("6.1.0-50-amd64"), (6, 1));
        assert_eq!(major_minor("6.12.95+deb12-amd64"), (6, 12));
        assert_eq!(major_minor("5.10.0-32-amd64"), (5, 10));
        assert_eq!(major_minor("6.18.0"), (6, 18));
    }
}
