//! The TC entry of the NAT sweep, `nat_sweep`: never attached, run by the daemon with
//! BPF_PROG_TEST_RUN on the removals it decided (`sweep`).

use aya_ebpf::{macros::classifier, programs::TcContext};

use crate::features::sweep;

/// Its return value counts what went; it never fails.
#[classifier]
pub fn nat_sweep(ctx: TcContext) -> i32 {
    sweep::run(&ctx)
}
