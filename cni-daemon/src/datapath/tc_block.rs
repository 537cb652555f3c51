//! Two shared TC filter blocks for every pod veth, one for its ingress and one for its
//! egress (rtnetlink, synchronous wrappers).
//!
//! Attaching a BPF program to a device (TCX link or cls_bpf filter alike) waits for an
//! RCU grace period under the rtnl lock: 4 to 24 ms here, the longest step of ADD by far.
//! A shared block (Linux 4.16) moves that cost to the daemon's start: the `from_pod`
//! filter is added once to block [`POD_BLOCK`], the `to_pod` filter to block
//! [`POD_EGRESS_BLOCK`], both kept alive by an anchor veth pair bound to them, and a new
//! pod's host veth only gets a `clsact` qdisc whose ingress and egress are bound to the
//! blocks, which costs no grace period (an expedited one at most). A restarted daemon
//! replaces the filters' programs in place (`NLM_F_REPLACE` on the same preference and
//! handle): every pod switches at once, without a gap.
//!
//! A veth bound before the egress block existed (by a daemon of release 0.1.0) keeps
//! its ingress binding, which the kernel cannot change without taking the qdisc off (a
//! gap in `from_pod`). Its clsact's egress, a block of its own, gets `to_pod` as a
//! filter of its own instead ([`bind_interface`]), replaced in place at every start as
//! the blocks' filters are: one RCU grace period per such veth and start.
//!
//! Block indexes are per network namespace, so every node (and every simulated node of
//! the tests) uses the same index.

use std::collections::BTreeSet;

use futures::{StreamExt, TryStreamExt};
use rtnetlink::{
    Handle, LinkVeth,
    packet_core::{
        NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
        NetlinkPayload, Nla,
    },
    packet_route::{
        RouteNetlinkMessage,
        tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption},
    },
};

use super::{DatapathError, netlink::with_netlink};

/// The block every pod veth's ingress is bound to.
pub const POD_BLOCK: u32 = 0xec01;
/// The block every pod veth's egress is bound to.
pub const POD_EGRESS_BLOCK: u32 = 0xec02;
/// The anchor pair that keeps the blocks (and their filters) alive while no pod exists.
pub const ANCHOR: &str = "ecnblock0";
const ANCHOR_PEER: &str = "ecnblock1";
/// Preference and handle of the `from_pod` filter in the block.
const FILTER_PREF: u16 = 1;
const FILTER_HANDLE: u32 = 1;

/// `TCA_INGRESS_BLOCK` and `TCA_EGRESS_BLOCK` (not named by netlink-packet-route yet).
const TCA_INGRESS_BLOCK: u16 = 13;
const TCA_EGRESS_BLOCK: u16 = 14;
const ETH_P_ALL: u16 = 0x0003;

#[derive(Debug, thiserror::Error)]
pub enum TcBlockError {
    #[error("cannot open a netlink socket: {0}")]
    Socket(#[from] std::io::Error),
    #[error("{what}: {source}")]
    Netlink {
        what: String,
        source: rtnetlink::Error,
    },
    #[error("no interface {0} in the daemon's network namespace")]
    NoInterface(String),
    #[error(
        "link {0} has a clsact qdisc the daemon did not create (not bound to block \
         {POD_BLOCK}); it is left alone"
    )]
    ForeignQdisc(u32),
}

pub(super) fn netlink(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> TcBlockError {
    let what = what.into();
    move |source| TcBlockError::Netlink { what, source }
}

/// Errno of a netlink error, positive (EEXIST = 17).
fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => message.code.map(|code| -code.get()),
        _ => None,
    }
}

/// A program to put into a block: its file descriptor and its name.
#[derive(Debug, Clone)]
pub struct BlockProgram {
    pub fd: u32,
    pub name: String,
}

