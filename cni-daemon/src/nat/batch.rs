//! The sweep's syscalls, in batches: reads and deletes of the flow tables
//! (BPF_MAP_LOOKUP_BATCH and BPF_MAP_DELETE_BATCH, Linux 5.6) for the sweep's reads and
//! the flush when NAT is switched off, and runs of the `nat_sweep` program
//! (BPF_PROG_TEST_RUN) for its removals.
//!
//! Written by hand on the `bpf` syscall: aya 0.14 has no batch operations, and reading
//! a table through aya's iterator costs two syscalls per entry (the next key, then its
//! value); in batches of [`CHUNK`] entries a whole table takes a few. aya's test run
//! needs the program object, which the loaded `Ebpf` keeps; the sweeper owns a copy of
//! the program's fd only.

use std::{
    io,
    mem::{MaybeUninit, size_of},
    os::fd::{AsFd, AsRawFd},
};

use aya::{Pod, maps::MapData, programs::ProgramFd, sys::SyscallError};

/// `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// Entries read per syscall. A hash map's batch never splits a bucket, so this must
/// exceed the longest bucket chain (a handful of entries).
const CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The `test` member of `union bpf_attr` (BPF_PROG_TEST_RUN).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
}

/// Runs `cmd` on `attr`, a member of `union bpf_attr` whose pointers the caller made
/// valid for the sizes it gives. A batch command writes `count` back (entries done),
/// also when it fails part way.
fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> Result<(), io::Error> {
    // SAFETY: `attr` is the `union bpf_attr` member for `cmd`, of the size given, whose
    // pointers the caller made valid; the kernel reads and writes it within that size.
    let result =
        unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<A>()) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs the TC program `program` once on `frame` (BPF_PROG_TEST_RUN, nothing copied
/// back) and returns its return value.
pub fn run(program: &ProgramFd, frame: &[u8]) -> Result<u32, SyscallError> {
    let mut attr = TestRunAttr {
        prog_fd: program.as_fd().as_raw_fd() as u32,
        data_size_in: u32::try_from(frame.len()).unwrap_or(u32::MAX),
        data_in: frame.as_ptr() as u64,
        repeat: 1,
        ..TestRunAttr::default()
    };
    bpf(BPF_PROG_TEST_RUN, &mut attr).map_err(|io_error| SyscallError {
        call: "bpf_prog_test_run",
        io_error,
    })?;
    Ok(attr.retval)
}

fn zeroed<T: Pod>(len: usize) -> Vec<T> {
    // SAFETY: `Pod` types are plain data, for which all-zero bytes are a value.
    (0..len)
        .map(|_| unsafe { MaybeUninit::<T>::zeroed().assume_init() })
        .collect()
}

/// Every entry of the hash map `map`, at most `max` (the datapath changes the map
/// meanwhile: an entry added during the read may be missed, one removed may still show).
pub fn read_all<K: Pod, V: Pod>(map: &MapData, max: usize) -> Result<Vec<(K, V)>, SyscallError> {
    let fd = map.fd().as_fd().as_raw_fd();
    let (mut keys, mut values) = (zeroed::<K>(CHUNK), zeroed::<V>(CHUNK));
    let mut entries = Vec::new();
    // The position to go on from: a bucket index the kernel hands back.
    let mut position: Option<u32> = None;
    loop {
        let mut next: u32 = 0;
        let mut attr = BatchAttr {
            in_batch: position
                .as_ref()
                .map_or(0, |at| std::ptr::from_ref(at) as u64),
            out_batch: std::ptr::from_mut(&mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // ENOENT: this was the last batch (possibly with entries).
        let last = match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
            Ok(()) => false,
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => true,
            Err(io_error) => {
                return Err(SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error,
                });
            }
        };
        let read = (attr.count as usize).min(CHUNK);
        entries.extend(
            keys[..read]
                .iter()
                .copied()
                .zip(values[..read].iter().copied()),
        );
        if last || entries.len() >= max {
            return Ok(entries);
        }
        position = Some(next);
    }
}

/// Deletes `keys` from `map`; keys already gone are skipped. Returns how many were
/// deleted.
pub fn delete<K: Pod>(map: &MapData, keys: &[K]) -> Result<usize, SyscallError> {
    let fd = map.fd().as_fd().as_raw_fd();
    let (mut done, mut deleted) = (0, 0);
    while done < keys.len() {
        let rest = &keys[done..];
        let mut attr = BatchAttr {
            keys: rest.as_ptr() as u64,
            count: u32::try_from(rest.len()).unwrap_or(u32::MAX),
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        let result = bpf(BPF_MAP_DELETE_BATCH, &mut attr);
        let through = (attr.count as usize).min(rest.len());
        deleted += through;
        match result {
            Ok(()) if through > 0 => done += through,
            // The kernel stops at a key that is not there: skip it, go on after it.
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => done += through + 1,
            Ok(()) => break,
            Err(io_error) => {
                return Err(SyscallError {
                    call: "bpf_map_delete_batch",
                    io_error,
                });
            }
        }
    }
    Ok(deleted)
}
