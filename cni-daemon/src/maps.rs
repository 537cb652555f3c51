//! Small helpers over aya's maps.

use aya::maps::MapError;

/// A delete whose key was already absent reached its goal: `Ok`.
pub fn removed(outcome: Result<(), MapError>) -> Result<(), MapError> {
    match outcome {
        Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(error))
            if error.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        other => other,
    }
}
