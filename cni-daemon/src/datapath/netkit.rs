//! The pod program on a pod's netkit pair (Linux 6.7; the plugin makes one for a
//! conflist with `"podDevice": "netkit"`), in place of the TC block a veth is bound to.
//!
//! `from_pod` goes on the pair's peer hook (`BPF_NETKIT_PEER`, named through the
//! host-side primary device): it runs inside the pod's own transmit, and a frame it
//! redirects leaves for the uplink or another pod from there. A veth hands every frame
//! the pod sends to the host's backlog queue first and runs the program in a second pass
//! (`docs/decisions.md`, "netkit pods").
//!
//! `to_pod` goes on the pair's primary hook (`BPF_NETKIT_PRIMARY`): it runs in the
//! primary's transmit, on what the node's stack (or the datapath) hands to the pod.
//!
//! The programs are attached without a link (`BPF_PROG_ATTACH`), as the block's filter
//! is: the attachment belongs to the device, outlives the daemon and goes with the
//! device, so nothing is pinned per pod. A restarted daemon replaces the program it
//! finds there with its own (`BPF_F_REPLACE`), one device at a time, with no moment
//! without one.
//!
//! aya 0.14 (pinned: docs/architecture.md, Toolchain) attaches TCX programs but not netkit ones: the four
//! `bpf(2)` commands below are written here, over aya-obj's `bpf_attr`.

use std::{
    io, mem,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

use aya_obj::generated::{BPF_F_REPLACE, bpf_attach_type, bpf_attr, bpf_cmd};

/// Most programs a pair's hook is expected to hold (the daemon puts one on each).
const MAX_PROGRAMS: usize = 16;

/// A netkit pair's hooks, both named through its primary device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// The pod's side: what the pod sends.
    Peer,
    /// The host's side: what is sent to the pod.
    Primary,
}

impl Hook {
    fn attach_type(self) -> u32 {
        match self {
            Self::Peer => bpf_attach_type::BPF_NETKIT_PEER as u32,
            Self::Primary => bpf_attach_type::BPF_NETKIT_PRIMARY as u32,
        }
    }
}

/// IDs of the programs on `hook` of the netkit pair whose primary is `ifindex`, in the
/// order they run.
pub fn attached(ifindex: u32, hook: Hook) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; MAX_PROGRAMS];
    let mut attr = zeroed();
    attr.query.__bindgen_anon_1.target_ifindex = ifindex;
    attr.query.attach_type = hook.attach_type();
    attr.query.prog_ids = ids.as_mut_ptr() as u64;
    attr.query.__bindgen_anon_2.prog_cnt = MAX_PROGRAMS as u32;
    bpf(bpf_cmd::BPF_PROG_QUERY, &mut attr)?;
    // SAFETY: the kernel wrote the count into the same variant.
    let count = unsafe { attr.query.__bindgen_anon_2.prog_cnt } as usize;
    Ok(ids[..count.min(MAX_PROGRAMS)].to_vec())
}

/// Attaches `program` to `hook` of the pair whose primary is `ifindex`; with
/// `replace`, in that program's place, in one step.
pub fn attach(
    ifindex: u32,
    hook: Hook,
    program: BorrowedFd<'_>,
    replace: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut attr = zeroed();
    attr.__bindgen_anon_5.__bindgen_anon_1.target_ifindex = ifindex;
    attr.__bindgen_anon_5.attach_bpf_fd = program.as_raw_fd() as u32;
    attr.__bindgen_anon_5.attach_type = hook.attach_type();
    if let Some(old) = replace {
        attr.__bindgen_anon_5.attach_flags = BPF_F_REPLACE;
        attr.__bindgen_anon_5.replace_bpf_fd = old.as_raw_fd() as u32;
    }
    bpf(bpf_cmd::BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// Detaches `program` from `hook` of the pair whose primary is `ifindex`.
pub fn detach(ifindex: u32, hook: Hook, program: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = zeroed();
    attr.__bindgen_anon_5.__bindgen_anon_1.target_ifindex = ifindex;
    attr.__bindgen_anon_5.attach_bpf_fd = program.as_raw_fd() as u32;
    attr.__bindgen_anon_5.attach_type = hook.attach_type();
    bpf(bpf_cmd::BPF_PROG_DETACH, &mut attr).map(drop)
}

/// A file descriptor of the loaded program `id` (an earlier daemon's, to replace or
/// detach it).
pub fn program(id: u32) -> io::Result<OwnedFd> {
    let mut attr = zeroed();
    attr.__bindgen_anon_6.__bindgen_anon_1.prog_id = id;
    let fd = bpf(bpf_cmd::BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn zeroed() -> bpf_attr {
    // SAFETY: bpf_attr is plain data; all zeroes is how the kernel wants unused fields.
    unsafe { mem::zeroed() }
}

fn bpf(command: bpf_cmd, attr: &mut bpf_attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a whole bpf_attr, and its size is the size passed.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command as libc::c_int,
            attr as *mut bpf_attr,
            mem::size_of::<bpf_attr>(),
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}