/// Makes the blocks exist with `ingress` and `egress` as their filters: the anchor pair
/// (created if missing, its qdisc made again when it lacks the egress block) bound to
/// them, and each filter added or its program replaced.
pub fn install(ingress: BlockProgram, egress: BlockProgram) -> Result<(), TcBlockError> {
    with_netlink(move |handle| async move {
        let anchor = match link_index(&handle, ANCHOR).await? {
            Some(index) => index,
            None => {
                handle
                    .link()
                    .add(LinkVeth::new(ANCHOR, ANCHOR_PEER).build())
                    .execute()
                    .await
                    .map_err(netlink(format!("creating the block anchor {ANCHOR}")))?;
                link_index(&handle, ANCHOR)
                    .await?
                    .ok_or_else(|| TcBlockError::NoInterface(ANCHOR.to_owned()))?
            }
        };
        if bound_blocks(&handle, anchor).await? == Some((POD_BLOCK, 0)) {
            // Bound by a daemon without the egress block: the anchor carries no traffic,
            // and the pods bound to the ingress block keep it alive meanwhile.
            request(
                &handle,
                RouteNetlinkMessage::DelQueueDiscipline(clsact(anchor)),
                0,
            )
            .await
            .map_err(netlink(format!("rebinding the block anchor {ANCHOR}")))?;
        }
        bind(&handle, anchor).await?;
        for (block, program) in [(POD_BLOCK, &ingress), (POD_EGRESS_BLOCK, &egress)] {
            let filter = bpf_filter(
                TcHeader::TCM_IFINDEX_MAGIC_BLOCK as i32,
                block.into(),
                program,
            );
            request(
                &handle,
                RouteNetlinkMessage::NewTrafficFilter(filter),
                NLM_F_CREATE | NLM_F_REPLACE,
            )
            .await
            .map_err(netlink(format!("adding the pod filter to block {block}")))?;
        }
        Ok(())
    })
}

/// The direct-action BPF filter of `program` at the daemon's preference and handle, for
/// `parent` of link `index` (a block: [`TcHeader::TCM_IFINDEX_MAGIC_BLOCK`] and the
/// block's index).
fn bpf_filter(index: i32, parent: TcHandle, program: &BlockProgram) -> TcMessage {
    let mut filter = TcMessage::with_index(index);
    filter.header.parent = parent;
    filter.header.handle = FILTER_HANDLE.into();
    filter.header.info = (u32::from(FILTER_PREF) << 16) | u32::from(ETH_P_ALL.to_be());
    filter.attributes = vec![
        TcAttribute::Kind("bpf".to_owned()),
        TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(program.fd)),
            TcOption::Bpf(TcFilterBpfOption::ProgName(program.name.clone())),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
        ]),
    ];
    filter
}

/// Removes the filters and the anchor (uninstall); what is already gone is not an error.
pub fn remove() -> Result<(), TcBlockError> {
    with_netlink(move |handle| async move {
        for block in [POD_BLOCK, POD_EGRESS_BLOCK] {
            let mut filter = TcMessage::with_index(TcHeader::TCM_IFINDEX_MAGIC_BLOCK as i32);
            filter.header.parent = block.into();
            filter.header.info = (u32::from(FILTER_PREF) << 16) | u32::from(ETH_P_ALL.to_be());
            match request(&handle, RouteNetlinkMessage::DelTrafficFilter(filter), 0).await {
                Ok(()) => {}
                Err(error) if matches!(errno(&error), Some(libc::ENOENT | libc::EINVAL)) => {}
                Err(error) => return Err(netlink("removing the pod filter")(error)),
            }
        }
        if let Some(anchor) = link_index(&handle, ANCHOR).await? {
            match handle.link().del(anchor).execute().await {
                Ok(()) => {}
                Err(error) if errno(&error) == Some(libc::ENODEV) => {}
                Err(error) => return Err(netlink(format!("deleting {ANCHOR}"))(error)),
            }
        }
        Ok(())
    })
}

