//! The socket programs (hostPorts for the node's own processes, see the eBPF `sock`
//! module), attached to a cgroup v2 folder through links pinned under
//! `<bpf dir>/links/cgroup/<program>`, so they keep working while the daemon is
//! stopped. A restart attaches the new program first (several programs may share a
//! cgroup hook) and then renames its pin over the old one, which detaches the old
//! program: there is no moment without a hook. Running both for that instant is
//! harmless: a second rewrite finds no mapping for a pod's address.

use std::{
    fs::{self, File},
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap, MapData},
    programs::{CgroupAttachMode, CgroupSockAddr, links::FdLink},
};
use cni_api::Attachment;
use cni_ebpf_common::{SockConfig, map_names, program_names};

use super::{
    Datapath, DatapathError,
    links::{pin_error, remove_pin},
};

/// The maps the node's hostPort code keeps: node addresses and the bitmap of target
/// ports.
pub struct HostPortMaps {
    pub node_addrs: HashMap<MapData, [u8; 4], u8>,
    pub targets: Array<MapData, u32>,
}

impl Datapath {
    /// Gives the node's own processes hostPorts when `cgroup` is given: the socket
    /// programs' configuration (this namespace's cookie: they touch only its sockets)
    /// written, and the programs attached to `cgroup` ([`Self::attach_sockets`]).
    /// Without it, the configuration says no namespace.
    pub fn start_sockets(&mut self, cgroup: Option<&Path>) -> Result<(), DatapathError> {
        let name = map_names::SOCK_CONFIG;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DatapathError::MissingMap(name))?;
        let mut config: Array<_, SockConfig> = Array::try_from(map)?;
        let netns_cookie = match cgroup {
            Some(_) => netns_cookie().map_err(DatapathError::NetnsCookie)?,
            None => 0,
        };
        config.set(0, SockConfig { netns_cookie }, 0)?;
        if let Some(cgroup) = cgroup {
            self.attach_sockets(cgroup)?;
        }
        Ok(())
    }

    /// Attaches the socket programs to the cgroup v2 folder `cgroup` (replacing a
    /// previous daemon's, see the module doc).
    pub fn attach_sockets(&mut self, cgroup: &Path) -> Result<(), DatapathError> {
        let dir = self.links_dir().join("cgroup");
        fs::create_dir_all(&dir).map_err(|source| pin_error(&dir, source))?;
        let folder = File::open(cgroup).map_err(|source| DatapathError::Cgroup {
            path: cgroup.display().to_string(),
            source,
        })?;
        for name in program_names::SOCKET_PROGRAMS {
            let program: &mut CgroupSockAddr = super::program(&mut self.ebpf, name)?;
            let program_error = |source| DatapathError::Program {
                program: name,
                source,
            };
            // A BPF link always shares its hook with other links (the kernel attaches
            // links in multi mode and wants no flags): "Single" means flags 0 here.
            let id = program
                .attach(&folder, CgroupAttachMode::Single)
                .map_err(program_error)?;
            let link = program.take_link(id).map_err(program_error)?;
            let pin = dir.join(name);
            let fresh = dir.join(format!("{name}-next"));
            let link_error = |source| DatapathError::Link {
                path: fresh.display().to_string(),
                source,
            };
            let fd_link = FdLink::try_from(link).map_err(link_error)?;
            remove_pin(&fresh)?;
            fd_link
                .pin(&fresh)
                .map_err(|source| pin_error(&fresh, io::Error::other(source.to_string())))?;
            fs::rename(&fresh, &pin).map_err(|source| pin_error(&pin, source))?;
            tracing::info!(cgroup = %cgroup.display(), program = name, "attached");
            self.attachments.push(Attachment {
                interface: cgroup.display().to_string(),
                ifindex: 0,
                program: name.to_owned(),
                mode: "cgroup".to_owned(),
            });
        }
        Ok(())
    }

    /// Hands the hostPort helper maps to their owner ([`crate::model::hostports`]).
    pub fn take_hostport_maps(&mut self) -> Result<HostPortMaps, DatapathError> {
        let mut take = |name: &'static str| {
            self.ebpf
                .take_map(name)
                .ok_or(DatapathError::MissingMap(name))
        };
        let node_addrs = take(map_names::NODE_ADDRS)?;
        let targets = take(map_names::HOSTPORT_TARGETS)?;
        Ok(HostPortMaps {
            node_addrs: HashMap::try_from(node_addrs)?,
            targets: Array::try_from(targets)?,
        })
    }
}

/// Where cgroup v2 is mounted, from the text of `/proc/self/mountinfo`: the first
/// `cgroup2` mount (on a hybrid systemd host, `/sys/fs/cgroup/unified`).
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // <id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fs type> ...
        let (mount, filesystem) = line.split_once(" - ")?;
        if filesystem.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let point = mount.split_whitespace().nth(4)?;
        // mountinfo escapes spaces and the like as octal (\040).
        Some(PathBuf::from(point.replace("\\040", " ")))
    })
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`, Linux 5.14),
/// which the socket programs compare with their socket's.
pub fn netns_cookie() -> io::Result<u64> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let socket = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, and an out-buffer of `len` bytes that outlives the call.
    // Written by hand: neither std nor nix offers SO_NETNS_COOKIE.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_cgroup2_mount_is_found_on_hybrid_and_unified_hosts() {
        let hybrid = "\
24 1 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
25 24 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw
26 24 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "35 24 0:30 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(
            cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            cgroup2_mount("26 24 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw"),
            None
        );
    }

    #[test]
    fn the_netns_cookie_is_stable_within_a_namespace() {
        let first = netns_cookie().expect("SO_NETNS_COOKIE");
        assert_ne!(first, 0);
        assert_eq!(netns_cookie().expect("SO_NETNS_COOKIE"), first);
    }
}
