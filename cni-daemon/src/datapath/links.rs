//! Programs attached through pinned TCX links, which outlive the daemon: attach or swap
//! through a pin, and the error of a pin that cannot be made or read.

use std::{io, path::PathBuf};

use aya::programs::{
    SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::SchedClassifierLink,
};

use super::DatapathError;

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

/// Removes the pin at `path`; returns whether there was one.
pub(super) fn remove_pin(path: &std::path::Path) -> Result<bool, DatapathError> {
    crate::files::remove_file(path).map_err(|source| pin_error(path, source))
}

pub(super) fn pin_error(path: &std::path::Path, source: io::Error) -> DatapathError {
    DatapathError::Pin {
        path: path.display().to_string(),
        source,
    }
}
