//! The eBPF programs of ebpf-cni.
//!
//! Layout (Cilium-like): one entry file per attach point holds the thin `#[classifier]`
//! functions; each feature has a module with its maps and logic.
#![no_std]
#![no_main]

mod count_by_source;
mod features;
mod forward;
mod pod;
mod primitives;
mod sock;
mod sweep;
mod uplink;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

/// Kernel-side license: GPL, since `bpf_redirect_peer` and the ring buffer helpers used by
/// aya-log are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
