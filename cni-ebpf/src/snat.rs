//! Source NAT on the uplink's egress: a masqueraded pod's packet to a destination
//! outside the cluster ranges leaves with the node's address and a node port (or ICMP
//! echo identifier) taken from the configured range, recorded in both NAT tables.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST, TC_ACT_OK},
    programs::TcContext,
};
use cni_ebpf_common::{
    DropReason, NatConfig, NatCounter, NatEntry, NatKey, endpoint_flags, tcp_state,
};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::{
    csum::{self, ICMP, IP_CSUM, IP_SRC, L4Csum, TCP, UDP},
    endpoints, hostport, metrics,
    nat_maps::{self, NAT_IN, NAT_OUT},
};

const ICMP_ECHO_REQUEST: u8 = 8;
/// Ports probed for a new flow before giving up (linear probing from a per-flow hash).
const MAX_PROBES: u32 = 128;
/// An entry's timestamp is refreshed at most this often, to spare map writes on the
/// fast path.
const REFRESH_NS: u64 = 1_000_000_000;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

pub fn egress(ctx: &TcContext) -> Result<i32, i64> {
    // Parsed inline: a helper returning (config, eth, ip) made LLVM read an unset
    // register on its early-return path, which the verifier refuses.
    let Some(config) = nat_maps::config() else {
        return Ok(TC_ACT_OK);
    };
    let eth: EthHdr = ctx.load(0)?;
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return Ok(TC_ACT_OK);
    }
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    // A pod's reply on a hostPort connection leaves with the host address and port.
    let proto = ip.proto as u8;
    if ip.frag_offset() == 0 && (proto == TCP || proto == UDP) {
        let l4 = EthHdr::LEN + ip.ihl() as usize;
        if let Some(l4_csum) = L4Csum::of(proto, l4) {
            if hostport::outbound(ctx, &ip, l4, l4_csum)? {
                return Ok(TC_ACT_OK);
            }
        }
    }
    let masqueraded = endpoints::lookup(ip.src_addr)
        .is_some_and(|pod| pod.flags & endpoint_flags::MASQUERADE != 0);
    if !masqueraded || nat_maps::in_cluster(ip.dst_addr) {
        return Ok(TC_ACT_OK);
    }
    if ip.frag_offset() != 0 {
        return Ok(metrics::drop_packet(DropReason::NatFragment));
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    let Some(l4_csum) = L4Csum::of(ip.proto as u8, l4) else {
        return Ok(TC_ACT_OK);
    };
    // The pod-side port (or echo identifier) and where it sits.
    let (pod_port, remote_port, port_at, tcp_flags) = match ip.proto as u8 {
        TCP | UDP => {
            let ports: [u8; 4] = ctx.load(l4)?;
            let flags = if ip.proto as u8 == TCP {
                ctx.load::<u8>(l4 + 13)?
            } else {
                0
            };
            (
                u16::from_be_bytes([ports[0], ports[1]]),
                u16::from_be_bytes([ports[2], ports[3]]),
                l4,
                flags,
            )
        }
        ICMP => {
            // Only echo requests open flows; other ICMP from a pod stays as it is.
            if ctx.load::<u8>(l4)? != ICMP_ECHO_REQUEST {
                return Ok(TC_ACT_OK);
            }
            let id: [u8; 2] = ctx.load(l4 + 4)?;
            (u16::from_be_bytes(id), 0, l4 + 4, 0)
        }
        _ => return Ok(TC_ACT_OK),
    };
    let key = NatKey {
        pod_addr: ip.src_addr,
        remote_addr: ip.dst_addr,
        pod_port,
        remote_port,
        proto: ip.proto as u8,
        pad: [0; 3],
    };
    let now = nat_maps::now_ns();
    // SAFETY: the value is copied at once.
    let existing = unsafe { NAT_OUT.get(&key) }
        .copied()
        .filter(|entry| !nat_maps::expired(entry, key.proto, &config, now));
    let node_port = match existing {
        Some(entry) => {
            let state = next_state(entry.state, tcp_flags, Way::Out);
            if state != entry.state || now.saturating_sub(entry.last_seen_ns) > REFRESH_NS {
                record(
                    &key,
                    &NatEntry {
                        last_seen_ns: now,
                        state,
                        ..entry
                    },
                );
            }
            entry.node_port
        }
        None => {
            let state = if key.proto != TCP {
                0
            } else if tcp_flags & TCP_SYN != 0 && tcp_flags & TCP_ACK == 0 {
                tcp_state::SYN_SENT
            } else {
                tcp_state::ESTABLISHED
            };
            let Some(port) = allocate(&key, &config, now, state) else {
                nat_maps::count(NatCounter::AllocationFailures);
                return Ok(metrics::drop_packet(DropReason::NatPortsExhausted));
            };
            nat_maps::count(NatCounter::NewFlows);
            port
        }
    };

    csum::set_addr(ctx, IP_SRC, IP_CSUM, ip.src_addr, config.node_addr, l4_csum)?;
    if node_port != pod_port {
        csum::set_port(ctx, port_at, pod_port, node_port, l4_csum)?;
    }
    nat_maps::count(NatCounter::TranslatedOut);
    Ok(TC_ACT_OK)
}

