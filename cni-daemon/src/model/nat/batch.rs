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
    /// The struct's tail padding, as a field so that it is zero: the kernel refuses
    /// (EINVAL) a command whose bytes after its last field are not all zero, and
    /// padding is not initialised.
    pad: u32,
}

// No implicit padding left: every byte the kernel reads is a field's.
const _: () = assert!(size_of::<TestRunAttr>() == 80);
const _: () = assert!(size_of::<BatchAttr>() == 56);

/// Runs `cmd` on `attr`. A batch command writes `count` back (entries done), also when
/// it fails part way.
///
/// # Safety
/// `A` is the `union bpf_attr` member `cmd` takes, `#[repr(C)]` with the kernel's
/// layout, and every pointer in `attr` is valid for what the kernel reads or writes
/// through it: for a batch, `count` keys and values of the map's own key and value
/// sizes (see [`check_layout`]), and the batch position; for a test run, `data_size_in`
/// bytes of `data_in`.
unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> Result<(), io::Error> {
    // SAFETY: the caller's contract above; the kernel reads and writes `attr` within
    // its size.
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
    // SAFETY: `attr` is the `test` member; `data_in` points to `frame`, of at least
    // `data_size_in` bytes, and nothing is copied out.
    unsafe { bpf(BPF_PROG_TEST_RUN, &mut attr) }.map_err(|io_error| SyscallError {
        call: "bpf_prog_test_run",
        io_error,
    })?;
    Ok(attr.retval)
}

/// Refuses a `K`/`V` whose size is not the map's key and value size: the kernel copies
/// the map's sizes, whatever the buffers were made for.
fn check_layout<K, V>(map: &MapData, call: &'static str) -> Result<(), SyscallError> {
    let info = map_info(map, call)?;
    check_size("key", info.key_size(), size_of::<K>(), call)?;
    check_size("value", info.value_size(), size_of::<V>(), call)
}

fn check_key_size<K>(map: &MapData, call: &'static str) -> Result<(), SyscallError> {
    let info = map_info(map, call)?;
    check_size("key", info.key_size(), size_of::<K>(), call)
}

fn map_info(map: &MapData, call: &'static str) -> Result<aya::maps::MapInfo, SyscallError> {
    map.info().map_err(|error| SyscallError {
        call,
        io_error: io::Error::other(error.to_string()),
    })
}

fn check_size(what: &str, map: u32, ours: usize, call: &'static str) -> Result<(), SyscallError> {
    if usize::try_from(map).ok() == Some(ours) {
        return Ok(());
    }
    Err(SyscallError {
        call,
        io_error: io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the map's {what} size is {map} bytes, the caller's type {ours}"),
        ),
    })
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
    check_layout::<K, V>(map, "bpf_map_lookup_batch")?;
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
        // SAFETY: `attr` is the `batch` member; `keys` and `values` hold CHUNK entries
        // of the map's own sizes (checked above), `in_batch` and `out_batch` point to
        // u32s that outlive the call.
        let last = match unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
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
    check_key_size::<K>(map, "bpf_map_delete_batch")?;
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
        // SAFETY: `attr` is the `batch` member; `keys` points to `count` keys of the
        // map's own key size (checked above), which the kernel only reads.
        let result = unsafe { bpf(BPF_MAP_DELETE_BATCH, &mut attr) };
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
