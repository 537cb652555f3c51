//! Source NAT on an uplink's egress: a masqueraded pod's packet to a destination
//! outside the cluster ranges leaves with that uplink's address and a node port (or ICMP
//! echo identifier) taken from the configured range, recorded in both NAT tables. SCTP
//! keeps its ports and protocols without ports change address alone ([`keep_port`]).

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST, TC_ACT_OK},
    cty::c_void,
    helpers::generated::{bpf_get_prandom_u32, bpf_loop},
    programs::TcContext,
};
use cni_ebpf_common::{
    DropReason, FragmentKey, NatConfig, NatCounter, NatEntry, NatKey, Way, endpoint_flags,
    flow::{next_state, opening_state},
    ip_proto::{DCCP, ICMP, TCP, UDP, UDPLITE},
    tcp_flags,
};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::{
    conntrack, fragments, hostport,
    primitives::{
        clock, counters,
        csum::{self, IcmpErrorSide, L4Csum},
        maps::{self, CURSOR_BITS, NAT_CURSORS, NAT_IN, NAT_OUT},
        packet::{self, EthIpv4, ICMP_ECHO_REQUEST, IP_SRC},
    },
};

/// Ports probed for a new flow before giving up (see `allocate`).
const MAX_PROBES: u32 = 128;
/// Consecutive ports tried before the search jumps ahead.
const LINEAR_PROBES: u32 = 8;
/// How far the search jumps, as a fraction of the range in 32-bit fixed point: the
/// golden ratio's 0.618..., whose multiples spread evenly over the range whatever its
/// size (the 16 blocks of a search land at least 3% of the range apart, none twice in
/// one place), so any free stretch longer than a tenth of the range is found wherever
/// the search starts. A fixed jump of 7919 ports, as before, is nearly a quarter of
/// the default range (31,744 ports): the 16 blocks fell in four clusters of about 120
/// ports, and a new flow was dropped as "ports exhausted" when those 500 ports were
/// held, however much of the range was free.
const GOLDEN_STRIDE: u64 = 0x9E37_79B9;

