//! The uplink programs as `cls_bpf` filters of a device's `clsact` qdisc, where TCX
//! links are not used (Linux < 6.6, or `--enable-tcx false`).
//!
//! A filter lives in the kernel, not in a pin, so it outlives the daemon as a pinned
//! TCX link does. Each program's filter sits at a fixed preference and handle
//! ([`PRIORITY`], [`HANDLE`]): a restarted daemon replaces the program inside that
//! filter in one netlink request, as TCX swaps a link's program, so the uplink never
//! goes without it. (Detaching the old filter and attaching a new one, as this path
//! did before, left a moment in which replies reached the node's stack untranslated
//! and were answered with a reset.)

use aya::programs::{
    SchedClassifier, TcAttachType,
    links::Link,
    tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
};
use futures::TryStreamExt;
use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcMessage, TcOption};

use super::{DatapathError, netlink, tc_block};

/// The preference of the uplink programs' filters: after the filters the kernel numbers
/// itself (the first gets 0xc000, later ones lower numbers, which run first), so that an
/// observer attached before them (the counter of `--attach`) still sees every packet, as
/// it does when both are TCX links in attach order.
pub const PRIORITY: u16 = 0xc001;
/// The filters' handle at [`PRIORITY`].
pub const HANDLE: u32 = 1;

/// Puts `program` (named `name`) into `interface`'s filter at ([`PRIORITY`], `handle`)
/// on `attach_type`: the program replaced in place when the filter exists, else the
/// filter created (the `clsact` qdisc must exist). Filters of the same name elsewhere
/// on that hook (added by hand or by a build that used another preference) go
/// afterwards, once this one runs.
pub(super) fn attach(
    program: &mut SchedClassifier,
    name: &'static str,
    interface: &str,
    attach_type: TcAttachType,
    handle: u32,
) -> Result<(), DatapathError> {
    let program_error = |source| DatapathError::Program {
        program: name,
        source,
    };
    let found = filters_named(interface, attach_type, name)?;
    let ours = (PRIORITY, handle);
    let id = if found.contains(&ours) {
        let link = SchedClassifierLink::attached(
            interface,
            attach_type,
            PRIORITY,
            TcHandle::from(handle),
            None,
        )
        .map_err(|source| program_error(tc::TcError::IoError(source).into()))?;
        program.attach_to_link(link)
    } else {
        program.attach_with_options(
            interface,
            attach_type,
            TcAttachOptions::Netlink(NlOptions {
                priority: PRIORITY,
                handle: TcHandle::from(handle),
                classid: None,
            }),
        )
    }
    .map_err(program_error)?;
    // The filter lives in the kernel; dropping the handle would remove it, so it is
    // deliberately leaked (it holds no file descriptor).
    std::mem::forget(program.take_link(id).map_err(program_error)?);
    for (priority, handle) in found.into_iter().filter(|filter| *filter != ours) {
        tracing::info!(
            interface,
            program = name,
            priority,
            handle,
            "removing another filter of the program"
        );
        SchedClassifierLink::attached(
            interface,
            attach_type,
            priority,
            TcHandle::from(handle),
            None,
        )
        .map_err(|source| program_error(tc::TcError::IoError(source).into()))?
        .detach()
        .map_err(program_error)?;
    }
    Ok(())
}

/// Removes every filter of the program `name` from `interface`'s `attach_type` hook;
/// none there, or no such device (any more: a device going away while this runs, as a
/// veth whose peer's namespace is being deleted, answers ENODEV), is not an error.
pub fn detach(
    interface: &str,
    attach_type: TcAttachType,
    name: &'static str,
) -> Result<(), DatapathError> {
    match tc::qdisc_detach_program(interface, attach_type, name) {
        Ok(()) => Ok(()),
        Err(tc::TcError::IoError(error))
            if error.kind() == std::io::ErrorKind::NotFound
                || error.raw_os_error() == Some(libc::ENODEV) =>
        {
            Ok(())
        }
        Err(tc::TcError::NetlinkError(error)) if error.raw_os_error() == Some(libc::ENODEV) => {
            Ok(())
        }
        Err(source) => Err(DatapathError::Program {
            program: name,
            source: source.into(),
        }),
    }
}

/// (preference, handle) of the BPF filters of the program `name` on `interface`'s
/// `attach_type` hook.
fn filters_named(
    interface: &str,
    attach_type: TcAttachType,
    name: &str,
) -> Result<Vec<(u16, u32)>, DatapathError> {
    let index = nix::net::if_::if_nametoindex(interface)
        .map_err(|_| DatapathError::NoInterface(interface.to_owned()))?;
    let filters: Vec<TcMessage> = netlink::with_netlink(move |handle| async move {
        let request = handle.traffic_filter(index as i32).get();
        let request = match attach_type {
            TcAttachType::Egress => request.egress(),
            _ => request.ingress(),
        };
        request
            .execute()
            .try_collect()
            .await
            .map_err(tc_block::netlink(format!("listing the filters of {index}")))
    })?;
    Ok(filters
        .iter()
        .filter(|filter| u32::from(filter.header.handle) != 0 && is_named(filter, name))
        .map(|filter| {
            (
                (filter.header.info >> 16) as u16,
                u32::from(filter.header.handle),
            )
        })
        .collect())
}

/// Whether `filter` is a BPF filter whose program is named `name`.
fn is_named(filter: &TcMessage, name: &str) -> bool {
    filter.attributes.iter().any(|attribute| {
        match attribute {
        TcAttribute::Options(options) => options.iter().any(|option| {
            matches!(option, TcOption::Bpf(TcFilterBpfOption::ProgName(found)) if found == name)
        }),
        _ => false,
    }
    })
}
