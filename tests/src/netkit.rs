//! netkit pairs (Linux 6.7, `CONFIG_NETKIT`): whether the running kernel makes them,
//! and which programs sit on a pair's peer hook, asked from the kernel itself.
//!
//! Debian's bpftool (7.1) and iproute2 (6.1) predate netkit, so the probe goes through
//! rtnetlink and the hook's query is the `bpf(2)` command, over aya-obj's `bpf_attr`.

use std::{io, mem};

use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd};
use rtnetlink::{LinkNetkit, packet_route::link::NetkitMode};

use crate::{netns::Netns, traffic::run_in};

/// What `cargo xtask vm-test` tells a guest of its kernel's configuration: `y` when it
/// is built with netkit, `n` when not. Unset on a host, whose kernel the probe decides.
pub const KERNEL_VAR: &str = "EBPF_CNI_KERNEL_NETKIT";

/// Whether the running kernel makes netkit pairs: a pair made (and dropped with its
/// namespace) in a namespace of its own. Where the test harness knows the kernel's
/// configuration ([`KERNEL_VAR`]), the probe must agree with it, so that a kernel with
/// netkit can never run only the tests for one without.
pub fn supported() -> bool {
    let scratch = Netns::new("nkprobe");
    let made = run_in(&scratch, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async {
            let (connection, handle, _) = rtnetlink::new_connection().expect("netlink socket");
            let connection = tokio::spawn(connection);
            let outcome = handle
                .link()
                .add(LinkNetkit::new("nkprobe0", "nkprobe1", NetkitMode::L2).build())
                .execute()
                .await;
            connection.abort();
            outcome
        })
    });
    let supported = match made {
        Ok(()) => true,
        Err(rtnetlink::Error::NetlinkError(message))
            if message.code.map(|code| -code.get()) == Some(libc::EOPNOTSUPP) =>
        {
            false
        }
        Err(error) => panic!("probing for netkit: {error}"),
    };
    crate::kernel::as_configured(KERNEL_VAR, supported, "a netkit pair")
}

/// IDs of the programs on the peer hook of the netkit pair whose primary is `device` in
/// `netns`, in the order they run.
pub fn peer_programs(netns: &Netns, device: &str) -> Vec<u32> {
    let device = device.to_owned();
    run_in(netns, move || {
        let ifindex = nix::net::if_::if_nametoindex(device.as_str())
            .unwrap_or_else(|error| panic!("no device {device}: {error}"));
        let mut ids = [0u32; 16];
        // SAFETY: bpf_attr is plain data; zeroes are what the kernel wants unused.
        let mut attr: bpf_attr = unsafe { mem::zeroed() };
        attr.query.__bindgen_anon_1.target_ifindex = ifindex;
        attr.query.attach_type = bpf_attach_type::BPF_NETKIT_PEER as u32;
        attr.query.prog_ids = ids.as_mut_ptr() as u64;
        attr.query.__bindgen_anon_2.prog_cnt = ids.len() as u32;
        // SAFETY: a whole bpf_attr of the size passed; `ids` outlives the call.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                bpf_cmd::BPF_PROG_QUERY as libc::c_int,
                &mut attr as *mut bpf_attr,
                mem::size_of::<bpf_attr>(),
            )
        };
        assert!(
            result == 0,
            "BPF_PROG_QUERY on {device}: {}",
            io::Error::last_os_error()
        );
        // SAFETY: the kernel wrote the count into the variant it was given in.
        let count = unsafe { attr.query.__bindgen_anon_2.prog_cnt } as usize;
        ids[..count].to_vec()
    })
}

/// The name of the loaded program `id`.
pub fn program_name(id: u32) -> String {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|program| program.id() == id)
        .and_then(|program| program.name_as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no loaded program {id}"))
}

/// The kind of the link `device` in `netns` (`veth`, `netkit`), as the kernel names it.
pub fn kind(netns: &Netns, device: &str) -> String {
    let out = netns.ip(&["-d", "-j", "link", "show", "dev", device]);
    let links: serde_json::Value = serde_json::from_str(&out).expect("ip -j prints JSON");
    links[0]["linkinfo"]["info_kind"]
        .as_str()
        .unwrap_or_else(|| panic!("{device} has no kind: {out}"))
        .to_owned()
}