/// Translates a packet leaving by the uplink `ifindex`.
pub fn egress(ctx: &TcContext, ifindex: u32) -> Result<i32, i64> {
    // Parsed inline: a helper returning (config, eth, ip) made LLVM read an unset
    // register on its early-return path, which the verifier refuses.
    let Some(config) = maps::nat_config() else {
        return Ok(TC_ACT_OK);
    };
    // What leaves by this device takes its address (a device no longer an uplink, whose
    // programs are on their way off, translates nothing).
    let Some(node_addr) = maps::uplink_addr(ifindex) else {
        return Ok(TC_ACT_OK);
    };
    let has_address = NatConfig::is_address(node_addr);
    // Ethernet and IPv4 headers in one read (a frame too short for both is no IPv4
    // packet we translate: the error lets it go on).
    let EthIpv4 { eth, ip } = ctx.load(0)?;
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return Ok(TC_ACT_OK);
    }
    if fragments::is_later(&ip) {
        return later_fragment(ctx, &ip);
    }
    let l4 = EthHdr::LEN + ip.ihl() as usize;
    // Other protocols than TCP, UDP and ICMP have no checksum over the addresses.
    let l4_csum = L4Csum::of(ip.proto, l4).unwrap_or(L4Csum::NONE);
    // The pod-side port (or echo identifier) and where it sits.
    let (pod_port, remote_port, port_at, flags) = match ip.proto {
        TCP | UDP => {
            let (pod_port, remote_port, flags) = packet::ports_and_flags(ctx, ip.proto, l4)?;
            // A pod's reply on a hostPort connection leaves with the host address and
            // port.
            if let Some(host_addr) =
                hostport::outbound(ctx, &ip, l4, l4_csum, pod_port, remote_port, flags)?
            {
                fragments::left(&ip, host_addr);
                return Ok(TC_ACT_OK);
            }
            (pod_port, remote_port, l4, flags)
        }
        ICMP => match ctx.load::<u8>(l4)? {
            // Only echo requests open flows.
            ICMP_ECHO_REQUEST => {
                let id: [u8; 2] = ctx.load(l4 + 4)?;
                (u16::from_be_bytes(id), 0, l4 + 4, 0)
            }
            icmp_type if packet::is_icmp_error(icmp_type) => {
                return icmp_error(ctx, &ip, l4, &config, has_address);
            }
            // Other ICMP from a pod (an echo reply to a host that reached it) stays as it
            // is.
            _ => return Ok(TC_ACT_OK),
        },
        // DCCP and UDP-Lite, translated as UDP is; SCTP keeps its ports; protocols
        // without ports (GRE, ESP, IP in IP...) change address alone (see `keep_port`).
        _ => match packet::flow_ports(ctx, ip.proto, l4)? {
            Some((pod_port, remote_port)) => (pod_port, remote_port, l4, 0),
            None => return Ok(TC_ACT_OK),
        },
    };
    let key = NatKey {
        pod_addr: ip.src_addr,
        remote_addr: ip.dst_addr,
        pod_port,
        remote_port,
        proto: ip.proto as u8,
        pad: [0, 0, 0],
    };
    let now = clock::now_ns();
    // A flow in the table was found to need translation when it began: its packets
    // skip the endpoint and cluster-range lookups (two more maps to touch per packet).
    let found = NAT_OUT.get_ptr_mut(&key);
    let existing = found.filter(|entry| {
        // SAFETY: a pointer into the map value, valid for the program run.
        !conntrack::expired(unsafe { &**entry }, key.proto, &config, now)
    });
    let node_port = match existing {
        Some(_) if !has_address => {
            return Ok(counters::drop_packet(DropReason::NatNoAddress));
        }
        Some(slot) => {
            // SAFETY: as above; copied at once.
            let entry = unsafe { *slot };
            let state = if key.proto == TCP {
                next_state(entry.state, flags, Way::Out)
            } else {
                entry.state
            };
            // A flow goes on from its uplink's address as it is now (see
            // `Nat::follow_uplink` in the daemon).
            if state != entry.state
                || entry.node_addr != node_addr
                || now.saturating_sub(entry.last_seen_ns) > conntrack::REFRESH_NS
            {
                let reverse = key.reverse(entry.node_port);
                conntrack::refresh(slot, &NAT_IN, &reverse, now, state, node_addr);
            }
            entry.node_port
        }
        None => {
            if !to_translate(&ip) {
                return Ok(TC_ACT_OK);
            }
            // An answer on a flow a host outside opened to the pod's own address (a
            // pod's SYN opens a connection of its own: no lookup on that hot path).
            let syn = key.proto == TCP && tcp_flags::opens(flags);
            if !syn && conntrack::opened_from_outside(&key, flags, &config, now) {
                fragments::left(&ip, ip.src_addr);
                return Ok(TC_ACT_OK);
            }
            // No address to give it: dropped before a port is taken (see
            // `NatConfig::NO_ADDRESS`).
            if !has_address {
                return Ok(counters::drop_packet(DropReason::NatNoAddress));
            }
            let state = opening_state(key.proto, flags);
            let port = if rewrites_port(key.proto) {
                allocate(&key, &config, node_addr, now, state)
            } else {
                keep_port(&key, &config, node_addr, now)
            };
            let Some(port) = port else {
                counters::nat(NatCounter::AllocationFailures);
                return Ok(counters::drop_packet(DropReason::NatPortsExhausted));
            };
            let entry = flow_entry(&key, port, node_addr, now, state);
            match found {
                // The flow's expired entry (a pod reusing a port after a close) is
                // rewritten in place: no LRU node taken, none freed.
                // SAFETY: a pointer into the map value, valid for the program run.
                Some(slot) => unsafe { *slot = entry },
                None => {
                    let _ = NAT_OUT.insert(&key, &entry, BPF_ANY as u64);
                }
            }
            counters::nat(NatCounter::NewFlows);
            port
        }
    };

    csum::set_source(ctx, &ip, node_addr, l4_csum)?;
    if node_port != pod_port {
        csum::set_port(ctx, port_at, pod_port, node_port, l4_csum)?;
    }
    fragments::left(&ip, node_addr);
    counters::nat(NatCounter::TranslatedOut);
    Ok(TC_ACT_OK)
}

