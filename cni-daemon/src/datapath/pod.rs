//! The pod program on every pod's host-side veth, through the shared TC block of
//! [`tc_block`](super::tc_block): the daemon puts `from_pod` and `to_pod` into the
//! blocks once at start, and a pod's veth only has its ingress and egress bound to them. The filter and the
//! bindings live in the kernel, so forwarding goes on while the daemon is stopped or
//! killed, and a restarted daemon swaps its program into the filter in one step.
//!
//! A pod whose pair is netkit rather than veth (its host side is the pair's primary)
//! has `from_pod` on the pair's own hook instead ([`netkit`](super::netkit)); everything
//! here that says "veth" means either.
//!
//! A veth whose ingress alone is bound (release 0.1.0's binding) gets `to_pod` on its
//! own egress instead of the egress block ([`tc_block::bind_interface`]).

use std::{
    os::fd::{AsFd, AsRawFd},
    path::PathBuf,
};

use cni_api::{Attachment, naming};
use cni_ebpf_common::program_names;

use super::{Datapath, DatapathError, classifier, netkit, tc_block, tc_block::DeviceKind};

/// How `status` shows the block's attachment.
const BLOCK_MODE: &str = "tc block";

impl Datapath {
    /// Puts this daemon's `from_pod` and `to_pod` into the pods' blocks (replacing the
    /// previous daemon's programs in place); run once at start, before pods are bound.
    pub fn install_pod_block(&mut self) -> Result<(), DatapathError> {
        let name = program_names::FROM_POD;
        let ingress = self.block_program(name)?;
        let egress = self.block_program(program_names::TO_POD)?;
        tc_block::install(ingress, egress)?;
        tracing::info!(
            block = tc_block::POD_BLOCK,
            program = name,
            "pod filter installed"
        );
        if self.attachments.iter().any(|a| a.mode == BLOCK_MODE) {
            return Ok(());
        }
        self.attachments.push(Attachment {
            interface: format!("block {}", tc_block::POD_BLOCK),
            ifindex: nix::net::if_::if_nametoindex(tc_block::ANCHOR).unwrap_or(0),
            program: name.to_owned(),
            mode: BLOCK_MODE.to_owned(),
        });
        self.attachments.push(Attachment {
            interface: format!("block {}", tc_block::POD_EGRESS_BLOCK),
            ifindex: nix::net::if_::if_nametoindex(tc_block::ANCHOR).unwrap_or(0),
            program: program_names::TO_POD.to_owned(),
            mode: BLOCK_MODE.to_owned(),
        });
        Ok(())
    }

    /// `name`'s program as a block filter takes it.
    fn block_program(
        &mut self,
        name: &'static str,
    ) -> Result<tc_block::BlockProgram, DatapathError> {
        let program = classifier(&mut self.ebpf, name)?;
        let fd = program.fd().map_err(|source| DatapathError::Program {
            program: name,
            source,
        })?;
        // A file descriptor is never negative.
        let fd = u32::try_from(fd.as_fd().as_raw_fd()).map_err(|_| DatapathError::Program {
            program: name,
            source: aya::programs::ProgramError::NotLoaded,
        })?;
        Ok(tc_block::BlockProgram {
            fd,
            name: name.to_owned(),
        })
    }

