//! The eBPF programs of ebpf-cni, in three layers whose imports point only down:
//! - [`programs`]: one entry file per attach point (pod veth, uplink, sockets, ...),
//!   each with its own dispatch;
//! - [`features`]: what the datapath does (ARP, routing, source NAT and its replies,
//!   connection tracking, hostPort, Services, fragments, the sweep's removals);
//! - [`primitives`]: what every feature uses (header access and checks, checksums, the
//!   clock, the maps, delivery, counters).
//!
//! What the daemon must agree on (map types, protocol numbers, TCP flags, flow states
//! and timeouts) is in `cni_ebpf_common`.
#![no_std]
#![no_main]
// The atomic adds of `features::budget`: the target has no `AtomicU32` (no
// compare-and-swap), but the instruction set has atomic add.
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod features;
mod primitives;
mod programs;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

/// The license the kernel reads: GPL (GPL-2.0-only, this crate's LICENSE), which the
/// GPL-only helpers the programs call require (`bpf_fib_lookup`, `bpf_check_mtu`).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