/// An ICMP error a pod sends about a packet it got on a translated flow (a datagram to a
/// socket it closed, say) or on a hostPort connection: it leaves as the node's, quoting
/// the packet as the remote sent it (node address and port), as conntrack translates
/// such errors along with their flow; sent as it was, it would carry the pod's address
/// and a quote the remote cannot match. Errors about anything else stay as they are.
#[inline(always)]
fn icmp_error(
    ctx: &TcContext,
    ip: &Ipv4Hdr,
    l4: usize,
    config: &NatConfig,
    has_address: bool,
) -> Result<i32, i64> {
    let inner = l4 + 8;
    let inner_ip: Ipv4Hdr = ctx.load(inner)?;
    // The quote is of a packet the pod received: from the remote, to the pod.
    if inner_ip.frag_offset() != 0 || inner_ip.dst_addr != ip.src_addr {
        return Ok(TC_ACT_OK);
    }
    let inner_l4 = inner + inner_ip.ihl() as usize;
    let proto = inner_ip.proto as u8;
    let Some((remote_port, pod_port)) = packet::flow_ports(ctx, proto, inner_l4)? else {
        return Ok(TC_ACT_OK);
    };
    let flow = NatKey::new(
        (inner_ip.dst_addr, pod_port),
        (inner_ip.src_addr, remote_port),
        proto,
    );
    let now = clock::now_ns();
    // SAFETY: the value is copied at once.
    let translated = unsafe { NAT_OUT.get(&flow) }
        .copied()
        .filter(|entry| !conntrack::expired(entry, proto, config, now));
    let (addr, port) = match translated {
        Some(entry) if entry.node_addr != [0; 4] => (entry.node_addr, entry.node_port),
        // Written by an earlier datapath, without the address it left with.
        Some(entry) => (config.node_addr, entry.node_port),
        None => match hostport::host_of(&flow, None) {
            Some(host) => (host.host_addr, host.host_port),
            None => return Ok(TC_ACT_OK),
        },
    };
    if !has_address || !NatConfig::is_address(addr) {
        return Ok(counters::drop_packet(DropReason::NatNoAddress));
    }
    let pod_side = IcmpErrorSide {
        icmp: l4,
        inner,
        outer_at: IP_SRC,
        outer_addr: ip.src_addr,
        inner_at: inner + 16,
        inner_addr: inner_ip.dst_addr,
        port_at: inner_l4 + 2,
        port: pod_port,
    };
    csum::translate_icmp_error(ctx, &pod_side, addr, port)?;
    counters::nat(NatCounter::TranslatedOut);
    Ok(TC_ACT_OK)
}

