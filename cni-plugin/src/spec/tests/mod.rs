//! Unit tests of the protocol layer, one file per module; JSON fixtures live in
//! `../fixtures` and are read with `include_str!`.

mod args;
mod config;
mod env;
mod error;
mod go_json;
mod result;
mod runtimes;
mod version;

use super::CniError;

/// The numeric code of a failed call, with a message naming what was expected to fail.
#[track_caller]
fn code_of<T: std::fmt::Debug>(outcome: Result<T, CniError>) -> u32 {
    match outcome {
        Ok(value) => panic!("expected a CNI error, got Ok({value:?})"),
        Err(err) => err.code.code(),
    }
}

/// The error of a failed call.
#[track_caller]
fn error_of<T: std::fmt::Debug>(outcome: Result<T, CniError>) -> CniError {
    match outcome {
        Ok(value) => panic!("expected a CNI error, got Ok({value:?})"),
        Err(err) => err,
    }
}