/// Writes a flow's entry into both tables.
#[inline(always)]
fn record(key: &NatKey, entry: &NatEntry) {
    let _ = NAT_OUT.insert(key, entry, BPF_ANY as u64);
    let _ = NAT_IN.insert(&key.reverse(entry.node_port), entry, BPF_ANY as u64);
}

/// Finds a free node port for `key` (same remote address, port and protocol) and claims
/// it in both tables. A port whose flow has expired is taken over.
#[inline(always)]
fn allocate(key: &NatKey, config: &NatConfig, now: u64, state: u8) -> Option<u16> {
    let size = u32::from(config.port_max.checked_sub(config.port_min)?) + 1;
    let start = flow_hash(key) % size;
    for probe in 0..MAX_PROBES {
        let port = config.port_min + ((start + probe) % size) as u16;
        // Host ports belong to their mappings.
        if hostport::is_host_port(key.proto, port, config.node_addr) {
            continue;
        }
        let reverse = key.reverse(port);
        let entry = NatEntry {
            last_seen_ns: now,
            pod_addr: key.pod_addr,
            pod_port: key.pod_port,
            node_port: port,
            state,
            pad: [0; 7],
        };
        if NAT_IN.insert(&reverse, &entry, BPF_NOEXIST as u64).is_err() {
            // SAFETY: the value is copied at once.
            let holder = unsafe { NAT_IN.get(&reverse) }.copied();
            match holder {
                // This very flow already holds the port (its NAT_OUT entry was evicted
                // or had expired): it keeps it.
                Some(old) if old.pod_addr == key.pod_addr && old.pod_port == key.pod_port => {
                    let _ = NAT_IN.insert(&reverse, &entry, BPF_ANY as u64);
                }
                Some(old) if nat_maps::expired(&old, key.proto, config, now) => {
                    // The old flow's NAT_OUT entry goes only if it still points here:
                    // it may have moved to another port since.
                    let stale = reverse.forward(&old);
                    // SAFETY: the value is copied at once.
                    let still_here =
                        unsafe { NAT_OUT.get(&stale) }.is_some_and(|moved| moved.node_port == port);
                    if still_here {
                        let _ = NAT_OUT.remove(&stale);
                    }
                    if NAT_IN.insert(&reverse, &entry, BPF_ANY as u64).is_err() {
                        continue;
                    }
                }
                _ => continue,
            }
        }
        let _ = NAT_OUT.insert(key, &entry, BPF_ANY as u64);
        return Some(port);
    }
    None
}

/// A cheap, well-mixed hash of a flow: where its port search starts, so two pods using
/// the same source port usually land on different node ports at once.
#[inline(always)]
fn flow_hash(key: &NatKey) -> u32 {
    let mut h = u32::from_ne_bytes(key.pod_addr) ^ 0x9e37_79b9;
    h = (h ^ (u32::from(key.pod_port) << 16 | u32::from(key.remote_port)))
        .wrapping_mul(0x85eb_ca6b);
    h = (h ^ u32::from_ne_bytes(key.remote_addr)).wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Which way a packet of a flow goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Way {
    Out,
    In,
}

/// TCP state after a packet with `flags` going `way` (non-TCP flows stay 0).
#[inline(always)]
pub fn next_state(state: u8, flags: u8, way: Way) -> u8 {
    if state == 0 {
        return 0;
    }
    if flags & TCP_RST != 0 {
        return tcp_state::CLOSED;
    }
    if flags & TCP_FIN != 0 {
        // A FIN each way closes the flow; the first one only starts closing it.
        return match (way, state) {
            (Way::Out, tcp_state::REMOTE_CLOSING) | (Way::In, tcp_state::CLOSING) => {
                tcp_state::CLOSED
            }
            (_, tcp_state::CLOSED) => tcp_state::CLOSED,
            (Way::Out, _) => tcp_state::CLOSING,
            (Way::In, _) => tcp_state::REMOTE_CLOSING,
        };
    }
    if way == Way::Out && flags & TCP_SYN != 0 && flags & TCP_ACK == 0 {
        // The pod opens the same 4-tuple again (after a close).
        tcp_state::SYN_SENT
    } else if state == tcp_state::SYN_SENT && way == Way::In && flags & TCP_ACK != 0 {
        tcp_state::ESTABLISHED
    } else {
        state
    }
}
