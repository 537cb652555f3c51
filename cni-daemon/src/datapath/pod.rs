//! The pod program on each pod's host-side veth, attached through a link pinned at
//! `<bpf dir>/links/<veth>_ingress` (bpffs refuses dots in names), so it keeps
//! forwarding while the daemon is stopped or killed. Daemons before 0.2 also pinned a
//! `<veth>_egress` counting program; a restart removes those links.
//!
//! On a restart the daemon swaps its freshly loaded programs into the pinned links
//! (`attach_to_link`, atomic), so a changed object replaces the programs without any
//! gap and without touching endpoints. Kernels without TCX (< 6.6) get netlink clsact
//! filters instead, which outlive the process by themselves; there a restart replaces
//! the filter (detach by name, attach), a gap of a few microseconds.

use std::{fs, io, path::PathBuf};

use aya::programs::{
    SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::{self, SchedClassifierLink},
};
use cni_ebpf_common::program_names;

use super::{Datapath, DatapathError, classifier, ensure_clsact, has_tcx};

/// The program of a pod veth: where it attaches and its pin's suffix (one program: see
/// the eBPF `pod` module for why there is none on egress).
const POD_PROGRAMS: [(&str, TcAttachType, &str); 1] =
    [(program_names::FROM_POD, TcAttachType::Ingress, "ingress")];

/// Pin suffix of the egress counting program earlier daemons attached.
const LEGACY_EGRESS: &str = "egress";

impl Datapath {
    /// Attaches (or re-attaches, replacing the program in place) the pod programs on
    /// `host_veth`.
    pub fn attach_pod(&mut self, host_veth: &str) -> Result<(), DatapathError> {
        let links_dir = self.links_dir();
        fs::create_dir_all(&links_dir).map_err(|source| pin_error(&links_dir, source))?;
        let tcx = has_tcx();
        if !tcx {
            ensure_clsact(host_veth)?;
        }
        self.remove_legacy_egress(host_veth)?;
        // Each TCX attach waits for an RCU grace period under the rtnl lock (4 to 24 ms
        // here, in steps of a 4 ms jiffy): most of ADD's time.
        for (name, attach_type, suffix) in POD_PROGRAMS {
            let program = classifier(&mut self.ebpf, name)?;
            if tcx {
                attach_pinned(
                    program,
                    name,
                    host_veth,
                    attach_type,
                    links_dir.join(format!("{host_veth}_{suffix}")),
                )?;
            } else {
                attach_netlink(program, name, host_veth, attach_type)?;
            }
        }
        Ok(())
    }

    /// Detaches the pod programs of `host_veth` (its pins go; with TCX the links end with
    /// them). A veth that is already gone took its programs with it: not an error.
    pub fn detach_pod(&mut self, host_veth: &str) -> Result<(), DatapathError> {
        for (name, attach_type, suffix) in POD_PROGRAMS {
            let pin = self.links_dir().join(format!("{host_veth}_{suffix}"));
            match fs::remove_file(&pin) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(pin_error(&pin, source)),
            }
            if !has_tcx() {
                // Absent veth or filter: nothing to detach.
                let _ = tc::qdisc_detach_program(host_veth, attach_type, name);
            }
        }
        self.remove_legacy_egress(host_veth)
    }

    /// Removes the egress link an earlier daemon pinned for `host_veth`, if any (with
    /// TCX, the link ends with its pin; netlink filters of that program are left to
    /// the veth's removal: they only counted).
    fn remove_legacy_egress(&self, host_veth: &str) -> Result<(), DatapathError> {
        let pin = self
            .links_dir()
            .join(format!("{host_veth}_{LEGACY_EGRESS}"));
        match fs::remove_file(&pin) {
            Ok(()) => {
                tracing::info!(pin = %pin.display(), "removed an earlier daemon's egress link");
                Ok(())
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(pin_error(&pin, source)),
        }
    }

    /// Host veths that have pinned links (for reconciliation after a restart); the
    /// uplink's pins are not a pod's.
    pub fn pinned_pods(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.links_dir()) else {
            return Vec::new();
        };
        let mut veths: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                if super::uplink::is_uplink_pin(&name) {
                    return None;
                }
                name.rsplit_once('_').map(|(veth, _)| veth.to_owned())
            })
            .collect();
        veths.sort();
        veths.dedup();
        veths
    }

    /// `<bpf dir>/links`, where the pod and uplink links are pinned.
    pub(super) fn links_dir(&self) -> PathBuf {
        self.bpf_dir.join("links")
    }
}

/// Attaches `program` to `interface` through the TCX link pinned at `pin`: swapped into
/// the existing link when there is one, else a new link, pinned.
pub(super) fn attach_pinned(
    program: &mut SchedClassifier,
    name: &'static str,
    interface: &str,
    attach_type: TcAttachType,
    pin: PathBuf,
) -> Result<(), DatapathError> {
    let program_error = |source| DatapathError::Program {
        program: name,
        source,
    };
    let link_error = |source| DatapathError::Link {
        path: pin.display().to_string(),
        source,
    };
    // Checked first: BPF_OBJ_GET on a missing path answers EPERM, not ENOENT.
    if pin.exists() {
        // Swap this daemon's program into the existing link: traffic never sees a
        // moment without a program.
        let pinned = PinnedLink::from_pin(&pin).map_err(link_error)?;
        let link = SchedClassifierLink::try_from(FdLink::from(pinned)).map_err(link_error)?;
        let id = program.attach_to_link(link).map_err(program_error)?;
        // The link stays pinned; this process needs no handle on it.
        drop(program.take_link(id).map_err(program_error)?);
    } else {
        let id = program
            .attach(interface, attach_type)
            .map_err(program_error)?;
        let link = program.take_link(id).map_err(program_error)?;
        let fd_link = FdLink::try_from(link).map_err(link_error)?;
        fd_link
            .pin(&pin)
            .map_err(|source| pin_error(&pin, io::Error::other(source.to_string())))?;
    }
    Ok(())
}

/// Attaches `program` to `interface` as a netlink clsact filter (kernels < 6.6), replacing
/// the filter of the same name a previous daemon left.
pub(super) fn attach_netlink(
    program: &mut SchedClassifier,
    name: &'static str,
    interface: &str,
    attach_type: TcAttachType,
) -> Result<(), DatapathError> {
    let program_error = |source| DatapathError::Program {
        program: name,
        source,
    };
    // A filter left by the previous daemon is replaced, never doubled.
    let _ = tc::qdisc_detach_program(interface, attach_type, name);
    let id = program
        .attach(interface, attach_type)
        .map_err(program_error)?;
    // Netlink filters live in the kernel; dropping the handle would remove the filter,
    // so it is deliberately leaked (it holds no file descriptor).
    std::mem::forget(program.take_link(id).map_err(program_error)?);
    Ok(())
}

pub(super) fn pin_error(path: &std::path::Path, source: io::Error) -> DatapathError {
    DatapathError::Pin {
        path: path.display().to_string(),
        source,
    }
}