/// Binds `interface`'s ingress and egress to the blocks (a `clsact` qdisc with
/// `ingress_block` and `egress_block`);
/// already bound is fine, another `clsact` there is refused ([`TcBlockError::ForeignQdisc`]:
/// it may hold someone else's filters). A veth whose ingress alone is bound (by release
/// 0.1.0) gets `egress` (`to_pod`) as a filter on its own egress, or its program
/// replaced there. Returns `false`, binding
/// nothing, when the anchor pair is gone: deleted by hand with no pod bound, it took the
/// block and its filter along, and the caller must [`install`] them again first.
pub fn bind_interface(interface: &str, egress: BlockProgram) -> Result<bool, TcBlockError> {
    let interface = interface.to_owned();
    with_netlink(move |handle| async move {
        if link_index(&handle, ANCHOR).await?.is_none() {
            return Ok(false);
        }
        let index = link_index(&handle, &interface)
            .await?
            .ok_or_else(|| TcBlockError::NoInterface(interface.clone()))?;
        if bind(&handle, index).await? == Bound::IngressOnly {
            let egress_hook = TcHandle {
                major: TcHandle::CLSACT.major,
                minor: TcHandle::MIN_EGRESS,
            };
            request(
                &handle,
                RouteNetlinkMessage::NewTrafficFilter(bpf_filter(
                    index as i32,
                    egress_hook,
                    &egress,
                )),
                NLM_F_CREATE | NLM_F_REPLACE,
            )
            .await
            .map_err(netlink(format!(
                "putting {} on the egress of {interface}",
                egress.name
            )))?;
            tracing::info!(
                veth = interface,
                program = egress.name,
                "a veth bound by release 0.1.0 (no egress block): the program is on its own egress"
            );
        }
        Ok(true)
    })
}

/// Removes `interface`'s `clsact` qdisc when it is bound to the block (it leaves the
/// block); a missing interface or qdisc is not an error, and a `clsact` bound elsewhere
/// or of its own is never removed (not ours: it may hold another program's filters).
pub fn unbind_interface(interface: &str) -> Result<(), TcBlockError> {
    let interface = interface.to_owned();
    with_netlink(move |handle| async move {
        let Some(index) = link_index(&handle, &interface).await? else {
            return Ok(());
        };
        if bound_blocks(&handle, index)
            .await?
            .map(|(ingress, _)| ingress)
            != Some(POD_BLOCK)
        {
            return Ok(());
        }
        match request(
            &handle,
            RouteNetlinkMessage::DelQueueDiscipline(clsact(index)),
            0,
        )
        .await
        {
            Ok(()) => Ok(()),
            Err(error)
                if matches!(
                    errno(&error),
                    Some(libc::ENOENT | libc::EINVAL | libc::ENODEV)
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(netlink(format!("removing the clsact qdisc of {interface}"))(error)),
        }
    })
}

/// How [`bind`] found or left a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// Both sides bound to the blocks.
    Both,
    /// The ingress bound, the egress a block of its own (release 0.1.0's binding).
    IngressOnly,
}

async fn bind(handle: &Handle, index: u32) -> Result<Bound, TcBlockError> {
    match bound_blocks(handle, index).await? {
        Some((POD_BLOCK, 0)) => return Ok(Bound::IngressOnly),
        Some((POD_BLOCK, _)) => return Ok(Bound::Both),
        // A clsact of someone else's making, or bound elsewhere: never ours to replace.
        Some(_) => return Err(TcBlockError::ForeignQdisc(index)),
        None => {}
    }
    let mut qdisc = clsact(index);
    for (kind, block) in [
        (TCA_INGRESS_BLOCK, POD_BLOCK),
        (TCA_EGRESS_BLOCK, POD_EGRESS_BLOCK),
    ] {
        qdisc
            .attributes
            .push(TcAttribute::Other(rtnetlink::packet_core::DefaultNla::new(
                kind,
                block.to_ne_bytes().to_vec(),
            )));
    }
    request(
        handle,
        RouteNetlinkMessage::NewQueueDiscipline(qdisc),
        NLM_F_CREATE | NLM_F_EXCL,
    )
    .await
    .map_err(netlink(format!(
        "binding link {index} to block {POD_BLOCK}"
    )))?;
    Ok(Bound::Both)
}