    /// Refuses `host_veth` unless it is one of the plugin's host veths: its name
    /// (`cni_api::naming::is_host_veth`), a veth device or a netkit pair's primary,
    /// without an alias other than the plugin's. A request naming any other link (the
    /// uplink, the anchor) must never bind or unbind it.
    pub fn check_pod_veth(&self, host_veth: &str) -> Result<(), DatapathError> {
        let refuse = |reason: &'static str| DatapathError::NotPodVeth {
            name: host_veth.to_owned(),
            reason,
        };
        if !naming::is_host_veth(host_veth) {
            return Err(refuse("not a name the plugin gives"));
        }
        let facts = tc_block::link_facts(host_veth)?
            .ok_or_else(|| DatapathError::NoInterface(host_veth.to_owned()))?;
        if facts.kind == DeviceKind::Other {
            return Err(refuse("neither a veth nor a netkit primary"));
        }
        // The kernel does not set an alias given with RTM_NEWLINK, which is how the
        // plugin passes it: a veth of ours may have none, but never another one.
        if facts
            .alias
            .is_some_and(|alias| !alias.starts_with(naming::ALIAS_PREFIX))
        {
            return Err(refuse("its alias is not the plugin's"));
        }
        Ok(())
    }

    /// Refuses an endpoint whose host side is not the link it names: the link
    /// `host_veth` must have the index `ifindex` and the MAC `mac` the plugin sent (the
    /// pod program checks frames against both).
    pub fn check_pod_link(
        &self,
        host_veth: &str,
        ifindex: u32,
        mac: [u8; 6],
    ) -> Result<(), DatapathError> {
        let facts = tc_block::link_facts(host_veth)?
            .ok_or_else(|| DatapathError::NoInterface(host_veth.to_owned()))?;
        let refuse = |reason: &'static str| DatapathError::NotPodVeth {
            name: host_veth.to_owned(),
            reason,
        };
        if facts.index != ifindex {
            return Err(refuse("its index is not the one given"));
        }
        if facts.mac != Some(mac) {
            return Err(refuse("its MAC is not the one given"));
        }
        Ok(())
    }

    /// Binds `host_veth`'s ingress and egress to the pods' blocks (already bound is fine;
    /// a block whose anchor was deleted is installed again first; a veth release 0.1.0
    /// bound gets `to_pod` on its own egress). A netkit primary gets this
    /// daemon's `from_pod` on its pair's hook instead, in place of the program found
    /// there (the previous daemon's).
    pub fn attach_pod(&mut self, host_veth: &str) -> Result<(), DatapathError> {
        if let Some(facts) = tc_block::link_facts(host_veth)?
            && facts.kind == DeviceKind::NetkitPrimary
        {
            return self.attach_netkit(host_veth, facts.index);
        }
        let egress = self.block_program(program_names::TO_POD)?;
        if !tc_block::bind_interface(host_veth, egress.clone())? {
            tracing::warn!(
                anchor = tc_block::ANCHOR,
                "the pods' block anchor is gone: reinstalling"
            );
            self.install_pod_block()?;
            tc_block::bind_interface(host_veth, egress)?;
        }
        Ok(())
    }

    /// Unbinds `host_veth` from the block, or takes the programs off a netkit pair's
    /// hook (whose policy then drops what the pod sends). A device that is already gone
    /// took its binding with it: not an error.
    pub fn detach_pod(&mut self, host_veth: &str) -> Result<(), DatapathError> {
        if let Some(facts) = tc_block::link_facts(host_veth)?
            && facts.kind == DeviceKind::NetkitPrimary
        {
            return detach_netkit(host_veth, facts.index);
        }
        tc_block::unbind_interface(host_veth)?;
        Ok(())
    }

    /// Puts `from_pod` on the peer hook and `to_pod` on the primary hook of the netkit
    /// pair whose primary is `name` (index `ifindex`): nothing to do where it is there,
    /// else in place of the first program found (the plugin's pair carries only the
    /// daemon's), else added.
    fn attach_netkit(&mut self, name: &str, ifindex: u32) -> Result<(), DatapathError> {
        for (program_name, hook) in [
            (program_names::FROM_POD, netkit::Hook::Peer),
            (program_names::TO_POD, netkit::Hook::Primary),
        ] {
            let program = classifier(&mut self.ebpf, program_name)?;
            let program_error = |source| DatapathError::Program {
                program: program_name,
                source,
            };
            let id = program.info().map_err(program_error)?.id();
            let fd = program.fd().map_err(program_error)?;
            let netkit_error = netkit_error(name);
            let found = netkit::attached(ifindex, hook).map_err(netkit_error)?;
            if found.contains(&id) {
                continue;
            }
            let previous = found
                .first()
                .map(|id| netkit::program(*id))
                .transpose()
                .map_err(netkit_error)?;
            netkit::attach(
                ifindex,
                hook,
                fd.as_fd(),
                previous.as_ref().map(AsFd::as_fd),
            )
            .map_err(netkit_error)?;
            tracing::debug!(
                device = name,
                ?hook,
                replaced = ?found.first(),
                "pod program on the netkit pair"
            );
        }
        Ok(())
    }

    /// `<bpf dir>/links`, where the uplink and guard links are pinned.
    pub(super) fn links_dir(&self) -> PathBuf {
        self.bpf_dir.join("links")
    }
}

/// Takes the pod program off every netkit pair of the plugin's in this namespace (their
/// pods' traffic is dropped from then on, their policy); for uninstall, as the pods'
/// block goes with it. Returns how many pairs there were.
pub fn detach_netkit_pods() -> Result<usize, DatapathError> {
    let mut pairs = 0;
    for (name, _, _) in tc_block::aliased_links(naming::ALIAS_PREFIX)? {
        if !naming::is_host_veth(&name) {
            continue;
        }
        if let Some(facts) = tc_block::link_facts(&name)?
            && facts.kind == DeviceKind::NetkitPrimary
        {
            detach_netkit(&name, facts.index)?;
            pairs += 1;
        }
    }
    Ok(pairs)
}

/// Takes every program off both hooks of the netkit pair whose primary is `name`.
fn detach_netkit(name: &str, ifindex: u32) -> Result<(), DatapathError> {
    let netkit_error = netkit_error(name);
    for hook in [netkit::Hook::Peer, netkit::Hook::Primary] {
        for id in netkit::attached(ifindex, hook).map_err(netkit_error)? {
            let program = match netkit::program(id) {
                Ok(program) => program,
                // Unloaded since the query: gone from the hook with it.
                Err(error) if error.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(error) => return Err(netkit_error(error)),
            };
            match netkit::detach(ifindex, hook, program.as_fd()) {
                Ok(()) => {}
                Err(error) if error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(error) => return Err(netkit_error(error)),
            }
        }
    }
    Ok(())
}

fn netkit_error(name: &str) -> impl Fn(std::io::Error) -> DatapathError + Copy + '_ {
    move |source| DatapathError::Netkit {
        device: name.to_owned(),
        source,
    }
}
