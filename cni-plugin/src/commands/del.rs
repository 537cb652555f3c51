//! DEL: idempotent and best effort. Every step runs whatever is already gone (netns,
//! veth, daemon record); IPAM DEL always runs, so the address is freed even when the
//! pod's namespace was deleted first. A `usePodCidr` network's IPAM config needs the
//! node's pod ranges, from the daemon or, while it does not answer, its file; without
//! either, DEL fails with 11 and the runtime's retry frees the address
//! (`ipam::pod_cidr`).

use crate::{
    commands::{
        Invocation,
        teardown::{self, Failures},
    },
    spec::{CniError, Command},
};

pub fn run(inv: &Invocation) -> Result<(), CniError> {
    let host_veth = cni_api::naming::host_veth(inv.container_id()?, inv.ifname()?);
    let mut failures = Failures::default();
    failures.record(
        "daemon detach",
        teardown::detach(&inv.daemon(), inv.endpoint_id()?),
    );
    failures.record("veth removal", teardown::delete_host_veth(&host_veth));
    if let Some(ipam) = failures.record("IPAM lookup", inv.ipam())
        && let Some(config) = failures.record("IPAM config", inv.ipam_config(None))
    {
        failures.record(
            "IPAM release",
            ipam.run(&inv.ipam_env(Command::Del), &config),
        );
    }
    failures.into_result("DEL")
}
