//! A link's IPv4 GSO/GRO sizes (BIG TCP), which iproute2 6.1 (Debian 12) can neither
//! set nor show: read and written with rtnetlink, from a thread inside the namespace.

use futures::TryStreamExt;
use rtnetlink::{
    LinkUnspec,
    packet_route::link::{LinkAttribute, LinkMessage},
};

use crate::{netns::Netns, traffic::run_in};

/// IPv4 BIG TCP's usual size (192 KiB), as Cilium sets it.
pub const SIZE: u32 = 196_608;

/// The kernel's default.
pub const DEFAULT: u32 = 65_536;

/// `link`'s IPv4 GSO and GRO max sizes inside `netns` ([`DEFAULT`] before Linux 6.3,
/// which reports neither).
pub fn sizes(netns: &Netns, link: &str) -> (u32, u32) {
    let name = link.to_owned();
    let message = on_netlink(netns, move |handle| async move {
        handle
            .link()
            .get()
            .match_name(name)
            .execute()
            .try_next()
            .await
    })
    .unwrap_or_else(|| panic!("no link {link} in {}", netns.name()));
    let find =
        |wanted: fn(&LinkAttribute) -> Option<u32>| message.attributes.iter().find_map(wanted);
    let gso = find(|attribute| match attribute {
        LinkAttribute::GsoIpv4MaxSize(size) => Some(*size),
        _ => None,
    });
    let gro = find(|attribute| match attribute {
        LinkAttribute::GroIpv4MaxSize(size) => Some(*size),
        _ => None,
    });
    assert_eq!(
        (gso.is_some(), gro.is_some()),
        (
            crate::kernel::has_big_tcp_ipv4(),
            crate::kernel::has_big_tcp_ipv4()
        ),
        "the kernel reports gso_ipv4_max_size and gro_ipv4_max_size from Linux 6.3"
    );
    // A kernel before 6.3 has no IPv4 BIG TCP: the 64 KiB limit.
    (gso.unwrap_or(DEFAULT), gro.unwrap_or(DEFAULT))
}

/// Sets `link`'s IPv4 GSO and GRO max sizes inside `netns` to `size`.
pub fn set(netns: &Netns, link: &str, size: u32) {
    let name = link.to_owned();
    on_netlink(netns, move |handle| async move {
        let message = LinkUnspec::new_with_name(&name)
            .append_extra_attribute(LinkAttribute::GsoIpv4MaxSize(size))
            .append_extra_attribute(LinkAttribute::GroIpv4MaxSize(size))
            .build();
        handle.link().set(message).execute().await.map(|()| None)
    });
}

/// Runs `work` with an rtnetlink handle inside `netns`; panics on a netlink error.
fn on_netlink<F, Fut>(netns: &Netns, work: F) -> Option<LinkMessage>
where
    F: FnOnce(rtnetlink::Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Option<LinkMessage>, rtnetlink::Error>>,
{
    let outcome = run_in(netns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async move {
            let (connection, handle, _) = rtnetlink::new_connection().expect("netlink socket");
            let connection = tokio::spawn(connection);
            let outcome = work(handle).await;
            connection.abort();
            outcome.map_err(|error| error.to_string())
        })
    });
    outcome.unwrap_or_else(|error| panic!("netlink in {}: {error}", netns.name()))
}
