//! DEL: idempotent and best effort. Every step runs whatever is already gone (netns,
//! veth, daemon record); IPAM DEL always runs, so the address is freed even when the
//! pod's namespace was deleted first.

use crate::{
    commands::{
        Invocation,
        teardown::{self, Failures},
    },
    spec::CniError,
};

pub fn run(inv: &Invocation) -> Result<(), CniError> {
    let host_veth = cni_api::naming::host_veth(inv.container_id()?, inv.ifname()?);
    let mut failures = Failures::default();
    failures.record(
        "daemon detach",
        teardown::detach(&inv.daemon(), inv.endpoint_id()?),
    );
    failures.record("veth removal", teardown::delete_host_veth(&host_veth));
    if let Some(ipam) = failures.record("IPAM lookup", inv.ipam()) {
        failures.record("IPAM release", ipam.run(&inv.ipam_env("DEL"), inv.raw()));
    }
    failures.into_result("DEL")
}