/// The blocks `index`'s clsact ingress and egress are bound to (0 for a side of its
/// own), `None` without clsact.
async fn bound_blocks(handle: &Handle, index: u32) -> Result<Option<(u32, u32)>, TcBlockError> {
    let qdiscs: Vec<TcMessage> = handle
        .qdisc()
        .get()
        .index(index as i32)
        .execute()
        .try_collect()
        .await
        .map_err(netlink(format!("listing the qdiscs of link {index}")))?;
    Ok(qdiscs
        .iter()
        .filter(|qdisc| {
            qdisc.header.index == index as i32
                && qdisc.attributes.iter().any(
                    |attribute| matches!(attribute, TcAttribute::Kind(kind) if kind == "clsact"),
                )
        })
        .map(|qdisc| {
            (
                block_of(qdisc, TCA_INGRESS_BLOCK),
                block_of(qdisc, TCA_EGRESS_BLOCK),
            )
        })
        .next())
}

/// The block a clsact's attribute `kind` names, 0 without one.
fn block_of(qdisc: &TcMessage, kind: u16) -> u32 {
    qdisc
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            TcAttribute::Other(nla) if nla.kind() == kind => {
                let mut bytes = [0u8; 4];
                nla.emit_value(&mut bytes);
                Some(u32::from_ne_bytes(bytes))
            }
            _ => None,
        })
        .unwrap_or(0)
}

/// The links with a root qdisc other than `noqueue` (a veth's default): all of them,
/// or only link `index` when given.
pub fn queued_links(index: Option<u32>) -> Result<BTreeSet<u32>, TcBlockError> {
    with_netlink(move |handle| async move {
        let mut request = handle.qdisc().get();
        if let Some(index) = index {
            request = request.index(index as i32);
        }
        let qdiscs: Vec<TcMessage> = request
            .execute()
            .try_collect()
            .await
            .map_err(netlink("listing the qdiscs"))?;
        Ok(qdiscs
            .iter()
            .filter(|qdisc| index.is_none_or(|index| qdisc.header.index == index as i32))
            .filter_map(|qdisc| {
                let index = u32::try_from(qdisc.header.index).ok()?;
                is_queue(qdisc).then_some(index)
            })
            .collect())
    })
}

/// Whether `qdisc` (as dumped or announced) is a root qdisc other than `noqueue`.
pub fn is_queue(qdisc: &TcMessage) -> bool {
    qdisc.header.parent == TcHandle::ROOT
        && qdisc
            .attributes
            .iter()
            .any(|attribute| matches!(attribute, TcAttribute::Kind(kind) if kind != "noqueue"))
}

fn clsact(index: u32) -> TcMessage {
    let mut qdisc = TcMessage::with_index(index as i32);
    qdisc.header.parent = TcHandle::CLSACT;
    qdisc.header.handle = TcHandle::from(0xffff_0000);
    qdisc
        .attributes
        .push(TcAttribute::Kind("clsact".to_owned()));
    qdisc
}

/// What the daemon checks of a link before it binds or unbinds it: its index, its kind
/// and its alias.
pub struct LinkFacts {
    pub index: u32,
    pub kind: DeviceKind,
    pub alias: Option<String>,
    pub mac: Option<[u8; 6]>,
}

/// The kinds of device a pod's host side can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Veth,
    /// The primary (host-side) device of a netkit pair.
    NetkitPrimary,
    /// Anything else, a netkit pair's peer included.
    Other,
}

