//! DEL: idempotent and best effort. Every step runs whatever is already gone (netns,
//! veth, daemon record); IPAM DEL always runs, so the address is freed even when the
//! pod's namespace was deleted first.

use crate::{
    commands::{
        Invocation,
        teardown::{self, Failures},
    },
    ipam::Ipam,
    naming,
    spec::CniError,
};

pub fn run(inv: &Invocation) -> Result<(), CniError> {
    let host_veth = naming::host_veth(inv.container_id()?, inv.ifname()?);
    let mut failures = Failures::default();
    failures.record(
        "daemon detach",
        teardown::detach(&inv.daemon(), inv.endpoint_id()?),
    );
    failures.record("veth removal", teardown::delete_host_veth(&host_veth));
    let ipam_type = inv.conf.ipam_type()?;
    if let Some(ipam) = failures.record(
        "IPAM lookup",
        Ipam::find(ipam_type, &inv.env.path, inv.ipam_versions()),
    ) {
        failures.record("IPAM release", ipam.run(&inv.ipam_env("DEL"), inv.raw()));
    }
    failures.into_result("DEL")
}
