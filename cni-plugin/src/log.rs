//! Diagnostics for people: always on stderr, since stdout is the CNI protocol channel.

/// One warning line on stderr, prefixed with the plugin's name.
pub fn warn(message: &str) {
    eprintln!("ebpf-cni: {message}");
}