/// [`LinkFacts`] of `name`; `None` when there is no such link.
pub fn link_facts(name: &str) -> Result<Option<LinkFacts>, TcBlockError> {
    use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoNetkit, LinkAttribute, LinkInfo};
    let name = name.to_owned();
    with_netlink(move |handle| async move {
        let mut links = handle.link().get().match_name(name.clone()).execute();
        let message = match links.try_next().await {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(None),
            Err(error) if errno(&error) == Some(libc::ENODEV) => return Ok(None),
            Err(error) => return Err(netlink(format!("looking up {name}"))(error)),
        };
        let mut facts = LinkFacts {
            index: message.header.index,
            kind: DeviceKind::Other,
            alias: None,
            mac: None,
        };
        for attribute in &message.attributes {
            match attribute {
                LinkAttribute::IfAlias(alias) => facts.alias = Some(alias.clone()),
                LinkAttribute::Address(mac) => facts.mac = <[u8; 6]>::try_from(mac.as_slice()).ok(),
                LinkAttribute::LinkInfo(infos) => {
                    let primary = infos.iter().any(|info| {
                        matches!(info, LinkInfo::Data(InfoData::Netkit(data))
                            if data.contains(&InfoNetkit::Primary(true)))
                    });
                    for info in infos {
                        match info {
                            LinkInfo::Kind(InfoKind::Veth) => facts.kind = DeviceKind::Veth,
                            LinkInfo::Kind(InfoKind::Netkit) if primary => {
                                facts.kind = DeviceKind::NetkitPrimary;
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Some(facts))
    })
}

/// A link whose alias starts with a given prefix: (name, index, alias).
pub type AliasedLink = (String, u32, String);

/// Every link of the daemon's namespace whose alias starts with `prefix`.
pub fn aliased_links(prefix: &str) -> Result<Vec<AliasedLink>, TcBlockError> {
    use rtnetlink::packet_route::link::LinkAttribute;
    let prefix = prefix.to_owned();
    with_netlink(move |handle| async move {
        let messages: Vec<_> = handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(netlink("listing links"))?;
        Ok(messages
            .iter()
            .filter_map(|message| {
                let mut name = None;
                let mut alias = None;
                for attribute in &message.attributes {
                    match attribute {
                        LinkAttribute::IfName(value) => name = Some(value.clone()),
                        LinkAttribute::IfAlias(value) => alias = Some(value.clone()),
                        _ => {}
                    }
                }
                let alias = alias.filter(|alias| alias.starts_with(&prefix))?;
                Some((name?, message.header.index, alias))
            })
            .collect())
    })
}

async fn link_index(handle: &Handle, name: &str) -> Result<Option<u32>, TcBlockError> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(Some(link)) => Ok(Some(link.header.index)),
        Ok(None) => Ok(None),
        Err(error) if errno(&error) == Some(libc::ENODEV) => Ok(None),
        Err(error) => Err(netlink(format!("looking up {name}"))(error)),
    }
}

/// Sends `message` with `flags` (plus request and ack) and waits for the kernel's answer.
async fn request(
    handle: &Handle,
    message: RouteNetlinkMessage,
    flags: u16,
) -> Result<(), rtnetlink::Error> {
    let mut request = NetlinkMessage::from(message);
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut responses = handle.clone().request(request)?;
    while let Some(response) = responses.next().await {
        if let NetlinkPayload::Error(error) = response.payload
            && error.code.is_some()
        {
            return Err(rtnetlink::Error::NetlinkError(error));
        }
    }
    Ok(())
}

/// The file beside the endpoint records where the daemon says in which network
/// namespace the pods' block lives: `uninstall` removes the block only from there.
pub const NETNS_FILE: &str = "tc-block-netns";

/// Records this namespace's cookie in `<state_dir>/`[`NETNS_FILE`] (the CLI may run in
/// another namespace, as the tests run it, and must not touch that one's block).
pub fn record_netns(state_dir: &std::path::Path) -> Result<(), DatapathError> {
    let cookie = super::sock::netns_cookie().map_err(DatapathError::NetnsCookie)?;
    let path = state_dir.join(NETNS_FILE);
    std::fs::create_dir_all(state_dir)
        .and_then(|()| cni_api::files::write_atomic(&path, cookie.to_string().as_bytes(), 0o644))
        .map_err(|source| DatapathError::BlockNetns {
            path: path.display().to_string(),
            source,
        })
}