/// A fragment after the first of a pod's datagram (no ports): it leaves with the
/// source its first fragment was given. Without a record (see `fragments`) a fragment
/// to translate is dropped, as it would leak the pod's address.
#[inline(always)]
fn later_fragment(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<i32, i64> {
    match fragments::first_of(ip, FragmentKey::LEAVING) {
        Some(first) => {
            csum::set_source(ctx, ip, first.addr, L4Csum::NONE)?;
            counters::nat(NatCounter::FragmentsOut);
            Ok(TC_ACT_OK)
        }
        None if to_translate(ip) => Ok(counters::drop_packet(DropReason::NatFragment)),
        None => Ok(TC_ACT_OK),
    }
}

/// Whether `ip` is a masqueraded pod's packet for outside the cluster ranges.
#[inline(always)]
fn to_translate(ip: &Ipv4Hdr) -> bool {
    maps::endpoint(ip.src_addr).is_some_and(|pod| pod.flags & endpoint_flags::MASQUERADE != 0)
        && !maps::in_cluster(ip.dst_addr)
}

/// Finds a free node port for `key` (same remote address, port and protocol) and claims
/// it in `NAT_IN`. A port whose flow has expired is taken over.
///
/// Ports are handed out in sequence per destination, from a cursor that starts at a
/// random port (after RFC 6056's double-hash selection, which Linux uses for its own
/// ports: a table of counters indexed by a hash of the destination, here with random
/// starts in place of a keyed offset): an off-path host cannot guess the next port
/// without a connection to that same destination, and the ports of closed flows, which
/// stay held a little while (`tcp_state::POD_CLOSED`), are the ones right behind the
/// cursor, so at a high connection rate to one service the next port is nearly always
/// free at the first lookup. Decision: the pod's own source port is not kept, as with
/// the `--random-fully` MASQUERADE rules Kubernetes writes. Keeping it when free (what
/// this did before, as Linux NAT does by default) made flows collide: a pod's ports
/// inside the range and those folded into it from outside land on each other, and a
/// benchmark pod needed 0.86 extra lookups per new flow, each a cache miss.
///
/// Cursors are per CPU (no atomics, no contention), in 2^[`CURSOR_BITS`] slots chosen by
/// a hash of the destination. On a held port the next one is tried; after
/// [`LINEAR_PROBES`] in a row the search jumps ahead (block k starts k times
/// [`GOLDEN_STRIDE`] of the range past the first port tried), so a block of ports held
/// by long-lived flows (which a cursor hands out in a row) is not walked port by port.
/// Each probe is a lookup, which takes no lock; only a port that looks free is claimed,
/// with an insert that fails if another CPU claimed it meanwhile.
#[inline(always)]
fn allocate(
    key: &NatKey,
    config: &NatConfig,
    node_addr: [u8; 4],
    now: u64,
    state: u8,
) -> Option<u16> {
    let size = u32::from(config.port_max.checked_sub(config.port_min)?) + 1;
    let cursor = NAT_CURSORS.get_ptr_mut(cursor_slot(key))?;
    // SAFETY: a pointer into this CPU's slot, valid for the program run.
    let start = match unsafe { *cursor } {
        // Not used yet: a random start.
        // SAFETY: a helper without arguments.
        0 => unsafe { bpf_get_prandom_u32() },
        next => next - 1,
    } % size;
    let mut search = Search {
        flow: NewFlow {
            key: *key,
            config: *config,
            node_addr,
            now,
            state,
        },
        start,
        size,
        stride: ((u64::from(size) * GOLDEN_STRIDE) >> 32) as u32,
        port: 0,
    };
    // SAFETY: `probe` has the callback signature bpf_loop expects and reads `search`,
    // which outlives the call, as the `Search` it is.
    unsafe {
        bpf_loop(
            MAX_PROBES,
            probe as *mut c_void,
            (&raw mut search).cast(),
            0,
        )
    };
    if search.port == 0 {
        return None;
    }
    // SAFETY: as above; the next offset, plus one (0 means "not used yet").
    unsafe { *cursor = (u32::from(search.port - config.port_min) + 1) % size + 1 };
    Some(search.port)
}

/// Whether flows of `proto` get a node port (or identifier) of their own: those whose
/// port (and checksum over it, if any) is rewritten in place.
#[inline(always)]
fn rewrites_port(proto: u8) -> bool {
    matches!(proto, TCP | UDP | ICMP | DCCP | UDPLITE)
}

/// Claims the pod's own port for `key`, a flow of a protocol whose port is not rewritten
/// (see below): `None` when another pod's live flow holds it.
///
/// Decision: SCTP keeps its ports, since rewriting one means recomputing
/// the CRC32c over the whole packet, and protocols without ports (GRE, ESP, IP in IP)
/// are translated by address alone (port 0), as MASQUERADE's generic protocol handling
/// does: one pod at a time per (remote address, protocol), or per (remote address and
/// port, pod port) for SCTP; another pod's flow meanwhile is dropped and counted as
/// `nat_ports_exhausted`.
#[inline(always)]
fn keep_port(key: &NatKey, config: &NatConfig, node_addr: [u8; 4], now: u64) -> Option<u16> {
    let flow = NewFlow {
        key: *key,
        config: *config,
        node_addr,
        now,
        state: 0,
    };
    claim(&flow, key.pod_port).then_some(key.pod_port)
}

/// A port search of [`allocate`], shared with its [`probe`] callback.
///
/// The search runs under `bpf_loop`, whose callback the verifier checks once: as a
/// plain loop, it was walked once per iteration and per path into it, and
/// `uplink_egress` hit the verifier's million-instruction limit whenever the loop or
/// what leads to it changed.
#[repr(C)]
struct Search {
    flow: NewFlow,
    start: u32,
    size: u32,
    /// How far apart blocks of [`LINEAR_PROBES`] start ([`GOLDEN_STRIDE`] of `size`).
    stride: u32,
    /// The port claimed; 0 while none (node ports are 1024 and above).
    port: u16,
}

/// A new flow claiming a node port (see [`claim`]).
#[repr(C)]
struct NewFlow {
    key: NatKey,
    config: NatConfig,
    /// The uplink's address, which the flow leaves with.
    node_addr: [u8; 4],
    now: u64,
    /// Its state in the tables.
    state: u8,
}

/// Probe `index` of a [`Search`]: claims its port and stops the loop (1), or counts a
/// held port and goes on (0).
extern "C" fn probe(index: u64, search: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the pointer `allocate` gave it.
    let search = unsafe { &mut *search.cast::<Search>() };
    if search.size == 0 {
        // Never so (`allocate` sets one or more); tells the compiler the division
        // below cannot panic, which would leave the callback without an exit.
        return 1;
    }
    let index = index as u32;
    // 128 probes: 16 blocks, each offset under 65,536; no overflow.
    let offset = (search.start + index % LINEAR_PROBES + index / LINEAR_PROBES * search.stride)
        % search.size;
    let port = search.flow.config.port_min + offset as u16;
    if claim(&search.flow, port) {
        search.port = port;
        return 1;
    }
    counters::nat(NatCounter::PortProbes);
    0
}

/// The cursor slot of `key`'s destination (remote address, port and protocol).
#[inline(always)]
fn cursor_slot(key: &NatKey) -> u32 {
    let mixed = u32::from_ne_bytes(key.remote_addr)
        ^ (u32::from(key.remote_port) << 16)
        ^ u32::from(key.proto);
    // Fibonacci hashing: the top bits of the product, spread over the slots.
    mixed.wrapping_mul(0x9E37_79B1) >> (32 - CURSOR_BITS)
}

/// The entry of `key`'s flow on node `port` of `node_addr`.
#[inline(always)]
fn flow_entry(key: &NatKey, port: u16, node_addr: [u8; 4], now: u64, state: u8) -> NatEntry {
    NatEntry {
        last_seen_ns: now,
        pod_addr: key.pod_addr,
        pod_port: key.pod_port,
        node_port: port,
        state,
        pad: [0, 0, 0],
        node_addr,
    }
}

/// Claims node `port` for `flow` in `NAT_IN` if it is free, held by this
/// very flow, or held by an expired one (the caller writes `NAT_OUT`). Node ports are
/// one space for all uplinks (`NAT_IN` is keyed without the node address): a remote
/// reached by two uplinks never sees the same node port from both.
///
/// Decision: an expired flow's `NAT_OUT` entry stays when its port is taken over, for
/// the daemon's sweep to remove (it pairs entries by pod address and port, so it leaves
/// the new holder alone). Looking that entry up and deleting it here cost a SYN two
/// more cold hash-bucket walks and an LRU list update, ~130 ns per packet of
/// `uplink_egress` on average in the connection-rate benchmark (bpf_stats), for no
/// change in behaviour: the stale entry is expired, so a packet on the old flow's
/// 4-tuple opens a new flow (rewriting the entry in place) and never takes the port it
/// lost.
#[inline(always)]
fn claim(flow: &NewFlow, port: u16) -> bool {
    let (key, config, now) = (&flow.key, &flow.config, flow.now);
    // Host ports belong to their mappings.
    if hostport::is_host_port(key.proto, port, flow.node_addr) {
        return false;
    }
    let reverse = key.reverse(port);
    let entry = flow_entry(key, port, flow.node_addr, now, flow.state);
    match NAT_IN.get_ptr_mut(&reverse) {
        None => {
            if NAT_IN.insert(&reverse, &entry, BPF_NOEXIST as u64).is_err() {
                return false;
            }
        }
        Some(holder) => {
            // SAFETY: a pointer into the map value, valid for the program run.
            let old = unsafe { *holder };
            // This very flow already holds the port (its NAT_OUT entry was evicted or
            // had expired): it keeps it.
            let same_flow = old.pod_addr == key.pod_addr && old.pod_port == key.pod_port;
            if !same_flow && !conntrack::expired(&old, key.proto, config, now) {
                return false;
            }
            // SAFETY: as above; the port changes hands in place.
            unsafe { *holder = entry };
        }
    }
    true
}
